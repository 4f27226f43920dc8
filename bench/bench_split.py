"""Split-time benchmark: every shared case against ggml's recorded time, and
synthetic llama graphs from 1k to 100k nodes (µs per node, linear scaling), with
split + reserve + alloc and graph reuse beside: the same Graph allocated again (level
1) and a rebuilt graph of equal structure (level 2, per node and against ggml's split).
Beside the split's cost per node, its memory floor: the time of a bare sweep that reads
only what any split must read of the graph (ggml_py.tools.schedtime.time_struct_sweep).

    python bench/bench_split.py [--cases DIR] [--random] [--sizes 1000,10000,40000,100000] [--json]

ggml's figures beside the synthetic sizes are measured in the same run, alternating, by
ggml 0.10.1's own scheduler (bench/ggml_sched_ref.py) where its libraries are installed;
without them, issue 11's recorded per-node figures are shown instead, marked so.

Medians of wall time, measured as SCHED_CASES.md says ggml was measured
(graph restored, scheduler reset and assignments re-applied before each split,
untimed). This machine has 2 noisy cores: read ratios, not absolute numbers.

Every figure is a time (µs, or µs per node): lower is better; a ratio is ggml_py's time
over ggml's, below 1 where ggml_py is faster. The columns:
  split    split_graph (the scheduler's passes);
  reuse    alloc_graph of the same Graph again: graph reuse level 1, the plan kept
           after checking that nothing changed (no split);
  rebuilt  alloc_graph of a rebuilt graph of equal structure (new tensors, as a model's
           next decode step builds): graph reuse level 2, the plan taken over by
           fingerprint, compared with ggml's split, which ggml does again there.
The shared cases' ggml figures are not measured here: they are the `timing` block of
each case's plan file (*.plan.json), recorded by ggml 0.10.1 on the machine that wrote
the case, another machine; a case without a plan file is timed alone, with a warning.
The synthetic sizes' ggml figures are measured in this run, as said above.

--json prints one JSON object per line, each with the machine inside it ("machine").
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

from ggml_py.models.synthetic import synthetic_llama_builder
from ggml_py.sched import Scheduler
from ggml_py.tools.machine import announce, with_machine
from ggml_py.tools.schedtime import (time_alloc, time_rebuilt_reuse, time_split, time_reuse,
                                     time_struct_sweep)

HERE = os.path.dirname(os.path.abspath(__file__))
# ggml's reference cases (tests/data); GGML_PY_SHARED points at another copy
DEFAULT_CASES = os.environ.get("GGML_PY_SHARED", os.path.join(HERE, "..", "tests", "data"))


MACHINE = None          # describe() of this machine, inside each JSON line (main sets it)


def emit(row):
    """One JSON line: the row with the machine inside it."""
    print(with_machine(row, MACHINE or {}), flush=True)


def time_splits(sched, graph, min_time_s=0.5, min_reps=20):
    samples = []
    while len(samples) < min_reps or sum(samples) < min_time_s * 1e6:
        samples += time_split(sched, graph, max(min_reps, 5))
    return statistics.median(samples), len(samples)


def bench_cases(cases_dir, include_random, as_json):
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import median_split_us
    paths = sorted(glob.glob(os.path.join(cases_dir, "cases", "*.case.json")))
    if include_random:
        paths += sorted(glob.glob(os.path.join(cases_dir, "cases", "random", "*.case.json")))
    ratios = []
    if paths and not as_json:
        print("split_graph, median µs (lower is better); ggml: the plan file's time, recorded "
              "on the machine that wrote the case; ratio = ours / ggml's")
    for path in paths:
        case = load_case(path)
        ref = plan_timing(path)
        us, reps = median_split_us(case, 0.1 if case.name.startswith("rand-") else 0.5)
        ggml_us = ref.get("split_us_median")
        ratio = us / ggml_us if ggml_us else None
        if ratio is not None:
            ratios.append(ratio)
        row = {"case": case.name, "n_nodes": case.graph.n_nodes, "split_us_median": round(us, 3),
               "ggml_split_us": ggml_us, "ggml_source": "plan file" if ggml_us else None,
               "split_ratio": None if ratio is None else round(ratio, 3), "reps": reps}
        if as_json:
            emit(row)
        else:
            vs = (f"ggml {ggml_us:9.2f} us  {ratio:5.2f}x" if ratio is not None
                  else "ggml -  (no plan file)")
            print(f"{case.name:<36} {case.graph.n_nodes:>6} nodes {us:9.2f} us  {vs}",
                  flush=True)
    if ratios and not as_json:
        print(f"median ratio over {len(ratios)} cases: {statistics.median(ratios):.2f}x, "
              f"worst {max(ratios):.2f}x")


def plan_timing(case_path):
    """The `timing` block of the plan file beside a case file; {} with a warning on
    stderr when there is none (the case is then timed without ggml's figure)."""
    plan_path = case_path[:-len(".case.json")] + ".plan.json"
    try:
        with open(plan_path) as f:
            timing = json.load(f).get("timing")
    except (OSError, ValueError, AttributeError) as e:
        print(f"warning: {plan_path}: no plan file to compare with "
              f"({getattr(e, 'strerror', None) or e}); {os.path.basename(case_path)} is timed "
              "without ggml's figure", file=sys.stderr)
        return {}
    return timing if isinstance(timing, dict) else {}


# issue 11: ggml's split, µs per node, on synthetic llama full-offload graphs (used where
# ggml itself cannot be run here)
GGML_SPLIT_US_PER_NODE = {1030: 0.048, 10246: 0.054, 40966: 0.129}


def _issue_per_node(n_nodes):
    """The issue's ggml figure for the size nearest n_nodes (within 10 %), or None."""
    near = min(GGML_SPLIT_US_PER_NODE, key=lambda n: abs(n - n_nodes))
    return GGML_SPLIT_US_PER_NODE[near] if abs(near - n_nodes) <= 0.1 * near else None


def _paired(ours, theirs, rounds):
    """Medians of ours() and theirs() sample lists gathered alternately, round by round
    (a noisy machine slows both alike)."""
    a, b = [], []
    for _ in range(rounds):
        a += ours()
        b += theirs()
    return statistics.median(a), statistics.median(b)


def _ggml_server():
    """A ggml RPC server on 127.0.0.1 for ggml's own scheduler, or None (no ggml)."""
    try:
        from ggml_py.rpc_server import start_server
        return start_server()
    except Exception as e:          # no ggml libraries: the issue's figures instead
        print(f"ggml's scheduler not run ({e}); ggml columns are issue 11's figures",
              file=sys.stderr)
        return None


def bench_scaling(sizes, as_json, with_ggml=True):
    server = _ggml_server() if with_ggml else None
    try:
        for n_nodes in sizes:
            _bench_size(n_nodes, as_json, server)
    finally:
        if server is not None:
            server.stop()


def _bench_size(n_nodes, as_json, server):
    n_layers = max(1, n_nodes // 31)
    backends, build, keep = synthetic_llama_builder(n_layers)
    graph = build()
    # ggml sizes hash sets at twice the tensors (ggml_graph_nbytes); a full set probes long
    sched = Scheduler(backends, graph_size=2 * (graph.n_nodes + graph.n_leafs))
    _bench_graph(f"synthetic-llama-{n_layers}L", sched, graph, lambda: (build(), []), [], {},
                 as_json, server)


def bench_case_files(paths, as_json, with_ggml=True):
    """Case files (any size: bench/scale_case.py makes large ones) beside ggml's own
    scheduler on the same graph, measured in this run."""
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import scheduler_for_case
    server = _ggml_server() if with_ggml else None
    try:
        for path in paths:
            case = load_case(path)
            sched = scheduler_for_case(case)
            def rebuild(case=case):
                again = case.rebuilt()
                return again.graph, again.assignments
            _bench_graph(case.name, sched, case.graph, rebuild,
                         case.assignments, dict(parallel=case.parallel, op_offload=case.op_offload,
                              graph_size=case.graph_size),
                         as_json, server)
    finally:
        if server is not None:
            server.stop()


def sweep_graph_size(n_nodes, factors, as_json):
    """One graph, schedulers of graph_size factor x (nodes + leafs): the split's cost per
    node and the hash set's probes per lookup (counted) at each size."""
    backends, build, keep = synthetic_llama_builder(max(1, n_nodes // 31))
    graph = build()
    n = graph.n_nodes + graph.n_leafs
    for f in factors:
        sched = Scheduler(backends, graph_size=int(f * n))
        us = statistics.median(time_split(sched, graph, 15))
        st = sched.hash_stats()
        row = {"n_nodes": graph.n_nodes, "graph_size": int(f * n), "hash_size": st["size"],
               "load": round(st["load"], 3), "split_us_per_node": round(us / graph.n_nodes, 4),
               "hit_probes": round(st["hit_probes_mean"], 3),
               "ideal_hit_probes": round(st["ideal_hit_probes"], 3),
               "miss_probes": round(st["miss_probes_mean"], 3),
               "ideal_miss_probes": round(st["ideal_miss_probes"], 3)}
        if as_json:
            emit(row)
            continue
        print(f"{graph.n_nodes:>7} nodes  graph_size {row['graph_size']:>8} ({f:.2f}x)  "
              f"slots {st['size']:>8} load {st['load']:.2f}  split "
              f"{row['split_us_per_node']:.4f} us/node  probes/lookup: hit "
              f"{row['hit_probes']:.2f} (uniform hash {row['ideal_hit_probes']:.2f}), miss "
              f"{row['miss_probes']:.2f} ({row['ideal_miss_probes']:.2f})", flush=True)


def _bench_graph(name, sched, graph, build, assignments, ref_options, as_json, server):
    """One graph's row: split, alloc_graph, split+reserve+alloc, reuse of the same graph
    and of a rebuilt one (build() makes an equal graph and its user assignments), beside
    ggml's where server is."""
    t0 = time.perf_counter()
    big = graph.n_nodes >= 50000
    reps, rounds = (3, 5) if big else (max(5, 200000 // graph.n_nodes), 5)
    row = {"case": name, "n_nodes": graph.n_nodes}
    if server is not None:
        from ggml_sched_ref import GgmlSched
        gpus = [b for b in sched.backends if b.name.startswith("GPU")]
        ref = GgmlSched(graph, [server.endpoint] * len(gpus), **ref_options)
        ref.assignments = [(t, sched.backend_id(b)) for t, b in assignments]
        try:
            us, ggml_us = _paired(lambda: time_split(sched, graph, reps, assignments),
                                  lambda: ref.time_split(reps), rounds)
            alloc_us, ggml_alloc_us = _paired(lambda: time_alloc(sched, graph, reps, assignments),
                                              lambda: ref.time_alloc(reps), rounds)
            few = max(3, reps // 4)
            reserve_us, ggml_sched_reserve_us = _paired(
                lambda: time_alloc(sched, graph, few, assignments, reserve=True),
                lambda: ref.time_reserve(few), rounds)
            # ggml's split + reserve_n + gallocr_alloc_graph, from its public calls
            ggml_reserve_us = ggml_sched_reserve_us + ggml_alloc_us - ggml_us
            # level 2 (a rebuilt graph of equal structure, built in Python, untimed)
            # against ggml's split, round by round
            other, other_assignments = build()
            rebuilt_us, ggml_split_again_us = _paired(
                lambda: time_rebuilt_reuse(sched, graph, other, few, assignments, other_assignments),
                lambda: ref.time_split(few), rounds)
            row.update(ggml="measured", ggml_n_splits=ref.n_splits)
        finally:
            ref.close()
        ggml_per_node = ggml_us / graph.n_nodes
        row.update(ggml_split_us_median=round(ggml_us, 1),
                   alloc_graph_us_median=round(alloc_us, 1),
                   ggml_alloc_graph_us=round(ggml_alloc_us, 1),
                   alloc_ratio=round(alloc_us / ggml_alloc_us, 3),
                   ggml_alloc_reserve_us=round(ggml_reserve_us, 1),
                   alloc_reserve_ratio=round(reserve_us / ggml_reserve_us, 3),
                   ggml_split_us_beside_rebuilt=round(ggml_split_again_us, 1))
    else:
        us = statistics.median(time_split(sched, graph, reps * rounds, assignments))
        ggml_per_node = _issue_per_node(graph.n_nodes)
        row.update(ggml="issue 11" if ggml_per_node else None)
        reserve_us = statistics.median(time_alloc(sched, graph, 3 if big else 5, assignments,
                                                        reserve=True))
        # level 2: a rebuilt graph of equal structure (built in Python, untimed)
        other, other_assignments = build()
        rebuilt_us = statistics.median(time_rebuilt_reuse(sched, graph, other, 5 if big else 21,
                                                                assignments, other_assignments))
    reuse_us = statistics.median(time_reuse(sched, graph, 101, assignments))
    # the memory floor: a sweep reading only what any split must read of the graph
    sweep_us = statistics.median(time_struct_sweep(sched, graph, reps * rounds))
    ggml_split_us = None if ggml_per_node is None else ggml_per_node * graph.n_nodes
    if server is not None:
        ggml_split_us = ggml_split_again_us         # measured alongside the rebuilt graphs
    row.update(split_us_median=round(us, 1), split_us_per_node=round(us / graph.n_nodes, 4),
               struct_sweep_us_per_node=round(sweep_us / graph.n_nodes, 4),
               ggml_split_us_per_node=None if ggml_per_node is None else round(ggml_per_node, 4),
               split_ratio=None if ggml_per_node is None else
               round(us / graph.n_nodes / ggml_per_node, 3),
               alloc_reserve_us_median=round(reserve_us, 1),
               reuse_same_graph_us=round(reuse_us, 3),
               reuse_rebuilt_graph_us=round(rebuilt_us, 1),
               reuse_rebuilt_us_per_node=round(rebuilt_us / graph.n_nodes, 4),
               reuse_ratio=None if ggml_split_us is None else round(rebuilt_us / ggml_split_us, 3),
               n_splits=sched.n_splits)
    if as_json:
        emit(row)
        return
    g = "-" if ggml_per_node is None else f"{ggml_per_node:.4f} ({row['ggml']})"
    ratio = "" if ggml_per_node is None else f" {row['split_ratio']:.2f}x"
    alloc = "" if "alloc_ratio" not in row else \
        (f"  alloc_graph {row['alloc_ratio']:.2f}x ggml  split+reserve+alloc "
         f"{row['alloc_reserve_ratio']:.2f}x ggml ({reserve_us:.0f} us)")
    vs_ggml = "" if row["reuse_ratio"] is None else f" ({row['reuse_ratio']:.2f}x ggml split)"
    print(f"{row['case']:<26} {graph.n_nodes:>7} nodes  split {row['split_us_per_node']:.4f} "
          f"us/node (memory floor {row['struct_sweep_us_per_node']:.4f}), ggml {g}{ratio}"
          f"{alloc}  reuse {reuse_us:.2f} us  rebuilt "
          f"{row['reuse_rebuilt_us_per_node']:.4f} us/node{vs_ggml}  "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="the reference data folder, holding cases/ (default: tests/data)")
    ap.add_argument("--random", action="store_true", help="also the random cases")
    ap.add_argument("--sizes", default="1000,10000,40000,100000")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-ggml", action="store_true",
                    help="do not run ggml's scheduler (the issue's figures instead)")
    ap.add_argument("--case", nargs="+", metavar="CASE.case.json",
                    help="only these case files, each beside ggml's scheduler run live")
    ap.add_argument("--sweep-graph-size", type=int, metavar="N_NODES",
                    help="only a graph of about N_NODES nodes under graph_size 1x-4x its "
                         "tensors: split cost and hash probes per lookup at each")
    args = ap.parse_args(argv)
    global MACHINE
    MACHINE = announce(args.json)
    if not args.json and not args.sweep_graph_size:
        print("times: medians, lower is better; reuse = alloc_graph of the same Graph (plan "
              "kept), rebuilt = alloc_graph of a rebuilt graph of equal structure (plan taken "
              "over), against ggml's split; ggml's figures: measured in this run, or issue 11's")
    if args.sweep_graph_size:
        return sweep_graph_size(args.sweep_graph_size, (1.0, 1.25, 1.5, 2.0, 3.0, 4.0), args.json)
    if args.case:
        return bench_case_files(args.case, args.json, not args.no_ggml)
    if os.path.isdir(os.path.join(args.cases, "cases")):
        bench_cases(args.cases, args.random, args.json)
    else:
        print(f"no cases under {args.cases}; skipping the case benchmark", file=sys.stderr)
    bench_scaling([int(x) for x in args.sizes.split(",") if x], args.json, not args.no_ggml)


if __name__ == "__main__":
    main()
