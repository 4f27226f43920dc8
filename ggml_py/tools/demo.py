"""The main job: run model graphs through the scheduler on the backends at hand.

Part 1 builds a small llama, the three classic MoE forms and a gemma2 (llama.cpp's graph:
sliding-window layers among global ones, soft-capped scores and logits, post-norms) with
seeded random weights (or loads a GGUF file of an architecture ggml_py builds), offloads their layers to the best device
backend here (an OpenCL device that is not the CPU emulated, else the numpy device;
--device auto says which and why), or spreads them over
ggml RPC servers (--rpc, as llama.cpp does; the CPU always last), and
runs a prompt and greedy decode steps, printing the generated token ids and, per
step, the scheduler's splits, copies, bytes and times -- and why each extra split
exists: the op, its types and the backend that cannot run it.

Part 2 is what-if planning: a deeper llama-shaped graph planned over simulated
GPUs (where ggml's scheduler puts every node, where it cuts splits, which tensors
it copies and how long the split takes). Nothing is computed there.

The prompt and the generated tokens share the model's context: --prompt + --steps
may be at most 64 for the random models, and the file's context_length with --gguf.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ggml_py import backends as backend_registry
from ggml_py.tools import cli
from ggml_py import quants
from ggml_py.models.config import MAX_LAYERS, WEIGHT_TYPES
from ggml_py.models.synthetic import MAX_LAYERS as MAX_PLAN_LAYERS, synthetic_llama
from ggml_py.reasons import split_reasons
from ggml_py.sched import Scheduler
from ggml_py.tools.schedtime import time_split
from ggml_py.tools.splitmap import SplitMap, fmt_bytes

if TYPE_CHECKING:
    from ggml_py._backend import Backend
    from ggml_py.models.config import ModelConfig
    from ggml_py.models.model import Model
    from ggml_py.models.session import StepStats

Out = Callable[[str], None]

RANDOM_N_CTX = 64           # the random models' context (KV cache cells)
DEFAULTS = {"layers": 4, "wtype": "f16", "prompt": 16, "steps": 16, "seed": 0,
            "plan_layers": 8}
MODEL_OPTIONS = ("gguf", "device", "rpc", "gpu_layers", "tensor_split", "layers", "wtype",
                 "prompt", "steps")

SCENARIOS: list[tuple[str, dict[str, Any]]] = [
    ("full offload to one GPU", dict(n_gpus=1)),
    ("GPU without ROPE", dict(n_gpus=1, gpu_unsupported=("ROPE",))),
    ("two GPUs, pipeline parallel", dict(n_gpus=2, parallel=True)),
    ("CPU only", dict(n_gpus=0)),
]

# live output, also through a pipe (`ggml-py demo | tee log`)
say: Out = functools.partial(print, flush=True)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def slug(title: str) -> str:
    """A file name's part from a title: lower case, each run of other characters one
    hyphen ('two GPUs, pipeline parallel' -> 'two-gpus-pipeline-parallel')."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "map"


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _terminal_columns(stream: Any) -> int:
    """The width of the terminal `stream` writes to; 0 where it does not say (a pty that
    nobody sized: `script`, an editor's shell, a container's -t, Python's pty module)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def progress(total: int, desc: str) -> Any:
    """A progress bar on stderr (tqdm; nothing when stderr is not a terminal). It stays
    on screen when the model is done (its passes, time and rate), and it is 80 columns
    wide on a terminal that does not give its size ($COLUMNS and $LINES where set):
    tqdm's own size there is -1 x -1, with which it draws nothing."""
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:         # installed without its dependencies
        return _NoProgress()
    if _terminal_columns(sys.stderr) > 0:
        size: dict[str, Any] = dict(dynamic_ncols=True)
    else:                       # tqdm would read -1 x -1 and draw nothing at all
        size = dict(ncols=_env_size("COLUMNS", 80), nrows=_env_size("LINES", 24))
    return tqdm(total=total, desc=f"   {desc}", unit="pass", leave=True, file=sys.stderr,
                disable=None, **size)


