"""Timing the scheduler as SCHED_CASES.md times ggml (the benchmarks' and `ggml-py
bench`'s tooling, kept out of the scheduler core): snapshots that restore a graph
between repeated splits, and timed repetitions of split, alloc_graph and reserve, and
of a bare sweep over what any split reads (the memory floor under its cost)."""

from libc.stdlib cimport free
from libc.string cimport memcpy

from ggml_py._ggml cimport *
from ggml_py._core cimport (Graph, ggml_context, checked_calloc, int_arg, tensor_changed,
                            scan_sources, source_mask, lowest_bit, prefetch_leaf_ahead,
                            prefetch_node_ahead, graph_tensor)
from ggml_py._schedcore cimport SchedCore
from ggml_py._reuse cimport sched_reset, forget_plan
from ggml_py._schedalloc cimport sched_split_graph, sched_alloc_graph

from ggml_py.errors import AllocationError, SchedulerError

from time import perf_counter_ns

_INT32_MAX = (1 << 31) - 1


# ---------------------------------------------------------------------------
# graph snapshots: the split rewires sources and sets flags in the user's graph

cdef class GraphSnapshot:
    """Sources, flags, data and buffer of every tensor of a graph, to restore
    between repeated splits (benchmarks, re-planning). It keeps alive whatever the
    saved pointers reach, and a buffer released since is not restored."""
    cdef ggml_tensor ** tensors
    cdef ggml_tensor ** srcs            # [n][GGML_MAX_SRC]
    cdef int * flags
    cdef char ** data
    cdef ggml_backend_buffer ** buffers
    cdef int n
    cdef object graph
    cdef set _keep                      # contexts of the saved sources, buffers

    def __cinit__(self, Graph graph not None):
        cdef ggml_cgraph * g = &graph.graph
        cdef int i, j
        cdef void * last_owner = NULL
        cdef ggml_tensor * src
        self.graph = graph
        self._keep = set()
        self.n = g.n_nodes + g.n_leafs
        self.tensors = <ggml_tensor **>checked_calloc(self.n, sizeof(void *), "a graph snapshot")
        self.srcs = <ggml_tensor **>checked_calloc(self.n, GGML_MAX_SRC * sizeof(void *),
                                                   "a graph snapshot")
        self.flags = <int *>checked_calloc(self.n, sizeof(int), "a graph snapshot")
        self.data = <char **>checked_calloc(self.n, sizeof(void *), "a graph snapshot")
        self.buffers = <ggml_backend_buffer **>checked_calloc(self.n, sizeof(void *),
                                                              "a graph snapshot")
        for i in range(self.n):
            self.tensors[i] = graph_tensor(g, i)
            memcpy(&self.srcs[i * GGML_MAX_SRC], self.tensors[i].src, GGML_MAX_SRC * sizeof(void *))
            self.flags[i] = self.tensors[i].flags
            self.data[i] = self.tensors[i].data
            self.buffers[i] = self.tensors[i].buffer
            if self.buffers[i] != NULL:
                self._keep.add(<object>self.buffers[i].pyobj)
            for j in range(GGML_MAX_SRC):
                src = self.tensors[i].src[j]
                if src != NULL and src.owner != last_owner:
                    last_owner = src.owner
                    self._keep.add(<object>(<ggml_context *>src.owner).pyobj)

    def __dealloc__(self):
        free(self.tensors)
        free(self.srcs)
        free(self.flags)
        free(self.data)
        free(self.buffers)

    cpdef restore(self):
        cdef int i
        for i in range(self.n):
            memcpy(self.tensors[i].src, &self.srcs[i * GGML_MAX_SRC], GGML_MAX_SRC * sizeof(void *))
            self.tensors[i].src_mask = scan_sources(self.tensors[i])
            self.tensors[i].flags = self.flags[i]
            if self.buffers[i] != NULL and self.buffers[i].released:
                self.tensors[i].data = NULL
                self.tensors[i].buffer = NULL
            else:
                self.tensors[i].data = self.data[i]
                self.tensors[i].buffer = self.buffers[i]
            tensor_changed(self.tensors[i])


TIME_SPLIT, TIME_ALLOC, TIME_RESERVE, TIME_REUSE, TIME_SWEEP = 0, 1, 2, 3, 4

cdef extern from *:
    """
    static volatile size_t ggml_py_sweep_sink;
    """
    # what the sweeps read, stored where the compiler must keep it (a sweep whose result
    # went unread would be optimised away)
    size_t sweep_sink "ggml_py_sweep_sink"


cdef size_t sweep_structs(const ggml_cgraph * g) noexcept nogil:
    """Read what any split of g must read, and nothing more: each leaf's first cache
    line and its buffer struct (where its memory is), each node's first line and its
    sources' (what it reads), asking for them ahead as the split's pass 1 does (the same
    helpers). Its time is the memory floor under the split's per-node cost."""
    cdef int i
    cdef uint32_t m
    cdef size_t sink = 0
    cdef const ggml_tensor * t
    # (the helpers' results go into the sink too: a call whose result went unused, to a
    # function that only prefetches, would be optimised away)
    for i in range(g.n_leafs):
        sink += <size_t>prefetch_leaf_ahead(g, i)
        t = g.leafs[i]
        sink += <size_t>t.flags
        if t.buffer != NULL:
            sink += <size_t>t.buffer.usage
    for i in range(g.n_nodes):
        sink += <size_t>prefetch_node_ahead(g, i)
        t = g.nodes[i]
        sink += <size_t>t.op
        m = source_mask(t)
        while m:
            sink += <size_t>t.src[lowest_bit(m)].order
            m &= m - 1
    return sink


