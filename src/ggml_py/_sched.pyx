"""Scheduler core: a port of ggml_backend_sched_split_graph (ggml 0.10.1).

Given a graph and backends in priority order, decide where every node runs, cut the graph
into splits, add copies of the inputs that a split's backend cannot read, and build the
graph copy that the allocator places and the runtime executes. The five passes follow
ggml's pass for pass; the loops run over C structs only. Where ggml aborts on user input,
this raises SchedulerError (with the abort class of SCHED_CASES.md as `kind`) and the
scheduler stays usable.

The scheduler's state is SchedCore (_schedcore.pyx); graph reuse, which takes a kept
plan instead of running these passes, is _reuse.pyx, and the allocation _schedalloc.pyx.
"""

from libc.stdlib cimport malloc
from libc.string cimport memset
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t

from ggml_py._ggml cimport *
from ggml_py._core cimport (Context, Graph, ggml_join_name, tensor_name, ggml_hash_set_reset,
                            ggml_hash_home, ggml_is_view_op, ggml_dup_tensor_layout,
                            ggml_view_tensor, ggml_context_reset, ggml_context_tensor,
                            ggml_is_node_from, ggml_views_computed_node, leaf_view_message,
                            ggml_is_computed_from, ggml_computes, OP_NONE, OP_CPY,
                            tensor_set_src, tensor_changed, src_owner, order_message, source_mask, lowest_bit,
                            PREFETCH_AHEAD, prefetch, prefetch_memory, prefetch_leaf_ahead,
                            prefetch_node_ahead, safe_realloc, OP_ROPE, graph_tensor)
from ggml_py._backend cimport (Backend, backend_supports_op, backend_supports_op_of,
                               backend_supports_buft, backend_offload_op)

from ggml_py._core import OP_NAMES_LIST as _OP_NAMES_LIST
from ggml_py.errors import AllocationError, GraphError, SchedulerError

_TABLES = "the scheduler's tables"          # what safe_realloc names when a table cannot grow


# ---------------------------------------------------------------------------
# What the passes read of the graph's tensors: the ggml_tensor fields each function of
# this module reads, itself or through a helper of another module it hands a tensor to
# (CALLEE_READS). A kept plan is taken for a rebuilt graph (graph reuse, _reuse.pyx) only
# where the fingerprint compares every field read here, or says why one cannot change
# the plan (_reuse.NOT_COMPARED): tests/test_sched_reads.py holds these declarations to
# the source of both modules, so a pass that starts reading a field must declare it.

# what a backend's supports_op / offload_op rule may read of the op's tensor
_RULE_READS = ("op", "flags", "type", "ne", "nb", "op_params", "src", "src_mask", "view_src",
               "buffer")

CALLEE_READS = {
    "backend_supports_op": _RULE_READS,
    "backend_supports_op_of": _RULE_READS,
    "backend_offload_op": _RULE_READS,
    "ggml_is_node_from": ("order",),
    "ggml_is_computed_from": ("op", "order"),
    "ggml_computes": ("op",),
    "ggml_views_computed_node": ("op", "order", "view_src"),
    "source_mask": ("src_mask",),
    "ggml_dup_tensor_layout": ("type", "ne", "nb", "name"),
    "ggml_view_tensor": ("type", "ne", "nb", "view_src", "view_offs", "buffer", "data", "name"),
    "tensor_name": ("name",),                   # (error messages)
    "leaf_view_message": ("op", "name"),
    "order_message": ("op", "name"),
}

TENSOR_READS = {
    "memory_key": ("buffer", "data"),
    "_base_buffer": ("view_src", "buffer"),
    "hash_set_full": ("name",),
    "backend_for_memory": _RULE_READS,
    "unmovable_memory_error": ("op", "view_src", "buffer", "name"),
    "cur_may_choose": ("flags", "view_src", "buffer"),
    "backend_id_from_cur": _RULE_READS,
    "describe_source": ("flags", "view_src", "buffer"),
    "find_weights": ("src", "src_mask"),
    "src_readable": ("view_src",),
    "set_if_supported": _RULE_READS,
    "hashed_ref": ("order",),
    "pass1_preallocated": ("op", "order", "view_src", "name"),
    "pass1_sweep": ("op", "flags", "order", "src", "src_mask", "view_src"),
    "pass3_upgrade": _RULE_READS,
    "_computed_input": ("op", "order", "view_src"),
    "pass4_sources": ("op", "order", "view_src", "name"),
    "name_copy": ("name",),
    "new_sched_tensor": ("type", "ne", "nb", "view_src", "view_offs", "buffer", "data", "name",
                         "id"),
    "note_view_assignment": ("view_src",),
    "add_graph_input": ("flags", "name"),
    "add_split_input": ("flags", "name"),
    "pass5_split": ("op", "name"),
    "add_every_input_leaf": ("flags",),
    "record_rewiring": ("src",), "apply_rewirings": ("src",), "undo_rewiring": ("owner", "src"),
    "retire_arena": ("view_src", "buffer", "data"),
}


cdef inline ggml_backend_buffer * memory_key(SchedCore s, const ggml_tensor * t,
                                             size_t * offset) noexcept:
    """The memory t has before an allocation, as the split and the allocator see it:
    its buffer (NULL for none or a compute buffer of this scheduler's) and the data
    offset in it (the address for memory outside any buffer)."""
    cdef ggml_backend_buffer * b = unallocated_memory(s, t.buffer)
    if b != NULL:
        offset[0] = <size_t>(t.data - b.base)
    elif t.buffer == NULL:
        offset[0] = <size_t>t.data
    else:
        offset[0] = 0
    return b


cdef inline ggml_backend_buffer * _base_buffer(SchedCore s, const ggml_tensor * t) noexcept:
    return unallocated_memory(s, t.view_src.buffer if t.view_src != NULL else t.buffer)


# ---------------------------------------------------------------------------
# hash map access (ggml: hash_id / tensor_backend_id / tensor_copy macros)

cdef int hash_set_full(SchedCore s, ggml_tensor * t) except -1:
    """hash_id's error: no slot is left for t."""
    raise SchedulerError(
        f"the scheduler's hash set is full ({s.hash_set.size} slots, from graph_size "
        f"{s.opts.graph_size}) at tensor '{tensor_name(t)}': the graph and the tensors it refers "
        f"to need more slots; create the scheduler with a larger graph_size", "hash-set-too-small")


cdef inline int backend_of(SchedCore s, ggml_tensor * t) except -2:
    """tensor_backend_id; a NULL tensor has none (ggml would insert NULL as a key)."""
    if t == NULL:
        return -1
    return s.hv_tensor_backend_ids[hash_id(s, t)]


cdef inline void prefetch_slot(SchedCore s, const ggml_tensor * t) noexcept:
    """Ask for the hash set's lines at t's home slot, where a lookup of t starts (and,
    the set being at most half full, mostly ends): in a large graph they are misses.
    (The used bits are dense enough to stay in the caches; the causes are only written:
    asking for their line too made a split of 100k nodes 1.7x slower.)"""
    cdef size_t h = ggml_hash_home(&s.hash_set, t)
    prefetch(&s.hash_set.keys[h])
    prefetch(&s.hv_tensor_backend_ids[h])