def _env_size(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default


# ---------------------------------------------------------------------------
# part 1: computing models

def device_backends(which: str = "auto", out: Out = say) -> list[Backend]:
    """The device backend to offload to: 'cpu' (none), a computing backend's registry name
    ('opencl', 'numpy_device', ...; its errors propagate: the user asked for it), or
    'auto': the registry's choice (backends.choose_auto: a real OpenCL device when there
    is one, else the numpy device), said in one line with what was skipped and why."""
    if which == "cpu":
        return []
    if which != "auto":
        return [backend_registry.create(which)]
    backend, why = backend_registry.choose_auto()
    out(f"   --device auto: {why}")
    return [] if backend is None else [backend]


def gguf_config(path: str, graph: str | None = None) -> ModelConfig:
    """The config of a GGUF file (graph: ModelConfig.graph), or a UsageError that says
    what is wrong with it."""
    cli.require_module("gguf", "reading a GGUF file", "gguf")
    from ggml_py.models.gguf import GGUFError, read_config
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise cli.UsageError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        return read_config(path, graph=graph)
    except GGUFError as e:
        raise cli.UsageError(str(e)) from None


def demo_models(args: argparse.Namespace) -> Iterator[Model]:
    """The models to run, built one at a time as they are needed."""
    from ggml_py.models.config import arch_config
    from ggml_py.models.config import llama_config, moe_config
    from ggml_py.models.model import Model
    if args.gguf:
        from ggml_py.models.gguf import GGUFError, load_gguf
        n_ctx = args.prompt + args.steps
        try:
            yield load_gguf(args.gguf, n_ctx=-(-n_ctx // 32) * 32)
        except GGUFError as e:
            raise cli.UsageError(str(e)) from None
        return
    kw = dict(n_layer=args.layers, wtype=args.wtype, n_ctx=RANDOM_N_CTX)
    if quants.is_quantized(args.wtype) and quants.BLOCKS[args.wtype][0] > 128:
        # (rows of 256-value blocks: the K-quants and iq4_xs need wider matrices)
        kw.update(n_embd=256, n_ff=512, n_ff_exp=256)
    cfgs = [llama_config(**kw), moe_config("moe_dense", **kw), moe_config("moe_topk", **kw),
            moe_config("moe_shared", **kw),
            # a window the prompt slides past, and a cap the scores reach
            arch_config("gemma2", **kw, n_swa=8, attn_softcap=20.0)]
    for i, c in enumerate(cfgs):
        yield Model.random(c, seed=args.seed + i)


def describe_model(model: Model) -> str:
    """One line: the model's shape, FFN, weight type and size."""
    c = model.config
    ffn = {"dense": f"{'GELU' if c.arch in ('gemma2', 'gemma3') else 'SwiGLU'}-gated FFN {c.n_ff}",
           "moe_dense": f"dense MoE: all {c.n_expert} experts x {c.ff_exp}, softmax gate",
           "moe_topk": f"sparse MoE: top-{c.n_expert_used} of {c.n_expert} experts x {c.ff_exp}",
           "moe_shared": f"shared+routed MoE: {c.n_expert_shared} shared + top-"
                         f"{c.n_expert_used} of {c.n_expert} experts x {c.ff_exp}"}[c.ffn]
    window = (f", a window of {c.n_swa} tokens in {len(c.swa_layers)} of them"
              if c.swa_layers else "")
    return (f"{c.name}: {c.n_layer} layers{window}, n_embd {c.n_embd}, {c.n_head} heads "
            f"({c.n_head_kv} KV), vocab {c.n_vocab}, {ffn}; {c.wtype} weights, "
            f"{model.n_params / 1e6:.2f} M params ({fmt_bytes(model.nbytes)})")


def run_model(model: Model, backends: list[Backend], args: argparse.Namespace,
              out: Out = say) -> dict[str, Any]:
    """Prompt + greedy decode of one model through the scheduler; prints its tables and
    returns a summary row."""
    from ggml_py.models.placement import place_model
    from ggml_py.models.session import Session
    cfg = model.config
    out(f"\n== {describe_model(model)}")
    # llama.cpp's layout for -ngl N / --tensor-split: token embeddings stay on the CPU,
    # the last N layers go to the devices, and the output head too when N exceeds the
    # layer count
    place_model(model, backends, args.gpu_layers, args.tensor_split)
    # the prompt is one batch: the sliding layers' cache (if any) holds it and the window
    sess = Session(model, backends, profile_splits=True, n_ubatch=max(512, args.prompt))
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, cfg.n_vocab, size=args.prompt).tolist()
    bar = progress(2 + max(args.steps - 1, 0), cfg.name)
    try:
        # an untimed pass first: numpy/BLAS start-up and the scheduler's first
        # reservation would otherwise land in the prompt's time
        sess.forward(prompt[:1], logits="last")
        sess.reset()
        bar.update(1)
        seen: dict[str, Any] = {}

        def on_step(i: int) -> None:
            bar.update(1)
            if i == 0:          # the prompt's splits, while they are the scheduler's
                seen["n_splits"] = len(sess.sched.splits)
                seen["reasons"] = split_reasons(sess.sched, sess.graph) if sess.graph else []
                seen["map"] = SplitMap.from_scheduler(
                    sess.sched, f"{cfg.name}, prompt of {args.prompt} tokens",
                    [sp.copy_s + sp.compute_s for sp in sess.history[-1].splits],
                    graph=sess.graph)
        t0 = time.perf_counter()
        new = sess.generate(prompt, args.steps, on_step)
        wall = time.perf_counter() - t0
    finally:
        bar.close()

    out(f"   prompt   {prompt}")
    out(f"   greedy   {new}")
    hist = sess.history
    p, d = hist[0], hist[1:]
    out(f"   {'step':<8} {'tokens':>6} {'nodes':>6} {'splits':>6} {'copies':>6} "
        f"{'copied':>10} {'alloc ms':>9} {'compute ms':>11} {'tok/s':>8}")

    def row(label: str, steps: list[StepStats]) -> None:
        n_tok = sum(s.n_tokens for s in steps)
        comp = sum(s.compute_s for s in steps)
        s0 = steps[0]
        out(f"   {label:<8} {n_tok:>6} {s0.n_nodes:>6} {s0.n_splits:>6} "
            f"{statistics.median(s.n_inputs for s in steps):>6.0f} "
            f"{fmt_bytes(statistics.median(s.copy_bytes for s in steps)):>10} "
            f"{_ms(statistics.median(s.alloc_s for s in steps)):>9} "
            f"{_ms(statistics.median(s.compute_s for s in steps)):>11} "
            f"{n_tok / comp if comp else 0:>8.0f}")
    row("prompt", [p])
    if d:
        row("decode", d)
    out("   (decode row: medians per step; copies = split inputs copied between backends)")
    if d:
        kept = sum(s.graph_reused and s.plan_reused for s in d)
        out(f"   decode graph kept in {kept} of {len(d)} steps (no build, split or allocation)")
    _split_table(p, out)
    _why_splits(seen["reasons"], seen["n_splits"], out)
    if args.maps:
        path = os.path.join(args.maps, f"{slug(cfg.name)}.png")
        from ggml_py.tools import splitmap
        splitmap.save(seen["map"], path)
        out(f"   split map: {path}")
    return dict(name=cfg.name, nodes=p.n_nodes, splits=p.n_splits, copy_bytes=p.copy_bytes,
                prompt_s=p.compute_s, decode_s=statistics.median(s.compute_s for s in d) if d
                else 0.0, wall=wall, tokens=new)


def _split_table(step: StepStats, out: Out, limit: int = 12) -> None:
    out(f"   prompt splits: {'#':>3} {'backend':<10} {'nodes':>5} {'inputs':>6} {'copied':>10}"
        f" {'copy ms':>8} {'compute ms':>10}")
    for k, sp in enumerate(step.splits[:limit]):
        out(f"                  {k:>3} {sp.backend:<10} {sp.n_nodes:>5} {sp.n_inputs:>6} "
            f"{fmt_bytes(sp.bytes_copied):>10} {_ms(sp.copy_s):>8} {_ms(sp.compute_s):>10}")
    if len(step.splits) > limit:
        rest = step.splits[limit:]
        out(f"                  ... {len(rest)} more splits on "
            f"{', '.join(sorted({sp.backend for sp in rest}))}")


def _why_splits(reasons: list[Any], n_splits: int, out: Out, limit: int = 8) -> None:
    """Why the splits after the first exist, grouped: 'N x REASON (splits a, b, ...)'."""
    if not reasons:
        return
    groups: dict[str, list[int]] = {}
    for r in reasons:
        groups.setdefault(r.text() + f" [{r.cause}]" if r.cause else r.text(), []).append(r.split)
    out(f"   why {n_splits} splits: split 0 starts the graph; then")
    for text, ks in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))[:limit]:
        at = ", ".join(map(str, ks[:6])) + (", ..." if len(ks) > 6 else "")
        out(f"     {len(ks):>3} x {text} (split{'s' if len(ks) > 1 else ''} {at})")
    if len(groups) > limit:
        out(f"     ... and {len(groups) - limit} more reasons (`ggml-py plan --explain` "
            "lists every node)")


