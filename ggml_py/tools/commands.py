"""The command line, installed as `ggml-py` (also `python -m ggml_py`): `demo`, `run`,
`plan`, `bench` and `ops-check`, each with its own `--help`. Parsing, argument checks and the
mapping of errors to exit statuses live in ggml_py.tools.cli.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

from ggml_py import __version__
from ggml_py.tools import cli

if TYPE_CHECKING:
    from ggml_py.tools.cases import Case

ALLOC_REPS_MAX = 5000
DOT_SUFFIXES = (".dot", ".gv", ".svg", ".png", ".pdf")

BENCH_HELP = """\
Median times of each case file's split_graph, alloc_graph and split + reserve +
alloc_graph, and of graph reuse, in µs: lower is better.

  split    split_graph: the scheduler's passes over the graph
  alloc    alloc_graph after a split
  reserve  split_graph + reserve + alloc_graph
  reuse    alloc_graph of the same Graph again: graph reuse, the plan kept after
           checking that nothing changed (no split)
  rebuilt  alloc_graph of a rebuilt graph of equal structure (new tensors, as a
           model's next decode step builds): the plan taken over by its fingerprint;
           compared with ggml's split, which ggml does again there

ggml's times (ggml X, and the ratio ours / ggml's, below 1 where ggml_py is faster)
are not measured here: they are the timing block of the plan file beside each case
(NAME.plan.json beside NAME.case.json), recorded by ggml 0.10.1 on the machine that
wrote the case, another machine: read the ratios with that in mind. A case without a
plan file is timed alone, with a warning on stderr.

--json prints one JSON object per case, one a line, the machine inside it."""

BENCH_LEGEND = ("µs, medians, lower is better; (ggml X, R x): ggml's time from the case's "
                "plan file (recorded on another machine) and ours / ggml's; reuse: same Graph "
                "again, rebuilt: an equal rebuilt graph (see --help)")


def load_case_file(path: str) -> Case:
    """A case file, or a UsageError/CaseFormatError that names the file."""
    from ggml_py.tools.cases import load_case
    from ggml_py.errors import CaseFormatError
    try:
        return load_case(path)
    except CaseFormatError as e:
        msg = str(e)
        raise CaseFormatError(msg if msg.startswith(path) else f"{path}: {msg}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    from ggml_py.tools import model_planning
    from ggml_py.tools.cases import gc_paused
    if args.map:
        cli.require_module("matplotlib", "--map", "plot")
    if args.case.endswith(".gguf"):
        if args.explain:
            raise cli.UsageError("--explain applies to a case file, not to a model file")
        return model_planning.run(args)
    model_planning.check_case_arguments(args)
    # the collector off from the load to the end: the case is a million objects, none
    # garbage, and freed by reference counts before it comes back on (back on with them
    # alive, its next full collection would walk them all)
    with gc_paused():
        _plan(args)
    return 0


def _plan(args: argparse.Namespace) -> None:
    from ggml_py.tools.planning import explain, plan_case
    case = load_case_file(args.case)
    sched, plan = plan_case(case, alloc=args.alloc)
    text = plan.to_json(explain=args.explain)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    if args.explain:
        print(explain(sched, case.graph))
    elif not args.output:
        print(text)
    if args.dot:
        from ggml_py.tools.dot import plan_to_dot, render
        rendered = render(plan_to_dot(sched, case.graph, case.name), args.dot)
        if not rendered and not args.dot.endswith((".dot", ".gv")):
            print(f"note: Graphviz's `dot` is not installed; wrote {args.dot}.dot",
                  file=sys.stderr)
    if args.map:
        from ggml_py.tools import splitmap
        splitmap.SplitMap.from_scheduler(sched, case.name, graph=case.graph).save(args.map)


def _reference_timing(case_path: str) -> dict[str, Any]:
    """The `timing` block of the plan file beside a case file (ggml's times, recorded on
    the machine that wrote the case); {} and a warning on stderr when there is none, or
    it cannot be read, or it has no timing: the case is then timed without ggml's."""
    if case_path.endswith(".case.json"):
        plan_path = case_path[: -len(".case.json")] + ".plan.json"
        try:
            with open(plan_path) as f:
                timing = json.load(f).get("timing")
            if isinstance(timing, dict):
                return timing
            why = "it has no timing block"
        except OSError as e:
            why = e.strerror or str(e)
        except (ValueError, AttributeError) as e:
            why = f"not a plan file: {e}"
    else:
        plan_path, why = "its plan file", "the case file's name does not end in .case.json"
    print(f"warning: {plan_path}: no ggml times to compare with ({why}); "
          f"{os.path.basename(case_path)} is timed alone", file=sys.stderr)
    return {}


