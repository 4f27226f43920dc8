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
from typing import Any, Iterable, Sequence

import numpy as np

from ggml_py import ops
from ggml_py._backend import Backend, Buffer, BufferType
from ggml_py._core import Context, Graph, Tensor
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.errors import ArgumentError, ModelError
from ggml_py.models.arch import get_builder
from ggml_py.models.arch.blocks import GraphContext
from ggml_py.models.config import ModelConfig, graph_size, layer_of
from ggml_py.models.devices import Device
from ggml_py.models.devices import cpu as cpu_kind
from ggml_py.models.devices import cuda as cuda_kind
from ggml_py.models.graph import step_inputs
from ggml_py.models.gguf import TensorInfo, read_tensor_infos
from ggml_py.models.placement import flash_attn_off_layers, split_layers
from ggml_py.reasons import split_reasons
from ggml_py.sched import Scheduler

CTX_PAD = 256           # llama_context pads n_ctx to this
MAX_SEQ = 256           # llama.cpp's LLAMA_MAX_SEQ: --parallel's most
SPLIT_MODES = ("layer", "row", "none")
FLASH_ATTN = ("on", "off", "auto")
UNQUANTIZED = ("f32", "f16", "bf16")
CACHE_TYPES = (*UNQUANTIZED, "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
BUFFER_KINDS = ("model", "kv", "compute", "output")
# weights every layer reads on its own device: llama.cpp creates them with layer 0 and
# copies them to each other device that holds a layer (TENSOR_DUPLICATED)
LAYER_COPIED = ("rope_factors_long.weight", "rope_factors_short.weight")
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
    swa_full: bool = False              # --swa-full: the sliding layers' cache full-size
    n_parallel: int = 1                 # --parallel: sequences decoded together (n_seq_max)
    kv_unified: bool = False            # --kv-unified: one KV stream for all sequences
    repack: bool = True                 # --no-repack clears it: no CPU_REPACK buffer
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
                           ("-ub", self.n_ubatch, 1), ("--main-gpu", self.main_gpu, 0),
                           ("--parallel", self.n_parallel, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ArgumentError(f"{opt} must be an integer >= {lo}, got {v!r}")
        if self.n_parallel > MAX_SEQ:
            raise ArgumentError(f"--parallel must be <= {MAX_SEQ} (llama.cpp's most), got "
                                f"{self.n_parallel}")
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
    """A buffer llama.cpp allocates: on which device, for what, how many bytes, and (a
    model buffer) its name in llama.cpp's log: CPU_Mapped, CPU_REPACK, CUDA0, CUDA0_Split,
    ... (a split buffer counts on its main device, as llama.cpp counts it)."""
    device: str
    kind: str
    bytes: int
    buffer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The buffer in --json's `buffers` (`buffer` where it is named)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


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
    flash_attn: bool = False            # as -fa resolved it

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
                "buffers": [b.to_dict() for b in self.buffers], "flash_attn": self.flash_attn,
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
                 f"ubatch {self.n_ubatch}, flash attention {'on' if self.flash_attn else 'off'}",
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
        lines.append("model buffers: " + ", ".join(f"{b.buffer} {b.bytes / 2**20:.2f} MiB"
                                                   for b in self.buffers if b.kind == "model"))
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
    """The KV cache tensors the graph builders read, a K and a V per layer ([n_embd_gqa,
    cells, streams] each), the cells of a stream of the global layers' cache and of the
    sliding layers' (llama_kv_cache_iswa's second cache; the same where the model has no
    window), and the streams (a sequence each, unless one is shared: --kv-unified)."""

    def __init__(self, cells: int, cells_swa: int, n_stream: int) -> None:
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.cells, self.cells_swa, self.n_stream = cells, cells_swa, n_stream


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def _cache_layout(cfg: ModelConfig, opts: PlanOptions, n_ubatch: int) -> tuple[int, int, int]:
    """llama.cpp's KV caches for a context of cfg.n_ctx cells: (the cells of a stream of
    the global layers' cache, of the sliding layers', the streams). A unified cache is one
    stream of n_ctx cells; otherwise each of the --parallel sequences has a stream of its
    share, padded to 256. The sliding layers keep their window (each sequence's, in a
    unified cache) and a ubatch, padded to 256 (llama_kv_cache_iswa), unless --swa-full."""
    n_seq = opts.n_parallel
    cells, n_stream = (cfg.n_ctx, 1) if opts.kv_unified else (_pad(cfg.n_ctx // n_seq), n_seq)
    if not cfg.iswa or opts.swa_full:
        return cells, cells, n_stream
    window = cfg.n_swa * (n_seq if opts.kv_unified else 1)
    return cells, _pad(min(cells, window + n_ubatch)), n_stream


def _buffers_bytes(buffers: list[Buffer]) -> int:
    return sum(b.size for b in buffers)


def _mapped_bytes(infos: Sequence[TensorInfo]) -> int:
    """The CPU_Mapped buffer of weights read from the mapped file: the span of the file
    from the first of their bytes to the end of the last (llama.cpp maps that range)."""
    return max(i.offset + i.nbytes for i in infos) - min(i.offset for i in infos)


def _llama_cpp_name(name: str, infos: dict[str, TensorInfo]) -> str:
    """The name llama.cpp gives a weight, which -ot's rules search: a tied output head (the
    file has none; the token embeddings serve) is the token embeddings' duplicate, and
    named so."""
    tied = name == "output.weight" and infos[name] == infos.get("token_embd.weight")
    return "token_embd.weight" if tied else name


def _overrider(name: str, infos: dict[str, TensorInfo],
               overrides: Sequence[tuple[re.Pattern[str], Backend]]) -> Backend | None:
    """The device of the first override whose regex finds the weight's llama.cpp name."""
    return next((device for regex, device in overrides
                 if regex.search(_llama_cpp_name(name, infos))), None)


def _weight_device(name: str, layers: Sequence[Backend], output: Backend, cpu: Backend,
                   overridden: Backend | None) -> Backend:
    """llama.cpp's device of a weight: the one an override gives it (`overridden`), else
    its layer's, the output layer's, or (the input layer, the token embeddings) the CPU's."""
    if overridden is not None:
        return overridden
    il = 0 if name in LAYER_COPIED else layer_of(name)
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


def _buffer_type_names(devices: Sequence[Device]) -> dict[str, Device]:
    """The devices by the names -ot takes for their buffer types: llama.cpp's (CPU,
    RPC0[HOST:PORT] for a live server's device) and the device names (RPC0, RPC1, ...)."""
    return {n: d for d in devices for n in (d.name, d.buffer_type) if n is not None}


def _overrides(opts: PlanOptions, devices: Sequence[Device],
               used: Sequence[Device]) -> list[tuple[re.Pattern[str], Backend]]:
    """The tensor overrides' compiled regexes and devices, by buffer type name (see
    _buffer_type_names); one the model does not use (--split-mode none's other devices)
    is refused."""
    by_name = _buffer_type_names(used)
    out = []
    for regex, buft in opts.tensor_overrides:
        if buft not in by_name:
            why = ("not used by the model with --split-mode none"
                   if buft in _buffer_type_names(devices) else "unknown buffer type")
            raise ArgumentError(f"-ot {regex}={buft}: {why} (the model's: "
                                f"{', '.join(by_name)})")
        out.append((re.compile(regex), by_name[buft].backend))
    return out


def plan_gguf(path: str, devices: Sequence[Device], options: PlanOptions | None = None,
              *, as_fit_measures: bool = False) -> ModelPlan:
    """The ModelPlan of the GGUF file at `path` on `devices` (models.devices.parse_devices:
    the GPUs then the CPU) with llama.cpp's `options`. `as_fit_measures`: the compute
    buffers as llama.cpp's fit measures them (a load without allocations, whose buffers are
    the prompt graph's sizes from a reserve that resets the scheduler first, forgetting the
    assignments made while building the graph; its nodes and splits are the prompt graph's
    for both graphs), not as a load allocates them."""
    opts = options or PlanOptions()
    opts.check()
    cfg, infos = read_tensor_infos(path)
    cfg = dataclasses.replace(cfg, n_ctx=_pad(opts.n_ctx or cfg.n_ctx))
    _check_cache_rotation(cfg, opts)
    n_ubatch = min(cfg.n_ctx, opts.n_batch, opts.n_ubatch)
    layout = _cache_layout(cfg, opts, n_ubatch)
    n_ctx = layout[0] * layout[2]           # (each sequence's share padded: more, maybe)
    n_seq = opts.n_parallel
    cpu = devices[-1]
    gpus, shares = _model_devices(devices, opts)
    layers, output = split_layers(cfg.n_layer, [d.backend for d in gpus], cpu.backend,
                                  opts.n_gpu_layers, shares)
    used = [*gpus, cpu]
    overrides = _overrides(opts, devices, used)
    overriders = {n: _overrider(n, infos, overrides) for n in infos}
    placed = {n: _weight_device(n, layers, output, cpu.backend, overriders[n]) for n in infos}
    placed = _usable_placement(placed, infos, cfg, cpu.backend)
    copied = [n for n in LAYER_COPIED if n in infos and overriders[n] is None]
    split = _row_split_weights(placed, infos, (n for n in infos if overriders[n] is not None),
                               gpus, opts, shares)
    weights, buffers = _place_weights(infos, used, placed, opts, layers, copied, split)
    cache, kv_buffers = _place_cache(cfg, used, layers if opts.kv_offload else
                                     [cpu.backend] * cfg.n_layer, opts, layout)
    buffers += kv_buffers

    # the compute buffers: sched_reserve's prompt, decode and prompt graphs
    full_offload = (cfg.n_layer + 1 if opts.n_gpu_layers < 0 else opts.n_gpu_layers) > cfg.n_layer
    parallel = (len(gpus) > 1 and full_offload and opts.split_mode == "layer" and
                opts.kv_offload and not opts.tensor_overrides)
    sched = Scheduler([d.backend for d in used], graph_size=graph_size(cfg), parallel=parallel,
                      op_offload=opts.op_offload, copy_all_inputs=True, graph_reuse=False)
    # llama.cpp lays V out for flash attention unless -fa off, and -fa auto turns it on
    # for a quantized V cache, else where every layer's FLASH_ATTN_EXT runs on its device
    v_rows = opts.flash_attn != "off"
    flash_attn = opts.flash_attn == "on" or (opts.flash_attn == "auto" and (
        opts.cache_type_v not in UNQUANTIZED or
        _flash_attn_runs_on_layers(sched, cfg, weights, cache, layers, n_seq)))
    nodes: list[int] = []
    splits: list[tuple[SplitUse, ...]] = []
    # (tokens, outputs): a ubatch of every sequence's tokens alike, a token of each
    prompt = (-(-n_ubatch // n_seq) * n_seq, n_ubatch)
    for n_tokens, n_outputs in (prompt, (n_seq, n_seq), prompt):
        graph = _reserve_graph(cfg, weights, cache, n_tokens, n_outputs, flash_attn, v_rows)
        pin = functools.partial(_pin_as_llama_cpp, sched, graph, layers, cpu.backend,
                                n_tokens < 32 or full_offload, not opts.kv_offload)
        pin()
        if len(splits) < 2:     # (the third graph is the first again)
            # the splits are read from a split of their own: reserve forgets the assignments
            splits.append(_split_uses(sched.split_graph(graph), graph))
            sched.reset()
            pin()
        nodes.append(graph.n_nodes)
        if as_fit_measures:     # its sizes: the prompt graph's, the assignments forgotten
            sched.reset()
            sched.reserve(graph)
            break
        sched.reserve(graph)
    buffers += [BufferUse(d.name, "compute", sched.get_buffer_size(d.backend)) for d in used
                if sched.get_buffer_size(d.backend) > 1]      # (llama.cpp prints those only)
    sched.close()
    buffers.append(BufferUse(cpu.name, "output", 4 * cfg.n_vocab * n_seq))  # a row a sequence
    names = {id(d.backend): d.name for d in devices}
    overridden = {n: names[id(placed[n])] for n in infos if overriders[n] is not None}
    decode = min(1, len(nodes) - 1)     # (a fit trial plans the prompt graph alone)
    return ModelPlan(str(path), cfg, list(devices), [names[id(b)] for b in layers],
                     names[id(output)], n_ctx, n_ubatch, (nodes[0], nodes[decode]),
                     (len(splits[0]), len(splits[decode])), sched.n_copies, buffers, overridden,
                     (splits[0], splits[decode]), flash_attn)


def _model_devices(devices: Sequence[Device],
                   opts: PlanOptions) -> tuple[list[Device], tuple[float, ...] | None]:
    """The devices llama.cpp's model uses besides the CPU (--split-mode none: the main one
    alone; row: all, each of a kind with split buffers, as llama.cpp refuses any other)
    and their shares of the layers (row splits them as layer does): --tensor-split, else
    (or all 0) their memories (equal where none is given)."""
    gpus = [d for d in devices if not d.is_cpu]
    if not gpus:
        return [], None
    shares = opts.tensor_split
    # llama.cpp asks every device for its split buffer type, and stops at the first that
    # has none: only ggml-cuda has them
    unsplit = [d for d in gpus if d.kind != cuda_kind.KIND]
    if opts.split_mode == "row" and unsplit:
        raise ArgumentError(f"--split-mode row: device {unsplit[0].name} does not support "
                            "split buffers (llama.cpp refuses to load the model)")
    if opts.split_mode == "none":
        if opts.main_gpu >= len(gpus):
            raise ArgumentError(f"--main-gpu {opts.main_gpu}: there are {len(gpus)} devices")
        gpus, shares = [gpus[opts.main_gpu]], None
    if shares is not None and len(shares) > len(gpus):
        raise ArgumentError(f"--tensor-split has {len(shares)} shares for {len(gpus)} devices")
    if shares is None or not any(shares):
        return gpus, tuple(d.memory if d.memory is not None else 1 for d in gpus)
    return gpus, tuple(shares) + (0.0,) * (len(gpus) - len(shares))


def _row_split_weights(placed: dict[str, Backend], infos: dict[str, TensorInfo],
                       overridden: Iterable[str], gpus: Sequence[Device], opts: PlanOptions,
                       shares: tuple[float, ...] | None) -> dict[str, BufferType]:
    """--split-mode row: the weights llama.cpp puts in their device's split buffer
    (CUDA<i>_Split, the first of a CUDA device's buffer types), each with that buffer
    type: the matrices read by a MUL_MAT (select_weight_buft probes each weight's op with
    the split buffer: ggml-cuda takes a MUL_MAT of a 2-D split weight, and no other op,
    where the device holds some of its rows), unless -ot placed them. The rows are cut
    by --tensor-split, else (or all 0) by the devices' memories."""
    if opts.split_mode != "row" or shares is None:
        return {}
    given = opts.tensor_split is not None and any(opts.tensor_split)
    points = cuda_kind.split_points(shares, by_memory=not given)
    bufts = {id(d.backend): cuda_kind.CudaSplitBufferType(d.name, i, points)
             for i, d in enumerate(gpus)}
    skip = set(overridden)
    out: dict[str, BufferType] = {}
    for name, device in placed.items():
        info, buft = infos[name], bufts.get(id(device))
        if (buft is not None and name not in skip and _weight_op(name, info) == "MUL_MAT"
                and all(n == 1 for n in info.ne[2:]) and buft.holds_rows(info.type, info.ne)):
            out[name] = buft
    return out


def _place_weights(infos: dict[str, TensorInfo], used: list[Device], placed: dict[str, Backend],
                   opts: PlanOptions, layers: Sequence[Backend] = (),
                   copied: Sequence[str] = (),
                   split: dict[str, BufferType] | None = None
                   ) -> tuple[dict[str, Tensor], list[BufferUse]]:
    """The weight tensors, in a buffer per device (`used`, the CPU last) as `placed` says,
    and those buffers. Beside a device's own buffer (the CPU's, with mmap, is the span of
    the mapped file its weights lie in: CPU_Mapped) are those of its extra buffer types:
    the CPU's CPU_REPACK, of the weights ggml-cpu repacks (unless --no-repack), and a
    CUDA device's split buffer, of the weights `split` names (_row_split_weights). Each
    weight named in `copied` has a copy on every device of `layers` besides its own,
    layer il's being `blk.{il}.NAME` in the weights."""
    ctx = Context("weights")
    homes = {n: list({id(b): b for b in [placed[n], *(layers if n in copied else ())]}.values())
             for n in infos}
    # a tensor of the file per device it is on (a tied head beside the token embeddings
    # is one tensor there, as llama.cpp's duplicate is)
    on: dict[tuple[TensorInfo, int], Tensor] = {}
    for n, info in infos.items():
        for key in ((info, id(b)) for b in homes[n]):
            if key not in on:
                on[key] = ops.new_tensor(ctx, info.type, info.ne, name=n)
    weights = {n: on[infos[n], id(placed[n])] for n in infos}
    weights.update({f"blk.{il}.{n}": on[infos[n], id(b)] for n in copied if n in infos
                    for il, b in enumerate(layers)})
    buffers = []
    split = split or {}
    for d in used:
        mine = {n: on[infos[n], id(d.backend)] for n in infos if (infos[n], id(d.backend)) in on}
        extra = {n: split.get(n) or (cpu_kind.repack_buffer_type(d.backend) if
                                     d.is_cpu and opts.repack and _read_by_mul_mat(n, infos[n])
                                     and cpu_kind.repacks(n, infos[n].type, infos[n].ne)
                                     else None)
                 for n in mine}
        for buft in {id(b): b for b in extra.values() if b is not None}.values():
            bufs = alloc_ctx_tensors_from_buft(_distinct(mine[n] for n in mine
                                                         if extra[n] is buft), buft, "weights")
            buffers.append(BufferUse(d.name, "model", _buffers_bytes(bufs), buft.name))
        mine = {n: t for n, t in mine.items() if extra[n] is None}
        if not mine:
            continue
        own = d.backend.get_default_buffer_type()
        bufs = alloc_ctx_tensors_from_buft(_distinct(mine.values()), own, "weights")
        mapped = d.is_cpu and opts.use_mmap
        size = _mapped_bytes([infos[n] for n in mine]) if mapped else _buffers_bytes(bufs)
        buffers.append(BufferUse(d.name, "model", size, f"{own.name}_Mapped" if mapped
                                 else own.name))
    return weights, buffers


def _distinct(tensors: Iterable[Tensor]) -> list[Tensor]:
    """The tensors, each once (a tied head shares its tensor with the embeddings)."""
    return list({id(t): t for t in tensors}.values())


def _read_by_mul_mat(name: str, info: TensorInfo) -> bool:
    """Whether llama.cpp's graph reads the weight with a MUL_MAT (the matrices, but the
    token embeddings, read by GET_ROWS) or a MUL_MAT_ID (the 3-D expert matrices)."""
    n_dims = max((i + 1 for i, n in enumerate(info.ne) if n > 1), default=1)     # ggml_n_dims
    return (n_dims == 2 and name != "token_embd.weight") or (n_dims == 3 and "_exps" in name)


def _place_cache(cfg: ModelConfig, used: list[Device], layers: Sequence[Backend],
                 opts: PlanOptions,
                 layout: tuple[int, int, int]) -> tuple[_Cache, list[BufferUse]]:
    """llama_kv_cache's K and V of every layer ([n_embd_gqa, cells, streams] each, as
    _cache_layout gives them), each layer's on `layers[il]`: a buffer per device of `used`
    for each cache (the global layers', then the sliding layers' of a model with a
    window)."""
    ctx = Context("kv")
    cache = _Cache(*layout)
    cells = (cache.cells, cache.cells_swa)
    held: dict[tuple[bool, int], list[Tensor]] = {}
    for il in range(cfg.n_layer):
        swa = cfg.is_swa(il)
        for part, t, out in (("k", opts.cache_type_k, cache.k), ("v", opts.cache_type_v, cache.v)):
            out.append(ops.new_tensor(ctx, t, (cfg.n_embd_gqa, cells[swa], cache.n_stream),
                                      name=f"cache_{part}_l{il}"))
            held.setdefault((swa, id(layers[il])), []).append(out[-1])
    buffers = [BufferUse(d.name, "kv", _buffers_bytes(alloc_ctx_tensors_from_buft(
                   held[swa, id(d.backend)], d.backend.get_default_buffer_type(), "any")))
               for swa in (False, True) for d in used if (swa, id(d.backend)) in held]
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
                               cache: _Cache, layers: Sequence[Backend], n_seq: int) -> bool:
    """-fa auto as llama.cpp resolves it (llama_context's resolve_fused_ops): split a graph
    of a token per sequence with flash attention, and keep it only where each layer's
    FLASH_ATTN_EXT runs on the layer's device."""
    graph = _reserve_graph(cfg, weights, cache, n_seq, n_seq, True, True)
    _pin_as_llama_cpp(sched, graph, layers, layers[0], True, False)
    return not flash_attn_off_layers(sched, graph, layers)


def _reserve_graph(cfg: ModelConfig, weights: dict[str, Tensor], cache: _Cache,
                   n_tokens: int, n_outputs: int, flash_attn: bool, v_rows: bool) -> Graph:
    """llama.cpp's graph_reserve graph: `n_tokens` tokens (split evenly between the
    cache's streams), the first `n_outputs` of them outputs, over the whole cache
    (init_full: every cell), with or without flash attention, over a V cache of a row per
    cell (`v_rows`, laid out for flash attention) or transposed."""
    data = step_inputs(cfg, np.zeros(n_tokens, dtype=np.int32), 0, cfg.n_ctx, kv_rows=True)
    data["inp_out_ids"] = np.arange(n_outputs)
    if v_rows:                      # V rows are cells, as K's
        data["inp_v_idxs"] = data["inp_k_idxs"]
    if cfg.iswa:                    # (the sliding layers' values: reserve reads shapes only)
        data["inp_v_idxs_swa"] = data["inp_v_idxs"]
    data["inp_embd"] = np.zeros((n_tokens, cfg.n_embd), dtype=np.float32)
    gc = GraphContext(cfg, weights, cache, n_tokens, 0, cache.cells, n_outputs, data,
                      embd_input=True, flash_attn=flash_attn, v_trans=not v_rows,
                      n_kv_swa=cache.cells_swa,
                      n_stream=cache.n_stream)
    gc.expand(get_builder(cfg.arch)(gc).set_output())
    return gc.graph


__all__ = ["BufferUse", "ModelPlan", "PlanOptions", "SplitUse", "plan_gguf"]
