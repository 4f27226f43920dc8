"""Why the scheduler put each node and split where it did, in words: its recorded rules
(Scheduler.get_cause, which ggml compiles out) as sentences, and the reason of each split
(`split_reasons`). The case planner's --explain, the split maps and the model plans say
them."""

from __future__ import annotations

from dataclasses import dataclass

from ggml_py._backend import Backend, get_buffer
from ggml_py._core import VIEW_OPS, Graph, Tensor
from ggml_py.sched import Scheduler


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
        """The reason in a sentence: 'ROPE(f32, i32) -> f32 on CPU: GPU0 can't run it'."""
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


__all__ = ["CAUSE_TEXT", "SplitReason", "cause_text", "split_reasons"]
