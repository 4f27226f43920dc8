"""The scheduler's compute runtime: a port of ggml_backend_sched_compute_splits (the
per-backend, per-copy-slot events, the input copies and the MUL_MAT_ID used-expert
copies). A leaf: the Scheduler decides (splits, allocation) and hands the runtime what
to run -- the splits with their input copies and the copy slot -- and the runtime never
reaches back into the scheduler.

For every split, in order:
  1. copy its inputs to the split's backend: user inputs (INPUT flag) at once, after
     the split backend finished with the current copy slot; other inputs after making
     the backend's queue wait for that slot's event, asynchronously when the backend
     can (cpy_tensor_async) and with a blocking copy otherwise; host-resident MoE expert
     weights only for the experts the ids use;
  2. compute the split's nodes on its backend (graph_compute_range(graph, i0, i1): no
     node handles for backends that compute in C), with the eval callback when one is set;
  3. record the backend's event for the copy slot (pipeline parallelism), so the next
     use of the slot's input copies waits until this split is done with them.

Differences from ggml, on purpose:
  * ggml's header says an eval callback that returns false cancels the graph compute,
    but ggml's loop only leaves the current split. Here the whole graph compute stops
    and Status.ABORTED is returned, as documented.
  * A failing kernel raises ComputeError (naming the node and the backend) instead of
    aborting the process; the scheduler stays usable (reset() and compute again).
The runtime also keeps a Profile of what it did (times, bytes, copy kinds, events).
"""

from __future__ import annotations

import enum
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ggml_py._backend import Backend, GraphView, get_buffer, host_bytes, tensor_copy
from ggml_py._core import Graph, Tensor, index_arg, instance_arg, int_arg, items_arg
from ggml_py.errors import OutOfRangeError, SchedulerError

if TYPE_CHECKING:
    from ggml_py._types import EvalCallback

# (an input, its backend's index, its copy on the split's backend)
InputCopy = tuple[Tensor, int, Tensor]


class Status(enum.IntEnum):
    """ggml_status."""
    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


_SUCCESS = Status.SUCCESS       # (an enum member read from its class costs a lookup)


# ---------------------------------------------------------------------------
# profile

@dataclass
class SplitProfile:
    """What one split cost in one graph compute. Times are wall seconds on the caller's
    thread: for an asynchronous backend `compute_s` is the time to enqueue, unless the
    runtime's `sync_splits` is set (then it waits for the backend after each split)."""
    split: int
    backend: str
    n_nodes: int
    n_inputs: int
    copy_s: float = 0.0
    compute_s: float = 0.0
    bytes_copied: int = 0
    n_async: int = 0
    n_sync: int = 0

    @property
    def wall_s(self) -> float:
        """Seconds of copies and compute together."""
        return self.copy_s + self.compute_s