def model_backends(args: argparse.Namespace, out: Out = say,
                   n_threads: int | None = None) -> list[Backend]:
    """The backends a model runs on, in priority order: the devices of the --rpc servers
    or the --device backend, then the CPU (n_threads: its threads, default all cores);
    says which in one line."""
    from ggml_py.backends.cpu.backend import CPUBackend
    if args.rpc:
        from ggml_py.backends.rpc import rpc_backends
        devices: list[Backend] = list(rpc_backends(args.rpc))
    else:
        devices = device_backends(args.device, out)
    if args.tensor_split and len(args.tensor_split) != len(devices):
        raise cli.UsageError(f"--tensor-split gives {len(args.tensor_split)} shares for "
                             f"{len(devices)} device(s): {', '.join(d.name for d in devices)}")
    backends = devices + [CPUBackend(n_threads=n_threads)]
    out(f"   backends (priority order): {', '.join(b.name for b in backends)}")
    return backends


def run_models(args: argparse.Namespace, out: Out = say) -> list[dict[str, Any]]:
    out("== part 1: models computed through the scheduler")
    backends = model_backends(args, out)
    rows = [run_model(model, backends, args, out) for model in demo_models(args)]
    out(f"\n   {'model':<12} {'nodes':>6} {'splits':>6} {'copied':>10} {'prompt ms':>10} "
        f"{'decode ms':>10} {'wall s':>7}")
    for r in rows:
        out(f"   {r['name']:<12} {r['nodes']:>6} {r['splits']:>6} {fmt_bytes(r['copy_bytes']):>10} "
            f"{_ms(r['prompt_s']):>10} {_ms(r['decode_s']):>10} {r['wall']:>7.2f}")
    return rows


