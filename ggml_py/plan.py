"""The plan-file format of SCHED_CASES.md (`ggml-sched-plan/1`): what a split decided
(`Plan`, from `Scheduler.plan()`), with the `alloc` block of an allocated graph copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ggml_py._core import Graph, instance_arg

if TYPE_CHECKING:
    from ggml_py.sched import Scheduler


def _alloc_block(sched: Scheduler) -> dict[str, Any]:
    """The `alloc` block of a plan file for `sched`'s allocated graph copy."""
    nodes, _, leafs, _ = sched.graph_copy
    backends = sched.backends
    return {
        "buffer_sizes": {b.name: sched.get_buffer_size(i) for i, b in enumerate(backends)},
        "chunk_sizes": {b.name: sched.get_chunk_sizes(i) for i, b in enumerate(backends)},
        "graph_copy_nodes": [list(sched.tensor_location(t)) for t in nodes],
        "graph_copy_leafs": [list(sched.tensor_location(t)) for t in leafs],
    }


@dataclass
class Plan:
    """What a split decided, as in a `ggml-sched-plan/1` file (without timing/alloc)."""
    case: str
    n_splits: int
    splits: list
    node_backends: list
    leaf_backends: list
    node_srcs: list
    graph_inputs: list
    graph_copy: dict
    causes: list = field(default_factory=list)
    alloc: dict | None = None
    timing: dict | None = None

    @classmethod
    def from_scheduler(cls, sched: Scheduler, graph: Graph, name: str = "") -> Plan:
        """The plan of `sched`'s last split of `graph`; with its `alloc` block when the
        graph was allocated."""
        from ggml_py.sched import Scheduler     # sched.py imports this module
        instance_arg(sched, Scheduler, "sched")
        instance_arg(graph, Graph, "graph")
        tok = sched.token
        bname = lambda b: None if b is None else b.name  # noqa: E731
        nodes, leafs = graph.nodes, graph.leafs
        splits = [{"backend": s.backend.name, "i_start": s.i_start, "i_end": s.i_end,
                   "inputs": [tok(t) for t in s.inputs]} for s in sched.splits]
        gnodes, gnb, gleafs, glb = sched.graph_copy
        return cls(
            case=name,
            n_splits=sched.n_splits,
            splits=splits,
            node_backends=[bname(sched.get_tensor_backend(n)) for n in nodes],
            leaf_backends=[bname(sched.get_tensor_backend(t)) for t in leafs],
            node_srcs=[[tok(s) for s in n.src] for n in nodes],
            graph_inputs=[tok(t) for t in sched.graph_inputs],
            graph_copy={"nodes": [tok(t) for t in gnodes], "node_backends": [bname(b) for b in gnb],
                        "leafs": [tok(t) for t in gleafs], "leaf_backends": [bname(b) for b in glb]},
            causes=[sched.get_cause(n) for n in nodes],
            alloc=_alloc_block(sched) if sched.is_alloc else None,
        )

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        """The plan as JSON data ("ggml-sched-plan/1", as the case files store it), with
        each node's cause where explain is set, and the alloc and timing blocks when present."""
        d = {"format": "ggml-sched-plan/1", "case": self.case, "n_splits": self.n_splits,
             "splits": self.splits, "node_backends": self.node_backends,
             "leaf_backends": self.leaf_backends, "node_srcs": self.node_srcs,
             "graph_inputs": self.graph_inputs, "graph_copy": self.graph_copy}
        if explain:
            d["node_causes"] = self.causes
        if self.alloc is not None:
            d["alloc"] = self.alloc
        if self.timing is not None:
            d["timing"] = self.timing
        return d