def time_reps(SchedCore s not None, Graph graph not None, GraphSnapshot snap not None,
              assignments, reps, what):
    """Times (ns) of `reps` repetitions measured as SCHED_CASES.md times ggml: before
    each, untimed, the graph is restored, the scheduler reset to copy slot 0 and the
    user assignments [(Tensor, backend_id), ...] re-applied. `what` is TIME_SPLIT (the
    split alone), TIME_ALLOC (alloc_graph; in the steady state the reservation is
    reused) or TIME_RESERVE (split + reserve_n + alloc_graph: a new or changed graph);
    these three never reuse a plan. TIME_REUSE times alloc_graph of the unchanged graph
    after a reset (graph reuse: the graph is allocated once first, untimed, and not
    restored between repetitions). TIME_SWEEP times sweep_structs, after the same
    untimed steps as a split."""
    global sweep_sink
    cdef list out = []
    cdef int r, n = int_arg(reps, "reps", 0, _INT32_MAX)
    cdef int kind = int_arg(what, "what", TIME_SPLIT, TIME_SWEEP)
    cdef size_t sink = 0
    cdef bint reuse = s.graph_reuse
    cdef int reuses = s.n_graph_reuses
    clock = perf_counter_ns
    s.graph_reuse = kind == TIME_REUSE
    try:
        if kind == TIME_REUSE:
            snap.restore()
            forget_plan(s)
            sched_reset(s)
            s.pipeline.next_copy = 0
            for t, b in assignments:
                s.set_tensor_backend(t, b)
            if not sched_alloc_graph(s, graph):
                raise AllocationError("time_reps: the graph could not be allocated")
        for r in range(n):
            if kind != TIME_REUSE:
                snap.restore()
                forget_plan(s)
            sched_reset(s)
            s.pipeline.next_copy = 0         # copy slot 0 every time (ggml_backend_sched_synchronize)
            for t, b in assignments:
                s.set_tensor_backend(t, b)
            t0 = clock()
            if kind == TIME_SPLIT:
                sched_split_graph(s, graph)
            elif kind == TIME_SWEEP:
                sink += sweep_structs(&graph.graph)
            elif kind == TIME_ALLOC or kind == TIME_REUSE:
                sched_alloc_graph(s, graph)
            else:
                sched_split_graph(s, graph)
                s.galloc.c_reserve_n(&s.graph_copy.graph, s.graph_copy.node_backend_ids,
                                     s.graph_copy.leaf_backend_ids)
                s.galloc.c_alloc_graph(&s.graph_copy.graph, (graph, s.arena), True)   # as sched_alloc_splits
            out.append(clock() - t0)
        sweep_sink = sink
    finally:
        s.graph_reuse = reuse
        s.plan_reusable = s.plan_reusable and reuse and kind == TIME_REUSE
    s.is_alloc = False
    if kind == TIME_REUSE and s.n_graph_reuses - reuses != n:
        raise SchedulerError(f"time_reps: {s.n_graph_reuses - reuses} of {n} allocations "
                             f"reused the plan (the graph or what it depends on changes)",
                             "no-reuse")
    return out


def time_rebuilt_reps(SchedCore s not None, Graph graph not None, Graph other not None,
                      assignments, other_assignments, reps):
    """Times (ns) of `reps` alloc_graph calls that take the kept plan for a rebuilt graph
    of equal structure (graph reuse level 2: the fingerprint and the re-pointing):
    `graph` and `other` alternate, each after a reset and its user assignments
    [(Tensor, backend_id), ...] (untimed). The first three are not timed: an allocated
    graph keeps its views initialised in the pre-allocated buffers they view, which
    the split reads (a weight's view), so the steady state starts when both graphs
    have been allocated once and the plan was made from one of them in that state."""
    cdef list out = []
    cdef int r, n = int_arg(reps, "reps", 0, _INT32_MAX)
    cdef int reuses = s.n_graph_rebuilt_reuses
    cdef bint reuse = s.graph_reuse
    cdef Graph g
    clock = perf_counter_ns
    s.graph_reuse = True
    try:
        forget_plan(s)
        for r in range(n + 3):
            g, ids = (graph, assignments) if r % 2 == 0 else (other, other_assignments)
            sched_reset(s)
            for t, b in ids:
                s.set_tensor_backend(t, b)
            if r == 3:
                reuses = s.n_graph_rebuilt_reuses
            t0 = clock()
            if not sched_alloc_graph(s, g):
                raise AllocationError("time_rebuilt_reps: the graph could not be allocated")
            if r >= 3:
                out.append(clock() - t0)
            s.is_alloc = False
    finally:
        s.graph_reuse = reuse
    reuses = s.n_graph_rebuilt_reuses - reuses
    if reuses != n:
        raise SchedulerError(f"time_rebuilt_reps: {reuses} of {n} "
                             f"allocations reused the plan (pipeline parallelism, or the graphs "
                             f"differ)", "no-reuse")
    return out