cdef int sched_tensor_backend_id(SchedCore s, ggml_tensor * t) noexcept:
    """Backend id of t without inserting it (-1 when unknown)."""
    cdef Py_ssize_t i = slot_of(s, t)
    return -1 if i == -1 else s.hv_tensor_backend_ids[i]


# ---------------------------------------------------------------------------
# assignment rules

cdef inline int backend_for_memory(SchedCore s, ggml_backend_buffer_type * buft,
                                   ggml_tensor * op) except -2:
    """Highest-priority backend that can use memory of type buft and run op; -1 if none
    (or no buft: no memory). In line: pass 1 asks it of most weights and of the nodes that
    read them, and the call cost more than its loop."""
    cdef int i
    if buft == NULL:
        return -1
    for i in range(s.n_backends):
        if backend_supports_buft(s.backends[i], buft) and backend_supports_op(s.backends[i], op):
            return i
    return -1


cdef inline ggml_backend_buffer_type * buft_of(const ggml_backend_buffer * buf) noexcept:
    return buf.buft if buf != NULL else NULL


cdef object unmovable_memory_error(SchedCore s, ggml_tensor * tensor, ggml_backend_buffer * buf):
    """The error for a tensor with memory (buf, its base's) that no backend able to use
    it can run its op on, or for a view with a buffer its view_src lacks (buf NULL)."""
    if buf == NULL:
        # ggml reads the view_src's buffer (here NULL) for its message and crashes
        return SchedulerError(
            f"view '{tensor_name(tensor)}' (op {_OP_NAMES_LIST[tensor.op]}) has a buffer of type "
            f"'{tensor.buffer.buft.name.decode()}' but its view_src "
            f"'{tensor_name(tensor.view_src)}' has none: a view's memory is its view_src's",
            "unsupported-preallocated")
    # the memory already exists and cannot move: ggml aborts here
    return SchedulerError(
        f"pre-allocated tensor '{tensor_name(tensor)}' (op {_OP_NAMES_LIST[tensor.op]}) lives in a "
        f"buffer of type '{buf.buft.name.decode()}' that no backend able to use it can run "
        f"the op on", "unsupported-preallocated")


cdef inline bint cur_may_choose(const ggml_tensor * t, bint reads_weights) noexcept:
    """False only where backend_id_from_cur finds no backend (and raises nothing): t nor
    its base has memory, t is no input and reads no weights (as most nodes). Its rules'
    cheap superset, for pass 1 to skip the call."""
    return (t.buffer != NULL
            or (t.view_src != NULL and (t.view_src.buffer != NULL or t.view_src.view_src != NULL))
            or t.flags & GGML_TENSOR_FLAG_INPUT or reads_weights)


cdef int backend_id_from_cur(SchedCore s, ggml_tensor * tensor, uint8_t * cause,
                             const weights_source * weights) except -2:
    """Pass 1 for one tensor: the backend its current location implies, or -1. weights:
    its first source in a weights buffer, as pass 1 recorded it."""
    cdef ggml_backend_buffer * buf = _base_buffer(s, tensor)
    cdef int cur, b, src_backend_id
    if buf != NULL or tensor.view_src != NULL:     # (most nodes have no memory yet)
        cur = backend_for_memory(s, buft_of(buf), tensor)
        if cur != -1:
            cause[0] = CAUSE_1_DST
            return cur
        if tensor.view_src != NULL:
            cur = backend_for_memory(s, buft_of(_base_buffer(s, tensor.view_src)), tensor)
            if cur != -1:
                cause[0] = CAUSE_1_VSRC
                return cur
        if buf != NULL or unallocated_memory(s, tensor.buffer) != NULL:
            raise unmovable_memory_error(s, tensor, buf)
    if tensor.flags & GGML_TENSOR_FLAG_INPUT:
        cause[0] = CAUSE_1_INP
        return s.n_backends - 1
    # operations with weights run preferably where the weights are; ROPE's frequency
    # tensor is too small to choose a backend by
    if tensor.op == OP_ROPE:
        return -1
    if weights.j != -1:
        src_backend_id = backend_for_memory(s, weights.buft, tensor)
        # a higher-priority backend may want to offload the op anyway
        if s.opts.op_offload and src_backend_id == s.n_backends - 1 and weights.host:
            for b in range(src_backend_id):
                if backend_supports_op(s.backends[b], tensor) and backend_offload_op(s.backends[b], tensor):
                    cause[0] = CAUSE_1_OFF
                    return b
        cause[0] = CAUSE_1_WGT0 + weights.j
        return src_backend_id
    return -1


cdef inline uint8_t describe_source(SchedCore s, const ggml_tensor * src,
                                    ggml_backend_buffer_type ** buft) noexcept:
    """What pass 1 records of a tensor a node reads: its SRC_* bits but SRC_NOT_BEFORE
    (which depends on the reader), and the buffer type of its memory (buft)."""
    cdef uint8_t bits = SRC_INPUT if src.flags & GGML_TENSOR_FLAG_INPUT else 0
    buft[0] = buft_of(_base_buffer(s, src))
    if buft[0] != NULL:
        bits |= SRC_MEMORY
    if src.buffer != NULL and src.buffer.usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS:
        bits |= SRC_WEIGHTS
        if src.buffer.buft.is_host:
            bits |= SRC_HOST
    if src.view_src != NULL:
        bits |= SRC_VIEW
    return bits


cdef inline void record_tensor(SchedCore s, int ref, const ggml_tensor * t) noexcept:
    """What a node reading t records of it, for t's index ref in dense_ids (the buffer
    type only for a tensor with memory: most nodes have none, and their readers read
    SRC_MEMORY)."""
    cdef ggml_backend_buffer_type * buft
    s.sweep.dense_bits[ref] = describe_source(s, t, &buft)
    if buft != NULL:
        s.sweep.dense_bufts[ref] = buft


cdef inline void note_weights(weights_source * weights, int j, uint8_t bits,
                              ggml_backend_buffer_type * buft) noexcept:
    """Keep a source (slot j, SRC_* bits, buft) as the tensor's weights_source if it is
    the first in a weights buffer."""
    if bits & SRC_WEIGHTS and weights.j == -1:
        weights.j = j
        weights.host = bits & SRC_HOST != 0
        weights.buft = buft


cdef void find_weights(SchedCore s, const ggml_tensor * t, weights_source * weights) noexcept:
    """t's weights_source, from its sources' structs (a leaf's: few have sources)."""
    cdef ggml_backend_buffer_type * buft
    cdef uint8_t bits
    cdef int j
    cdef uint32_t m = source_mask(t)
    weights.j = -1
    while m and weights.j == -1:
        j = lowest_bit(m)
        m &= m - 1
        bits = describe_source(s, t.src[j], &buft)
        note_weights(weights, j, bits, buft)


cdef inline ggml_tensor * src_tensor(SchedCore s, ggml_cgraph * graph,
                                     const split_src * e) noexcept:
    """The tensor a node source is (the node's src[j] before pass 5 rewires it)."""
    if e.ref < 0:
        return s.sweep.outside[-2 - e.ref].tensor
    return graph_tensor(graph, e.ref)


