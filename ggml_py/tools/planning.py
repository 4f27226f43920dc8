"""Graphs through the scheduler: plans of case files, explanations (every node's rule in
words: ggml_py.reasons) and split timings as SCHED_CASES.md defines them."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable

from ggml_py._core import Graph
from ggml_py.plan import Plan
from ggml_py.reasons import cause_text
from ggml_py.sched import Scheduler
from ggml_py.tools.schedtime import time_alloc, time_rebuilt_reuse, time_reuse, time_split

if TYPE_CHECKING:
    from ggml_py.tools.cases import Case


def scheduler_for_case(case: Case) -> Scheduler:
    """A new scheduler with the case's backends and settings, assignments applied."""
    sched = Scheduler(case.backends, graph_size=case.graph_size, parallel=case.parallel,
                      op_offload=case.op_offload)
    for tensor, backend in case.assignments:
        sched.set_tensor_backend(tensor, backend)
    return sched


def plan_case(case: Case, alloc: bool = False) -> tuple[Scheduler, Plan]:
    """Split the case's graph on a fresh scheduler; the plan of that split. With
    `alloc`, split and allocate (alloc_graph) and add the plan's `alloc` block."""
    sched = scheduler_for_case(case)
    if alloc:
        sched.alloc_graph(case.graph)
    else:
        sched.split_graph(case.graph)
    return sched, sched.plan(case.name)


def explain(sched: Scheduler, graph: Graph) -> str:
    """A readable table: each split, then each node's backend and the rule that chose it;
    last, a legend: each rule met, in words."""
    out = []
    causes: dict[str, str] = {}
    for i, node, k, s in sched.walk(graph):
        if s is not None:
            ins = ", ".join(t.name for t in s.inputs) or "-"
            out.append(f"## split {k}: {s.backend.name}, nodes {s.i_start}..{s.i_end - 1}, "
                       f"inputs: {ins}")
        b = sched.get_tensor_backend(node)
        srcs = ", ".join(
            (f"{s.name}" if sched.describe(s) is None else f"{s.name} (copy)")
            for s in node.src if s is not None)
        cause = sched.get_cause(node)
        causes.setdefault("1.wgtN" if cause.startswith("1.wgt") else cause or "-",
                          cause_text(cause))
        out.append(f"  #{i:<5} {node.op:<12} {node.name:<32} {b.name if b else 'NULL':<8} "
                   f"{cause or '-':<7} <- {srcs}")
    out.append("legend (why each node went to its backend):")
    out += [f"  {cause:<7} {text}" for cause, text in sorted(causes.items())]
    return "\n".join(out)


def median_split_us(case: Case, min_time_s: float = 0.5, min_reps: int = 50) -> tuple[float, int]:
    """Median split time (µs) measured as ggml was: each repetition restores the
    graph, resets the scheduler and re-applies the user assignments, untimed;
    repeated until min_time_s of timed splits and at least min_reps."""
    sched = scheduler_for_case(case)
    return _median_until(lambda n: time_split(sched, case.graph, n, case.assignments),
                         min_time_s, min_reps)


def median_alloc_us(case: Case, reps: int, reserve: bool = False) -> float:
    """Median time (µs) of `reps` alloc_graph calls in the steady state, or with
    `reserve` of split + reserve_n + alloc_graph (SCHED_CASES.md "Timing")."""
    sched = scheduler_for_case(case)
    return statistics.median(time_alloc(sched, case.graph, reps, case.assignments, reserve))


def median_reuse_us(case: Case, reps: int) -> float:
    """Median time (µs) of `reps` alloc_graph calls that reuse the plan of the unchanged
    graph (graph reuse level 1: the check alone)."""
    sched = scheduler_for_case(case)
    return statistics.median(time_reuse(sched, case.graph, reps, case.assignments))


def median_rebuilt_reuse_us(case: Case, reps: int) -> float:
    """Median time (µs) of `reps` alloc_graph calls that take the plan for a rebuilt
    graph of equal structure (graph reuse level 2: fingerprint, re-pointing, placing)."""
    sched = scheduler_for_case(case)
    other = case.rebuilt()
    return statistics.median(time_rebuilt_reuse(sched, case.graph, other.graph, reps,
                                                      case.assignments, other.assignments))


def _median_until(run: Callable[[int], list[float]], min_time_s: float,
                  min_reps: int) -> tuple[float, int]:
    samples: list[float] = []
    start = time.perf_counter()
    batch = min_reps
    while True:
        samples += run(batch)
        if len(samples) >= min_reps and sum(samples) >= min_time_s * 1e6:
            break
        if time.perf_counter() - start > 20 * min_time_s + 5:
            break   # a pathological case: report what we have
        batch = max(batch, len(samples))
    return statistics.median(samples), len(samples)