# ---------------------------------------------------------------------------
# part 2: what-if planning over simulated GPUs

def run_scenario(title: str, n_layers: int, n_gpus: int = 1,
                 gpu_unsupported: tuple[str, ...] = (), parallel: bool = False,
                 out: Out = say, maps: str | None = None) -> Scheduler:
    backends, graph, _keep = synthetic_llama(n_layers, n_gpus=max(n_gpus, 0),
                                             gpu_unsupported=gpu_unsupported,
                                             offload=n_gpus > 0)
    sched = Scheduler(backends, graph_size=2 * (graph.n_nodes + graph.n_leafs), parallel=parallel)
    times = time_split(sched, graph, 200)
    sched.reset()       # like ggml, a split keeps the last split's copies until a reset
    sched.split_graph(graph)
    out(f"\n== {title}: {graph.n_nodes} nodes, {graph.n_leafs} leafs on "
        f"{', '.join(b.name for b in backends)}")
    out(f"   {sched.n_splits} split{'s' if sched.n_splits != 1 else ''}, "
        f"{sched.n_copies} copy slot{'s' if sched.n_copies != 1 else ''}, "
        f"split time {statistics.median(times):.1f} us (median of {len(times)})")
    out(f"   {'split':>5}  {'backend':<8} {'nodes':>11}  {'inputs':>6}  {'copied':>10}  first inputs")
    shown = 0
    total = 0
    for k, s in enumerate(sched.splits):
        nbytes = sum(t.nbytes for t in s.inputs)
        total += nbytes
        if shown < 12:
            names = ", ".join(t.name for t in s.inputs[:3]) + (" ..." if len(s.inputs) > 3 else "")
            out(f"   {k:>5}  {s.backend.name:<8} {s.i_start:>5}..{s.i_end - 1:<5}  "
                f"{len(s.inputs):>6}  {fmt_bytes(nbytes):>10}  {names}")
            shown += 1
    if sched.n_splits > shown:
        out(f"   ... {sched.n_splits - shown} more splits")
    out(f"   bytes copied between backends per evaluation: {fmt_bytes(total)}")
    _why_splits(split_reasons(sched, graph), sched.n_splits, out)
    if maps:
        from ggml_py.tools import splitmap
        path = os.path.join(maps, f"whatif-{slug(title)}.png")
        splitmap.save(SplitMap.from_scheduler(sched, f"{title}, {n_layers} layers",
                                              graph=graph), path)
        out(f"   split map: {path}")
    return sched