cdef inline ggml_backend_buffer_type * src_buft(SchedCore s, const split_src * e) noexcept:
    """The buffer type of a node source's memory; NULL: it has none yet."""
    if not e.bits & SRC_MEMORY:
        return NULL
    return s.sweep.dense_bufts[e.ref] if e.ref >= 0 else s.sweep.outside[-2 - e.ref].buft


cdef inline Py_ssize_t src_slot(SchedCore s, const split_src * e) noexcept:
    """The hash slot of a node source (passes 4 and 5: where it gets a backend or copies)."""
    return s.sweep.node_slots[e.ref] if e.ref >= 0 else s.sweep.outside[-2 - e.ref].slot


cdef inline int src_backend(SchedCore s, const split_src * e) noexcept:
    """The backend id of a node source (passes 2 to 5)."""
    return s.sweep.dense_ids[e.ref] if e.ref >= 0 else s.hv_tensor_backend_ids[src_slot(s, e)]


cdef inline const int * node_refs_of(SchedCore s) noexcept:
    """Each node's index in dense_ids (passes 2 to 5), or NULL where it is its position."""
    return NULL if s.sweep.refs_are_positions else s.sweep.node_refs


cdef inline int node_ref(const int * refs, int i) noexcept:
    """Node i's index in dense_ids, from node_refs_of."""
    return i if refs == NULL else refs[i]


cdef inline const int * compute_refs_of(SchedCore s) noexcept:
    """The index in dense_ids of each node that is not a view op (compute_nodes: the
    positions of those nodes, where they are their indexes)."""
    return s.sweep.compute_nodes if s.sweep.refs_are_positions else s.sweep.compute_refs


cdef inline void set_backend(SchedCore s, int ref, Py_ssize_t h, int backend_id,
                             uint8_t cause) noexcept:
    """Assign a tensor (hash slot h, index ref in dense_ids or -1) in passes 2 to 5."""
    s.hv_tensor_backend_ids[h] = backend_id
    s.hv_tensor_causes[h] = cause
    if ref >= 0:
        s.sweep.dense_ids[ref] = backend_id


cdef bint src_readable(SchedCore s, ggml_cgraph * graph, const split_src * e,
                       int backend_id) except -1:
    """Can backend_id read a node source where it is or will be? A source without memory
    yet will live in the buffer type of its backend (or of its view_src's)."""
    cdef ggml_backend_buffer_type * buft = src_buft(s, e)
    cdef int id
    if buft == NULL:
        id = src_backend(s, e)
        if id == -1 and e.bits & SRC_VIEW:
            id = backend_of(s, src_tensor(s, graph, e).view_src)
        if id == -1:
            return False
        buft = s.bufts[id]
    return backend_supports_buft(s.backends[backend_id], buft)


cdef inline int set_if_supported(SchedCore s, ggml_tensor * node, int op, int ref,
                                 Py_ssize_t h, int backend_id) except -1:
    if backend_supports_op_of(s.backends[backend_id], op, node):
        set_backend(s, ref, h, backend_id, CAUSE_2_SUP)
    return 0


# ---------------------------------------------------------------------------
# the passes

cdef int grow_node_tables(SchedCore s, ggml_cgraph * graph) except -1:
    if graph.n_nodes > s.sweep.node_slots_capacity or s.sweep.src_begin == NULL:
        safe_realloc(<void **>&s.sweep.src_begin, graph.n_nodes + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.node_bits, graph.n_nodes, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.sweep.view_refs, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.compute_nodes, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.compute_refs, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.compute_slots, graph.n_nodes, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.sweep.compute_ops, graph.n_nodes, sizeof(uint16_t), _TABLES)
        safe_realloc(<void **>&s.sweep.node_refs, graph.n_nodes, sizeof(int), _TABLES)
        s.sweep.node_slots_capacity = graph.n_nodes
    cdef int n = graph.n_leafs + graph.n_nodes
    if n > s.sweep.pre_capacity or s.sweep.pre_memory == NULL:
        safe_realloc(<void **>&s.sweep.pre_memory, n + 1, sizeof(void *), _TABLES)
        safe_realloc(<void **>&s.sweep.pre_offset, n + 1, sizeof(size_t), _TABLES)
        safe_realloc(<void **>&s.sweep.pre_indexes, n + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.dense_bufts, n + 1, sizeof(void *), _TABLES)
        safe_realloc(<void **>&s.sweep.dense_bits, n + 1, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.sweep.leaf_refs, n + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.sweep.node_slots, n + 1, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.sweep.dense_ids, n + 1, sizeof(int8_t), _TABLES)
        s.sweep.pre_capacity = n
    return 0


cdef inline int hashed_ref(SchedCore s, ggml_cgraph * graph, const ggml_tensor * t,
                           int i) noexcept:
    """t's index in dense_ids where pass 1 has hashed t already, as a leaf (after the
    leaf sweep) or as a node up to position i (its slot, and what a reader records of
    it, are then known without a lookup: node_slots, dense_bufts, dense_bits); -1 if it
    has not. t.order says where t is (a leaf's is -2 - its position), trusted only where
    the graph has t there."""
    cdef int p = t.order
    if 0 <= p <= i:
        if graph.nodes[p] == t:
            return p
    elif p <= -2 and -2 - p < graph.n_leafs and graph.leafs[-2 - p] == t:
        return graph.n_nodes - 2 - p
    return -1


