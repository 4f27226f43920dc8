"""The plan-file format of SCHED_CASES.md (`ggml-sched-plan/1`): what a split decided
(`Plan`, from `Scheduler.plan()`), with the `alloc` block of an allocated graph copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ggml_py._caseio import json_text
from ggml_py._core import Graph, instance_arg

if TYPE_CHECKING:
    from ggml_py.sched import Scheduler


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
        # every node's and source's answer from the scheduler's tables in one call
        tables = sched.plan_tables(graph)
        tok = sched.token
        splits = [{"backend": s.backend.name, "i_start": s.i_start, "i_end": s.i_end,
                   "inputs": [tok(t) for t in s.inputs]} for s in sched.splits]
        alloc = None
        if sched.is_alloc:
            backends = sched.backends
            alloc = {
                "buffer_sizes": {b.name: sched.get_buffer_size(i) for i, b in enumerate(backends)},
                "chunk_sizes": {b.name: sched.get_chunk_sizes(i) for i, b in enumerate(backends)},
                "graph_copy_nodes": tables["graph_copy_nodes"],
                "graph_copy_leafs": tables["graph_copy_leafs"],
            }
        return cls(
            case=name,
            n_splits=sched.n_splits,
            splits=splits,
            node_backends=tables["node_backends"],
            leaf_backends=tables["leaf_backends"],
            node_srcs=tables["node_srcs"],
            graph_inputs=[tok(t) for t in sched.graph_inputs],
            graph_copy=tables["graph_copy"],
            causes=tables["node_causes"],
            alloc=alloc,
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

    def to_json(self, explain: bool = False) -> str:
        """The plan file's text: json.dumps(self.to_dict(explain), indent=1), written in C
        (json's indenting encoder is pure Python: seconds for a 100k-node plan)."""
        return json_text(self.to_dict(explain))
