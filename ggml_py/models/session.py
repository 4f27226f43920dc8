"""Running a model: a Session of prompt and decode steps over a Scheduler, with the
statistics of each step."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ggml_py._backend import Backend, tensor_set_all
from ggml_py._core import Graph, instance_arg
from ggml_py.errors import BackendError
from ggml_py.models.config import graph_size
from ggml_py.models.decode_graph import DecodeGraph
from ggml_py.models.graph import build_forward, token_ids
from ggml_py.models.model import KVCache, Model, tensor_values
from ggml_py.runtime import Status

if TYPE_CHECKING:
    from ggml_py.sched import Scheduler

# ---------------------------------------------------------------------------
# running: a session of prompt and decode steps

@dataclass
class SplitStats:
    """One split of a step: where it ran, what it copied in and what it cost (from the
    runtime's profile; compute_s is enqueue time on an asynchronous device unless the
    session profiles splits)."""
    backend: str
    n_nodes: int
    n_inputs: int
    input_bytes: int           # the split inputs' sizes
    bytes_copied: int = 0      # what the runtime copied (MoE weights: used experts only)
    copy_s: float = 0.0
    compute_s: float = 0.0


@dataclass
class StepStats:
    """What one forward pass cost and how the scheduler cut it."""
    kind: str                  # 'prompt' or 'decode'
    n_tokens: int
    n_nodes: int
    n_splits: int
    n_copies: int              # copy slots (pipeline parallelism)
    build_s: float             # graph build
    alloc_s: float             # split + alloc_graph + setting the inputs
    compute_s: float           # graph compute, copies included
    splits: list[SplitStats]
    graph_reused: bool = False     # the decode graph of the step before (no build)
    plan_reused: bool = False      # the scheduler's plan and allocation (no split, no alloc)

    @property
    def n_inputs(self) -> int:
        """Split inputs over all the step's splits."""
        return sum(s.n_inputs for s in self.splits)

    @property
    def copy_bytes(self) -> int:
        """Bytes the runtime copied between backends."""
        return sum(s.bytes_copied for s in self.splits)


class Session:
    """A model, its KV cache and a Scheduler over `backends` (priority order, CPU last).

    profile_splits: time every split to completion (the runtime's sync_splits: an
    asynchronous device is waited for after each split, so split times are real, at
    the price of the overlap).
    reuse_decode_graph: keep the one-token graph across decode steps while the padded
    KV length holds, as llama.cpp does (models.decode_graph); with the scheduler's
    graph reuse such a step builds, splits and allocates nothing.
    n_ubatch, swa_full: the sliding layers' cache of a model with a window (KVCache)."""

    def __init__(self, model: Model, backends: Sequence[Backend],
                 scheduler: Scheduler | None = None, profile_splits: bool = False,
                 reuse_decode_graph: bool = True, n_ubatch: int = 512,
                 swa_full: bool = False) -> None:
        from ggml_py.sched import Scheduler
        instance_arg(model, Model, "model")
        instance_arg(scheduler, Scheduler, "scheduler", optional=True)
        self.model = model
        self.backends = list(backends)
        self.cache = KVCache(model, n_ubatch, swa_full)
        self.sched = scheduler or Scheduler(self.backends, graph_size=graph_size(model.config))
        self.sched.runtime.sync_splits = bool(profile_splits)
        self.history: list[StepStats] = []
        self.graph: Graph | None = None     # the last forward graph (split as sched.splits)
        self.decode = DecodeGraph(model, self.cache) if reuse_decode_graph else None
        self._layout: list[tuple[str, int, int, int]] = []     # the last plan's splits

    def forward(self, tokens: Sequence[int] | np.ndarray, logits: str = "all") -> np.ndarray:
        """Run `tokens` through the model after the cached ones (llama_decode: build the
        graph, allocate it, set the inputs, compute); returns their logits, numpy
        [n_outputs, n_vocab]."""
        t0 = time.perf_counter()
        tokens = token_ids(tokens, self.model.config)
        if self.decode is not None and tokens.size == 1:
            fw, graph_reused = self.decode.forward(tokens, logits)
        else:
            fw, graph_reused = build_forward(self.model, self.cache, tokens, logits=logits), False
        t1 = time.perf_counter()
        sched = self.sched
        reuses = sched.n_graph_reuses
        sched.reset()
        sched.alloc_graph(fw.graph)
        plan_reused = sched.n_graph_reuses > reuses
        tensor_set_all(fw.inputs)
        sched.profile.reset()
        t2 = time.perf_counter()
        status = sched.graph_compute(fw.graph)
        t3 = time.perf_counter()
        if status != Status.SUCCESS:
            raise BackendError(f"graph compute of {self.model.config.name}: {status.name}")
        out = tensor_values(fw.logits).reshape(fw.n_outputs, -1)
        self.cache.advance(fw.n_tokens, fw.swa)
        self.graph = fw.graph
        self.history.append(self._stats(fw, t1 - t0, t2 - t1, t3 - t2, sched.profile,
                                        graph_reused, plan_reused))
        return out

    def _stats(self, fw, build_s, alloc_s, compute_s, profile, graph_reused, plan_reused):
        s = self.sched
        if not (plan_reused and self._layout):      # a kept plan keeps its splits
            self._layout = [(sp.backend.name, sp.i_end - sp.i_start, len(sp.inputs),
                             sum(t.nbytes for t in sp.inputs)) for sp in s.splits]
        splits = [SplitStats(*layout) for layout in self._layout]
        for st, p in zip(splits, profile.splits):
            st.bytes_copied, st.copy_s, st.compute_s = p.bytes_copied, p.copy_s, p.compute_s
        return StepStats("prompt" if fw.n_tokens > 1 else "decode", fw.n_tokens,
                         fw.graph.n_nodes, s.n_splits, s.n_copies, build_s, alloc_s, compute_s,
                         splits, graph_reused, plan_reused)

    def generate(self, prompt: Sequence[int], n_new: int,
                 on_step: Callable[[int], None] | None = None) -> list[int]:
        """Greedy decoding: the prompt in one pass, then one token per step; the new ids.
        on_step(i) is called after each forward pass (i = 0: the prompt's), when the
        step's graph, splits and history entry are current."""
        logits = self.forward(prompt, logits="last")
        if on_step is not None:
            on_step(0)
        out = []
        for i in range(n_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            if i + 1 < n_new:
                logits = self.forward([tok], logits="last")
                if on_step is not None:
                    on_step(i + 1)
        return out

    def reset(self) -> None:
        """Empty the KV cache and the history: the next step starts a new sequence."""
        self.cache.clear()
        self.history.clear()
