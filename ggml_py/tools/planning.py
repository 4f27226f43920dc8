"""Graphs through the scheduler: plans of case files, explanations (every node's rule,
why each split exists) and split timings as SCHED_CASES.md defines them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ggml_py._backend import Backend, get_buffer
from ggml_py._core import Graph, Tensor
from ggml_py.ops import VIEW_OPS
from ggml_py.plan import Plan
from ggml_py.sched import Scheduler

if TYPE_CHECKING:
    from ggml_py.tools.cases import Case


# the scheduler's rules (Scheduler.get_cause), in words
CAUSE_TEXT = {
    "usr": "assigned by the user",
    "usr.away": "assigned by the user away from the memory it views (read there in place)",
    "1.dst": "its memory is already allocated there",
    "1.vsrc": "it views memory allocated there",
    "1.inp": "graph inputs start on the CPU",
    "1.off": "that backend offloads the op",
    "2.sup": "it follows its neighbours there",
    "3.best": "the backend with most of its inputs that supports it",
    "3.upg": "upgraded to a higher-priority backend",
    "4.vsrc": "a view goes with its source",
    "4.cur": "an input goes with its node",
}


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


def cause_text(cause: str) -> str:
    """A rule of Scheduler.get_cause in words ('1.wgt0': 'it runs where its weight is')."""
    if cause.startswith("1.wgt"):
        return "it runs where its weight is"
    return CAUSE_TEXT.get(cause, cause or "unassigned")


@dataclass(frozen=True)
class SplitReason:
    """Why split `split` exists: the node that starts it, its backend, the rule that put
    it there (Scheduler.get_cause) and the higher-priority backends that cannot run it.
    A split on the same backend as the one before exists for one of ggml's two other
    reasons: a weight in memory this backend cannot use (`weight`), or full inputs."""
    split: int
    backend: str
    node: Tensor
    cause: str
    src_types: tuple[str, ...]
    cannot: tuple[str, ...] = ()        # higher-priority backends whose supports_op said no
    same_backend: bool = False
    weight: Tensor | None = None        # same backend: the weight that needs a new split

    @property
    def op(self) -> str:
        """The node's op with its sources' types and its own: 'MUL_MAT(q4_0, f32) -> f32'."""
        return f"{self.node.op}({', '.join(self.src_types)}) -> {self.node.type}"

    def brief(self) -> str:
        """The reason in a few words, for a picture: 'ROPE: GPU0 can't run it',
        'MUL_MAT: weight in NUMPY_DEV memory', 'input slots full', 'RMS_NORM [2.sup]'."""
        if self.same_backend:
            if self.weight is not None:
                buf = get_buffer(self.weight.view_src or self.weight)
                where = f" in {buf.buffer_type.name} memory" if buf is not None else ""
                return f"{self.node.op}: weight{where}"
            return "input slots full"
        if self.cannot:
            return f"{self.node.op}: {', '.join(self.cannot)} can't run it"
        return f"{self.node.op} [{self.cause}]" if self.cause else self.node.op

    def text(self) -> str:
        if self.same_backend:
            if self.weight is not None:
                buf = get_buffer(self.weight.view_src or self.weight)
                where = f"{buf.buffer_type.name} memory" if buf is not None else "memory"
                return (f"{self.backend} again: {self.node.op}'s weight is in {where}, which "
                        f"{self.backend} cannot use (a new split lets the memory of the "
                        "weights copied before be reused)")
            return f"{self.backend} again: the split before ran out of input slots"
        if self.cannot:
            return f"{self.op} on {self.backend}: {', '.join(self.cannot)} can't run it"
        return f"{self.node.op} on {self.backend}: {cause_text(self.cause)}"


def _original(sched: Scheduler, t: Tensor) -> Tensor:
    """The tensor a scheduler copy stands for (split_graph rewires sources to copies)."""
    d = sched.describe(t)
    return d[1] if d is not None and d[0] == "copy" else t


def _foreign_weight(sched: Scheduler, node: Tensor, backend: Backend) -> Tensor | None:
    """A weight of `node` in a buffer `backend` cannot use (ggml then starts a new split)."""
    for src in node.src:
        if src is None:
            continue
        w = _original(sched, src)
        buf = get_buffer(w.view_src or w)
        if buf is not None and buf.usage == "weights" and not backend.supports_buft(buf.buffer_type):
            return w
    return None


def split_reasons(sched: Scheduler, graph: Graph) -> list[SplitReason]:
    """Why each split after the first exists, from the recorded causes: the first node
    of the split that is not a view, the rule that chose its backend, and the backends of
    higher priority that cannot run it (Backend.supports_op)."""
    out: list[SplitReason] = []
    splits = sched.splits
    nodes = graph.nodes
    for k in range(1, len(splits)):
        s, prev = splits[k], splits[k - 1]
        span = nodes[s.i_start:s.i_end]
        node = next((t for t in span if t.op not in VIEW_OPS), span[0])
        cause = sched.get_cause(node)
        src_types = tuple(t.type for t in node.src if t is not None)
        if s.backend is prev.backend:
            out.append(SplitReason(k, s.backend.name, node, cause, src_types, same_backend=True,
                                   weight=_foreign_weight(sched, node, s.backend)))
            continue
        higher = sched.backends[:sched.backend_id(s.backend)]
        out.append(SplitReason(k, s.backend.name, node, cause, src_types,
                               cannot=tuple(b.name for b in higher if not b.supports_op(node))))
    return out


def median_split_us(case: Case, min_time_s: float = 0.5, min_reps: int = 50) -> tuple[float, int]:
    """Median split time (µs) measured as ggml was: each repetition restores the
    graph, resets the scheduler and re-applies the user assignments, untimed;
    repeated until min_time_s of timed splits and at least min_reps."""
    sched = scheduler_for_case(case)
    return _median_until(lambda n: sched.time_split(case.graph, n, case.assignments),
                         min_time_s, min_reps)


def median_alloc_us(case: Case, reps: int, reserve: bool = False) -> float:
    """Median time (µs) of `reps` alloc_graph calls in the steady state, or with
    `reserve` of split + reserve_n + alloc_graph (SCHED_CASES.md "Timing")."""
    sched = scheduler_for_case(case)
    return statistics.median(sched.time_alloc(case.graph, reps, case.assignments, reserve))


def median_reuse_us(case: Case, reps: int) -> float:
    """Median time (µs) of `reps` alloc_graph calls that reuse the plan of the unchanged
    graph (graph reuse level 1: the check alone)."""
    sched = scheduler_for_case(case)
    return statistics.median(sched.time_reuse(case.graph, reps, case.assignments))


def median_rebuilt_reuse_us(case: Case, reps: int) -> float:
    """Median time (µs) of `reps` alloc_graph calls that take the plan for a rebuilt
    graph of equal structure (graph reuse level 2: fingerprint, re-pointing, placing)."""
    sched = scheduler_for_case(case)
    other = case.rebuilt()
    return statistics.median(sched.time_rebuilt_reuse(case.graph, other.graph, reps,
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
