"""SchedCore: the scheduler's C state (_schedcore.pxd) and its Python face. The
public API is ggml_py.sched.Scheduler, which checks arguments and adds the Pythonic
API; the passes that fill the state are _sched.pyx, graph reuse _reuse.pyx, and the
split and alloc steps _schedalloc.pyx."""

from libc.stdlib cimport free
from libc.stdint cimport int8_t, uint32_t, uintptr_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

from ggml_py._ggml cimport *
from ggml_py._core cimport (Context, Tensor, Graph, tensor_handle, ggml_hash_set_init,
                            ggml_hash_set_free, hash_probe_stats, ggml_hash_size, ggml_is_view_op,
                            OP_NONE, source_mask, checked_calloc, int_arg, index_arg)
from ggml_py._backend cimport Backend, BufferType, tensor_is_written
from ggml_py._alloc cimport GraphAllocator, tensor_location_list
from ggml_py._schedtypes cimport *
from ggml_py._sched cimport (hash_id, copy_slot, slot_of, sched_tensor_backend_id, undo_rewiring,
                             retire_arena)
from ggml_py._reuse cimport sched_reset, forget_plan, fp_ensure_keys, fingerprint_free
from ggml_py._schedalloc cimport sched_split_graph, sched_alloc_graph

from ggml_py._core import check_memory_available
from ggml_py.errors import ArgumentError, ArgumentTypeError, SchedulerError

CAUSE_NAMES = {CAUSE_NONE: "", CAUSE_USR: "usr", CAUSE_USR_AWAY: "usr.away", CAUSE_1_DST: "1.dst",
               CAUSE_1_VSRC: "1.vsrc", CAUSE_1_INP: "1.inp", CAUSE_1_OFF: "1.off", CAUSE_2_SUP: "2.sup",
               CAUSE_3_BEST: "3.best", CAUSE_3_UPG: "3.upg", CAUSE_4_VSRC: "4.vsrc",
               CAUSE_4_CUR: "4.cur"}
for _i in range(GGML_MAX_SRC):
    CAUSE_NAMES[CAUSE_1_WGT0 + _i] = f"1.wgt{_i}"

_MAX_BACKENDS_C = 64         # the C limit; Scheduler holds ggml's 16 (max_backends)
_MAX_LIMIT = 1 << 16         # split inputs, graph inputs and copies
_INT32_MAX = (1 << 31) - 1


cdef void sweep_free(sched_sweep * w) noexcept:
    free(w.node_slots)
    free(w.outside)
    free(w.node_bits)
    free(w.view_refs)
    free(w.dense_bufts)
    free(w.dense_bits)
    free(w.leaf_refs)
    free(w.compute_nodes)
    free(w.compute_refs)
    free(w.compute_slots)
    free(w.compute_ops)
    free(w.dense_ids)
    free(w.node_refs)
    free(w.src_begin)
    free(w.srcs)
    free(w.pre_indexes)
    free(w.pre_memory)
    free(w.pre_offset)


cdef void graph_copy_free(sched_graph_copy * c) noexcept:
    free(c.graph.nodes)
    free(c.graph.leafs)
    free(c.node_backend_ids)
    free(c.leaf_backend_ids)
    free(c.prev_node_backend_ids)
    free(c.prev_leaf_backend_ids)


cdef inline Py_ssize_t split_input_slot(SchedCore s, int k, ggml_tensor * input) except -1:
    """The hash slot of the k-th split input (over all splits, in order), without re-keying
    the hash set where its keys went stale (the compute of every step asks)."""
    return s.fp.entries[s.fp.input_entries[k]].slot if s.fp.keys_stale else hash_id(s, input)


