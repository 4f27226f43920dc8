"""The backend scheduler: split a graph over backends as ggml_backend_sched does.

`Scheduler` is the thin, checked Python face of the Cython core
(`ggml_py._schedcore.SchedCore`); `Scheduler.plan()` gives what a split decided in the
plan-file format of SCHED_CASES.md (`ggml_py.plan`). ggml's C-style names are provided as aliases at
the bottom, so code written against ggml's API reads the same.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Concatenate, Iterable, Iterator, Mapping,
                    ParamSpec, Sequence, TypeVar, overload)

import numpy as np

from ggml_py._backend import Backend, BufferType
from ggml_py._core import Graph, Tensor, instance_arg, int_arg, items_arg
from ggml_py._schedcore import SchedCore
from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, BackendError,
                            SchedulerError)
from ggml_py._backend import get_buffer, is_written, mark_written
from ggml_py.arrays import describe, read, write
from ggml_py.plan import Plan
from ggml_py.runtime import Runtime, Split, Status
from ggml_py.sched_debug import log_assignments

if TYPE_CHECKING:
    from ggml_py._types import BackendRef, EvalCallback
    from ggml_py.runtime import Profile

    Array = np.ndarray[Any, Any]       # what get_output and run return

MAX_BACKENDS = 16        # GGML_SCHED_MAX_BACKENDS
MAX_SPLIT_INPUTS = 30    # GGML_SCHED_MAX_SPLIT_INPUTS
MAX_COPIES = 4           # GGML_SCHED_MAX_COPIES
MAX_GRAPH_SIZE = 2**31 - 1   # ggml's graph sizes are C ints
MAX_BACKENDS_LIMIT = 64      # the most max_backends may be (the core's C limit)


def _env_int(name: str) -> int:
    value = os.environ.get(name, "0") or "0"
    try:
        return int(value)
    except ValueError:
        raise ArgumentError(f"environment variable {name} must be an integer, got "
                            f"{value!r}") from None


def _check_graph(graph: object) -> None:
    instance_arg(graph, Graph, "graph")


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[Scheduler, _P], _R]
            ) -> Callable[Concatenate[Scheduler, _P], _R]:
    """Run `method` holding the scheduler's lock: a scheduler is one piece of C state,
    so calls from several threads take turns (hold `sched.lock` to make a sequence of
    calls -- alloc, set inputs, compute, read -- one turn)."""
    def locked(self: Scheduler, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        # (a Scheduler itself without the checking call: a kept decode step's price)
        with (self if type(self) is Scheduler else _scheduler(self)).lock:
            return method(self, *args, **kwargs)
    functools.update_wrapper(locked, method)
    return locked


def _scheduler(sched: object) -> Scheduler:
    checked: Scheduler = instance_arg(sched, Scheduler, "sched")
    return checked


class Scheduler:
    """Splits graphs over `backends` (priority order; the last must be a CPU).

    buffer_types: the buffer type each backend allocates in (default: its own).
    graph_size: the most nodes plus leafs a graph may have (sizes the hash set).
    parallel: pipeline parallelism, `max_copies` copies of every split input.
    op_offload: let higher-priority backends take ops whose weights are on the host.
    debug_realloc: GGML_SCHED_DEBUG_REALLOC (default: from the environment). ggml aborts on
        an unexpected reallocation (1) or on every one (2); here they warn, or raise
        SchedulerError(kind='unexpected-realloc') with `realloc_raises`. `n_reallocs`
        and `n_unexpected_reallocs` count them always.
    validate: prove every allocation sound (default: GGML_PY_VALIDATE_ALLOC).
    graph_reuse: keep the plan and allocation of the graph allocated last across a
        reset, and give them to alloc_graph / split_graph / graph_compute of the same
        Graph again while it, its tensors, the user assignments and the buffers are
        unchanged (see README, "Graph reuse"); `n_graph_reuses` counts the reuses.
        alloc_graph / graph_compute of a newly built graph equal to the last one take
        the plan too, re-pointed at its tensors (`n_graph_rebuilt_reuses` counts these,
        which `n_graph_reuses` includes).
    max_split_inputs / max_graph_inputs / max_copies / max_backends: ggml's fixed limits
        (30, 30, 4, 16), here arguments.
    copy_all_inputs: with pipeline parallelism, give every input leaf of the graph its
        copies, read by a node or not, as the ggml of llama.cpp 0.3.36 does (its pass 6);
        ggml 0.10.1 copies only the inputs nodes read.
    check_inputs: graph_compute refuses (SchedulerError, kind 'input-not-written') a
        graph whose inputs were not written since the allocation placed them, naming them,
        where ggml computes from whatever bytes lie there. A graph input is a leaf of the
        graph that the scheduler's allocation gave memory (a leaf without memory of its
        own, INPUT flag or not); written means by set_input, Tensor.write, a backend's
        set_tensor or any tensor_set / memset / copy into it, or by a node of the graph
        that computes into it (CPY, SET_ROWS, ...). Pre-allocated tensors (weights,
        caches, inputs in your own buffers) are not checked. Default on; also a
        per-call argument of graph_compute.

    Threads: every call takes the scheduler's `lock` (an RLock), so concurrent calls
    take turns; hold `with sched.lock:` around a whole alloc / set inputs / compute /
    read sequence. Separate schedulers run in parallel. `close()` (or leaving a `with
    Scheduler(...) as sched:` block, or dropping the scheduler) gives the graph its own
    sources back and releases the compute buffers.
    """

    def __init__(self, backends: Iterable[Backend],
                 buffer_types: Iterable[BufferType] | None = None, graph_size: int = 2048,
                 parallel: bool = False, op_offload: bool = False, *,
                 max_backends: int = MAX_BACKENDS, max_split_inputs: int = MAX_SPLIT_INPUTS,
                 max_copies: int = MAX_COPIES, max_graph_inputs: int | None = None,
                 debug_realloc: int | None = None, realloc_raises: bool = False,
                 validate: bool | None = None, graph_reuse: bool = True,
                 check_inputs: bool = True, copy_all_inputs: bool = False) -> None:
        self.lock = threading.RLock()
        backends = items_arg(backends, "backends", of=Backend)
        if not backends:
            raise SchedulerError("a scheduler needs at least one backend (the CPU, last)",
                                 "no-backends")
        max_backends = int_arg(max_backends, "max_backends", 1, MAX_BACKENDS_LIMIT)
        if len(backends) > max_backends:
            raise SchedulerError(f"{len(backends)} backends is more than max_backends={max_backends}",
                                 "too-many-backends")
        if len({id(b) for b in backends}) != len(backends):
            raise BackendError("a backend is listed twice")
        if backends[-1].device_type != "cpu":
            raise SchedulerError(f"the last backend must be a CPU backend (ggml's fallback), "
                                 f"but {backends[-1].name} is a {backends[-1].device_type} backend",
                                 "last-backend-not-cpu")
        if buffer_types is None:
            buffer_types = [b.buffer_type for b in backends]
        buffer_types = items_arg(buffer_types, "buffer_types", of=BufferType)
        if len(buffer_types) != len(backends):
            raise BackendError(f"{len(buffer_types)} buffer types for {len(backends)} backends")
        for b, buft in zip(backends, buffer_types):
            if not b.supports_buft(buft):
                raise SchedulerError(f"backend {b.name} cannot use its buffer type '{buft.name}'",
                                     "backend-rejects-own-buffer-type")
        graph_size = int_arg(graph_size, "graph_size", 1, MAX_GRAPH_SIZE)
        max_split_inputs = int_arg(max_split_inputs, "max_split_inputs", 1, 1 << 16)
        max_copies = int_arg(max_copies, "max_copies", 1, 1 << 16)
        self.backends: list[Backend] = backends
        self.buffer_types: list[BufferType] = buffer_types
        self.graph_size = graph_size
        self.parallel = bool(parallel)
        self.op_offload = bool(op_offload)
        self._core = SchedCore(backends, buffer_types, graph_size, self.parallel, self.op_offload,
                               max_split_inputs, MAX_SPLIT_INPUTS if max_graph_inputs is None
                               else max_graph_inputs, max_copies,
                               _env_int("GGML_SCHED_DEBUG_REALLOC")
                               if debug_realloc is None else debug_realloc, realloc_raises,
                               copy_all_inputs)
        self._core.graph_reuse = bool(graph_reuse)
        self._graph: Graph | None = None
        # graphs whose placements a later alloc_graph took back: their inputs are gone,
        # so graph_compute does not allocate them again behind the user's back
        self._allocated: weakref.ref[Graph] | None = None
        self._displaced: weakref.WeakSet[Graph] = weakref.WeakSet()
        self.debug = _env_int("GGML_SCHED_DEBUG")
        # debug mode: prove every allocation sound (alloc.validate_allocation)
        self.validate = (os.environ.get("GGML_PY_VALIDATE_ALLOC", "0") not in ("", "0")
                         if validate is None else bool(validate))
        self.runtime = Runtime(backends, self.n_copies)   # events per backend and copy slot
        # the split records of the last split, and the core's key of the table they show
        self._split_table: tuple[Split, ...] = ()
        self._split_table_key: bytes | None = None
        self.check_inputs = bool(check_inputs)

    # --- lifetime ---

    @_locked
    def close(self) -> None:
        """Give the graph split last its own sources back, take back the compute-buffer
        placements of the graph allocated last and release the compute buffers. The
        scheduler stays usable: the next alloc_graph allocates again. Dropping the
        scheduler does the same."""
        self.synchronize()
        self._core.close()
        self._graph = None
        self._split_table, self._split_table_key = (), None
        last = self._allocated() if self._allocated is not None else None
        if last is not None:
            self._displaced.add(last)
        self._allocated = None

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state ---

    @_locked
    def reset(self) -> None:
        """Forget the assignments and copies of the last split (ggml_backend_sched_reset)."""
        self._core.reset()

    @_locked
    def split_graph(self, graph: Graph) -> Scheduler:
        """Assign a backend to every node, cut the graph into splits and add the
        copies (ggml_backend_sched_split_graph). Rewires node sources to copies, until
        the next split (of any graph) or close() gives them back."""
        _check_graph(graph)
        self._graph = None
        self._core.split_graph(graph)
        self._graph = graph
        if self.debug:
            log_assignments(self, self.debug)
        return self

    # --- allocation (port of the scheduler's reserve / alloc_graph path) ---

    def _allocation_error(self) -> AllocationError:
        galloc = self._core.galloc
        err = galloc.last_error or "a compute buffer could not be allocated"
        if 0 <= galloc.last_error_id < len(self.backends):
            err = f"backend {self.backends[galloc.last_error_id].name}: {err}"
        e = AllocationError(err)
        e.__cause__ = galloc.last_cause    # raised later: `from` cannot say it there
        return e

    @_locked
    def reserve(self, graph: Graph) -> bool:
        """Size and allocate the compute buffers for a worst-case graph
        (ggml_backend_sched_reserve). Raises AllocationError when a buffer cannot be had."""
        self.synchronize()
        self.split_graph(graph)
        try:
            ok = self._core.reserve_n()
        except AllocationError:
            self.reset()
            raise
        if not ok:
            raise self._allocation_error()
        self.reset()
        return True

    @_locked
    def reserve_size(self, graph: Graph) -> dict[str, int]:
        """The compute-buffer size each backend would need for `graph`, without
        allocating (ggml_backend_sched_reserve_size). {backend name: bytes}."""
        self.reset()
        self.synchronize()
        self.split_graph(graph)
        sizes = self._core.reserve_n_size()
        return {b.name: n for b, n in zip(self.backends, sizes)}

    @_locked
    def alloc_graph(self, graph: Graph) -> bool:
        """Split `graph` and place it in the compute buffers (ggml_backend_sched_alloc_graph).
        Reuses the last reservation when the graph's backends did not change. Raises
        AllocationError naming the buffer type and size when memory cannot be had.

        The graph allocated before gives its placements back (its tensors read as
        unallocated until it is allocated again), so several graphs can take turns on
        one scheduler as in ggml: allocate each before computing it."""
        _check_graph(graph)
        self._graph = None
        ok = self._core.alloc_graph(graph)
        self._graph = graph
        if not ok:
            self.reset()
            raise self._allocation_error()
        last = self._allocated() if self._allocated is not None else None
        if last is not None and last is not graph:
            self._displaced.add(last)
        self._displaced.discard(graph)
        self._allocated = weakref.ref(graph)
        if self.debug:
            log_assignments(self, self.debug)
        if self.validate:
            self.validate_allocation()
        return True

    @_locked
    def validate_allocation(self) -> int:
        """Prove the allocated graph copy sound: every tensor inside its buffer, no two
        tensors alive at the same time sharing bytes. Raises AllocationError listing the
        problems; returns the number of tensors checked."""
        from ggml_py.alloc import validate_allocation
        if not self.is_alloc:
            raise SchedulerError("no graph is allocated")
        nodes, _, leafs, _ = self.graph_copy
        copy = Graph.from_lists(nodes, leafs, allow_duplicates=True)
        return validate_allocation(copy, self._core.galloc)

    @_locked
    def synchronize(self, raise_errors: bool = True) -> None:
        """Wait for every backend (ggml_backend_sched_synchronize), then raise the first
        error an asynchronous backend reported (every backend is waited for even so)."""
        self._synchronize(raise_errors)

    def _synchronize(self, raise_errors: bool = True) -> None:
        """synchronize, the lock held."""
        first = None
        for b in self.backends:
            try:
                b.synchronize()
            except BackendError as e:
                first = first or e
        self._core.synchronize_copy()
        if first is not None and raise_errors:
            raise first

    # --- compute: the scheduler decides, the runtime (ggml_py.runtime) executes ---

    @_locked
    def graph_compute(self, graph: Graph, *, check_inputs: bool | None = None) -> Status:
        """Allocate `graph` if needed, run its splits and wait for every backend
        (ggml_backend_sched_graph_compute). Returns Status.SUCCESS, ABORTED (the eval
        callback cancelled) or ALLOC_FAILED; a failing kernel raises ComputeError and
        the scheduler stays usable. Computing again without reset() reuses the split
        and the allocation. A graph input never written since its allocation is a
        SchedulerError (kind 'input-not-written') naming it, unless `check_inputs` (default:
        the scheduler's) is False: see Scheduler."""
        _check_graph(graph)
        try:
            status = self._compute_async(graph, check_inputs)
        except BaseException:
            # leave no queue running when the caller resets; the first error is the one raised
            self._synchronize(raise_errors=False)
            raise
        self._synchronize()
        return status

    @_locked
    def graph_compute_async(self, graph: Graph, *, check_inputs: bool | None = None) -> Status:
        """graph_compute without the final synchronize; call synchronize() before
        reading results (ggml_backend_sched_graph_compute_async)."""
        _check_graph(graph)
        return self._compute_async(graph, check_inputs)

    def _compute_async(self, graph: Graph, check_inputs: bool | None) -> Status:
        """graph_compute_async, the lock held and `graph` checked."""
        core = self._core
        if not core.is_reset and not core.is_alloc:
            self.reset()
        if not core.is_alloc:
            # ggml allocates the graph here. Where it was allocated before, its inputs were
            # set in that allocation: allocating again must leave them in place, or ggml
            # would compute from bytes that are not the user's
            lost = graph in self._displaced
            inputs = _placed_inputs(graph)
            written = [(t, get_buffer(t), t.data_address) for t in graph.leafs
                       if is_written(t)]
            try:
                self.alloc_graph(graph)
            except MemoryError:
                return Status.ALLOC_FAILED
            if lost or _placed_inputs(graph, inputs) != inputs:
                self.reset()
                raise SchedulerError(
                    "graph_compute: the graph had to be allocated again (after a reset or "
                    "another graph's allocation) and its inputs did not keep their memory. "
                    "Call alloc_graph(graph), set its inputs, then compute", "inputs-lost")
            # the inputs kept their memory and what was written there: still written
            for t, buf, address in written:
                if get_buffer(t) is buf and t.data_address == address:
                    mark_written(t)
        elif self._graph is not graph:
            raise SchedulerError("graph_compute: the scheduler holds another allocated graph; "
                                 "call alloc_graph(graph) (or reset()) first", "already-allocated")
        if self.check_inputs if check_inputs is None else check_inputs:
            missing = core.unwritten_inputs(graph)
            if missing:
                self._refuse_unwritten(missing)
        if core.away_views:
            self._refuse_unreachable_views(graph)
        return self.runtime.compute_splits(graph, self._splits(), core.cur_copy)

    def _splits(self) -> tuple[Split, ...]:
        """The split records of the allocated graph with their copies in the current
        copy slot, made again only when the core's table changed: a kept plan hands the
        runtime the same records step after step."""
        key = self._core.split_table_key()
        if key != self._split_table_key:
            core, backends = self._core, self.backends
            self._split_table = tuple(
                Split(backends[b], b, i0, i1, tuple(inputs), tuple(core.get_split_copies(k)))
                for k, (b, i0, i1, inputs) in enumerate(core.get_splits()))
            self._split_table_key = key
        return self._split_table

    def _refuse_unreachable_views(self, graph: Graph) -> None:
        """A view the user assigned away from its memory (cause 'usr.away') is planned as
        ggml plans it: its readers on that backend read the view_src's memory in place, and
        a backend that cannot use the assigned one's memory copies the view at the start of
        its split. Refused where that computes from the wrong bytes: the assigned backend
        cannot use the memory, or the copy is made before the view_src is computed."""
        splits = self._splits()
        for i, b in self._core.away_views:
            view, backend = graph.node(i), self.backends[b]
            base = view.view_src
            if base is None:
                continue
            buf = get_buffer(base)
            if buf is not None and not backend.supports_buft(buf.buffer_type):
                why = (f"which cannot use the memory it views: its view_src '{base.name}' "
                       f"lives in buffer type '{buf.buffer_type.name}'")
            else:
                early = next((s.backend for s in splits
                              if view in s.inputs and any(graph.node(k) == base
                                                          for k in range(s.i_start, s.i_end))),
                             None)
                if early is None:
                    continue
                why = (f"and {early.name} would copy it at the start of the split that "
                       f"computes its view_src '{base.name}', before it is "
                       f"computed")
            raise SchedulerError(
                f"graph_compute: view '{view.name}' is assigned to backend {backend.name}, "
                f"{why}. Leave the view unassigned (it then runs where its view_src "
                f"lives) or assign it to a backend that can use that memory",
                "view-assigned-away")

    def _refuse_unwritten(self, missing: list[Tensor]) -> None:
        names = ", ".join(describe(t) + ("" if "INPUT" in t.flags else " (not flagged INPUT)")
                          for t in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        e = SchedulerError(
            f"graph_compute: {len(missing)} graph input{'s' if len(missing) > 1 else ''} "
            f"{'were' if len(missing) > 1 else 'was'} not written since alloc_graph gave "
            f"{'them' if len(missing) > 1 else 'it'} memory, which holds other tensors' "
            f"bytes: {names}{more}. Write each with sched.set_input(t, array) after "
            f"alloc_graph (a weight: place it in its own buffer, see README 'Your own "
            f"graph'); Scheduler(check_inputs=False) or graph_compute(g, check_inputs=False) "
            f"computes regardless", "input-not-written")
        e.tensors = missing      # type: ignore[attr-defined]
        raise e

    # --- numpy in and out ---

    @_locked
    def set_input(self, tensor: Tensor, array: Any) -> None:
        """Write a numpy array (or anything np.asarray takes) into `tensor` after
        alloc_graph, wherever the tensor lives. Its shape must be the tensor's (numpy
        order); its values are converted to the tensor's type with ggml's rounding (f32
        to f16, bf16 or a block type; integers checked against the range): see
        ggml_py.arrays. Errors name the tensor, both shapes and the dtype."""
        instance_arg(tensor, Tensor, "tensor")
        if get_buffer(tensor) is None:
            raise SchedulerError(
                f"set_input: tensor {describe(tensor)} has no memory yet: call "
                f"sched.alloc_graph(graph) first, then set the graph's inputs", "not-allocated")
        write(tensor, array)

    @_locked
    def get_output(self, tensor: Tensor, dtype: Any = None, *, copy: bool = True) -> Array:
        """The values of `tensor` after graph_compute as a numpy array of its numpy-order
        shape, read wherever it lives (after waiting for the backends): float32 for f32,
        bf16 and the block types, the stored dtype for f16, f64 and the integer types;
        `dtype` converts. A copy; `copy=False` gives a read-only view where the memory is
        the host's and no conversion is needed (the next compute may overwrite it). Flag
        outputs with `set_output()` so that no later node takes their memory."""
        instance_arg(tensor, Tensor, "tensor")
        self.synchronize()
        return read(tensor, dtype, copy)

    @overload
    def run(self, graph: Graph, inputs: Mapping[Tensor, Any], outputs: Tensor) -> Array: ...

    @overload
    def run(self, graph: Graph, inputs: Mapping[Tensor, Any],
            outputs: Sequence[Tensor]) -> list[Array]: ...

    def run(self, graph: Graph, inputs: Mapping[Tensor, Any],
            outputs: Tensor | Sequence[Tensor]) -> Array | list[Array]:
        """One step, as ONNX Runtime's run(): alloc_graph(graph) unless it is the graph
        allocated last, set_input for each {tensor: array} of `inputs`, graph_compute, and
        get_output of `outputs` (a tensor: its array; a sequence: a list of them). Another
        graph allocated before needs reset() first, as for alloc_graph. SchedulerError
        (kind 'not-computed') where the compute did not finish (the eval callback
        cancelled it)."""
        with self.lock:
            _check_graph(graph)
            if not isinstance(inputs, Mapping):
                raise ArgumentTypeError(f"run: inputs is a mapping of tensors to arrays, got "
                                        f"{type(inputs).__name__}")
            if not (self.is_alloc and self._graph is graph):
                self.alloc_graph(graph)
            for tensor, array in inputs.items():
                self.set_input(tensor, array)
            status = self.graph_compute(graph)
            if status != Status.SUCCESS:
                raise SchedulerError(f"run: graph_compute returned {status.name}", "not-computed")
            if isinstance(outputs, Tensor):
                return self.get_output(outputs)
            return [self.get_output(t) for t in items_arg(outputs, "run: outputs", Tensor)]

    @_locked
    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """callback(tensor, ask) -> bool, or None to remove it. With ask=True the
        scheduler asks whether the user wants to observe the node; with ask=False the
        node has been computed and is shown. Returning False then cancels the whole
        graph compute (ggml's documented behaviour; ggml itself only stops the split),
        and graph_compute returns Status.ABORTED."""
        if callback is not None and not callable(callback):
            raise ArgumentTypeError(f"the eval callback must be callable or None, got "
                                    f"{type(callback).__name__}")
        self.runtime.callback = callback

    @property
    def profile(self) -> Profile:
        """The runtime's Profile, accumulated over graph computes (profile.reset())."""
        return self.runtime.profile

    @_locked
    def get_buffer_size(self, backend: BackendRef) -> int:
        """Bytes of the backend's compute buffer (0 when it shares an earlier backend's)."""
        return self._core.galloc.get_buffer_size(self.backend_id(backend))

    def get_buffer_type(self, backend: BackendRef) -> BufferType:
        """The buffer type the scheduler allocates in for `backend` (object, name or index)."""
        return self.buffer_types[self.backend_id(backend)]

    @_locked
    def get_chunk_sizes(self, backend: BackendRef) -> list[int]:
        """Sizes of the chunks of the backend's compute buffer ([] when it has none)."""
        return self._core.galloc.chunk_sizes(self.backend_id(backend))

    @_locked
    def tensor_location(self, tensor: Tensor) -> tuple[str | None, int | None, int | None]:
        """(buffer type name, offset, chunk) of a tensor's data after alloc_graph."""
        return self._core.galloc.tensor_location(tensor)

    @_locked
    def hash_stats(self) -> dict[str, float]:
        """Slots read per lookup of the scheduler's hash set, counted, beside a uniformly
        random hash's at the same load (Graph.hash_stats says which keys)."""
        return self._core.hash_stats()

    @property
    def is_alloc(self) -> bool:
        """Is the last split graph allocated (alloc_graph, and no reset since)?"""
        return self._core.is_alloc

    @property
    def is_reset(self) -> bool:
        """Has the scheduler been reset since its last allocation?"""
        return self._core.is_reset

    @property
    def n_reallocs(self) -> int:
        """How many times alloc_graph had to reserve again (ggml's GGML_SCHED_DEBUG_REALLOC)."""
        return self._core.n_reallocs

    @property
    def graph_reuse(self) -> bool:
        """Reuse the last plan and allocation for the same, unchanged graph (default on)."""
        return bool(self._core.graph_reuse)

    @graph_reuse.setter
    def graph_reuse(self, on: bool) -> None:
        with self.lock:
            self._core.graph_reuse = bool(on)

    @property
    def n_graph_reuses(self) -> int:
        """How many splits / allocations took the kept plan instead of splitting."""
        return self._core.n_graph_reuses

    @property
    def n_graph_rebuilt_reuses(self) -> int:
        """How many of them were of a newly built graph equal to the planned one."""
        return self._core.n_graph_rebuilt_reuses

    @property
    def n_unexpected_reallocs(self) -> int:
        """Reallocations although the graph's size and backends did not change."""
        return self._core.n_unexpected_reallocs

    def backend_id(self, backend: BackendRef) -> int:
        """Priority index of a backend given as object, name or index."""
        names = ", ".join(b.name for b in self.backends)
        if isinstance(backend, Backend):
            for i, b in enumerate(self.backends):
                if b is backend:
                    return i
            same = [i for i, b in enumerate(self.backends) if b.name == backend.name]
            if same:
                raise BackendError(
                    f"{backend!r} is not one of this scheduler's backends: it is another "
                    f"object with the name of backend {same[0]} ({backend.name}). Pass the "
                    f"scheduler's own object (sched.backends[{same[0]}]), its name "
                    f"{backend.name!r} or its index {same[0]}")
            raise BackendError(f"{backend!r} is not one of this scheduler's backends ({names})")
        if isinstance(backend, int) and not isinstance(backend, bool):
            if 0 <= backend < len(self.backends):
                return backend
            raise BackendError(f"backend index {backend} is out of range: the scheduler has "
                               f"{len(self.backends)} backends ({names})")
        if isinstance(backend, str):
            for i, b in enumerate(self.backends):
                if b.name == backend:
                    return i
            raise BackendError(f"unknown backend {backend!r}; the scheduler has {names}")
        raise ArgumentTypeError(f"a backend is given as a Backend, its name or its index, "
                                f"got {type(backend).__name__}")

    @_locked
    def set_tensor_backend(self, tensor: Tensor, backend: BackendRef) -> None:
        """Pin a tensor to a backend (a user assignment, kept by every pass)."""
        self._core.set_tensor_backend(tensor, self.backend_id(backend))

    @_locked
    def get_tensor_backend(self, tensor: Tensor) -> Backend | None:
        """The backend a tensor was assigned, or None."""
        i = self._core.get_tensor_backend_id(tensor)
        return None if i < 0 else self.backends[i]

    @_locked
    def get_cause(self, tensor: Tensor) -> str:
        """Why the tensor got its backend: the pass and rule ('1.wgt0', '2.sup', 'usr', ...)."""
        return self._core.get_cause(tensor)

    @property
    def n_backends(self) -> int:
        """The number of backends."""
        return len(self.backends)

    @property
    def n_splits(self) -> int:
        """The splits of the last split graph (ggml_backend_sched_get_n_splits)."""
        return self._core.n_splits

    @property
    def n_copies(self) -> int:
        """Copy slots of each split input: 1, or more with pipeline parallelism."""
        return self._core.n_copies

    @property
    def hash_size(self) -> int:
        """Slots of the scheduler's hash set of tensors."""
        return self._core.hash_size

    def get_backend(self, i: int) -> Backend:
        """The backend of priority index i (ggml_backend_sched_get_backend)."""
        if isinstance(i, bool) or not isinstance(i, int):
            raise ArgumentTypeError(f"a backend index is an int, got {type(i).__name__}")
        return self.backends[self.backend_id(i)]

    # --- results ---

    def _require_split(self) -> Graph:
        """The graph split last (SchedulerError where none is)."""
        if self._graph is None:
            raise SchedulerError("no graph has been split yet")
        return self._graph

    @property
    @_locked
    def splits(self) -> list[Split]:
        """The splits of the last split graph: backend, node range and inputs each."""
        self._require_split()
        return [Split(self.backends[b], b, i0, i1, tuple(inputs))
                for b, i0, i1, inputs in self._core.get_splits()]

    @property
    @_locked
    def graph_inputs(self) -> list[Tensor]:
        """The INPUT tensors of the last split graph that get a copy per slot (pipeline
        parallelism: n_copies > 1; else none)."""
        self._require_split()
        return self._core.get_graph_inputs()

    @property
    @_locked
    def graph_copy(self) -> tuple[list[Tensor], list[Backend | None], list[Tensor],
                                  list[Backend | None]]:
        """(nodes, node_backends, leafs, leaf_backends) of the graph that is allocated and run."""
        self._require_split()
        nodes, nids, leafs, lids = self._core.get_graph_copy()
        be = self.backends
        return nodes, [be[i] if i >= 0 else None for i in nids], leafs, \
            [be[i] if i >= 0 else None for i in lids]

    @_locked
    def describe(self, tensor: Tensor) -> tuple[Any, ...] | None:
        """None for a user tensor; ('copy', of, backend, slot) or ('dep', of) for the
        scheduler's copies and dependency views."""
        d = self._core.describe(tensor)
        if d is not None and d[0] == "copy":
            return ("copy", d[1], self.backends[d[2]], d[3])
        return d

    @_locked
    def token(self, tensor: Tensor | None) -> int | str | None:
        """Plan-file token: the tensor's id, 'ID@BACKEND#C' for a copy, 'dep:ID'."""
        if tensor is None:
            return None
        d = self._core.describe(tensor)
        if d is None:
            return tensor.id
        if d[0] == "copy":
            return f"{d[1].id}@{self.backends[d[2]].name}#{d[3]}"
        return f"dep:{d[1].id}"

    @_locked
    def plan_tables(self, graph: Graph) -> dict[str, Any]:
        """What the plan file says of every node, leaf and source of the last split of
        `graph`, read in bulk (Plan.from_scheduler): node_backends, leaf_backends,
        node_srcs, graph_copy and node_causes as the plan file writes them, and once
        allocated the graph copy's tensor_location lists graph_copy_nodes/_leafs."""
        self._require_split()
        _check_graph(graph)
        return self._core.plan_tables(graph, [b.name for b in self.backends], self.is_alloc)

    @_locked
    def plan(self, name: str = "") -> Plan:
        """The plan of the last split, in the plan-file format; with its `alloc`
        block when the graph was allocated (alloc_graph)."""
        graph = self._require_split()
        # every node's and source's answer from the scheduler's tables in one call
        tables = self.plan_tables(graph)
        tok = self.token
        splits = [{"backend": s.backend.name, "i_start": s.i_start, "i_end": s.i_end,
                   "inputs": [tok(t) for t in s.inputs]} for s in self.splits]
        alloc = None
        if self.is_alloc:
            names = [b.name for b in self.backends]
            alloc = {
                "buffer_sizes": {n: self.get_buffer_size(i) for i, n in enumerate(names)},
                "chunk_sizes": {n: self.get_chunk_sizes(i) for i, n in enumerate(names)},
                "graph_copy_nodes": tables["graph_copy_nodes"],
                "graph_copy_leafs": tables["graph_copy_leafs"],
            }
        return Plan(case=name, n_splits=self.n_splits, splits=splits,
                    node_backends=tables["node_backends"],
                    leaf_backends=tables["leaf_backends"], node_srcs=tables["node_srcs"],
                    graph_inputs=[tok(t) for t in self.graph_inputs],
                    graph_copy=tables["graph_copy"], causes=tables["node_causes"],
                    alloc=alloc)

    def walk(self, graph: Graph) -> Iterator[tuple[int, Tensor, int, Split | None]]:
        """(node index, node, split index, the split where it starts here else None) for
        every node of the graph split last: the walk of every split table."""
        _check_graph(graph)
        splits = self.splits
        k = -1
        for i, node in enumerate(graph.nodes):
            start = k + 1 < len(splits) and splits[k + 1].i_start == i
            if start:
                k += 1
            yield i, node, k, splits[k] if start else None


def _placed_inputs(graph: Graph, like: Any = None) -> dict[Tensor, tuple[Any, int]]:
    """{input tensor: (buffer, address)} of the graph's INPUT tensors that have memory
    (with `like`: of the tensors in it)."""
    tensors = graph.leafs + graph.nodes if like is None else like
    return {t: (get_buffer(t), t.data_address) for t in tensors
            if "INPUT" in t.flags and t.data_address}


# ---------------------------------------------------------------------------
# ggml's C-style names, as thin aliases

def ggml_backend_sched_new(backends: Sequence[Backend], bufts: Sequence[BufferType] | None,
                           n_backends: int, graph_size: int, parallel: bool,
                           op_offload: bool) -> Scheduler:
    """ggml_backend_sched_new: a Scheduler over the first n_backends backends (and buffer
    types; None: each backend's default)."""
    n = int_arg(n_backends, "n_backends", 0, MAX_BACKENDS_LIMIT)
    backends = items_arg(backends, "backends")[:n]
    bufts = None if bufts is None else items_arg(bufts, "bufts")[:n]
    return Scheduler(backends, bufts, graph_size, parallel, op_offload)


def ggml_backend_sched_free(sched: Scheduler) -> None:
    """ggml_backend_sched_free: close the scheduler (Scheduler.close)."""
    _scheduler(sched).close()


ggml_backend_sched_reset = Scheduler.reset
ggml_backend_sched_split_graph = Scheduler.split_graph
ggml_backend_sched_set_tensor_backend = Scheduler.set_tensor_backend
ggml_backend_sched_get_tensor_backend = Scheduler.get_tensor_backend
ggml_backend_sched_get_backend = Scheduler.get_backend
ggml_backend_sched_graph_compute = Scheduler.graph_compute
ggml_backend_sched_graph_compute_async = Scheduler.graph_compute_async
ggml_backend_sched_synchronize = Scheduler.synchronize
ggml_backend_sched_set_eval_callback = Scheduler.set_eval_callback


def ggml_backend_sched_get_n_splits(sched: Scheduler) -> int:
    """ggml_backend_sched_get_n_splits: the splits of the last split graph."""
    return _scheduler(sched).n_splits


def ggml_backend_sched_get_n_copies(sched: Scheduler) -> int:
    """ggml_backend_sched_get_n_copies: the copy slots (pipeline parallelism's n_copies)."""
    return _scheduler(sched).n_copies


def ggml_backend_sched_get_n_backends(sched: Scheduler) -> int:
    """ggml_backend_sched_get_n_backends: the number of backends."""
    return _scheduler(sched).n_backends