def run_whatif(n_layers: int, out: Out = say, maps: str | None = None) -> None:
    out(f"\n== part 2: what-if plans of a {n_layers}-layer llama-shaped graph over simulated GPUs")
    for title, kw in SCENARIOS:
        run_scenario(title, n_layers, **kw, out=out, maps=maps)


# ---------------------------------------------------------------------------
# the command line: `ggml-py demo`

def add_placement_arguments(p: argparse.ArgumentParser, default_device: str = "auto") -> None:
    """--device, --rpc, --tensor-split and --gpu-layers (-ngl): where a model's layers go,
    as llama.cpp's options say it (check_placement checks them together)."""
    devices = ["auto", *backend_registry.available(computes=True)]
    p.add_argument("--device", choices=devices, metavar="NAME",
                   help=f"where the layers go: {', '.join(devices)} (default "
                        f"{default_device}); auto: the first of "
                        + ", ".join(backend_registry.auto_order())
                        + " that works here, an OpenCL device only when it is not the CPU "
                        "emulated (PoCL's pthread device); cpu: no offload; rpc: needs --rpc")
    p.add_argument("--rpc", type=cli.endpoints, metavar="HOST:PORT[,HOST:PORT...]",
                   help="spread the layers over these ggml RPC servers (every device of "
                        "each, in order; llama.cpp's --rpc) instead of --device; start one "
                        "with `python -m ggml_py.rpc_server`")
    p.add_argument("--tensor-split", type=cli.shares, metavar="A,B,...",
                   help="shares of the offloaded layers per device, in order (llama.cpp's "
                        "--tensor-split; default: each device's free memory where it says, "
                        "else equal)")
    p.add_argument("-ngl", "--gpu-layers", type=cli.count(0), metavar="N",
                   help="offload the last N of the layers and the output head, the head "
                        "counting as the last (llama.cpp's -ngl; default: everything)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("--gguf", metavar="PATH", type=cli.input_file(),
                   help="run this GGUF file (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, "
                        "phi3) instead of the random models (needs the gguf package: pip "
                        "install \"ggml-py-sched[gguf]\")")
    add_placement_arguments(p)
    p.add_argument("--layers", type=cli.count(1, MAX_LAYERS), metavar="N",
                   help=f"layers of the random models (default {d['layers']})")
    p.add_argument("--wtype", choices=WEIGHT_TYPES, metavar="TYPE",
                   help=f"weight type of the random models: {', '.join(WEIGHT_TYPES)} (default "
                        f"{d['wtype']}; 256-value block types make the models 256 wide)")
    p.add_argument("--prompt", type=cli.count(1), metavar="N",
                   help=f"prompt tokens (default {d['prompt']}); --prompt + --steps must fit "
                        f"the context: {RANDOM_N_CTX} for the random models, the file's "
                        "context_length with --gguf")
    p.add_argument("--steps", type=cli.count(0), metavar="N",
                   help=f"greedy decode steps (default {d['steps']})")
    p.add_argument("--seed", type=cli.count(0), metavar="N",
                   help=f"seed of the random weights and the prompt (default {d['seed']})")
    p.add_argument("--plan-layers", type=cli.count(1, MAX_PLAN_LAYERS), metavar="N",
                   help=f"depth of the what-if planning graphs (default {d['plan_layers']})")
    p.add_argument("--maps", metavar="DIR", type=cli.output_folder,
                   help="write a split map per model and per what-if plan into DIR, as PNG "
                        "(needs matplotlib: pip install \"ggml-py-sched[plot]\")")
    p.add_argument("--no-plan", action="store_true", help="skip the what-if planning part")
    p.add_argument("--no-models", action="store_true", help="skip the computed models")
    p.set_defaults(func=run)


