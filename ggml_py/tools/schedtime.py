"""Timing the scheduler as ggml was timed (SCHED_CASES.md "Timing"): wall times of
repeated splits, allocations and graph reuses of one graph, each after the untimed steps
ggml's figures were taken with (graph restored, scheduler reset, assignments applied
again). Over `_schedtime`'s timed loops; the benchmarks, `plan --time` and the demo use
them. The library itself never times anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from ggml_py._core import Graph, Tensor, instance_arg
from ggml_py._schedtime import (TIME_ALLOC, TIME_RESERVE, TIME_REUSE, TIME_SPLIT, TIME_SWEEP,
                                GraphSnapshot, time_rebuilt_reps, time_reps)
from ggml_py.sched import Scheduler

if TYPE_CHECKING:
    from ggml_py._types import BackendRef

Assignments = Iterable[tuple[Tensor, "BackendRef"]]


def time_split(sched: Scheduler, graph: Graph, reps: int,
               assignments: Assignments = ()) -> list[float]:
    """Wall times (µs) of `reps` splits, each after restoring the graph, a reset and
    re-applying `assignments` [(tensor, backend), ...]. The graph is left restored."""
    return _time(sched, graph, reps, assignments, TIME_SPLIT)


def time_alloc(sched: Scheduler, graph: Graph, reps: int, assignments: Assignments = (),
               reserve: bool = False) -> list[float]:
    """Wall times (µs) of `reps` alloc_graph calls in the steady state (the
    reservation reused), or with `reserve` of split + reserve_n + alloc_graph, each
    after restoring the graph, a reset and re-applying `assignments`."""
    return _time(sched, graph, reps, assignments, TIME_RESERVE if reserve else TIME_ALLOC)


def time_reuse(sched: Scheduler, graph: Graph, reps: int,
               assignments: Assignments = ()) -> list[float]:
    """Wall times (µs) of `reps` alloc_graph calls of the unchanged graph after a reset
    and `assignments` (untimed): graph reuse, no split and no allocation. Raises
    SchedulerError(kind='no-reuse') where the plan is not reused."""
    return _time(sched, graph, reps, assignments, TIME_REUSE)


def time_struct_sweep(sched: Scheduler, graph: Graph, reps: int) -> list[float]:
    """Wall times (µs) of `reps` sweeps that read what any split of `graph` must read
    and nothing more (each leaf's first cache line and buffer struct, each node's first
    line and its sources'), asking ahead as the split does, each after the untimed
    steps of `time_split`: the memory floor under the split's per-node cost, which
    grows with the graph as its tensor structs outgrow the caches."""
    return _time(sched, graph, reps, (), TIME_SWEEP)


def time_rebuilt_reuse(sched: Scheduler, graph: Graph, other: Graph, reps: int,
                       assignments: Assignments = (),
                       other_assignments: Assignments = ()) -> list[float]:
    """Wall times (µs) of `reps` alloc_graph calls of a rebuilt graph of equal
    structure (graph reuse level 2): `graph` and `other` (built alike) alternate,
    each after a reset and its assignments (untimed). Raises
    SchedulerError(kind='no-reuse') where the plan is not reused."""
    sched = instance_arg(sched, Scheduler, "sched")
    with sched.lock:
        instance_arg(graph, Graph, "graph")
        instance_arg(other, Graph, "other")
        ids = [(t, sched.backend_id(b)) for t, b in assignments]
        other_ids = [(t, sched.backend_id(b)) for t, b in other_assignments]
        try:
            ns = time_rebuilt_reps(sched._core, graph, other, ids, other_ids, reps)
        finally:
            sched.reset()
    return [x / 1000.0 for x in ns]


def _time(sched: Scheduler, graph: Graph, reps: int, assignments: Assignments,
          what: int) -> list[float]:
    """_schedtime.time_reps around a snapshot of the graph's own sources (the split's
    rewiring undone first), in µs; the graph is restored afterwards."""
    sched = instance_arg(sched, Scheduler, "sched")
    with sched.lock:
        instance_arg(graph, Graph, "graph")
        core = sched._core
        core.undo_rewiring()
        snap = GraphSnapshot(graph)
        ids = [(t, sched.backend_id(b)) for t, b in assignments]
        try:
            if what == TIME_ALLOC and not sched.is_alloc:
                sched.alloc_graph(graph)    # the first call reserves; time the steady state
            ns = time_reps(core, graph, snap, ids, reps, what)
        finally:
            core.undo_rewiring()
            snap.restore()
            if what != TIME_SPLIT and what != TIME_SWEEP:
                sched.reset()
    return [x / 1000.0 for x in ns]
