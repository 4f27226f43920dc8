"""Plan a GGUF model on simulated devices as llama.cpp would load it, without loading it.

`plan_gguf(path, devices, options)` reads the file's metadata and tensor infos (never a
weight byte), places the weights and the KV cache as llama.cpp's load_tensors and
llama_kv_cache do for `options` (its -ngl, --split-mode, --tensor-split, --main-gpu,
-ot/--override-tensor, --cpu-moe, --n-cpu-moe, -c, -b, -ub, --cache-type-k/-v,
--no-kv-offload, --no-op-offload), builds llama.cpp's
worst-case prompt-ubatch graph and its one-token decode graph, and reserves them with the
scheduler as llama-context's sched_reserve does (prompt, decode, prompt again). The
ModelPlan holds what llama.cpp logs: the graph nodes and splits of both graphs and each
device's model, KV, compute and output buffer sizes; and, beyond the log, each graph's
splits: their devices, the bytes the scheduler copies into them from other devices, and
why each exists (ggml_py.reasons).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ggml_py import ops
from ggml_py._backend import Backend, Buffer
from ggml_py._core import Context, Graph, Tensor
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.errors import ArgumentError, ModelError
from ggml_py.models.arch import get_builder
from ggml_py.models.arch.blocks import GraphContext
from ggml_py.models.config import ModelConfig, graph_size, layer_of
from ggml_py.models.devices import Device
from ggml_py.models.graph import step_inputs
from ggml_py.models.gguf import TensorInfo, read_tensor_infos
from ggml_py.models.placement import flash_attn_off_layers, split_layers
from ggml_py.reasons import split_reasons
from ggml_py.sched import Scheduler

CTX_PAD = 256           # llama_context pads n_ctx to this
SPLIT_MODES = ("layer", "none")
FLASH_ATTN = ("on", "off", "auto")
UNQUANTIZED = ("f32", "f16", "bf16")
CACHE_TYPES = (*UNQUANTIZED, "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
BUFFER_KINDS = ("model", "kv", "compute", "output")
# weight types ggml-cpu repacks into its CPU_REPACK buffer type (not modelled yet)
_REPACKED = ("q4_0", "q4_K", "iq4_nl", "q8_0", "mxfp4")
# the expert matrices' names as common's --cpu-moe and --n-cpu-moe match them
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def parse_overrides(text: str) -> tuple[tuple[str, str], ...]:
    """-ot's value as llama.cpp's common splits it: comma-separated REGEX=BUFFER_TYPE rules
    (the first '=' ends the regex), each (regex, buffer type)."""
    rules = []
    for rule in text.split(","):
        regex, eq, buft = rule.partition("=")
        if not eq:
            raise ArgumentError(f"-ot {rule!r}: expected REGEX=BUFFER_TYPE, e.g. "
                                r"blk\.[0-3]\.ffn_.*_exps\.=CPU")
        rules.append((regex, buft))
    return tuple(rules)


def cpu_moe_overrides(n_layers: int | None = None) -> tuple[tuple[str, str], ...]:
    """The rules of --cpu-moe (n_layers None: every layer's experts on the CPU) and of
    --n-cpu-moe N (the experts of layers 0..N-1), as common adds them."""
    if n_layers is None:
        return ((FFN_EXPS_REGEX, "CPU"),)
    return tuple((rf"blk\.{il}{FFN_EXPS_REGEX}", "CPU") for il in range(n_layers))


@dataclass(frozen=True)
class PlanOptions:
    """llama.cpp's placement and context options (common's defaults)."""
    n_gpu_layers: int = -1              # -ngl; negative: all (n_layer + 1 with the output)
    split_mode: str = "layer"           # --split-mode
    tensor_split: tuple[float, ...] | None = None   # --tensor-split; None: by free memory
    main_gpu: int = 0                   # --main-gpu (split mode none)
    n_ctx: int = 4096                   # -c; 0: the file's context length
    n_batch: int = 2048                 # -b
    n_ubatch: int = 512                 # -ub
    cache_type_k: str = "f16"           # --cache-type-k
    cache_type_v: str = "f16"           # --cache-type-v
    kv_offload: bool = True             # --no-kv-offload clears it
    op_offload: bool = True             # --no-op-offload clears it
    flash_attn: str = "auto"            # -fa on|off|auto (auto: on where the devices run it)
    use_mmap: bool = True               # CPU weights stay in the mapped file (CPU_Mapped)
    # -ot, --cpu-moe and --n-cpu-moe in their order on the command line: (regex, buffer
    # type) rules; a weight whose name the regex finds goes to that device (first rule wins)
    tensor_overrides: tuple[tuple[str, str], ...] = ()

    def check(self) -> None:
        """ArgumentError naming the first option llama.cpp or this planner refuses."""
        if self.split_mode not in SPLIT_MODES:
            raise ArgumentError(f"--split-mode must be one of {', '.join(SPLIT_MODES)}, got "
                                f"{self.split_mode!r}")
        for opt, t in (("--cache-type-k", self.cache_type_k), ("--cache-type-v",
                                                                  self.cache_type_v)):
            if t not in CACHE_TYPES:
                raise ArgumentError(f"{opt} must be one of {', '.join(CACHE_TYPES)}, got {t!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise ArgumentError(f"-fa must be one of {', '.join(FLASH_ATTN)}, got "
                                f"{self.flash_attn!r}")
        if self.flash_attn != "off" and not self.kv_offload:
            raise ArgumentError(f"-fa {self.flash_attn} with --no-kv-offload: llama.cpp pins a "
                                "view to the CPU there, which this scheduler refuses; not "
                                "planned yet (pass -fa off)")
        if self.cache_type_v not in UNQUANTIZED and self.flash_attn == "off":
            raise ArgumentError(f"--cache-type-v {self.cache_type_v}: a quantized V cache "
                                "needs flash attention (llama.cpp refuses it with -fa off)")
        for opt, v, lo in (("-c", self.n_ctx, 0), ("-b", self.n_batch, 1),
                           ("-ub", self.n_ubatch, 1), ("--main-gpu", self.main_gpu, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ArgumentError(f"{opt} must be an integer >= {lo}, got {v!r}")
        if self.tensor_split is not None and any(x < 0 for x in self.tensor_split):
            raise ArgumentError(f"--tensor-split shares must be >= 0, got {self.tensor_split}")
        for regex, buft in self.tensor_overrides:
            try:
                re.compile(regex)
            except re.error as e:
                raise ArgumentError(f"-ot {regex}={buft}: not a regular expression ({e})") \
                    from None


@dataclass(frozen=True)
class BufferUse:
    """A buffer llama.cpp allocates: on which device, for what, how many bytes."""
    device: str
    kind: str
    bytes: int


@dataclass(frozen=True)
class SplitUse:
    """One split of a planned graph: the device it runs on, its nodes [i_start, i_end),
    the inputs the scheduler copies into it from other devices ((that device, bytes) each)
    and why it exists (a sentence and a few words; empty for the first split)."""
    device: str
    i_start: int
    i_end: int
    copies: tuple[tuple[str, int], ...] = ()
    reason: str = ""
    brief: str = ""

    @property
    def copy_bytes(self) -> int:
        """Bytes copied into this split each time the graph is computed."""
        return sum(n for _, n in self.copies)

    def to_dict(self) -> dict[str, Any]:
        """The split in --json's `splits`."""
        return {"device": self.device, "nodes": [self.i_start, self.i_end],
                "copy_bytes": self.copy_bytes,
                "copies": [{"from": d, "bytes": n} for d, n in self.copies],
                "reason": self.reason}


