"""The main job: run model graphs through the scheduler on the backends at hand.

Part 1 builds a small llama and the three classic MoE forms with seeded random
weights (or loads a GGUF file), offloads their layers to the best device backend
here (OpenCL when present, else the numpy device; the CPU always last) and runs a
prompt and greedy decode steps, printing the generated token ids and, per step,
the scheduler's splits, copies, bytes and times.

Part 2 is what-if planning: a deeper llama-shaped graph planned over simulated
GPUs (where ggml's scheduler puts every node, where it cuts splits, which tensors
it copies and how long the split takes). Nothing is computed there.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from ggml_py.models.synthetic import synthetic_llama
from ggml_py.sched import Scheduler

SCENARIOS = [
    ("full offload to one GPU", dict(n_gpus=1)),
    ("GPU without ROPE", dict(n_gpus=1, gpu_unsupported=("ROPE",))),
    ("two GPUs, pipeline parallel", dict(n_gpus=2, parallel=True)),
    ("CPU only", dict(n_gpus=0)),
]


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


class Progress:
    """A one-line progress bar on a terminal (nothing when output is redirected)."""

    def __init__(self, total: int, label: str, stream=None, width: int = 28):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def update(self, done: int):
        if not self.enabled:
            return
        fill = self.width * done // self.total
        self.stream.write(f"\r  {self.label:<12} [{'#' * fill}{'.' * (self.width - fill)}] "
                          f"{done}/{self.total} {time.perf_counter() - self.t0:5.1f}s")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\r" + " " * (self.width + 40) + "\r")
            self.stream.flush()


# ---------------------------------------------------------------------------
# part 1: computing models

DEVICES = {"opencl": ("ggml_py.backends.opencl", "OpenCLBackend"),
           "numpy": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend")}


def device_backends(which="auto", out=print):
    """The device backend to offload to: 'auto' (OpenCL when it works here, else the
    numpy device), 'opencl', 'numpy' or 'cpu' (none). Each import is guarded: a backend
    that is not built or finds no device is left out with a note."""
    names = {"auto": ("opencl", "numpy"), "cpu": ()}.get(which, (which,))
    for name in names:
        module, cls = DEVICES[name]
        try:
            mod = __import__(module, fromlist=[cls])
            return [getattr(mod, cls)()]
        except ImportError:
            if which != "auto":
                out(f"  ({cls} is not in this build)")
        except Exception as e:      # e.g. the OpenCL library is there but no device
            out(f"  ({cls} unavailable: {e})")
    return []


def demo_models(args):
    from ggml_py.models.transformer import llama_config, moe_config, Model
    if args.gguf:
        from ggml_py.models.gguf import load_gguf
        n_ctx = args.prompt + args.steps
        return [load_gguf(args.gguf, n_ctx=-(-n_ctx // 32) * 32)]
    kw = dict(n_layer=args.layers, wtype=args.wtype)
    cfgs = [llama_config(**kw), moe_config("moe_dense", **kw), moe_config("moe_topk", **kw),
            moe_config("moe_shared", **kw)]
    return [Model.random(c, seed=args.seed + i) for i, c in enumerate(cfgs)]


def _describe(model):
    c = model.config
    ffn = {"dense": f"SwiGLU FFN {c.n_ff}",
           "moe_dense": f"dense MoE: all {c.n_expert} experts x {c.ff_exp}, softmax gate",
           "moe_topk": f"sparse MoE: top-{c.n_expert_used} of {c.n_expert} experts x {c.ff_exp}",
           "moe_shared": f"shared+routed MoE: {c.n_expert_shared} shared + top-"
                         f"{c.n_expert_used} of {c.n_expert} experts x {c.ff_exp}"}[c.ffn]
    return (f"{c.name}: {c.n_layer} layers, n_embd {c.n_embd}, {c.n_head} heads "
            f"({c.n_head_kv} KV), vocab {c.n_vocab}, {ffn}; {c.wtype} weights, "
            f"{model.n_params / 1e6:.2f} M params ({_fmt_bytes(model.nbytes)})")


def run_model(model, backends, args, out=print):
    """Prompt + greedy decode of one model through the scheduler; prints its tables and
    returns a summary row."""
    from ggml_py.models.transformer import Session
    cfg = model.config
    devices, cpu = backends[:-1], backends[-1]
    # llama.cpp's layout for -ngl N: token embeddings stay on the CPU, the last N layers
    # go to the device, and the output head too when N exceeds the layer count
    ngl = cfg.n_layer + 1 if args.gpu_layers is None else max(args.gpu_layers, 0)
    dev = devices[0] if devices else cpu
    n_dev = min(ngl, cfg.n_layer)
    layers = [cpu] * (cfg.n_layer - n_dev) + [dev] * n_dev
    model.place(layers, host=cpu, output_backend=dev if ngl > cfg.n_layer else cpu)
    sess = Session(model, backends, profile_splits=True)
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, cfg.n_vocab, size=args.prompt).tolist()
    # an untimed pass first: numpy/BLAS start-up and the scheduler's first reservation
    # would otherwise land in the prompt's time
    sess.forward(prompt[:1], logits="last")
    sess.reset()
    bar = Progress(1 + args.steps, cfg.name)
    t0 = time.perf_counter()
    logits = sess.forward(prompt, logits="last")
    new = []
    for i in range(args.steps):
        bar.update(i + 1)
        tok = int(np.argmax(logits[-1]))
        new.append(tok)
        if i + 1 < args.steps:
            logits = sess.forward([tok], logits="last")
    bar.update(1 + args.steps)
    bar.close()
    wall = time.perf_counter() - t0

    out(f"\n== {_describe(model)}")
    out(f"   prompt   {prompt}")
    out(f"   greedy   {new}")
    hist = sess.history
    p, d = hist[0], hist[1:]
    out(f"   {'step':<8} {'tokens':>6} {'nodes':>6} {'splits':>6} {'copies':>6} "
        f"{'copied':>10} {'alloc ms':>9} {'compute ms':>11} {'tok/s':>8}")

    def row(label, steps):
        n_tok = sum(s.n_tokens for s in steps)
        comp = sum(s.compute_s for s in steps)
        s0 = steps[0]
        out(f"   {label:<8} {n_tok:>6} {s0.n_nodes:>6} {s0.n_splits:>6} "
            f"{statistics.median(s.n_inputs for s in steps):>6.0f} "
            f"{_fmt_bytes(statistics.median(s.copy_bytes for s in steps)):>10} "
            f"{_ms(statistics.median(s.alloc_s for s in steps)):>9} "
            f"{_ms(statistics.median(s.compute_s for s in steps)):>11} "
            f"{n_tok / comp if comp else 0:>8.0f}")
    row("prompt", [p])
    if d:
        row("decode", d)
    out("   (decode row: medians per step; copies = split inputs copied between backends)")
    _split_table(p, out)
    return dict(name=cfg.name, nodes=p.n_nodes, splits=p.n_splits, copy_bytes=p.copy_bytes,
                prompt_s=p.compute_s, decode_s=statistics.median(s.compute_s for s in d) if d
                else 0.0, wall=wall, tokens=new)


def _split_table(step, out, limit=12):
    out(f"   prompt splits: {'#':>3} {'backend':<10} {'nodes':>5} {'inputs':>6} {'copied':>10}"
        f" {'copy ms':>8} {'compute ms':>10}")
    for k, sp in enumerate(step.splits[:limit]):
        out(f"                  {k:>3} {sp.backend:<10} {sp.n_nodes:>5} {sp.n_inputs:>6} "
            f"{_fmt_bytes(sp.bytes_copied):>10} {_ms(sp.copy_s):>8} {_ms(sp.compute_s):>10}")
    if len(step.splits) > limit:
        rest = step.splits[limit:]
        out(f"                  ... {len(rest)} more splits on "
            f"{', '.join(sorted({sp.backend for sp in rest}))}")


def run_models(args, out=print):
    from ggml_py.backends.cpu import CPUBackend
    out("== part 1: models computed through the scheduler")
    devices = device_backends(args.device, out)
    backends = devices + [CPUBackend()]
    out(f"   backends (priority order): {', '.join(b.name for b in backends)}")
    rows = []
    for model in demo_models(args):
        rows.append(run_model(model, backends, args, out))
    out(f"\n   {'model':<12} {'nodes':>6} {'splits':>6} {'copied':>10} {'prompt ms':>10} "
        f"{'decode ms':>10} {'wall s':>7}")
    for r in rows:
        out(f"   {r['name']:<12} {r['nodes']:>6} {r['splits']:>6} {_fmt_bytes(r['copy_bytes']):>10} "
            f"{_ms(r['prompt_s']):>10} {_ms(r['decode_s']):>10} {r['wall']:>7.2f}")
    return rows


# ---------------------------------------------------------------------------
# part 2: what-if planning over simulated GPUs

def run_scenario(title, n_layers, n_gpus=1, gpu_unsupported=(), parallel=False, out=print):
    backends, graph, _keep = synthetic_llama(n_layers, n_gpus=max(n_gpus, 0),
                                             gpu_unsupported=gpu_unsupported,
                                             offload=n_gpus > 0)
    sched = Scheduler(backends, graph_size=2 * (graph.n_nodes + graph.n_leafs), parallel=parallel)
    times = sched.time_split(graph, 200)
    sched.reset()       # like ggml, a split keeps the last split's copies until a reset
    sched.split_graph(graph)
    out(f"\n== {title}: {graph.n_nodes} nodes, {graph.n_leafs} leafs on "
        f"{', '.join(b.name for b in backends)}")
    out(f"   {sched.n_splits} splits, {sched.n_copies} copy slot(s), "
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
                f"{len(s.inputs):>6}  {_fmt_bytes(nbytes):>10}  {names}")
            shown += 1
    if sched.n_splits > shown:
        out(f"   ... {sched.n_splits - shown} more splits")
    out(f"   bytes copied between backends per evaluation: {_fmt_bytes(total)}")
    return sched


def run_whatif(n_layers, out=print):
    out(f"\n== part 2: what-if plans of a {n_layers}-layer llama-shaped graph over simulated GPUs")
    for title, kw in SCENARIOS:
        run_scenario(title, n_layers, **kw, out=out)


def build_parser():
    import argparse
    ap = argparse.ArgumentParser(prog="ggml-py demo", description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", metavar="PATH", help="run this llama GGUF file instead of the "
                    "random models (needs the gguf package)")
    ap.add_argument("--device", default="auto", choices=("auto", "opencl", "numpy", "cpu"),
                    help="where the layers go: auto (OpenCL if present, else the numpy "
                    "device), opencl, numpy, or cpu (no offload)")
    ap.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                    help="offload the last N layers, and the output head when N exceeds "
                    "the layer count (llama.cpp's -ngl; default: everything)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the random models (4)")
    ap.add_argument("--wtype", default="f16", choices=("f32", "f16", "q8_0", "q4_0"),
                    help="weight type of the random models (f16)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (16)")
    ap.add_argument("--steps", type=int, default=16, help="greedy decode steps (16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan-layers", type=int, default=8,
                    help="depth of the what-if planning graphs (8)")
    ap.add_argument("--no-plan", action="store_true", help="skip the what-if planning part")
    ap.add_argument("--no-models", action="store_true", help="skip the computed models")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.prompt < 1 or args.steps < 0:
        raise SystemExit("demo: --prompt must be >= 1 and --steps >= 0")
    t0 = time.perf_counter()
    print("ggml_py demo: llama-style models through a port of ggml's backend scheduler")
    if not args.no_models:
        run_models(args)
    if not args.no_plan:
        run_whatif(args.plan_layers)
    print(f"\ndone in {time.perf_counter() - t0:.1f} s")
    return 0