def _ratio(ours: float, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if theirs else None


def _fmt_time(ours: float, theirs: float | None) -> str:
    return (f"{ours:9.2f} us (ggml {theirs:9.2f}, {ours / theirs:4.2f}x)" if theirs
            else f"{ours:9.2f} us")


def cmd_bench(args: argparse.Namespace) -> int:
    from ggml_py.tools.planning import (median_alloc_us, median_rebuilt_reuse_us, median_reuse_us,
                                        median_split_us)
    from ggml_py.tools.machine import announce, with_machine
    cases = [(path, load_case_file(path)) for path in args.cases]     # all checked first
    machine = announce(args.json)
    if not args.json:
        print(BENCH_LEGEND, flush=True)
    for path, case in cases:
        is_random = case.name.startswith("rand-")
        ref = _reference_timing(path)       # (its warning before the wait)
        us, reps = median_split_us(case, min_time_s=0.1 if is_random else args.min_time)
        ggml_us = ref.get("split_us_median")
        # ggml timed as many allocations as splits; a median needs far fewer, and each
        # untimed restore costs more than a small case's allocation
        alloc_reps = min(reps, ALLOC_REPS_MAX)
        alloc_us = median_alloc_us(case, alloc_reps)
        reserve_us = median_alloc_us(case, alloc_reps, reserve=True)
        # graph reuse of the same Graph; pipeline-parallel schedulers always split again
        reuse_us = None if case.parallel else median_reuse_us(case, max(alloc_reps, 100))
        rebuilt_us = None if case.parallel else median_rebuilt_reuse_us(case, max(alloc_reps, 20))
        ggml_alloc, ggml_reserve = ref.get("alloc_graph_us_median"), ref.get("alloc_reserve_us_median")
        if args.json:
            row = {"case": case.name, "n_nodes": case.graph.n_nodes, "reps": reps,
                   "split_us_median": round(us, 3), "ggml_split_us": ggml_us,
                   "split_ratio": _ratio(us, ggml_us),
                   "split_us_per_node": round(us / max(case.graph.n_nodes, 1), 5),
                   "alloc_graph_us_median": round(alloc_us, 3), "ggml_alloc_graph_us": ggml_alloc,
                   "alloc_ratio": _ratio(alloc_us, ggml_alloc),
                   "alloc_reserve_us_median": round(reserve_us, 3),
                   "ggml_alloc_reserve_us": ggml_reserve,
                   "reserve_ratio": _ratio(reserve_us, ggml_reserve),
                   "alloc_reserve_ratio": _ratio(reserve_us, ggml_reserve),
                   "reuse_same_graph_us": None if reuse_us is None else round(reuse_us, 3),
                   "reuse_rebuilt_graph_us": None if rebuilt_us is None else round(rebuilt_us, 3),
                   "reuse_ratio": None if rebuilt_us is None else _ratio(rebuilt_us, ggml_us),
                   "ggml_source": "plan file" if ref else None}
            print(with_machine(row, machine), flush=True)
        else:
            print(f"{case.name:<34} {case.graph.n_nodes:>6} nodes  split {_fmt_time(us, ggml_us)}  "
                  f"alloc {_fmt_time(alloc_us, ggml_alloc)}  "
                  f"reserve {_fmt_time(reserve_us, ggml_reserve)}  "
                  f"reuse {'-' if reuse_us is None else f'{reuse_us:.2f} us'}  "
                  f"rebuilt {'-' if rebuilt_us is None else _fmt_time(rebuilt_us, ggml_us)}",
                  flush=True)
    return 0


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from ggml_py.tools import demo, model_planning, opscheck, run, splitmap
    prog = prog or cli.program_name()
    p = cli.Parser(prog=prog, description="ggml_py: a port of ggml's backend scheduler, graph "
                   "allocator and backends.",
                   epilog=f"'{prog} COMMAND --help' describes each command.\n\n"
                   + cli.EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{prog} {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands",
                           parser_class=cli.Parser)

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description,
                              epilog=cli.EXIT_STATUS_HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    demo.add_arguments(command("demo", "run llama and MoE models through the scheduler "
                               "(the main job)", demo.__doc__ or ""))

    run.add_arguments(command("run", "run a GGUF model: its tokens, prompt and decode "
                              "tokens/s", run.__doc__ or ""))

    sp = command("plan", "split a case file, or plan a model file as llama.cpp loads it",
                 "Split a case file (*.case.json, SCHED_CASES.md) on a fresh scheduler and "
                 "write what it decided:\nthe plan JSON (stdout unless -o), an explanation "
                 "per node, a Graphviz picture, a split map.\n\n"
                 "Or plan a model file (MODEL.gguf: llama with or without experts, qwen2, "
                 "qwen3, qwen3moe) on\nsimulated devices with llama.cpp's options (its "
                 "tensor overrides too), reading only its\nmetadata and tensor "
                 "infos: each device's model, KV, compute and output buffers and\nthe graph "
                 "nodes and splits of the prompt ubatch and the decode token, as llama.cpp "
                 "logs them.")
    sp.add_argument("case", type=cli.input_file(), metavar="CASE.case.json|MODEL.gguf",
                    help="the scheduling case to split, or the model to plan")
    sp.add_argument("-o", "--output", type=cli.output_file(), metavar="PLAN.json",
                    help="write the plan JSON here (default: stdout)")
    sp.add_argument("--explain", action="store_true",
                    help="print each node's backend and the rule that chose it")
    sp.add_argument("--dot", type=cli.output_file(*DOT_SUFFIXES), metavar="FILE",
                    help="write a Graphviz picture: .dot/.gv text, or .svg/.png/.pdf "
                         "rendered by Graphviz's `dot` when it is installed")
    sp.add_argument("--map", type=cli.output_file(*splitmap.SUFFIXES), metavar="FILE",
                    help="draw the split map (.png/.svg/.pdf): one lane per backend, the "
                         "splits along the node order, the bytes copied between them; "
                         "for a model file, the decode token's, and the prompt ubatch's "
                         "in FILE-prompt.EXT (needs matplotlib: pip install "
                         "\"ggml-py-sched[plot]\")")
    sp.add_argument("--alloc", action="store_true",
                    help="also allocate (alloc_graph) and write the plan's alloc block")
    sp.set_defaults(func=cmd_plan, model_defaults=model_planning.add_arguments(sp))

    sb = command("bench", "time the split of case files against ggml's", BENCH_HELP)
    sb.add_argument("cases", nargs="+", type=cli.input_file(), metavar="CASE.case.json")
    sb.add_argument("--json", action="store_true",
                    help="one JSON object per case, one a line, the machine inside each")
    sb.add_argument("--min-time", type=cli.positive_float, default=0.5, metavar="SECONDS",
                    help="seconds of timed splits per case (default 0.5; random cases: 0.1)")
    sb.set_defaults(func=cmd_bench)

    opscheck.add_arguments(command("ops-check", "compute ggml's op cases and model files "
                                   "on a backend", opscheck.__doc__ or ""))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default: sys.argv[1:]); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, status = cli.parse(parser, argv)
    if args is None:
        return status if status is not None else cli.EXIT_USAGE
    prog = f"{parser.prog} {args.command}"
    return cli.run(lambda: args.func(args), prog)


if __name__ == "__main__":
    sys.exit(main())