@dataclass
class ModelPlan:
    """What llama.cpp would report loading the model with these options."""
    path: str
    config: ModelConfig
    devices: list[Device]
    layer_devices: list[str]            # per layer
    output_device: str
    n_ctx: int                          # KV cells (padded)
    n_ubatch: int                       # tokens of the worst-case prompt graph
    graph_nodes: tuple[int, int]        # (prompt ubatch, decode token)
    graph_splits: tuple[int, int]
    n_copies: int                       # pipeline parallelism's copies of split inputs
    buffers: list[BufferUse] = field(default_factory=list)
    overridden: dict[str, str] = field(default_factory=dict)   # weight -> device, by -ot
    # the splits of (the prompt ubatch, the decode token)
    splits: tuple[tuple[SplitUse, ...], tuple[SplitUse, ...]] = ((), ())

    @property
    def copy_bytes(self) -> tuple[int, int]:
        """Bytes copied between devices per (prompt ubatch, decoded token)."""
        return (sum(s.copy_bytes for s in self.splits[0]),
                sum(s.copy_bytes for s in self.splits[1]))

    def device_bytes(self, device: str) -> int:
        """Bytes of every buffer on `device` (a name: RPC0, CPU, ...)."""
        return sum(b.bytes for b in self.buffers if b.device == device)

    @property
    def warnings(self) -> list[str]:
        """A sentence per device whose buffers exceed the memory it was given."""
        out = []
        for d in self.devices:
            need = self.device_bytes(d.name)
            if d.memory is not None and need > d.memory:
                out.append(f"{d.name} needs {need / 2**20:.2f} MiB but has "
                           f"{d.memory / 2**20:.2f} MiB")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The --json report."""
        return {"model": self.path, "arch": self.config.arch, "n_layer": self.config.n_layer,
                "n_ctx": self.n_ctx, "n_ubatch": self.n_ubatch,
                "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory}
                            for d in self.devices],
                "layers": self.layer_devices, "output_layer": self.output_device,
                "graph_nodes": list(self.graph_nodes), "graph_splits": list(self.graph_splits),
                "n_copies": self.n_copies, "tensor_overrides": self.overridden,
                "buffers": [dataclasses.asdict(b) for b in self.buffers],
                "warnings": self.warnings, "copy_bytes": list(self.copy_bytes),
                "splits": [[s.to_dict() for s in graph] for graph in self.splits]}

    def text(self) -> str:
        """The report in words, sizes in MiB as llama.cpp prints them."""
        cfg = self.config
        runs, il = [], 0
        for name, group in itertools.groupby(self.layer_devices):
            n = len(list(group))
            runs.append(f"layers {il}..{il + n - 1} {name}")
            il += n
        lines = [f"{self.path}: {cfg.arch}, {cfg.n_layer} layers, n_ctx {self.n_ctx}, "
                 f"ubatch {self.n_ubatch}",
                 "placement: " + ", ".join(runs) + f", output {self.output_device}",
                 *(["tensor overrides: " + ", ".join(
                     f"{n} weight{'s' * (n > 1)} to {name}" for name, n in
                     collections.Counter(self.overridden.values()).items())]
                   if self.overridden else []),
                 f"graph nodes: {self.graph_nodes[0]} / {self.graph_nodes[1]} "
                 f"(prompt ubatch / decode token)",
                 f"graph splits: {self.graph_splits[0]} / {self.graph_splits[1]}"
                 + (f" (pipeline parallel, {self.n_copies} copies)" if self.n_copies > 1
                    else ""),
                 f"{'device':<8} " + " ".join(f"{k:>12}" for k in BUFFER_KINDS)
                 + f" {'total':>12} {'memory':>12}"]
        for d in self.devices:
            sizes = {k: sum(b.bytes for b in self.buffers if b.device == d.name and b.kind == k)
                     for k in BUFFER_KINDS}
            mem = f"{d.memory / 2**20:9.2f} MiB" if d.memory is not None else f"{'-':>12}"
            lines.append(f"{d.name:<8} " + " ".join(f"{sizes[k] / 2**20:8.2f} MiB"
                                                    for k in BUFFER_KINDS)
                         + f" {self.device_bytes(d.name) / 2**20:8.2f} MiB {mem}")
        lines.append(f"bytes copied between devices: {self.copy_bytes[0]:,} / "
                     f"{self.copy_bytes[1]:,} (prompt ubatch / decode token)")
        for title, splits in zip(("prompt ubatch", "decode token"), self.splits):
            lines.append(f"splits of the {title}:")
            lines += [f"  {k:>3} {s.device:<8} nodes {s.i_start}..{s.i_end - 1}, "
                      f"{s.copy_bytes:,} bytes in" + (f"; {s.reason}" if s.reason else "")
                      for k, s in enumerate(splits)]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


class _Cache:
    """The KV cache tensors the graph builders read (models.model.KVCache's layout)."""

    def __init__(self, k: list[Tensor], v: list[Tensor]) -> None:
        self.k, self.v = k, v


def _buffers_bytes(buffers: list[Buffer]) -> int:
    return sum(b.size for b in buffers)


def _mapped_bytes(infos: Sequence[TensorInfo]) -> int:
    """The CPU_Mapped buffer of weights read from the mapped file: the span of the file
    from the first of their bytes to the end of the last (llama.cpp maps that range)."""
    return max(i.offset + i.nbytes for i in infos) - min(i.offset for i in infos)


def _weight_device(name: str, layers: Sequence[Backend], output: Backend, cpu: Backend,
                   overrides: Sequence[tuple[re.Pattern[str], Backend]]) -> Backend:
    """llama.cpp's device of a weight: the first override whose regex it matches, else its
    layer's, the output layer's, or (the input layer, the token embeddings) the CPU's."""
    for regex, device in overrides:
        if regex.search(name):
            return device
    il = layer_of(name)
    if il is not None:
        return layers[il]
    return cpu if name == "token_embd.weight" else output


PROBE_TOKENS = 512          # the batch llama.cpp probes a weight's op with


def _weight_op(name: str, info: TensorInfo) -> str:
    """The op that reads weight `name` (llama.cpp's tensor info table): GET_ROWS for the
    token embeddings, MUL_MAT_ID for experts, MUL_MAT for the other matrices; "" for
    vectors (norms, biases: MUL and ADD of f32 rows, which every device runs)."""
    if len(info.ne) < 2:
        return ""
    if name == "token_embd.weight":
        return "GET_ROWS"
    return "MUL_MAT_ID" if "_exps." in name else "MUL_MAT"


def _runs_weight_op(device: Backend, op: str, info: TensorInfo, cfg: ModelConfig) -> bool:
    """llama.cpp's weight_buft_supported: can `device` run `op` reading a weight like
    `info` on a batch of 512 tokens?"""
    ctx = Context()
    w = ops.new_tensor(ctx, info.type, info.ne)
    n = PROBE_TOKENS
    if op == "GET_ROWS":
        probe = ops.get_rows(ctx, w, ops.new_tensor(ctx, "i32", (n,)))
    elif op == "MUL_MAT_ID":
        used = cfg.n_expert_used
        probe = ops.mul_mat_id(ctx, w, ops.new_tensor(ctx, "f32", (info.ne[0], used, n)),
                               ops.new_tensor(ctx, "i32", (used, n)))
    else:
        probe = ops.mul_mat(ctx, w, ops.new_tensor(ctx, "f32", (info.ne[0], n, *info.ne[2:])))
    return device.supports_op(probe)


def _usable_placement(placed: dict[str, Backend], infos: dict[str, TensorInfo],
                      cfg: ModelConfig, cpu: Backend) -> dict[str, Backend]:
    """llama.cpp's select_weight_buft: a weight whose device cannot run the op that reads
    it is kept on the CPU (each kind of weight probed once per device)."""
    runs: dict[tuple[int, str, str, tuple[int, ...]], bool] = {}
    out = {}
    for name, device in placed.items():
        info = infos[name]
        op = _weight_op(name, info)
        key = (id(device), op, info.type, info.ne)
        if device is not cpu and op and key not in runs:
            runs[key] = _runs_weight_op(device, op, info, cfg)
        out[name] = device if runs.get(key, True) else cpu
    return out


def _check_cache_rotation(cfg: ModelConfig, opts: PlanOptions) -> None:
    """llama.cpp rotates a quantized K or V cache (Hadamard) when heads are a multiple of
    64: graph nodes this planner does not build yet."""
    for kv, t in (("k", opts.cache_type_k), ("v", opts.cache_type_v)):
        if t not in UNQUANTIZED and cfg.head_dim % 64 == 0:
            raise ModelError(f"--cache-type-{kv} {t} with {cfg.head_dim}-wide heads: llama.cpp "
                             f"adds its {kv.upper()} rotation to the graph, not planned yet")


# the models planned as llama.cpp loads them (checked against its logs: llama with or
# without experts); the others' buffers differ (iSWA's second KV cache) and are not
# planned yet
PLANNED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe")


def _check_planned(cfg: ModelConfig, path: str) -> None:
    """ModelError for a model this planner would not plan as llama.cpp loads it."""
    if cfg.arch not in PLANNED_ARCHS:
        raise ModelError(f"{path}: planning {cfg.arch} models is not supported yet (planned: "
                         f"{', '.join(PLANNED_ARCHS)})")


def _overrides(opts: PlanOptions, devices: Sequence[Device],
               used: Sequence[Device]) -> list[tuple[re.Pattern[str], Backend]]:
    """The tensor overrides' compiled regexes and devices. Their buffer types are device
    names (llama.cpp names a device's buffer type so: CPU, RPC0, ...); one the model does
    not use (--split-mode none's other devices) is refused."""
    by_name = {d.name: d for d in used}
    out = []
    for regex, buft in opts.tensor_overrides:
        if buft not in by_name:
            why = ("not used by the model with --split-mode none"
                   if any(d.name == buft for d in devices) else "unknown buffer type")
            raise ArgumentError(f"-ot {regex}={buft}: {why} (the model's: "
                                f"{', '.join(by_name)})")
        out.append((re.compile(regex), by_name[buft].backend))
    return out


def plan_gguf(path: str, devices: Sequence[Device],
              options: PlanOptions | None = None) -> ModelPlan:
    """The ModelPlan of the GGUF file at `path` on `devices` (models.devices.parse_devices:
    the GPUs then the CPU) with llama.cpp's `options`."""
    opts = options or PlanOptions()
    opts.check()
    cfg, infos = read_tensor_infos(path)
    _check_planned(cfg, path)
    n_ctx = -(-(opts.n_ctx or cfg.n_ctx) // CTX_PAD) * CTX_PAD
    cfg = dataclasses.replace(cfg, n_ctx=n_ctx)
    _check_cache_rotation(cfg, opts)
    n_ubatch = min(n_ctx, opts.n_batch, opts.n_ubatch)
    cpu = devices[-1]
    gpus, shares = _model_devices(devices, opts)
    layers, output = split_layers(cfg.n_layer, [d.backend for d in gpus], cpu.backend,
                                  opts.n_gpu_layers, shares)
    used = [*gpus, cpu]
    overrides = _overrides(opts, devices, used)
    placed = {n: _weight_device(n, layers, output, cpu.backend, overrides) for n in infos}
    placed = _usable_placement(placed, infos, cfg, cpu.backend)
    weights, buffers = _place_weights(infos, used, placed, opts.use_mmap)
    cache, kv_buffers = _place_cache(cfg, used, layers if opts.kv_offload else
                                     [cpu.backend] * cfg.n_layer, opts)
    buffers += kv_buffers

    # the compute buffers: sched_reserve's prompt, decode and prompt graphs
    full_offload = (cfg.n_layer + 1 if opts.n_gpu_layers < 0 else opts.n_gpu_layers) > cfg.n_layer
    parallel = (len(gpus) > 1 and full_offload and opts.split_mode == "layer" and
                opts.kv_offload and not opts.tensor_overrides)
    sched = Scheduler([d.backend for d in used], graph_size=graph_size(cfg), parallel=parallel,
                      op_offload=opts.op_offload, copy_all_inputs=True, graph_reuse=False)
    flash_attn = opts.flash_attn == "on" or (opts.flash_attn == "auto" and
                                             _flash_attn_runs_on_layers(sched, cfg, weights,
                                                                        cache, layers))
    nodes, splits = [], []
    for n_tokens in (n_ubatch, 1, n_ubatch):
        graph = _reserve_graph(cfg, weights, cache, n_tokens, flash_attn)
        pin = functools.partial(_pin_as_llama_cpp, sched, graph, layers, cpu.backend,
                                n_tokens < 32 or full_offload, not opts.kv_offload)
        pin()
        if len(splits) < 2:     # (the third graph is the first again)
            # the splits are read from a split of their own: reserve forgets the assignments
            splits.append(_split_uses(sched.split_graph(graph), graph))
            sched.reset()
            pin()
        sched.reserve(graph)
        nodes.append(graph.n_nodes)
    buffers += [BufferUse(d.name, "compute", sched.get_buffer_size(d.backend)) for d in used
                if sched.get_buffer_size(d.backend) > 1]      # (llama.cpp prints those only)
    sched.close()
    buffers.append(BufferUse(cpu.name, "output", 4 * cfg.n_vocab))     # one sequence's logits
    names = {id(d.backend): d.name for d in devices}
    overridden = {n: names[id(placed[n])] for n in infos
                  if any(regex.search(n) for regex, _ in overrides)}
    return ModelPlan(str(path), cfg, list(devices), [names[id(b)] for b in layers],
                     names[id(output)], n_ctx, n_ubatch, (nodes[0], nodes[1]),
                     (len(splits[0]), len(splits[1])), sched.n_copies, buffers, overridden,
                     (splits[0], splits[1]))


def _model_devices(devices: Sequence[Device],
                   opts: PlanOptions) -> tuple[list[Device], tuple[float, ...] | None]:
    """The devices llama.cpp's model uses besides the CPU (--split-mode none: the main one
    alone) and their shares of the layers: --tensor-split, else (or all 0) their memories
    (equal where none is given)."""
    gpus = [d for d in devices if not d.is_cpu]
    if not gpus:
        return [], None
    shares = opts.tensor_split
    if opts.split_mode == "none":
        if opts.main_gpu >= len(gpus):
            raise ArgumentError(f"--main-gpu {opts.main_gpu}: there are {len(gpus)} devices")
        gpus, shares = [gpus[opts.main_gpu]], None
    if shares is not None and len(shares) > len(gpus):
        raise ArgumentError(f"--tensor-split has {len(shares)} shares for {len(gpus)} devices")
    if shares is None or not any(shares):
        return gpus, tuple(d.memory if d.memory is not None else 1 for d in gpus)
    return gpus, tuple(shares) + (0.0,) * (len(gpus) - len(shares))


def _place_weights(infos: dict[str, TensorInfo], used: list[Device], placed: dict[str, Backend],
                   use_mmap: bool) -> tuple[dict[str, Tensor], list[BufferUse]]:
    """The weight tensors, in a buffer per device (`used`, the CPU last) as `placed` says,
    and those buffers: the CPU's is the span of the mapped file its weights lie in
    (CPU_Mapped)."""
    ctx = Context("weights")
    weights = {name: ops.new_tensor(ctx, info.type, info.ne, name=name)
               for name, info in infos.items()}
    buffers = []
    for d in used:
        held = [n for n in infos if placed[n] is d.backend]
        if not held:
            continue
        if d.is_cpu:
            repacked = [n for n in held if n != "token_embd.weight"     # (read by get_rows)
                        and infos[n].type in _REPACKED]
            if repacked:
                raise ModelError(f"{repacked[0]} ({infos[repacked[0]].type}) would go to "
                                 "ggml-cpu's CPU_REPACK buffer, which is not planned yet")
        bufs = alloc_ctx_tensors_from_buft([weights[n] for n in held],
                                           d.backend.get_default_buffer_type(), "weights")
        size = (_mapped_bytes([infos[n] for n in held]) if d.is_cpu and use_mmap
                else _buffers_bytes(bufs))
        buffers.append(BufferUse(d.name, "model", size))
    return weights, buffers


def _place_cache(cfg: ModelConfig, used: list[Device], layers: Sequence[Backend],
                 opts: PlanOptions) -> tuple[_Cache, list[BufferUse]]:
    """llama_kv_cache's K and V of every layer ([n_embd_gqa, cells] each), in a buffer per
    device of `used`: each layer's on `layers[il]`."""
    ctx = Context("kv")
    cache = _Cache([], [])
    held: dict[int, list[Tensor]] = {}
    for il in range(cfg.n_layer):
        for part, t, out in (("k", opts.cache_type_k, cache.k), ("v", opts.cache_type_v, cache.v)):
            out.append(ops.new_tensor_2d(ctx, t, cfg.n_embd_gqa, cfg.n_ctx,
                                         name=f"cache_{part}_l{il}"))
            held.setdefault(id(layers[il]), []).append(out[-1])
    buffers = [BufferUse(d.name, "kv", _buffers_bytes(alloc_ctx_tensors_from_buft(
                   held[id(d.backend)], d.backend.get_default_buffer_type(), "any")))
               for d in used if id(d.backend) in held]
    return cache, buffers


def _pin_as_llama_cpp(sched: Scheduler, graph: Graph, layers: Sequence[Backend], cpu: Backend,
                      norms: bool, kqv_on_cpu: bool) -> None:
    """The assignments llama.cpp makes while building a graph. `norms`: its graph callback
    pins each layer's norms to the layer's device (where it supports them) for small
    batches and full offloads, since the scheduler would leave a layer's first norm on the
    device of the layer before. `kqv_on_cpu` (--no-kv-offload): the attention output
    goes to the CPU, and with it every node between the KV store and it."""
    for node in graph.nodes:
        label, _, il = node.name.rpartition("-")
        if norms and label == "norm" and il.isdigit():
            if layers[int(il)].supports_op(node):
                sched.set_tensor_backend(node, layers[int(il)])
        elif kqv_on_cpu and label == "kqv_out" and il.isdigit():
            sched.set_tensor_backend(node, cpu)


def _split_uses(sched: Scheduler, graph: Graph) -> tuple[SplitUse, ...]:
    """The splits of `graph`, which `sched` split last (backends are named as the devices
    are): each one's inputs from other devices, and why it exists."""
    reasons = {r.split: r for r in split_reasons(sched, graph)}
    out = []
    for k, s in enumerate(sched.splits):
        froms = [(sched.get_tensor_backend(t), t.nbytes) for t in s.inputs]
        copies = tuple((b.name, n) for b, n in froms if b is not None and b is not s.backend)
        r = reasons.get(k)
        out.append(SplitUse(s.backend.name, s.i_start, s.i_end, copies,
                            r.text() if r else "", r.brief() if r else ""))
    return tuple(out)


def _flash_attn_runs_on_layers(sched: Scheduler, cfg: ModelConfig, weights: dict[str, Tensor],
                               cache: _Cache, layers: Sequence[Backend]) -> bool:
    """-fa auto as llama.cpp resolves it: split a one-token graph with flash attention and
    keep it where each layer's FLASH_ATTN_EXT runs on the layer's device. (Where one does
    not, llama.cpp computes without it over a V cache laid out for it: not planned yet.)"""
    graph = _reserve_graph(cfg, weights, cache, 1, True)
    _pin_as_llama_cpp(sched, graph, layers, layers[0], True, False)
    off = flash_attn_off_layers(sched, graph, layers)
    if off:
        raise ModelError(f"-fa auto: layer {off[0]}'s flash attention would not run on its "
                         "device, so llama.cpp would turn it off over a V cache laid out for "
                         "it: not planned yet; pass -fa off or -fa on")
    return True


def _reserve_graph(cfg: ModelConfig, weights: dict[str, Tensor], cache: _Cache,
                   n_tokens: int, flash_attn: bool) -> Graph:
    """llama.cpp's graph_reserve graph: `n_tokens` tokens, each an output, over the whole
    cache (init_full: every cell)."""
    data = step_inputs(cfg, np.zeros(n_tokens, dtype=np.int32), 0, cfg.n_ctx, kv_rows=True)
    data["inp_out_ids"] = np.arange(n_tokens)
    if flash_attn:                  # V rows are cells, as K's
        data["inp_v_idxs"] = data["inp_k_idxs"]
    data["inp_embd"] = np.zeros((n_tokens, cfg.n_embd), dtype=np.float32)
    gc = GraphContext(cfg, weights, cache, n_tokens, 0, cfg.n_ctx, n_tokens, data,
                      embd_input=True, flash_attn=flash_attn)
    gc.expand(get_builder(cfg.arch)(gc).set_output())
    return gc.graph


__all__ = ["BufferUse", "ModelPlan", "PlanOptions", "SplitUse", "plan_gguf"]
