"""Command line: `python -m ggml_py COMMAND ...` (also installed as `ggml-py`).

  demo [--gguf PATH] [--layers N] [--steps N] ...           the main job: models through the scheduler
  plan CASE.json [-o PLAN.json] [--explain] [--dot FILE]   split a case, write its plan
  bench CASE.json... [--json]                               split time against ggml's
  ops-check PATH... [--backend NAME] [--json]               op cases against ggml's results
"""

from __future__ import annotations

import argparse
import json
import os
import sys


ALLOC_REPS_MAX = 5000


def _load(path):
    from ggml_py.cases import load_case
    return load_case(path)


def cmd_plan(args) -> int:
    from ggml_py.dot import plan_to_dot, render
    from ggml_py.planning import explain, plan_case
    case = _load(args.case)
    sched, plan = plan_case(case, alloc=args.alloc)
    text = json.dumps(plan.to_dict(explain=args.explain), indent=1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    if args.explain:
        print(explain(sched, case.graph))
    elif not args.output:
        print(text)
    if args.dot:
        rendered = render(plan_to_dot(sched, case.graph, case.name), args.dot)
        if not rendered and not args.dot.endswith(".dot"):
            print(f"note: 'dot' is not installed; wrote {args.dot}.dot", file=sys.stderr)
    return 0


def _reference_timing(case_path):
    plan_path = case_path[: -len(".case.json")] + ".plan.json" if case_path.endswith(".case.json") \
        else None
    if plan_path and os.path.exists(plan_path):
        with open(plan_path) as f:
            return json.load(f).get("timing") or {}
    return {}


def cmd_bench(args) -> int:
    from ggml_py.planning import median_alloc_us, median_split_us
    rows = []
    for path in args.cases:
        case = _load(path)
        is_random = case.name.startswith("rand-")
        us, reps = median_split_us(case, min_time_s=0.1 if is_random else args.min_time)
        ref = _reference_timing(path)
        ggml_us = ref.get("split_us_median")
        # ggml timed as many allocations as splits; a median needs far fewer, and each
        # untimed restore costs more than a small case's allocation
        alloc_reps = min(reps, ALLOC_REPS_MAX)
        alloc_us = median_alloc_us(case, alloc_reps)
        reserve_us = median_alloc_us(case, alloc_reps, reserve=True)
        ggml_alloc, ggml_reserve = ref.get("alloc_graph_us_median"), ref.get("alloc_reserve_us_median")
        ratio = lambda a, b: round(a / b, 3) if b else None  # noqa: E731
        row = {"case": case.name, "n_nodes": case.graph.n_nodes, "reps": reps,
               "split_us_median": round(us, 3), "ggml_split_us": ggml_us,
               "split_ratio": ratio(us, ggml_us),
               "alloc_graph_us_median": round(alloc_us, 3), "ggml_alloc_graph_us": ggml_alloc,
               "alloc_ratio": ratio(alloc_us, ggml_alloc),
               "alloc_reserve_us_median": round(reserve_us, 3),
               "ggml_alloc_reserve_us": ggml_reserve, "reserve_ratio": ratio(reserve_us, ggml_reserve)}
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            def fmt(ours, theirs):
                return (f"{ours:9.2f} us (ggml {theirs:9.2f}, {ours / theirs:4.2f}x)" if theirs
                        else f"{ours:9.2f} us")
            print(f"{case.name:<34} {case.graph.n_nodes:>6} nodes  split {fmt(us, ggml_us)}  "
                  f"alloc {fmt(alloc_us, ggml_alloc)}  reserve {fmt(reserve_us, ggml_reserve)}",
                  flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ggml-py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="run model graphs through the scheduler (the main job; "
                                "see `demo --help`)")

    sp = sub.add_parser("plan", help="split a case file and write its plan")
    sp.add_argument("case")
    sp.add_argument("-o", "--output", help="write the plan JSON here (default: stdout)")
    sp.add_argument("--explain", action="store_true",
                    help="print each node's backend and the rule that chose it")
    sp.add_argument("--dot", help="write a Graphviz picture (.dot, or .svg/.png with `dot`)")
    sp.add_argument("--alloc", action="store_true",
                    help="also allocate (alloc_graph) and write the plan's alloc block")
    sp.set_defaults(func=cmd_plan)

    sb = sub.add_parser("bench", help="time the split of case files against ggml's")
    sb.add_argument("cases", nargs="+")
    sb.add_argument("--json", action="store_true", help="one JSON object per case")
    sb.add_argument("--min-time", type=float, default=0.5,
                    help="seconds of timed splits per case (random cases: 0.1)")
    sb.set_defaults(func=cmd_bench)

    sub.add_parser("ops-check", help="run op cases and model files on a backend "
                                     "(see `ops-check --help`)")
    return p


def main(argv=None) -> int:
    from ggml_py.errors import GgmlPyError
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        # its own parser: `demo --help` lists the demo's options
        from ggml_py.demo import main as demo_main
        return demo_main(argv[1:])
    if argv[:1] == ["ops-check"]:
        # its own parser: `ops-check --help` lists the runner's options
        from ggml_py.opscheck import main as ops_check_main
        return ops_check_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GgmlPyError as e:
        kind = getattr(e, "kind", None)
        print(f"error: {e}" + (f" [{kind}]" if kind else ""), file=sys.stderr)
        return 2
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