cdef class SchedCore:
    """The scheduler's C state. Use ggml_py.Scheduler, which checks arguments
    and adds the Pythonic API; this class holds the passes and the arrays."""

    def __init__(self, backends, bufts, graph_size, bint parallel, bint op_offload,
                 max_split_inputs=30, max_graph_inputs=30, n_copies=4, debug_realloc=0,
                 bint realloc_raises=False, bint copy_all_inputs=False):
        cdef int b
        backends, bufts = list(backends), list(bufts)
        if not 1 <= len(backends) <= _MAX_BACKENDS_C or len(bufts) != len(backends):
            raise ArgumentError(f"a scheduler needs 1 to {_MAX_BACKENDS_C} backends and one "
                                f"buffer type each, got {len(backends)} and {len(bufts)}")
        for b in range(len(backends)):
            if not isinstance(backends[b], Backend) or not isinstance(bufts[b], BufferType):
                raise ArgumentTypeError(f"backend {b}: expected a Backend and a BufferType, got "
                                        f"{type(backends[b]).__name__} and {type(bufts[b]).__name__}")
            if (<BufferType>bufts[b]).c.alignment == 0:
                raise ArgumentError(f"backend {b}: its buffer type was never initialised")
        self.opts.graph_size = int_arg(graph_size, "graph_size", 1, _INT32_MAX)
        self.opts.max_split_inputs = int_arg(max_split_inputs, "max_split_inputs", 1, _MAX_LIMIT)
        self.opts.max_graph_inputs = int_arg(max_graph_inputs, "max_graph_inputs", 0, _MAX_LIMIT)
        self.pipeline.n_copies = int_arg(n_copies, "n_copies", 1, _MAX_LIMIT) if parallel else 1
        self.opts.debug_realloc = int_arg(debug_realloc, "debug_realloc", 0, 2)
        self.opts.realloc_raises = realloc_raises
        self.opts.copy_all_inputs = copy_all_inputs
        self.opts.op_offload = op_offload
        self._keep = backends + bufts
        self.n_backends = len(backends)
        # the tables hold a slot per hash slot: refuse what this machine cannot hold
        # before touching any (the reset writes them all)
        cdef size_t n = ggml_hash_size(self.opts.graph_size)
        table_bytes = n * (sizeof(void *) + sizeof(int8_t) + 1 +
                           self.n_backends * self.pipeline.n_copies * sizeof(void *))
        check_memory_available(table_bytes, f"a scheduler with graph_size {self.opts.graph_size}, "
                               f"{self.n_backends} backends and {self.pipeline.n_copies} copies: "
                               f"its tables")
        self.backends = <ggml_backend **>checked_calloc(self.n_backends, sizeof(ggml_backend *),
                                                        "the scheduler's backend table")
        self.bufts = <ggml_backend_buffer_type **>checked_calloc(
            self.n_backends, sizeof(void *), "the scheduler's buffer type table")
        for b in range(self.n_backends):
            self.backends[b] = &(<Backend>backends[b]).c
            self.bufts[b] = &(<BufferType>bufts[b]).c
        ggml_hash_set_init(&self.hash_set, self.opts.graph_size)
        self.hv_tensor_backend_ids = <int8_t *>checked_calloc(n, sizeof(int8_t), "scheduler tables")
        self.hv_tensor_causes = <uint8_t *>checked_calloc(n, 1, "scheduler tables")
        self.hv_tensor_copies = <ggml_tensor **>checked_calloc(
            n * self.n_backends * self.pipeline.n_copies, sizeof(void *), "scheduler tables")
        self.splits_capacity = 16
        self.splits = <sched_split *>checked_calloc(self.splits_capacity, sizeof(sched_split),
                                                    "scheduler tables")
        self.pipeline.graph_inputs = <graph_input *>checked_calloc(
            max(self.opts.max_graph_inputs, 1), sizeof(graph_input), "scheduler tables")
        self.arena = Context("sched")
        # made on every split: interning their layouts would cost a dict lookup each
        self.arena.ctx.no_layout_ids = True
        self.galloc = GraphAllocator(bufts)
        self.graph_reuse = True
        self.user_assignments = {}
        self.plan_assignments = None
        self.away_views = []
        self.is_reset = False
        sched_reset(self)

    def __del__(self):
        # as ggml_backend_sched_free, but the user's graph is left whole: its sources
        # point at its own tensors again, and no tensor points into freed memory
        self.close()

    def close(self):
        """Undo the last split's rewiring, take back every placement and release the
        compute buffers. The scheduler stays usable (the next alloc_graph allocates
        again)."""
        if self.arena is None:
            return                  # __init__ did not finish
        forget_plan(self)
        undo_rewiring(self)
        retire_arena(self)
        self.n_splits = 0
        self.graph_copy.graph.n_nodes = 0
        self.graph_copy.graph.n_leafs = 0
        self.pipeline.n_graph_inputs = 0
        self.last_graph = NULL
        self.last_graph_obj = None
        self.galloc.close()
        sched_reset(self)

    def __dealloc__(self):
        # (the object's memory starts zeroed: a pointer never allocated is NULL)
        cdef int i
        if self.splits != NULL:
            for i in range(self.splits_capacity):
                free(self.splits[i].inputs)
        free(self.splits)
        free(self.backends)
        free(self.bufts)
        ggml_hash_set_free(&self.hash_set)
        free(self.hv_tensor_backend_ids)
        free(self.hv_tensor_causes)
        free(self.hv_tensor_copies)
        free(self.infos)
        free(self.rewired)
        sweep_free(&self.sweep)
        graph_copy_free(&self.graph_copy)
        free(self.pipeline.graph_inputs)
        free(self.pipeline.input_views)
        fingerprint_free(&self.fp)

    # --- state ---

    def reset(self):
        sched_reset(self)

    def split_graph(self, Graph graph not None):
        try:
            sched_split_graph(self, graph)
        except BaseException:
            # leave nothing half-made: the next split starts from a reset
            forget_plan(self)
            self.n_splits = 0
            self.graph_copy.graph.n_nodes = 0
            self.graph_copy.graph.n_leafs = 0
            sched_reset(self)
            raise

    def alloc_graph(self, Graph graph not None):
        """Split and allocate; True, or False when a buffer could not be allocated
        (the allocator's last_error says which)."""
        if self.is_alloc:
            # refused before anything changes: the allocated graph stays as it is
            raise SchedulerError("the scheduler already holds an allocated graph: call "
                                 "reset() before allocating another", "already-allocated")
        try:
            ok = sched_alloc_graph(self, graph)
        except BaseException:
            self.is_alloc = False
            forget_plan(self)
            sched_reset(self)
            raise
        if not ok:
            forget_plan(self)
        return bool(ok)

    def reserve_n(self):
        """Reserve compute buffers for the current graph copy (after a split)."""
        self.plan_reusable = False        # the reservation may move every placement
        cdef sched_graph_copy * c = &self.graph_copy
        ok = self.galloc.c_reserve_n(&c.graph, c.node_backend_ids, c.leaf_backend_ids)
        self.split_pending = self.plan_stale = False    # the plan is the last split's
        return bool(ok)

    def reserve_n_size(self):
        """Buffer sizes per backend the current graph copy would need (a dry run)."""
        cdef size_t * sizes = <size_t *>checked_calloc(self.n_backends, sizeof(size_t),
                                                       "the size table")
        try:
            self.galloc.c_reserve_n_size(&self.graph_copy.graph, self.graph_copy.node_backend_ids,
                                         self.graph_copy.leaf_backend_ids, sizes)
            return [sizes[i] for i in range(self.n_backends)]
        finally:
            free(sizes)

    def synchronize_copy(self):
        """After a synchronize with no graph allocated, start again at copy slot 0."""
        if not self.is_alloc:
            self.pipeline.next_copy = 0

    def undo_rewiring(self):
        """Give the nodes of the graph split last back the sources that the split
        replaced by this scheduler's copies (splitting does this first, too)."""
        forget_plan(self)
        undo_rewiring(self)

    def set_tensor_backend(self, Tensor t not None, backend_id):
        cdef int b = index_arg(backend_id, "backend id", self.n_backends)
        cdef Py_ssize_t h
        if not self.reset_deferred:
            forget_plan(self)            # the tables are the plan's: it would not be
            fp_ensure_keys(self)
            h = hash_id(self, t.ptr)
            self.hv_tensor_backend_ids[h] = b
            self.hv_tensor_causes[h] = CAUSE_USR
        # (with a deferred reset, the reuse check compares these with the plan's)
        self.user_assignments[<size_t>t.ptr] = (t, b)
        self.is_reset = False

    def get_tensor_backend_id(self, Tensor t not None):
        if self.reset_deferred:
            entry = self.user_assignments.get(<size_t>t.ptr)
            return -1 if entry is None else entry[1]
        fp_ensure_keys(self)
        return sched_tensor_backend_id(self, t.ptr)

    def get_cause(self, Tensor t not None):
        if self.reset_deferred:
            forget_plan(self)            # after a reset every cause is forgotten
        fp_ensure_keys(self)
        cdef Py_ssize_t i = slot_of(self, t.ptr)
        return "" if i == -1 else CAUSE_NAMES.get(self.hv_tensor_causes[i], "")


    # --- what the options and copy slots hold ---

    @property
    def graph_size(self):
        return self.opts.graph_size

    @property
    def debug_realloc(self):
        """GGML_SCHED_DEBUG_REALLOC level."""
        return self.opts.debug_realloc

    @property
    def realloc_raises(self):
        return self.opts.realloc_raises

    @property
    def copy_all_inputs(self):
        return self.opts.copy_all_inputs

    @property
    def n_copies(self):
        return self.pipeline.n_copies

    @property
    def cur_copy(self):
        return self.pipeline.cur_copy

    @property
    def hash_size(self):
        return self.hash_set.size

    def hash_stats(self):
        """Slots read per lookup of the scheduler's hash set as the last split left it
        (every tensor of the graph and its copies), beside a uniform hash's: see
        Graph.hash_stats."""
        return hash_probe_stats(&self.hash_set)

    # --- results, as plain Python data (read once per split, not in hot loops) ---

    def get_splits(self):
        """[(backend_id, i_start, i_end, [input Tensor, ...]), ...]"""
        cdef int i, j
        out = []
        for i in range(self.n_splits):
            out.append((self.splits[i].backend_id, self.splits[i].i_start, self.splits[i].i_end,
                        [tensor_handle(self.splits[i].inputs[j]) for j in range(self.splits[i].n_inputs)]))
        return out

    def get_split_copies(self, split_id):
        """[(input, input_backend_id, input_cpy), ...] of a split, input_cpy being the
        copy for the current copy slot (what the runtime copies before the split runs)."""
        cdef int s_id = index_arg(split_id, "split", self.n_splits)
        cdef sched_split * split = &self.splits[s_id]
        cdef Py_ssize_t h
        cdef int i, j, k = 0
        for i in range(s_id):
            k += self.splits[i].n_inputs
        out = []
        for j in range(split.n_inputs):
            h = split_input_slot(self, k + j, split.inputs[j])
            out.append((tensor_handle(split.inputs[j]), self.hv_tensor_backend_ids[h],
                        tensor_handle(copy_slot(self, h, split.backend_id,
                                                self.pipeline.cur_copy)[0])))
        return out

    def split_table_key(self):
        """Bytes equal from call to call exactly while get_splits and get_split_copies
        answer the same: every split's backend and node range, each input's tensor,
        backend and copy in the current copy slot. A Scheduler keeps its split records
        while the key stays (a kept plan's, step after step). No Python object but it."""
        cdef int i, j, k = 0, n = 0
        cdef Py_ssize_t h
        cdef sched_split * split
        cdef uintptr_t * w
        for i in range(self.n_splits):
            n += 4 + 3 * self.splits[i].n_inputs
        key = PyBytes_FromStringAndSize(NULL, n * sizeof(uintptr_t))
        w = <uintptr_t *>PyBytes_AS_STRING(key)
        for i in range(self.n_splits):
            split = &self.splits[i]
            w[0], w[1], w[2], w[3] = split.backend_id, split.i_start, split.i_end, split.n_inputs
            w += 4
            for j in range(split.n_inputs):
                h = split_input_slot(self, k, split.inputs[j])
                w[0] = <uintptr_t>split.inputs[j]
                w[1] = <uintptr_t>self.hv_tensor_backend_ids[h]
                w[2] = <uintptr_t>copy_slot(self, h, split.backend_id, self.pipeline.cur_copy)[0]
                w += 3
                k += 1
        return key

    def get_graph_inputs(self):
        return [tensor_handle(self.pipeline.graph_inputs[i].tensor)
                for i in range(self.pipeline.n_graph_inputs)]

    def unwritten_inputs(self, Graph graph not None):
        """The graph inputs of `graph` whose bytes were not written since this scheduler's
        allocation placed them (Scheduler's check_inputs). A graph input is a leaf of the
        graph (its view source, for a leaf that is a view of another leaf) that lies in
        this scheduler's compute buffers: a leaf without memory of its own, INPUT flag or
        not, which the allocation gave memory that other tensors used before. Written:
        through tensor_set / tensor_memset / tensor_copy (Scheduler.set_input,
        Tensor.write, a backend's set_tensor) since it was placed there, or by a node of
        the graph that writes into it (a view of it computed by an op: CPY, SET_ROWS,
        in-place ops). Pre-allocated tensors (weights, caches, inputs in the user's own
        buffers) hold what their owner put there and are not checked. One pass over the
        nodes and one over the leafs, no Python object unless one is found."""
        cdef ggml_cgraph * g = &graph.graph
        cdef ggml_tensor * t
        cdef int i
        cdef void * galloc = <void *>self.galloc
        for i in range(g.n_nodes):
            t = g.nodes[i]
            # a node that writes into a leaf's memory (the result is a view with an op)
            if (t.view_src != NULL and t.op != OP_NONE and not ggml_is_view_op(t.op)
                    and t.view_src.op == OP_NONE and t.view_src.buffer != NULL
                    and t.view_src.buffer.allocator == galloc):
                t.view_src.written = <uintptr_t>t.view_src.data
        out = None
        for i in range(g.n_leafs):
            t = g.leafs[i]
            if t.view_src != NULL:
                t = t.view_src
                if t.op != OP_NONE:
                    continue            # a view of a computed tensor: the graph writes it
            if (t.buffer != NULL and t.buffer.allocator == galloc
                    and not tensor_is_written(t)):
                if out is None:
                    out = []
                out.append(tensor_handle(t))
        return out or []

    def get_graph_copy(self):
        """(nodes, node_backend_ids, leafs, leaf_backend_ids) of the graph copy."""
        cdef int i
        return ([tensor_handle(self.graph_copy.graph.nodes[i]) for i in range(self.graph_copy.graph.n_nodes)],
                [self.graph_copy.node_backend_ids[i] for i in range(self.graph_copy.graph.n_nodes)],
                [tensor_handle(self.graph_copy.graph.leafs[i]) for i in range(self.graph_copy.graph.n_leafs)],
                [self.graph_copy.leaf_backend_ids[i] for i in range(self.graph_copy.graph.n_leafs)])

    def describe(self, Tensor t not None):
        """What a tensor is to the scheduler: None for a tensor of the user's
        graph (or of a split before the last), ('copy', of, backend_id, copy_id) or
        ('dep', of) for its own."""
        if t.owner is not self.arena or t.ptr.id >= self.arena.ctx.n_tensors:
            return None
        cdef sched_tensor_info * info = &self.infos[t.ptr.id]
        if info.kind == SCHED_TENSOR_COPY:
            return ("copy", tensor_handle(info.of), info.backend_id, info.copy_id)
        return ("dep", tensor_handle(info.of))

    # --- the plan in bulk: Plan.from_scheduler reads every table in one call ---

    def plan_tables(self, Graph graph not None, list names, bint alloc):
        """What a plan file says of the last split of `graph`, read from the tables in
        one pass (no Tensor handle and no call per node): a dict of the plan file's
        node_backends, leaf_backends, node_srcs, graph_copy and node_causes, and with
        `alloc` the graph copy's graph_copy_nodes and graph_copy_leafs. `names` are the
        backends' names by id. The answers of get_tensor_backend_id, describe,
        get_cause and GraphAllocator.tensor_location, in the plan's order."""
        cdef ggml_cgraph * g = &graph.graph
        cdef ggml_cgraph * c = &self.graph_copy.graph
        cdef ggml_tensor * t
        cdef uint32_t m
        cdef int i, j, n
        if len(names) != self.n_backends:
            raise ArgumentError(f"plan_tables needs a name for each of the {self.n_backends} "
                                f"backends, got {len(names)}")
        if not self.reset_deferred:
            fp_ensure_keys(self)
        out = {"node_backends": [_plan_name(names, _plan_backend_id(self, g.nodes[i]))
                                 for i in range(g.n_nodes)],
               "leaf_backends": [_plan_name(names, _plan_backend_id(self, g.leafs[i]))
                                 for i in range(g.n_leafs)]}
        srcs = []
        for i in range(g.n_nodes):
            t = g.nodes[i]
            m = source_mask(t)
            n = 0
            while m >> n:                # trailing empty slots cut, as Tensor.src does
                n += 1
            srcs.append([_plan_token(self, t.src[j], names) if m >> j & 1 else None
                         for j in range(n)])
        out["node_srcs"] = srcs
        out["graph_copy"] = {
            "nodes": [_plan_token(self, c.nodes[i], names) for i in range(c.n_nodes)],
            "node_backends": [_plan_name(names, self.graph_copy.node_backend_ids[i])
                              for i in range(c.n_nodes)],
            "leafs": [_plan_token(self, c.leafs[i], names) for i in range(c.n_leafs)],
            "leaf_backends": [_plan_name(names, self.graph_copy.leaf_backend_ids[i])
                              for i in range(c.n_leafs)]}
        if self.reset_deferred:
            forget_plan(self)            # after a reset every cause is forgotten
        fp_ensure_keys(self)
        out["node_causes"] = [_plan_cause(self, g.nodes[i]) for i in range(g.n_nodes)]
        if alloc:
            out["graph_copy_nodes"] = [tensor_location_list(self.galloc, c.nodes[i])
                                       for i in range(c.n_nodes)]
            out["graph_copy_leafs"] = [tensor_location_list(self.galloc, c.leafs[i])
                                       for i in range(c.n_leafs)]
        return out



