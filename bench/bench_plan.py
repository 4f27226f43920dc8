"""Time `ggml-py plan CASE --alloc -o PLAN` end to end, stage by stage.

    python bench/bench_plan.py CASE.case.json [--runs N]

Each run is a fresh interpreter that does what the command does -- load the case,
split and allocate it on a new scheduler, read the plan, write its JSON -- and
reports each stage's wall time and its peak RSS. The bench prints the medians over
the runs, and the wall time of the whole command (interpreter start and imports
included, as `time ggml-py plan` sees it). Issue 36's target on the 100k-node llama
(bench/scale_case.py): ggml's harness, 1.46 s and 628 MiB.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ("import", "load", "split+alloc", "plan", "write")


def one_run(case_path, out_path):
    """The command's stages in this process: {stage: seconds, ..., "rss_mib": peak}."""
    t = time.perf_counter()
    from ggml_py.tools.cases import gc_paused
    from ggml_py.tools.commands import load_case_file
    from ggml_py.tools.planning import scheduler_for_case
    t0 = time.perf_counter()
    with gc_paused():           # as cmd_plan does
        case = load_case_file(case_path)
        t1 = time.perf_counter()
        sched = scheduler_for_case(case)
        sched.alloc_graph(case.graph)
        t2 = time.perf_counter()
        plan = sched.plan(case.name)
        t3 = time.perf_counter()
        with open(out_path, "w") as f:
            f.write(plan.to_json() + "\n")
        t4 = time.perf_counter()
    times = dict(zip(STAGES, (t0 - t, t1 - t0, t2 - t1, t3 - t2, t4 - t3)))
    times["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", help="a case file (*.case.json)")
    p.add_argument("--runs", type=int, default=5, help="runs of each measure (default 5)")
    p.add_argument("--child", help=argparse.SUPPRESS)    # one run, as a child process
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_run(args.case, args.child)))
        return
    stages, totals, rss = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        for _ in range(args.runs):
            run = subprocess.run([sys.executable, __file__, args.case, "--child", out],
                                 check=True, capture_output=True, text=True)
            stages.append(json.loads(run.stdout))
        for _ in range(args.runs):
            # the command itself: its wall time and peak RSS as the OS counts them
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ggml_py", "plan", args.case, "--alloc",
                            "-o", out], check=True)
            totals.append(time.perf_counter() - t)
            rss.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(f"{os.path.basename(args.case)}: medians of {args.runs} runs")
    for stage in STAGES:
        print(f"  {stage:<12} {statistics.median(s[stage] for s in stages) * 1e3:9.1f} ms")
    in_process = statistics.median(sum(s[k] for k in STAGES) for s in stages)
    print(f"  {'in process':<12} {in_process * 1e3:9.1f} ms   peak RSS "
          f"{statistics.median(s['rss_mib'] for s in stages):6.0f} MiB")
    # RUSAGE_CHILDREN keeps the largest child's peak: every run's command is under it
    print(f"  {'command':<12} {statistics.median(totals) * 1e3:9.1f} ms   peak RSS "
          f"{max(rss):6.0f} MiB")


if __name__ == "__main__":
    main()