def check_placement(args: argparse.Namespace, given: set[str]) -> None:
    """The placement options (--device, --rpc, --gpu-layers, --tensor-split) agree with
    each other; `given`: the options the user gave."""
    if args.device == "rpc" and not args.rpc:
        raise cli.UsageError("--device rpc needs the servers' addresses: --rpc "
                             "HOST:PORT[,HOST:PORT...] (then --device may be left out)")
    if args.rpc and "device" in given and args.device != "rpc":
        raise cli.UsageError("--rpc and --device both say where the layers go: give one")
    if args.device not in (None, "auto", "cpu", "rpc") and backend_registry.needs(args.device):
        raise cli.UsageError(f"--device {args.device} needs "
                             f"{backend_registry.needs(args.device)}, which the command line "
                             "cannot give")
    if args.device == "cpu" and given & {"gpu_layers", "tensor_split"}:
        raise cli.UsageError(f"{', '.join(_option(k) for k in sorted(given & {'gpu_layers', 'tensor_split'}))}"
                             " would be ignored with --device cpu (no offload)")
    if args.tensor_split and not args.rpc and len(args.tensor_split) != 1:
        raise cli.UsageError(f"--tensor-split gives {len(args.tensor_split)} shares for "
                             f"1 device (--device); several devices come with --rpc")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse options that would be ignored and limits that would be crossed, before
    anything runs; then fill in the defaults."""
    given = {k for k in (*MODEL_OPTIONS, "plan_layers") if getattr(args, k) is not None}
    if args.no_models and args.no_plan:
        raise cli.UsageError("--no-models and --no-plan leave nothing to do")
    if args.no_models and given & set(MODEL_OPTIONS):
        raise cli.UsageError(f"{', '.join(_option(k) for k in sorted(given & set(MODEL_OPTIONS)))}"
                             " would be ignored with --no-models")
    if args.no_plan and "plan_layers" in given:
        raise cli.UsageError("--plan-layers would be ignored with --no-plan")
    if args.gguf and given & {"layers", "wtype"}:
        raise cli.UsageError(f"{', '.join(_option(k) for k in sorted(given & {'layers', 'wtype'}))}"
                             " apply to the random models; a GGUF file brings its own")
    check_placement(args, given)
    for k, v in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.device = args.device or "auto"
    if args.maps:
        cli.require_module("matplotlib", "--maps", "plot")
        os.makedirs(args.maps, exist_ok=True)
    if args.no_models:
        return
    n_ctx = gguf_config(args.gguf).n_ctx if args.gguf else RANDOM_N_CTX
    if args.prompt + args.steps > n_ctx:
        where = f"{args.gguf}'s context_length" if args.gguf else "the random models' context"
        raise cli.UsageError(f"--prompt {args.prompt} + --steps {args.steps} = "
                             f"{args.prompt + args.steps} tokens exceed {where} ({n_ctx})")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    t0 = time.perf_counter()
    say("ggml_py demo: llama-style models through a port of ggml's backend scheduler")
    if not args.no_models:
        run_models(args)
    if not args.no_plan:
        run_whatif(args.plan_layers, maps=args.maps)
    say(f"\ndone in {time.perf_counter() - t0:.1f} s")
    return 0