@dataclass
class Profile:
    """Accumulated over graph computes until reset(). bytes_by_pair and seconds_by_pair
    (the time the copies took on the caller's thread) are keyed by (source backend
    name, destination backend name): the links."""
    n_computes: int = 0
    wall_s: float = 0.0
    splits: list[SplitProfile] = field(default_factory=list)    # every compute's
    bytes_by_pair: dict[tuple[str, str], int] = field(default_factory=dict)
    seconds_by_pair: dict[tuple[str, str], float] = field(default_factory=dict)
    n_async_copies: int = 0
    n_sync_copies: int = 0
    n_input_copies: int = 0                 # user inputs (INPUT flag), always blocking
    n_event_records: int = 0
    n_event_waits: int = 0
    n_event_syncs: int = 0
    n_backend_syncs: int = 0                # synchronize() used where no event exists
    moe_bytes_copied: int = 0               # expert ranges copied, padding included
    moe_bytes_saved: int = 0                # whole expert tensors minus the above
    moe_experts_used: list[tuple[str, list[int]]] = field(default_factory=list)  # (name, ids)

    def reset(self) -> None:
        """Every count and time back to zero."""
        self.__dict__.update(Profile().__dict__)

    @property
    def bytes_copied(self) -> int:
        """Bytes copied between backends, over every pair."""
        return sum(self.bytes_by_pair.values())

    def links(self) -> dict[tuple[str, str], dict[str, float]]:
        """Per (source, destination) backend pair: bytes copied and seconds spent."""
        return {k: {"bytes": n, "seconds": self.seconds_by_pair.get(k, 0.0)}
                for k, n in self.bytes_by_pair.items()}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per backend: splits, total copy and compute seconds, bytes copied in."""
        out: dict[str, dict[str, float]] = {}
        for s in self.splits:
            d = out.setdefault(s.backend, {"splits": 0, "copy_s": 0.0, "compute_s": 0.0,
                                           "bytes_in": 0})
            d["splits"] += 1
            d["copy_s"] += s.copy_s
            d["compute_s"] += s.compute_s
            d["bytes_in"] += s.bytes_copied
        return out


# ---------------------------------------------------------------------------
# tensor copies between backends (blocking ones are _backend.tensor_copy)

def _set_tensor_async(backend: Backend, t: Tensor, data: bytes | memoryview,
                      offset: int) -> None:
    """ggml_backend_tensor_set_async: the backend's async set, or where that slot is NULL
    a blocking set."""
    (backend.set_tensor_async or backend.set_tensor)(t, data, offset)


# ---------------------------------------------------------------------------
# the runtime

@dataclass(frozen=True)
class Split:
    """A run of graph nodes [i_start, i_end) computed on `backend` (the scheduler's
    backend `backend_id`), and the tensors copied to it before it runs
    (ggml_backend_sched_split). The records the runtime runs also carry `copies`: each
    (input, its backend's index, its copy on `backend` in the current copy slot), in
    the order of `inputs`; Scheduler.splits leaves them out (they belong to a step)."""
    backend: Backend
    backend_id: int
    i_start: int
    i_end: int
    inputs: tuple[Tensor, ...] = ()
    copies: tuple[InputCopy, ...] = ()

    def __post_init__(self) -> None:
        instance_arg(self.backend, Backend, "Split.backend")
        for what in ("backend_id", "i_start", "i_end"):
            int_arg(getattr(self, what), f"Split.{what}", 0, 2**31 - 1)
        items_arg(self.inputs, "Split.inputs", Tensor)
        items_arg(self.copies, "Split.copies", tuple)


class Runtime:
    """Runs the splits a Scheduler hands it, on its backends. One per scheduler, created
    with it (the events are made then, as ggml_backend_sched_new makes them)."""

    def __init__(self, backends: Sequence[Backend], n_copies: int) -> None:
        self.backends = items_arg(backends, "backends", of=Backend)
        n_copies = int_arg(n_copies, "n_copies", 1, 1 << 16)
        # events[backend][copy slot]; None where the backend has no events, and all None
        # without pipeline parallelism (then synchronize() is used instead)
        self.events = [[b.event_new() if n_copies > 1 else None for _ in range(n_copies)]
                       for b in self.backends]
        self.callback: EvalCallback | None = None
        self.profile = Profile()
        # the split table checked last, with its graph and that graph's size then: a
        # kept plan's steps hand the same (immutable) table over, checked once
        self._checked: tuple[tuple[Split, ...], Graph, int] | None = None
        self.sync_splits = False

    # --- waiting for a copy slot ---

    def _wait_slot_host(self, b: int, backend: Backend, cur: int) -> None:
        """Block the caller until `backend` is done with copy slot `cur`."""
        ev = self.events[b][cur]
        if ev is not None:
            backend.event_synchronize(ev)
            self.profile.n_event_syncs += 1
        else:
            backend.synchronize()
            self.profile.n_backend_syncs += 1

    def _wait_slot_queue(self, b: int, backend: Backend, cur: int) -> None:
        """Make `backend`'s queue wait until it is done with copy slot `cur`."""
        ev = self.events[b][cur]
        if ev is not None:
            backend.event_wait(ev)
            self.profile.n_event_waits += 1
        else:
            backend.synchronize()
            self.profile.n_backend_syncs += 1

    # --- compute ---

    def compute_splits(self, graph: Graph, splits: Sequence[Split], cur: int) -> Status:
        """ggml_backend_sched_compute_splits: run `splits` of `graph` (split and
        allocated by the scheduler), their input copies in copy slot `cur`."""
        if type(cur) is not int or not 0 <= cur < len(self.events[0]):
            cur = int_arg(cur, "copy slot", 0, len(self.events[0]) - 1)
        splits = self._check(graph, splits)
        prof, clock = self.profile, time.perf_counter
        moe: _ExpertCopier | None = None        # made at the first MUL_MAT_ID expert copy
        t_start = clock()
        prof.n_computes += 1
        try:
            for split_id, split in enumerate(splits):
                backend, i0, i1, copies = split.backend, split.i_start, split.i_end, split.copies
                sp = SplitProfile(split_id, backend.name, i1 - i0, len(copies))
                prof.splits.append(sp)
                t1 = clock()
                if copies:
                    moe = self._copy_inputs(graph, split_id, split, sp, cur, moe)
                    sp.copy_s = clock() - t1
                    t1 += sp.copy_s

                if self.callback is None:
                    ok = backend.graph_compute_range(graph, i0, i1)
                    status = _SUCCESS if ok is True else _status(ok)
                else:
                    status = self._compute_observed(backend, graph.nodes[i0:i1])
                if self.sync_splits:
                    backend.synchronize()
                sp.compute_s = clock() - t1
                if status is not _SUCCESS:
                    return status

                # the next use of this slot's input copies must wait for this split
                event = self.events[split.backend_id][cur] if copies else None
                if event is not None:
                    backend.event_record(event)
                    prof.n_event_records += 1
        finally:
            prof.wall_s += clock() - t_start
        return _SUCCESS

    def _copy_inputs(self, graph: Graph, split_id: int, split: Split, sp: SplitProfile,
                     cur: int, moe: _ExpertCopier | None) -> _ExpertCopier | None:
        """Copy the split's inputs into copy slot `cur`, counted in `sp` and the
        profile's links; returns the expert copier, made here at its first use."""
        prof, backends, copies = self.profile, self.backends, split.copies
        b, backend = split.backend_id, split.backend
        first = graph.node(split.i_start) if split.i_end > split.i_start else None
        for input_id, (inp, ib, cpy) in enumerate(copies):
            t_copy = time.perf_counter()
            in_backend = backends[ib]
            nbytes = inp.nbytes
            if "INPUT" in inp.flags:
                # the user may overwrite an input as soon as we return: copy now
                self._wait_slot_host(b, backend, cur)
                tensor_copy(inp, cpy)
                prof.n_input_copies += 1
                sp.n_sync += 1
            else:
                self._wait_slot_queue(b, backend, cur)
                if first is not None and _ExpertCopier.applies(first, inp, cpy):
                    moe = moe or _ExpertCopier(self)
                    nbytes = moe.copy(split_id, first, copies, input_id, b, in_backend, backend)
                    sp.n_async += 1
                elif backend.cpy_tensor_async(in_backend, inp, cpy):
                    prof.n_async_copies += 1
                    sp.n_async += 1
                else:
                    # a blocking copy; the destination needs no full synchronize,
                    # the slot's event is what protects the copy
                    in_backend.synchronize()
                    self._wait_slot_host(b, backend, cur)
                    tensor_copy(inp, cpy)
                    prof.n_sync_copies += 1
                    sp.n_sync += 1
            sp.bytes_copied += nbytes
            key = (in_backend.name, backend.name)
            prof.bytes_by_pair[key] = prof.bytes_by_pair.get(key, 0) + nbytes
            prof.seconds_by_pair[key] = (prof.seconds_by_pair.get(key, 0.0)
                                         + time.perf_counter() - t_copy)
        return moe

    def _check(self, graph: Graph, splits: Sequence[Split]) -> Sequence[Split]:
        """`splits`, each a Split of this runtime's backends over nodes of `graph` (the
        records check themselves when made); a tuple checked last time, with the same
        graph of the same size, is not checked again."""
        checked = self._checked
        if checked is not None and checked[0] is splits and checked[1] is graph and \
                checked[2] == graph.n_nodes:
            return splits
        instance_arg(graph, Graph, "graph")
        table = tuple(items_arg(splits, "splits", Split))
        backends = self.backends
        for split in table:
            if backends[index_arg(split.backend_id, "split backend", len(backends))] \
                    is not split.backend:
                raise SchedulerError(f"split backend {split.backend.name} is not this "
                                     f"runtime's backend {split.backend_id}")
            if not split.i_start <= split.i_end <= graph.n_nodes:
                raise OutOfRangeError(f"split nodes [{split.i_start}, {split.i_end}) are not "
                                      f"in the graph's {graph.n_nodes} nodes")
        if isinstance(splits, tuple):
            self._checked = (splits, graph, graph.n_nodes)
        return table

    def _compute_observed(self, backend: Backend, nodes: list[Tensor]) -> Status:
        """The split's nodes with the eval callback: nodes the user does not ask for are
        computed together up to the next one asked for, which is then shown to the user
        (after a synchronize). ABORTED when the user cancels."""
        cb = self.callback
        assert cb is not None
        n = len(nodes)
        j0 = 0
        while j0 < n:
            j1 = j0
            need = bool(cb(nodes[j1], True))
            while not need and j1 < n - 1:
                j1 += 1
                need = bool(cb(nodes[j1], True))
            status = _status(backend.graph_compute(GraphView(nodes[j0:j1 + 1])))
            if status != Status.SUCCESS:
                return status
            backend.synchronize()
            if need and not cb(nodes[j1], False):
                return Status.ABORTED
            j0 = j1 + 1
        return Status.SUCCESS


def _status(ok: bool | int | None) -> Status:
    """A backend's graph_compute answer as a Status: True / None are success, False a
    failure, anything else a ggml_status value."""
    if ok is True or ok is None:
        return _SUCCESS
    return Status.FAILED if ok is False else Status(ok)


class _ExpertCopier:
    """The MUL_MAT_ID path of compute_splits: when a split starts with a MUL_MAT_ID
    whose expert weights are copied from host memory, copy only the experts its ids
    use, consecutive ones together. The ids are read once per ids tensor."""

    PADDING = 512       # bytes copied past the last expert of a range (CUDA's MMQ reads them)

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.prev_ids: Tensor | None = None
        self.used: np.ndarray[Any, np.dtype[np.int32]] = np.zeros(0, np.int32)

    @staticmethod
    def applies(node: Tensor, inp: Tensor, cpy: Tensor) -> bool:
        """Is `inp` (copied to `cpy`) the expert weights of `node`, a split's first node?"""
        buf = get_buffer(inp)
        return (node.op == "MUL_MAT_ID" and node.src[0] == cpy and buf is not None
                and buf.usage == "weights" and buf.is_host)

    def copy(self, split_id: int, node: Tensor, copies: Sequence[InputCopy], input_id: int, b: int,
             in_backend: Backend, backend: Backend) -> int:
        """Copy the used experts of copies[input_id]; returns the bytes copied."""
        inp, _, cpy = copies[input_id]
        n_expert = inp.ne[2]
        expert_size = inp.nb[2]
        in_backend.synchronize()

        # the ids may be a later input of this split, not copied yet: read the original
        ids_t, ids_backend = node.src[2], backend
        assert ids_t is not None            # (a MUL_MAT_ID has its ids)
        for later, lb, later_cpy in copies[input_id + 1:]:
            if later_cpy == ids_t:
                ids_t, ids_backend = later, self.rt.backends[lb]
                break

        if ids_t != self.prev_ids:
            ids_backend.synchronize()
            raw = ids_backend.get_tensor(ids_t)
            ids: np.ndarray[Any, np.dtype[np.int32]] = np.ndarray(
                (ids_t.ne[1], ids_t.ne[0]), dtype=np.int32, buffer=raw,
                strides=(ids_t.nb[1], ids_t.nb[0]))
            if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
                raise SchedulerError(f"MUL_MAT_ID '{node.name}': expert ids outside "
                                     f"[0, {n_expert}) in '{ids_t.name}'", "bad-expert-id")
            self.used = np.unique(ids)
            self.prev_ids = ids_t

        host = host_bytes(inp)
        copied = 0
        for first, last in _ranges(self.used):
            offset = first * expert_size
            size = (last - first + 1) * expert_size
            # a little more after a range that does not end the tensor, so that no NaNs
            # sit in the padding of its last expert
            if last < n_expert - 1:
                size += min(expert_size, self.PADDING)
            _set_tensor_async(backend, cpy, host[offset:offset + size], offset)
            copied += size
        prof = self.rt.profile
        prof.moe_bytes_copied += copied
        prof.moe_bytes_saved += inp.nbytes - copied
        prof.moe_experts_used.append((inp.name, [int(i) for i in self.used]))
        return copied


def _ranges(sorted_ids: Any) -> list[tuple[int, int]]:
    """Runs of consecutive ids: [0, 1, 2, 5, 7, 8] -> (0, 2), (5, 5), (7, 8)."""
    out: list[list[int]] = []
    for i in sorted_ids:
        i = int(i)
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [(first, last) for first, last in out]


# ---------------------------------------------------------------------------
# timing one backend

def time_graph_compute(backend: Backend, graph: Graph, reps: int = 20,
                       warmup: int = 3) -> dict[str, float]:
    """Median wall time of computing `graph` on `backend` in microseconds (through its
    synchronize, so asynchronous backends are timed to the end), after `warmup` computes
    (which make the executor's plan); {'compute_us_median', 'n_nodes', 'reps'}."""
    instance_arg(backend, Backend, "backend")
    instance_arg(graph, Graph, "graph")
    reps = int_arg(reps, "reps", 1, 1 << 30)
    warmup = int_arg(warmup, "warmup", 0, 1 << 30)

    def once() -> float:
        t0 = time.perf_counter()
        backend.graph_compute(graph)
        backend.synchronize()
        return time.perf_counter() - t0
    for _ in range(warmup):
        once()
    samples = [once() for _ in range(reps)]
    return {"compute_us_median": statistics.median(samples) * 1e6, "n_nodes": graph.n_nodes,
            "reps": reps}
