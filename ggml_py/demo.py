"""The main job: build model graphs and run them through the scheduler on the
backends at hand, with simulated devices where no real one exists.

Each scenario is a what-if plan of a llama-shaped model: where ggml's scheduler
puts every node, where it cuts splits, which tensors it copies between devices
and how long the split takes.
"""

from __future__ import annotations

import statistics

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


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="ggml-py demo", description=__doc__)
    ap.add_argument("--layers", type=int, default=8, help="model depth (default 8)")
    args = ap.parse_args(argv)
    print("ggml_py demo: llama-shaped model planned by the ggml scheduler port")
    print("(simulated GPUs stand in for devices this machine does not have)")
    for title, kw in SCENARIOS:
        run_scenario(title, args.layers, **kw)
    return 0
