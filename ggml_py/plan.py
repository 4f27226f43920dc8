"""The plan-file format of SCHED_CASES.md (`ggml-sched-plan/1`): what a split decided
(`Plan`, made by `Scheduler.plan()`), with the `alloc` block of an allocated graph copy.
Plain data: it knows nothing of the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ggml_py._caseio import json_text


@dataclass
class Plan:
    """What a split decided, as in a `ggml-sched-plan/1` file (without timing/alloc)."""
    case: str
    n_splits: int
    splits: list[dict[str, Any]]
    node_backends: list[Any]
    leaf_backends: list[Any]
    node_srcs: list[Any]
    graph_inputs: list[Any]
    graph_copy: dict[str, Any]
    causes: list[str] = field(default_factory=list)
    alloc: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        """The plan as JSON data ("ggml-sched-plan/1", as the case files store it), with
        each node's cause where explain is set, and the alloc and timing blocks when present."""
        d: dict[str, Any] = {"format": "ggml-sched-plan/1", "case": self.case, "n_splits": self.n_splits,
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