cdef int pass1_preallocated(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 1: assign backends to tensors with pre-allocated memory, inputs and
    ops with weights; user assignments are kept. The same sweep records what the
    later passes read of each node and source (node_slots, node_bits, srcs)."""
    cdef int i
    cdef bint leaf_views = False
    grow_node_tables(s, graph)
    s.sweep.refs_are_positions = pass1_sweep(s, graph, False, &leaf_views)
    if not s.sweep.refs_are_positions:
        pass1_sweep(s, graph, True, &leaf_views)
    if leaf_views:
        for i in range(graph.n_leafs):
            if ggml_views_computed_node(graph, graph.leafs[i]):
                raise GraphError(leaf_view_message(graph.leafs[i]))
    return 0


cdef inline void note_memory(SchedCore s, int index, const ggml_tensor * t) noexcept:
    """List t (its index) where it has memory before the allocation (memory_key)."""
    cdef size_t offset
    if memory_key(s, t, &offset) != NULL or offset != 0:
        s.sweep.pre_indexes[s.sweep.n_pre_indexes] = index
        s.sweep.n_pre_indexes += 1


cdef void spread_pre_memory(SchedCore s, ggml_cgraph * graph) noexcept:
    """pre_memory and pre_offset of the tensors of graph, split last and allocated since
    (unchanged since: fp_build's condition), from pass 1's list."""
    cdef int k, index
    cdef int n = graph.n_leafs + graph.n_nodes
    cdef const ggml_tensor * t
    memset(s.sweep.pre_memory, 0, n * sizeof(void *))
    memset(s.sweep.pre_offset, 0, n * sizeof(size_t))
    for k in range(s.sweep.n_pre_indexes):
        index = s.sweep.pre_indexes[k]
        t = graph.leafs[index] if index < graph.n_leafs else graph.nodes[index - graph.n_leafs]
        s.sweep.pre_memory[index] = memory_key(s, t, &s.sweep.pre_offset[index])


cdef int add_outside(SchedCore s, ggml_tensor * t, ggml_backend_buffer_type * buft,
                     Py_ssize_t slot) except? -1:
    """Keep a source outside the graph (its buft and hash slot); its split_src.ref."""
    cdef outside_source * o
    if s.sweep.n_outside == s.sweep.outside_capacity:
        safe_realloc(<void **>&s.sweep.outside, 2 * s.sweep.outside_capacity + 16, sizeof(outside_source),
                     _TABLES)
        s.sweep.outside_capacity = 2 * s.sweep.outside_capacity + 16
    o = &s.sweep.outside[s.sweep.n_outside]
    o.tensor = t
    o.buft = buft
    o.slot = slot
    s.sweep.n_outside += 1
    return -1 - s.sweep.n_outside        # -2 - its index


cdef bint pass1_sweep(SchedCore s, ggml_cgraph * graph, bint exact,
                      bint * leaf_views) except -1:
    """Pass 1's sweep over the leafs, then the nodes. The order rules read where each
    node is (its order). With exact, a first loop sets every node's; otherwise each
    node's is set as the sweep reaches it, which is all it needs where every tensor is
    listed once and nodes read only nodes before them and leafs (a graph in order, as
    ggml builds them): the sweep stops, False, at the first that is not so, and the
    caller sweeps again, exact. (At 100k nodes, a first loop is one more sweep over
    memory as large as the tensor structs.)"""
    cdef int i, j, ref, k = 0
    cdef uint8_t bits
    cdef uint32_t m
    cdef Py_ssize_t h, src_h
    cdef ggml_tensor * t
    cdef const ggml_tensor * ahead
    cdef ggml_tensor * src
    cdef ggml_backend_buffer_type * buft
    cdef split_src * e
    cdef weights_source weights
    s.sweep.n_outside = 0
    s.sweep.n_pre_indexes = 0
    if exact:
        # (a loop this short asks for its lines further ahead)
        for i in range(graph.n_nodes):
            if i + 4 * PREFETCH_AHEAD < graph.n_nodes:
                prefetch(graph.nodes[i + 4 * PREFETCH_AHEAD])
            graph.nodes[i].order = i
    for i in range(graph.n_leafs):
        ahead = prefetch_leaf_ahead(graph, i)
        if ahead != NULL:
            prefetch_slot(s, ahead)
        t = graph.leafs[i]
        note_memory(s, i, t)
        h = hash_id(s, t)
        s.sweep.node_slots[graph.n_nodes + i] = h
        if not exact or not ggml_is_node_from(graph, t, 0):
            t.order = -2 - i        # (hashed_ref)
        ref = graph.n_nodes + i if t.order < 0 else t.order  # (a node too)
        s.sweep.leaf_refs[i] = ref
        leaf_views[0] |= t.view_src != NULL
        record_tensor(s, ref, t)
        if s.hv_tensor_backend_ids[h] == -1:
            find_weights(s, t, &weights)
            s.hv_tensor_backend_ids[h] = backend_id_from_cur(s, t, &s.hv_tensor_causes[h],
                                                             &weights)
        s.sweep.dense_ids[ref] = s.hv_tensor_backend_ids[h]
    s.sweep.n_compute = 0
    for i in range(graph.n_nodes):
        ahead = prefetch_node_ahead(graph, i)
        if ahead != NULL:
            prefetch_slot(s, ahead)
        if i + PREFETCH_AHEAD // 2 < graph.n_nodes:
            # then the buffer struct of its memory (its view_src's: a view of a KV cache),
            # their lines in by now (its sources' were read by now: a node's as a node, a
            # leaf's by the leaf sweep, which recorded them)
            t = graph.nodes[i + PREFETCH_AHEAD // 2]
            prefetch_memory(t.view_src if t.view_src != NULL else t)
        t = graph.nodes[i]
        if not exact:
            if hashed_ref(s, graph, t, i - 1) != -1:
                return False        # listed before, as a node or a leaf
            t.order = i
        note_memory(s, graph.n_leafs + i, t)
        h = hash_id(s, t)
        s.sweep.node_slots[i] = h
        if exact:
            s.sweep.node_refs[i] = t.order    # i, or its last position (the order sweep's)
        # what its readers record of it (before its sources: a node may read itself)
        record_tensor(s, t.order, t)
        s.sweep.node_bits[i] = NODE_INPUT if t.flags & GGML_TENSOR_FLAG_INPUT else 0
        if ggml_is_view_op(t.op):
            s.sweep.node_bits[i] |= NODE_VIEW_OP
            if (s.hv_tensor_backend_ids[h] != -1
                    and (s.hv_tensor_causes[h] == CAUSE_USR
                         or s.hv_tensor_causes[h] == CAUSE_USR_AWAY)):
                s.sweep.node_bits[i] |= NODE_USER
        else:
            s.sweep.compute_nodes[s.sweep.n_compute] = i
            if exact:
                s.sweep.compute_refs[s.sweep.n_compute] = t.order
            s.sweep.compute_slots[s.sweep.n_compute] = h
            s.sweep.compute_ops[s.sweep.n_compute] = <uint16_t>t.op
            s.sweep.n_compute += 1
        if t.view_src != NULL:
            # else pass 4 hashes it, only where ggml would (read only for NODE_VIEW)
            s.sweep.view_refs[i] = hashed_ref(s, graph, t.view_src, i)
            if s.sweep.view_refs[i] == -1 and not exact:
                return False        # a base that is a later node, or outside the graph
            s.sweep.node_bits[i] |= NODE_VIEW | (
                NODE_BASE_LATER if t.op != OP_NONE and ggml_is_computed_from(graph, t.view_src, i)
                else 0)
        m = source_mask(t)
        s.sweep.src_begin[i] = k
        if k + GGML_MAX_SRC > s.sweep.src_capacity:
            safe_realloc(<void **>&s.sweep.srcs, 2 * (k + GGML_MAX_SRC), sizeof(split_src), _TABLES)
            s.sweep.src_capacity = 2 * (k + GGML_MAX_SRC)
        weights.j = -1
        while m:
            j = lowest_bit(m)
            m &= m - 1
            src = t.src[j]
            ref = hashed_ref(s, graph, src, i)
            if ref != -1:
                bits = s.sweep.dense_bits[ref]
                # a node reading itself is out of order, but for ggml_cast's CPY, whose
                # src[1] is itself (its destination; computed as one op)
                if ref == i and not (j == 1 and t.op == OP_CPY):
                    bits |= SRC_NOT_BEFORE
                buft = NULL
                if bits & SRC_WEIGHTS and bits & SRC_MEMORY:
                    buft = s.sweep.dense_bufts[ref]
            else:
                if not exact:
                    return False        # a later node, or a tensor outside the graph
                bits = describe_source(s, src, &buft)
                src_h = hash_id(s, src)
                if ggml_is_node_from(graph, src, i):
                    bits |= SRC_NOT_BEFORE
                    ref = src.order
                else:
                    ref = add_outside(s, src, buft, src_h)
            if bits & SRC_WEIGHTS:
                s.sweep.node_bits[i] |= NODE_WEIGHTS
                note_weights(&weights, j, bits, buft)
            e = &s.sweep.srcs[k]
            k += 1
            e.ref = ref
            e.j = j
            e.bits = bits
        # the backend its location implies (after its sources: whether it reads weights)
        if (s.hv_tensor_backend_ids[h] == -1
                and cur_may_choose(t, s.sweep.node_bits[i] & NODE_WEIGHTS)):
            s.hv_tensor_backend_ids[h] = backend_id_from_cur(s, t, &s.hv_tensor_causes[h],
                                                             &weights)
        s.sweep.dense_ids[t.order] = s.hv_tensor_backend_ids[h]
    s.sweep.src_begin[graph.n_nodes] = k
    return True


cdef bint expand(SchedCore s, ggml_cgraph * graph, bint down, bint skip_cpu) except -1:
    """One sweep of pass 2: give unassigned nodes the backend of the last
    assigned node before them (down) or after them (up). With skip_cpu the
    CPU (lowest priority) is not expanded, so it is used only where needed.
    True where it leaves a node unassigned (a sweep changes nothing else, so once
    none is left the sweeps after it have nothing to do)."""
    cdef int cur_backend_id = -1, k, b
    cdef int skipped = s.n_backends - 1 if skip_cpu else -1
    cdef int c = 0 if down else s.sweep.n_compute - 1
    cdef int step = 1 if down else -1
    cdef bint left = False
    cdef int ref
    cdef const int * refs = compute_refs_of(s)
    for k in range(s.sweep.n_compute):
        ref = refs[c]
        b = s.sweep.dense_ids[ref]
        if b != -1:
            cur_backend_id = -1 if b == skipped else b
        else:
            if cur_backend_id != -1:
                set_if_supported(s, graph.nodes[s.sweep.compute_nodes[c]], s.sweep.compute_ops[c],
                                 ref, s.sweep.compute_slots[c], cur_backend_id)
            left |= s.sweep.dense_ids[ref] == -1
        c += step
    return left


cdef int pass3_upgrade(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 3: move nodes to a higher-priority backend with the same buffer type
    when it can read all their sources; give each still unassigned node the
    backend that can read most of its sources."""
    cdef int c, i, k, b, n_supported, n_supported_best, cur, ref
    cdef bint supported
    cdef Py_ssize_t h
    cdef ggml_tensor * node
    cdef split_src * e
    cdef const int * refs = compute_refs_of(s)
    for c in range(s.sweep.n_compute):
        i = s.sweep.compute_nodes[c]
        ref = refs[c]
        h = s.sweep.compute_slots[c]
        node = graph.nodes[i]
        cur = s.sweep.dense_ids[ref]
        if cur == -1:
            n_supported_best = -1
            for b in range(s.n_backends):
                if not backend_supports_op(s.backends[b], node):
                    continue
                n_supported = 0
                for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
                    e = &s.sweep.srcs[k]
                    if ((src_backend(s, e) != -1
                         or (e.bits & SRC_VIEW and backend_of(s, src_tensor(s, graph, e).view_src) != -1))
                            and src_readable(s, graph, e, b)):
                        n_supported += 1
                if n_supported > n_supported_best:
                    n_supported_best = n_supported
                    set_backend(s, ref, h, b, CAUSE_3_BEST)
        else:
            for b in range(cur):
                if s.bufts[b] != s.bufts[cur] or not backend_supports_op(s.backends[b], node):
                    continue
                supported = True
                for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
                    if not src_readable(s, graph, &s.sweep.srcs[k], b):
                        supported = False
                        break
                if supported:
                    set_backend(s, ref, h, b, CAUSE_3_UPG)
                    break
    return 0


cdef inline bint _computed_input(ggml_cgraph * graph, ggml_tensor * t) noexcept:
    return ggml_computes(t) or (t.view_src != NULL and ggml_is_computed_from(graph, t.view_src, 0))


cdef int pass4_sources(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 4: views follow their view_src, unassigned sources follow their
    node, and a node still without a backend takes the first that supports it."""
    cdef int i, k, b, bits, ref
    cdef Py_ssize_t h
    cdef ggml_tensor * node
    cdef ggml_tensor * src
    cdef split_src * e
    cdef int8_t * ids = s.sweep.dense_ids
    cdef const int * refs = node_refs_of(s)
    for i in range(graph.n_nodes):
        h = s.sweep.node_slots[i]
        ref = node_ref(refs, i)
        bits = s.sweep.node_bits[i]
        if bits & (NODE_INPUT | NODE_BASE_LATER | NODE_VIEW):
            node = graph.nodes[i]
            if bits & NODE_INPUT and _computed_input(graph, node):
                raise GraphError(
                    f"'{tensor_name(node)}' is flagged INPUT, but the graph computes it (or the "
                    f"tensor it views): inputs hold what the user sets, and the scheduler copies "
                    f"them at the start of a split, before they would be computed")
            # the order rules (_core.pxd) where pass 5 does not look: the base a node
            # writes into (or shows), and a view's sources (the allocator takes them as
            # used where the view is)
            if bits & NODE_BASE_LATER:
                raise GraphError(order_message(node, i, node.view_src))
            if bits & NODE_VIEW and ids[ref] == -1:
                set_backend(s, ref, h, ids[s.sweep.view_refs[i]] if s.sweep.view_refs[i] != -1
                            else backend_of(s, node.view_src), CAUSE_4_VSRC)
        for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
            e = &s.sweep.srcs[k]
            if bits & NODE_VIEW_OP and e.bits & SRC_NOT_BEFORE:
                raise GraphError(order_message(graph.nodes[i], i, src_tensor(s, graph, e)))
            if src_backend(s, e) == -1:
                src = src_tensor(s, graph, e)
                if ggml_views_computed_node(graph, src):
                    raise GraphError(leaf_view_message(src))
                if e.bits & SRC_VIEW:
                    set_backend(s, e.ref, src_slot(s, e), backend_of(s, src.view_src),
                                CAUSE_4_VSRC)
                else:
                    set_backend(s, e.ref, src_slot(s, e), ids[ref], CAUSE_4_CUR)
        if ids[ref] == -1:
            node = graph.nodes[i]
            b = 0
            while b < s.n_backends and ids[ref] == -1:
                set_if_supported(s, node, node.op, ref, h, b)
                b += 1
            if ids[ref] == -1:
                raise SchedulerError(
                    f"no backend supports node '{tensor_name(node)}' (op {_OP_NAMES_LIST[node.op]}); "
                    f"the last backend ({s.backends[s.n_backends - 1].name.decode()}) should be a "
                    f"CPU backend that runs every op", "no-backend-supports-op")
    return 0


cdef inline void _copy_suffix(char * out, int copy_id) noexcept nogil:
    """'#C' for a copy slot C (0 <= C < 10**9)."""
    cdef char digits[12]
    cdef int n = 0, k = 1
    while True:
        digits[n] = 48 + copy_id % 10      # '0' + digit
        n += 1
        copy_id //= 10
        if copy_id == 0:
            break
    out[0] = 35                             # '#'
    while n > 0:
        n -= 1
        out[k] = digits[n]
        k += 1
    out[k] = 0


cdef void name_copy(SchedCore s, ggml_tensor * t, const ggml_tensor * of, int backend_id,
                    int copy_id) noexcept:
    """Name t as the copy of `of` for a backend and copy slot: BACKEND#name#C."""
    cdef char suffix[16]
    _copy_suffix(suffix, copy_id)
    ggml_join_name(t, s.backends[backend_id].name, b"#", of.name, suffix)


cdef ggml_tensor * new_sched_tensor(SchedCore s, ggml_tensor * of, int kind, int backend_id,
                                    int copy_id) except NULL:
    """A copy (same layout, named BACKEND#name#C) or a dependency view of `of`,
    made in the scheduler's arena and recorded for introspection."""
    cdef ggml_tensor * t
    if kind == SCHED_TENSOR_COPY:
        t = ggml_dup_tensor_layout(&s.arena.ctx, of)
        name_copy(s, t, of, backend_id, copy_id)
    else:
        t = ggml_view_tensor(&s.arena.ctx, of)
        tensor_set_src(t, 0, of)
    if t.id >= s.infos_capacity:
        safe_realloc(<void **>&s.infos, 2 * (t.id + 1), sizeof(sched_tensor_info), _TABLES)
        s.infos_capacity = 2 * (t.id + 1)
    s.infos[t.id].kind = kind
    s.infos[t.id].of = of
    s.infos[t.id].backend_id = backend_id
    s.infos[t.id].copy_id = copy_id
    return t


cdef int new_split(SchedCore s, int i_start, int backend_id) except -1:
    cdef int k
    if s.n_splits == s.splits_capacity:
        safe_realloc(<void **>&s.splits, 2 * s.splits_capacity, sizeof(sched_split), _TABLES)
        for k in range(s.splits_capacity, 2 * s.splits_capacity):
            s.splits[k].inputs = NULL
            s.splits[k].backend_id = 0
        s.splits_capacity *= 2
    cdef sched_split * split = &s.splits[s.n_splits]
    if split.inputs == NULL:
        split.inputs = <ggml_tensor **>malloc(s.opts.max_split_inputs * sizeof(ggml_tensor *))
        if split.inputs == NULL:
            raise AllocationError("cannot grow the scheduler's tables")
    if backend_id != -2:        # -2 keeps the slot's previous backend (ggml's first split)
        split.backend_id = backend_id
    split.i_start = i_start
    split.n_inputs = 0
    s.n_splits += 1
    return 0


cdef int note_view_assignment(SchedCore s, ggml_tensor * view, int i, Py_ssize_t h) except -1:
    """A view the user assigned to a backend other than its memory's is planned as ggml
    plans it (its readers there read that memory; others may copy it at the start of
    their split). Its cause says so, and graph_compute refuses it where that computes
    from the wrong bytes (Scheduler._refuse_unreachable_views)."""
    cdef int b = s.hv_tensor_backend_ids[h]
    cdef int vb = backend_of(s, view.view_src)
    if view.view_src != NULL and vb != -1 and s.bufts[vb] != s.bufts[b]:
        s.hv_tensor_causes[h] = CAUSE_USR_AWAY
        s.away_views.append((i, b))
    return 0


cdef int count_new_inputs(SchedCore s, ggml_cgraph * graph, int i, int cur_backend_id) except -1:
    """How many inputs node i would add to a split on cur_backend_id."""
    cdef int k, prev, n = 0
    cdef bint seen
    cdef split_src * e
    for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
        e = &s.sweep.srcs[k]
        seen = False
        for prev in range(s.sweep.src_begin[i], k):
            if src_tensor(s, graph, &s.sweep.srcs[prev]) == src_tensor(s, graph, e):
                seen = True
        if (not seen and src_backend(s, e) != cur_backend_id
                and copy_slot(s, src_slot(s, e), cur_backend_id, 0)[0] == NULL
                and not src_readable(s, graph, e, cur_backend_id)):
            n += 1
    return n


cdef int add_graph_input(SchedCore s, ggml_tensor * src, Py_ssize_t src_id,
                         int src_backend_id) except -1:
    """Pass 5, parallel mode: an input of the graph gets a copy in every copy slot (the
    current slot's is the input itself), once."""
    cdef int c
    cdef ggml_tensor * cpy
    cdef graph_input * gi
    if copy_slot(s, src_id, src_backend_id, 0)[0] != NULL:
        return 0
    if s.pipeline.n_graph_inputs == s.opts.max_graph_inputs:
        raise SchedulerError(
            f"graph input '{tensor_name(src)}' is more than the {s.opts.max_graph_inputs} "
            f"graph inputs a parallel scheduler holds (max_graph_inputs)",
            "too-many-graph-inputs")
    gi = &s.pipeline.graph_inputs[s.pipeline.n_graph_inputs]
    gi.tensor = src
    gi.slot = src_id
    gi.backend_id = src_backend_id
    gi.flags = src.flags
    for c in range(s.pipeline.n_copies):
        if c == s.pipeline.cur_copy:
            cpy = src       # the original is the current copy
        else:
            cpy = new_sched_tensor(s, src, SCHED_TENSOR_COPY, src_backend_id, c)
        # inputs and outputs: ggml-alloc must not overwrite them
        cpy.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
        copy_slot(s, src_id, src_backend_id, c)[0] = cpy
    s.pipeline.n_graph_inputs += 1
    return 0


cdef int add_split_input(SchedCore s, sched_split * split, ggml_tensor * node, int i, int j,
                         ggml_tensor * src, Py_ssize_t src_id, int backend_id) except -1:
    """Pass 5: source j of node (the i-th), src, which the split's backend cannot read,
    is read from its copy on that backend, made (and listed as the split's input) the
    first time."""
    cdef int c
    cdef ggml_tensor * cpy
    if copy_slot(s, src_id, backend_id, 0)[0] == NULL:
        if split.n_inputs == s.opts.max_split_inputs:
            raise SchedulerError(
                f"node '{tensor_name(node)}' alone needs more than the {s.opts.max_split_inputs} "
                f"inputs a split holds (max_split_inputs)", "too-many-split-inputs")
        for c in range(s.pipeline.n_copies):
            cpy = new_sched_tensor(s, src, SCHED_TENSOR_COPY, backend_id, c)
            if s.pipeline.n_copies > 1:
                cpy.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
            copy_slot(s, src_id, backend_id, c)[0] = cpy
        split.inputs[split.n_inputs] = src
        split.n_inputs += 1
    return record_rewiring(s, node, i, j, src,
                           copy_slot(s, src_id, backend_id, s.pipeline.cur_copy)[0])


cdef int pass5_split(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 5: cut the graph where the backend changes and replace every source
    that the split's backend cannot read by a copy on that backend."""
    cdef int i = 0, k, n_new
    cdef int cur_backend_id, node_backend_id, src_backend_id
    cdef bint need_new_split
    cdef ggml_tensor * node
    cdef sched_split * split
    cdef split_src * e
    cdef int8_t * ids = s.sweep.dense_ids
    cdef const int * refs = node_refs_of(s)

    s.n_splits = 0
    s.away_views = []
    new_split(s, 0, -2)
    split = &s.splits[0]
    # the first split's backend is that of the first non-view node
    while i < graph.n_nodes:
        if not s.sweep.node_bits[i] & NODE_VIEW_OP:
            split.backend_id = ids[node_ref(refs, i)]
            break
        i += 1
    cur_backend_id = split.backend_id

    while i < graph.n_nodes:
        node = graph.nodes[i]
        if s.sweep.node_bits[i] & NODE_VIEW_OP:
            if s.sweep.node_bits[i] & NODE_USER:
                note_view_assignment(s, node, i, s.sweep.node_slots[i])
            i += 1
            continue
        node_backend_id = ids[node_ref(refs, i)]

        # a new split where a weight needs copying (its memory can then be
        # reused) or where the node's new inputs would overflow the input list
        need_new_split = False
        if node_backend_id == cur_backend_id and split.n_inputs > 0:
            if s.sweep.node_bits[i] & NODE_WEIGHTS:
                for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
                    e = &s.sweep.srcs[k]
                    if (e.bits & SRC_WEIGHTS
                            and src_backend(s, e) != cur_backend_id
                            and not src_readable(s, graph, e, cur_backend_id)):
                        need_new_split = True
                        break
            if not need_new_split and split.n_inputs + GGML_MAX_SRC > s.opts.max_split_inputs:
                # ggml checks only a full list and aborts when a node brings two
                # inputs to 29; counting gives the same splits where ggml works
                # (and is needed only when the node's sources could overflow it)
                n_new = count_new_inputs(s, graph, i, cur_backend_id)
                need_new_split = n_new > 0 and split.n_inputs + n_new > s.opts.max_split_inputs

        if node_backend_id != cur_backend_id or need_new_split:
            split.i_end = i
            new_split(s, i, node_backend_id)
            split = &s.splits[s.n_splits - 1]
            cur_backend_id = node_backend_id

        # find the inputs that are not on the split's backend
        for k in range(s.sweep.src_begin[i], s.sweep.src_begin[i + 1]):
            e = &s.sweep.srcs[k]
            # ggml assumes nodes come after what they read; a graph that does not
            # would compute garbage
            if e.bits & SRC_NOT_BEFORE:
                raise GraphError(order_message(node, i, src_tensor(s, graph, e)))
            src_backend_id = src_backend(s, e)
            if src_backend_id == -1:
                raise SchedulerError(f"source '{tensor_name(src_tensor(s, graph, e))}' of node "
                                     f"'{tensor_name(node)}' has no backend", "source-without-backend")
            if e.bits & SRC_INPUT and s.pipeline.n_copies > 1 and not s.opts.copy_all_inputs:
                add_graph_input(s, src_tensor(s, graph, e), src_slot(s, e), src_backend_id)
            if src_backend_id != cur_backend_id and not src_readable(s, graph, e, cur_backend_id):
                add_split_input(s, split, node, i, e.j, src_tensor(s, graph, e), src_slot(s, e),
                                cur_backend_id)
        i += 1
    split.i_end = graph.n_nodes
    if s.pipeline.n_copies > 1 and s.opts.copy_all_inputs:
        add_every_input_leaf(s, graph)
    apply_rewirings(s)
    return 0


cdef int add_every_input_leaf(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 6 of the ggml in llama.cpp 0.3.36 (copy_all_inputs), parallel mode: every
    input leaf gets its copies, in leaf order, read by a node or not (ggml 0.10.1 copies
    those pass 5 meets as sources), so that a graph's memory does not depend on which of
    its inputs a batch uses."""
    cdef int i
    cdef ggml_tensor * leaf
    for i in range(graph.n_leafs):
        leaf = graph.leafs[i]
        if leaf.flags & GGML_TENSOR_FLAG_INPUT:
            add_graph_input(s, leaf, s.sweep.node_slots[graph.n_nodes + i],
                            s.sweep.dense_ids[s.sweep.leaf_refs[i]])
    return 0


# ---------------------------------------------------------------------------
# the rewiring of the user's graph: pass 5 points node sources at the scheduler's
# copies (as ggml does). Each is recorded so that it can be undone before the
# arena is reused and when the scheduler goes away, and no user tensor is left
# pointing into freed or reused copies.

cdef int record_rewiring(SchedCore s, ggml_tensor * node, int i, int j,
                         ggml_tensor * original, ggml_tensor * copy) except -1:
    """Remember that source j of node (the i-th), original, is to point at copy.
    apply_rewirings does it: the node's struct is not touched here."""
    cdef sched_rewiring * r
    if s.n_rewired == s.rewired_cap:
        safe_realloc(<void **>&s.rewired, 2 * s.rewired_cap + 32, sizeof(sched_rewiring),
                     "the scheduler's rewiring table")
        s.rewired_cap = 2 * s.rewired_cap + 32
    r = &s.rewired[s.n_rewired]
    r.slot = &node.src[j]
    r.original = original
    r.copy = copy
    r.node = i
    r.src = j
    s.n_rewired += 1
    return 0


cdef void apply_rewirings(SchedCore s) noexcept:
    """Point the recorded sources at their copies, in one sweep that asks for the nodes'
    lines ahead: in a large graph, pass 5 meets a node long after pass 1 read it."""
    cdef int k
    for k in range(s.n_rewired):
        if k + PREFETCH_AHEAD < s.n_rewired:
            prefetch(s.rewired[k + PREFETCH_AHEAD].slot)
        s.rewired[k].slot[0] = s.rewired[k].copy
        tensor_changed(src_owner(s.rewired[k].slot, s.rewired[k].src))


cdef void undo_rewiring(SchedCore s) noexcept:
    """Give the nodes of the graph split last their sources back, where they still
    point at this scheduler's copies (the user may have rewired them since)."""
    cdef int k
    cdef ggml_tensor * cur
    cdef ggml_tensor * original
    cdef Context arena = s.arena
    for k in range(s.n_rewired - 1, -1, -1):
        if k >= PREFETCH_AHEAD:
            prefetch(s.rewired[k - PREFETCH_AHEAD].slot)
        cur = s.rewired[k].slot[0]
        original = s.rewired[k].original
        if cur != original and cur != NULL and cur.owner == <void *>&arena.ctx:
            s.rewired[k].slot[0] = original
            tensor_changed(src_owner(s.rewired[k].slot, s.rewired[k].src))
    s.n_rewired = 0


cdef void retire_arena(SchedCore s) noexcept:
    """Forget the arena's copies and dependency views before the arena is reused or
    freed: a handle the user kept on one must not reach a user tensor that may be gone."""
    cdef int i
    cdef ggml_tensor * t
    cdef Context arena = s.arena
    for i in range(arena.ctx.n_tensors):
        if s.infos[i].kind == SCHED_TENSOR_DEP:
            t = ggml_context_tensor(&arena.ctx, i)
            t.view_src = NULL
            tensor_set_src(t, 0, NULL)
            t.buffer = NULL
            t.data = NULL
            tensor_changed(t)
        s.infos[i].of = NULL
    ggml_context_reset(&arena.ctx)


cdef int grow_ids(SchedCore s, int n) except -1:
    """Room for n graph-copy nodes and leafs in the four backend-id arrays."""
    cdef int ** arrays[4]
    cdef int k
    if n <= s.graph_copy.ids_capacity:
        return 0
    arrays[0] = &s.graph_copy.node_backend_ids
    arrays[1] = &s.graph_copy.leaf_backend_ids
    arrays[2] = &s.graph_copy.prev_node_backend_ids
    arrays[3] = &s.graph_copy.prev_leaf_backend_ids
    for k in range(4):
        safe_realloc(<void **>arrays[k], n, sizeof(int), _TABLES)
        memset(arrays[k][0] + s.graph_copy.ids_capacity, 0,
               (n - s.graph_copy.ids_capacity) * sizeof(int))
    s.graph_copy.ids_capacity = n
    return 0


cdef int build_graph_copy(SchedCore s, ggml_cgraph * graph) except -1:
    """The graph that is allocated and run: each split's input copies (with a
    view of the input so it outlives its copy) before the split's nodes; in
    parallel mode, every copy slot of the inputs as leafs, allocated first."""
    cdef int i, j, c, b, n = 0, l = 0
    cdef int * tmp_ids
    cdef Py_ssize_t id
    cdef sched_split * split
    cdef ggml_tensor * input
    cdef ggml_tensor * dep
    cdef ggml_cgraph * gc = &s.graph_copy.graph
    cdef const int * refs = node_refs_of(s)

    # the previous ids stay for the change check of alloc_graph
    tmp_ids = s.graph_copy.node_backend_ids
    s.graph_copy.node_backend_ids = s.graph_copy.prev_node_backend_ids
    s.graph_copy.prev_node_backend_ids = tmp_ids
    tmp_ids = s.graph_copy.leaf_backend_ids
    s.graph_copy.leaf_backend_ids = s.graph_copy.prev_leaf_backend_ids
    s.graph_copy.prev_leaf_backend_ids = tmp_ids

    cdef int size = (max(graph.n_nodes, graph.n_leafs)
                     + s.n_splits * s.opts.max_split_inputs * 2 * s.pipeline.n_copies)
    s.graph_copy.debug_prev_graph_size = s.graph_copy.debug_graph_size
    s.graph_copy.debug_graph_size = size
    grow_ids(s, size)
    if s.graph_copy.graph_capacity < size:
        safe_realloc(<void **>&gc.nodes, size, sizeof(ggml_tensor *), _TABLES)
        safe_realloc(<void **>&gc.leafs, size, sizeof(ggml_tensor *), _TABLES)
        s.graph_copy.graph_capacity = size
    gc.size = size

    for i in range(s.n_splits):
        split = &s.splits[i]
        for j in range(split.n_inputs):
            input = split.inputs[j]
            id = hash_id(s, input)
            dep = new_sched_tensor(s, input, SCHED_TENSOR_DEP, s.hv_tensor_backend_ids[id], 0)
            s.graph_copy.node_backend_ids[n] = s.hv_tensor_backend_ids[id]
            gc.nodes[n] = dep
            n += 1
            s.graph_copy.node_backend_ids[n] = split.backend_id
            gc.nodes[n] = copy_slot(s, id, split.backend_id, s.pipeline.cur_copy)[0]
            n += 1
        for j in range(split.i_start, split.i_end):
            s.graph_copy.node_backend_ids[n] = s.sweep.dense_ids[node_ref(refs, j)]
            gc.nodes[n] = graph.nodes[j]
            n += 1

    if s.pipeline.n_copies > 1:
        # (rotate_copy_slot finds the graph inputs' copies here, n_copies a graph input)
        for i in range(s.pipeline.n_graph_inputs):
            id = s.pipeline.graph_inputs[i].slot
            b = s.pipeline.graph_inputs[i].backend_id
            for c in range(s.pipeline.n_copies):
                s.graph_copy.leaf_backend_ids[l] = b
                gc.leafs[l] = copy_slot(s, id, b, c)[0]
                l += 1
        for i in range(s.n_splits):
            split = &s.splits[i]
            for j in range(split.n_inputs):
                id = hash_id(s, split.inputs[j])
                for c in range(s.pipeline.n_copies):
                    s.graph_copy.leaf_backend_ids[l] = split.backend_id
                    gc.leafs[l] = copy_slot(s, id, split.backend_id, c)[0]
                    l += 1

    for i in range(graph.n_leafs):
        s.graph_copy.leaf_backend_ids[l] = s.sweep.dense_ids[s.sweep.leaf_refs[i]]
        gc.leafs[l] = graph.leafs[i]
        l += 1
    gc.n_nodes = n
    gc.n_leafs = l
    return 0


cdef void clear_tables(SchedCore s) noexcept:
    """Forget every assignment, cause and copy of the hash set's tensors."""
    ggml_hash_set_reset(&s.hash_set)
    memset(s.hv_tensor_backend_ids, -1, s.hash_set.size * sizeof(int8_t))
    memset(s.hv_tensor_causes, 0, s.hash_set.size * sizeof(uint8_t))
    memset(s.hv_tensor_copies, 0,
           s.hash_set.size * s.n_backends * s.pipeline.n_copies * sizeof(ggml_tensor *))
    s.tables_fresh = True
    s.fp.keys_stale = False


cdef int check_graph_fits(SchedCore s, ggml_cgraph * graph) except -1:
    """ggml asserts that the hash set has a slot for every node and leaf."""
    if graph.n_nodes + graph.n_leafs > <int>s.hash_set.size:
        raise SchedulerError(
            f"the graph has {graph.n_nodes} nodes and {graph.n_leafs} leafs, more than the "
            f"{s.hash_set.size} slots of the scheduler's hash set (graph_size "
            f"{s.opts.graph_size}); "
            f"graph_size must count nodes and leafs", "hash-set-too-small")
    return 0


cdef int split_passes(SchedCore s, Graph g) except -1:
    """ggml_backend_sched_split_graph's passes, on tables that hold only the user's
    assignments (the caller, sched_split, took no kept plan). The previous split's
    rewiring is undone first (whatever graph it was). On error the split leaves nothing
    in the graph and the scheduler is left reset-able: the next reset() clears what it
    assigned."""
    cdef ggml_cgraph * graph = &g.graph
    undo_rewiring(s)
    retire_arena(s)
    if s.split_pending:
        s.plan_stale = True
    s.split_pending = True
    s.n_splits = 0
    s.pipeline.n_graph_inputs = 0
    s.is_reset = False
    s.last_graph = NULL
    s.last_graph_obj = g
    try:
        check_graph_fits(s, graph)
        pass1_preallocated(s, graph)
        # pass 2: expand the assignments to neighbouring nodes; GPUs first (down, up),
        # then every backend (down, up), while any node is left unassigned
        if (expand(s, graph, True, True) and expand(s, graph, False, True)
                and expand(s, graph, True, False)):
            expand(s, graph, False, False)
        pass3_upgrade(s, graph)
        pass4_sources(s, graph)
        pass5_split(s, graph)
        build_graph_copy(s, graph)
    except BaseException:
        undo_rewiring(s)
        raise
    s.last_graph = graph
    return 0
