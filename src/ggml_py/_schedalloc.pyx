"""The scheduler's two steps over the passes and graph reuse: split a graph
(ggml_backend_sched_split_graph: a kept plan when one can be taken, else the passes of
_sched.pyx) and allocate it (ggml_backend_sched_alloc_graph / _alloc_splits: the graph
copy placed by the graph allocator, reserving again where the backends changed)."""

from libc.string cimport memcpy, memcmp

from ggml_py._ggml cimport *
from ggml_py._core cimport Graph, mutation_epoch
from ggml_py._schedtypes cimport *
from ggml_py._schedcore cimport SchedCore
from ggml_py._sched cimport split_passes, check_graph_fits
from ggml_py._reuse cimport (FP_NONE, FP_BUILDABLE, try_reuse, try_reuse_rebuilt, forget_plan,
                             fp_ensure_keys, fp_place, prepare_rotation, rotate_copy_slot)

from ggml_py.errors import SchedulerError


cdef int sched_split_graph(SchedCore s, Graph g) except -1:
    """ggml_backend_sched_split_graph: the kept plan where graph reuse takes it, else a
    fresh split (split_passes) on tables that hold only the user's assignments."""
    if try_reuse(s, g):
        return 0
    forget_plan(s)
    fp_ensure_keys(s)
    s.fp.state = FP_NONE
    # a plan made from fresh tables depends on nothing but the graph and these
    s.plan_assignments = dict(s.user_assignments) if s.tables_fresh else None
    s.tables_fresh = False
    return split_passes(s, g)


cdef inline bint _ids_changed(SchedCore s, const int * ids, const int * prev, int n) noexcept:
    """Did any tensor move to a backend with another buffer type? (ggml reads
    bufts[-1] for a tensor without a backend; here that counts as a change.)"""
    cdef int i
    if memcmp(ids, prev, n * sizeof(int)) == 0:
        return False                    # the steady state: one vectorised compare
    for i in range(n):
        if ids[i] != prev[i]:
            if ids[i] < 0 or prev[i] < 0 or s.bufts[ids[i]] != s.bufts[prev[i]]:
                return True
    return False


cdef int sched_alloc_splits(SchedCore s) except -1:
    """Place the graph copy in the compute buffers, reusing the last reservation
    when the backends did not change; reserve again otherwise. 1 ok, 0 failed."""
    cdef sched_graph_copy * c = &s.graph_copy
    cdef bint changed = (s.plan_stale
                         or _ids_changed(s, c.node_backend_ids, c.prev_node_backend_ids,
                                         c.graph.n_nodes)
                         or _ids_changed(s, c.leaf_backend_ids, c.prev_leaf_backend_ids,
                                         c.graph.n_leafs))
    s.split_pending = False
    s.plan_stale = False
    cdef bint unexpected
    cdef int b
    # the galloc keeps the tensors it places alive: the user's graph and the copies
    owner = (s.last_graph_obj, s.arena)
    if not changed and s.galloc.c_alloc_graph(&c.graph, owner):
        return 1
    # a reallocation (ggml: GGML_SCHED_DEBUG_REALLOC aborts on the unexpected ones)
    unexpected = not changed and c.debug_prev_graph_size == c.debug_graph_size
    s.n_reallocs += 1
    s.n_unexpected_reallocs += unexpected
    if s.opts.debug_realloc > 0 and (unexpected or s.opts.debug_realloc > 1):
        msg = (f"unexpected graph reallocation (graph size = {c.debug_graph_size}, nodes = "
               f"{c.graph.n_nodes}, leafs = {c.graph.n_leafs}, debug_realloc = "
               f"{s.opts.debug_realloc})")
        if s.opts.realloc_raises:
            raise SchedulerError(msg, "unexpected-realloc")
        import warnings
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    # the reallocation may move split inputs: wait for queued work first
    for b in range(s.n_backends):
        (<object>s.backends[b].pyobj).synchronize()
    if not s.galloc.c_reserve_n(&c.graph, c.node_backend_ids, c.leaf_backend_ids):
        return 0
    return s.galloc.c_alloc_graph(&c.graph, owner, True)     # the graph just planned fits


cdef int alloc_again(SchedCore s) except -1:
    """Allocate the kept plan, moved to another copy slot, as alloc_graph allocates a
    fresh split of the same graph there (which leaves the previous backend ids and graph
    size equal to the new ones). 1 ok, 0 failed."""
    cdef sched_graph_copy * c = &s.graph_copy
    memcpy(c.prev_node_backend_ids, c.node_backend_ids, c.graph.n_nodes * sizeof(int))
    memcpy(c.prev_leaf_backend_ids, c.leaf_backend_ids, c.graph.n_leafs * sizeof(int))
    s.graph_copy.debug_prev_graph_size = s.graph_copy.debug_graph_size
    return sched_alloc_splits(s)


cdef int sched_alloc_graph(SchedCore s, Graph graph) except -1:
    """ggml_backend_sched_alloc_graph: split on the next copy slot, then allocate
    (the caller checked that no graph is allocated)."""
    check_graph_fits(s, &graph.graph)      # before the copy slot moves, as ggml checks it
    if try_reuse(s, graph):
        # the kept placements are in place (pipeline parallelism: moved to the next slot)
        if s.pipeline.n_copies > 1:
            rotate_copy_slot(s, s.pipeline.rotates_in_place)
            if not s.pipeline.rotates_in_place:
                if not alloc_again(s):
                    return 0
                s.plan_epoch = mutation_epoch()
        s.is_alloc = True
        return 1
    if try_reuse_rebuilt(s, graph):
        # the plan's backends, and a graph equal to one the reservation placed: no
        # change for sched_alloc_splits to find
        if s.pipeline.n_copies > 1:
            rotate_copy_slot(s, False)
        if s.pipeline.n_copies == 1 or s.pipeline.rotates_in_place:
            fp_place(s)
        elif not alloc_again(s):
            return 0
        if s.pipeline.n_copies > 1:
            prepare_rotation(s)            # the new graph's views of its inputs
        s.is_alloc = True
        s.plan_epoch = mutation_epoch()
        return 1
    s.pipeline.cur_copy = s.pipeline.next_copy
    s.pipeline.next_copy = (s.pipeline.next_copy + 1) % s.pipeline.n_copies
    sched_split_graph(s, graph)
    if not sched_alloc_splits(s):
        return 0
    s.is_alloc = True
    # reusable when made from a reset state; with pipeline parallelism each alloc_graph
    # moves to the next copy slot, which a kept plan does by itself where it can
    s.plan_reusable = s.plan_assignments is not None
    if s.pipeline.n_copies > 1:
        prepare_rotation(s)
    s.plan_epoch = mutation_epoch()
    s.fp.state = FP_BUILDABLE if s.plan_reusable else FP_NONE
    return 1