cdef inline object _plan_name(list names, int backend_id):
    return None if backend_id < 0 else names[backend_id]


cdef int _plan_backend_id(SchedCore s, ggml_tensor * t) except -2:
    """SchedCore.get_tensor_backend_id of a tensor struct."""
    if s.reset_deferred:
        entry = s.user_assignments.get(<size_t>t)
        return -1 if entry is None else entry[1]
    return sched_tensor_backend_id(s, t)


cdef object _plan_token(SchedCore s, ggml_tensor * t, list names):
    """Scheduler.token of a tensor struct: its id, 'ID@BACKEND#C' for a copy, 'dep:ID'."""
    if t == NULL:
        return None
    if t.owner != <void *>&s.arena.ctx or t.id >= s.arena.ctx.n_tensors:
        return t.id
    cdef sched_tensor_info * info = &s.infos[t.id]
    if info.kind == SCHED_TENSOR_COPY:
        return f"{info.of.id}@{names[info.backend_id]}#{info.copy_id}"
    return f"dep:{info.of.id}"


cdef str _plan_cause(SchedCore s, ggml_tensor * t):
    """SchedCore.get_cause of a tensor struct (the keys made current)."""
    cdef Py_ssize_t i = slot_of(s, t)
    return "" if i == -1 else CAUSE_NAMES.get(s.hv_tensor_causes[i], "")
