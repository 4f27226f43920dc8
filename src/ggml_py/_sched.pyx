"""Scheduler core: a port of ggml_backend_sched_split_graph (ggml 0.10.1).

Given a graph and backends in priority order, decide where every node runs,
cut the graph into splits, add copies of the inputs that a split's backend
cannot read, and build the graph copy that the allocator places and the
runtime executes. The five passes follow ggml's pass for pass; the loops run
over C structs only. Where ggml aborts on user input, this raises
SchedulerError (with the abort class of SCHED_CASES.md as `kind`) and the
scheduler stays usable.
"""

from libc.stdlib cimport malloc, calloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.string cimport memset, memcpy, memcmp, strncmp
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

from ggml_py._ggml cimport *
from ggml_py._core cimport (Context, Tensor, Graph, ggml_join_name, tensor_handle, tensor_name,
                            ggml_hash_set_init, ggml_hash_set_free, ggml_hash_set_reset,
                            hash_probe_stats,
                            ggml_hash_home, ggml_hash_find_or_insert, ggml_hash_find,
                            ggml_bitset_get, ggml_bitset_set, world_epoch, buffers_epoch,
                            ggml_is_view_op, ggml_dup_tensor_layout, ggml_view_tensor,
                            ggml_context_reset, ggml_context_tensor, ggml_is_node_from,
                            ggml_views_computed_node, leaf_view_message,
                            ggml_hash_size, ggml_context, ggml_is_computed_from,
                            ggml_computes, OP_NONE, OP_CPY, mutation_epoch, tensor_changed, tensor_set_src,
                            src_owner, graph_unchanged_since, order_message, LAYOUT_BYTES, new_epoch,
                            source_mask, lowest_bit, PREFETCH_AHEAD, prefetch, prefetch_bytes,
                            prefetch_memory, prefetch_leaf_ahead, prefetch_node_ahead,
                            checked_calloc, safe_realloc, int_arg, index_arg, OP_ROPE,
                            graph_tensor)
from ggml_py._backend cimport (Backend, Buffer, BufferType, backend_supports_op, backend_supports_op_of,
                               backend_supports_buft, backend_offload_op, tensor_is_written)

from ggml_py._alloc cimport GraphAllocator, recorded_place, GGML_VBUFFER_MAX_CHUNKS

from ggml_py._core import OP_NAMES_LIST as _OP_NAMES_LIST, check_memory_available
from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, GraphError,
                            SchedulerError)

CAUSE_NAMES = {CAUSE_NONE: "", CAUSE_USR: "usr", CAUSE_USR_AWAY: "usr.away", CAUSE_1_DST: "1.dst",
               CAUSE_1_VSRC: "1.vsrc", CAUSE_1_INP: "1.inp", CAUSE_1_OFF: "1.off", CAUSE_2_SUP: "2.sup",
               CAUSE_3_BEST: "3.best", CAUSE_3_UPG: "3.upg", CAUSE_4_VSRC: "4.vsrc",
               CAUSE_4_CUR: "4.cur"}
for _i in range(GGML_MAX_SRC):
    CAUSE_NAMES[CAUSE_1_WGT0 + _i] = f"1.wgt{_i}"

_TABLES = "the scheduler's tables"          # what safe_realloc names when a table cannot grow


cdef inline ggml_backend_buffer * _memory(SchedCore s, ggml_backend_buffer * b) noexcept:
    """b, unless it is one of this scheduler's compute buffers: a tensor placed there by
    an earlier allocation is placed anew by the next, so the split treats it as
    unallocated (ggml would take it for memory of its own, a graph's stale placement)."""
    return NULL if b != NULL and b.allocator == <void *>s.galloc else b


cdef inline ggml_backend_buffer * memory_key(SchedCore s, const ggml_tensor * t,
                                             size_t * offset) noexcept:
    """The memory t has before an allocation, as the split and the allocator see it:
    its buffer (NULL for none or a compute buffer of this scheduler's) and the data
    offset in it (the address for memory outside any buffer)."""
    cdef ggml_backend_buffer * b = _memory(s, t.buffer)
    if b != NULL:
        offset[0] = <size_t>(t.data - b.base)
    elif t.buffer == NULL:
        offset[0] = <size_t>t.data
    else:
        offset[0] = 0
    return b


cdef inline ggml_backend_buffer * _base_buffer(SchedCore s, const ggml_tensor * t) noexcept:
    return _memory(s, t.view_src.buffer if t.view_src != NULL else t.buffer)


# ---------------------------------------------------------------------------
# hash map access (ggml: hash_id / tensor_backend_id / tensor_copy macros)

cdef inline Py_ssize_t hash_id(SchedCore s, ggml_tensor * t) except -1:
    cdef size_t i = ggml_hash_find_or_insert(&s.hash_set, t)
    if i == GGML_HASHSET_FULL:
        raise SchedulerError(
            f"the scheduler's hash set is full ({s.hash_set.size} slots, from graph_size "
            f"{s.graph_size}) at tensor '{tensor_name(t)}': the graph and the tensors it refers to "
            f"need more slots; create the scheduler with a larger graph_size", "hash-set-too-small")
    return <Py_ssize_t>i


cdef inline int backend_of(SchedCore s, ggml_tensor * t) except -2:
    """tensor_backend_id; a NULL tensor has none (ggml would insert NULL as a key)."""
    if t == NULL:
        return -1
    return s.hv_tensor_backend_ids[hash_id(s, t)]


cdef inline ggml_tensor ** copy_slot(SchedCore s, Py_ssize_t id, int backend_id, int copy_id) noexcept:
    return &s.hv_tensor_copies[(id * s.n_backends + backend_id) * s.n_copies + copy_id]


cdef inline Py_ssize_t split_input_slot(SchedCore s, int k, ggml_tensor * input) except -1:
    """The hash slot of the k-th split input (over all splits, in order), without re-keying
    the hash set where its keys went stale (the compute of every step asks)."""
    return s.fp_entries[s.fp_input_entries[k]].slot if s.keys_stale else hash_id(s, input)


cdef inline Py_ssize_t slot_of(SchedCore s, const ggml_tensor * t) noexcept:
    """t's hash slot, without inserting it (-1 when t is not in the hash set)."""
    cdef size_t i = ggml_hash_find(&s.hash_set, t)
    if i == GGML_HASHSET_FULL or not ggml_bitset_get(s.hash_set.used, i):
        return -1
    return <Py_ssize_t>i


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
        if buf != NULL or _memory(s, tensor.buffer) != NULL:
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
        if s.op_offload and src_backend_id == s.n_backends - 1 and weights.host:
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
    s.dense_bits[ref] = describe_source(s, t, &buft)
    if buft != NULL:
        s.dense_bufts[ref] = buft


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
        return s.outside[-2 - e.ref].tensor
    return graph_tensor(graph, e.ref)


cdef inline ggml_backend_buffer_type * src_buft(SchedCore s, const split_src * e) noexcept:
    """The buffer type of a node source's memory; NULL: it has none yet."""
    if not e.bits & SRC_MEMORY:
        return NULL
    return s.dense_bufts[e.ref] if e.ref >= 0 else s.outside[-2 - e.ref].buft


cdef inline Py_ssize_t src_slot(SchedCore s, const split_src * e) noexcept:
    """The hash slot of a node source (passes 4 and 5: where it gets a backend or copies)."""
    return s.node_slots[e.ref] if e.ref >= 0 else s.outside[-2 - e.ref].slot


cdef inline int src_backend(SchedCore s, const split_src * e) noexcept:
    """The backend id of a node source (passes 2 to 5)."""
    return s.dense_ids[e.ref] if e.ref >= 0 else s.hv_tensor_backend_ids[src_slot(s, e)]


cdef inline const int * node_refs_of(SchedCore s) noexcept:
    """Each node's index in dense_ids (passes 2 to 5), or NULL where it is its position."""
    return NULL if s.refs_are_positions else s.node_refs


cdef inline int node_ref(const int * refs, int i) noexcept:
    """Node i's index in dense_ids, from node_refs_of."""
    return i if refs == NULL else refs[i]


cdef inline const int * compute_refs_of(SchedCore s) noexcept:
    """The index in dense_ids of each node that is not a view op (compute_nodes: the
    positions of those nodes, where they are their indexes)."""
    return s.compute_nodes if s.refs_are_positions else s.compute_refs


cdef inline void set_backend(SchedCore s, int ref, Py_ssize_t h, int backend_id,
                             uint8_t cause) noexcept:
    """Assign a tensor (hash slot h, index ref in dense_ids or -1) in passes 2 to 5."""
    s.hv_tensor_backend_ids[h] = backend_id
    s.hv_tensor_causes[h] = cause
    if ref >= 0:
        s.dense_ids[ref] = backend_id


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
    if graph.n_nodes > s.node_slots_capacity or s.src_begin == NULL:
        safe_realloc(<void **>&s.src_begin, graph.n_nodes + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.node_bits, graph.n_nodes, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.view_refs, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.compute_nodes, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.compute_refs, graph.n_nodes, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.compute_slots, graph.n_nodes, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.compute_ops, graph.n_nodes, sizeof(uint16_t), _TABLES)
        safe_realloc(<void **>&s.node_refs, graph.n_nodes, sizeof(int), _TABLES)
        s.node_slots_capacity = graph.n_nodes
    if graph.n_leafs + graph.n_nodes > s.pre_capacity or s.pre_memory == NULL:
        safe_realloc(<void **>&s.pre_memory, graph.n_leafs + graph.n_nodes + 1, sizeof(void *), _TABLES)
        safe_realloc(<void **>&s.pre_offset, graph.n_leafs + graph.n_nodes + 1, sizeof(size_t), _TABLES)
        safe_realloc(<void **>&s.pre_indexes, graph.n_leafs + graph.n_nodes + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.dense_bufts, graph.n_leafs + graph.n_nodes + 1, sizeof(void *), _TABLES)
        safe_realloc(<void **>&s.dense_bits, graph.n_leafs + graph.n_nodes + 1, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.leaf_refs, graph.n_leafs + graph.n_nodes + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.node_slots, graph.n_leafs + graph.n_nodes + 1, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.dense_ids, graph.n_leafs + graph.n_nodes + 1, sizeof(int8_t), _TABLES)
        s.pre_capacity = graph.n_leafs + graph.n_nodes
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
    s.refs_are_positions = pass1_sweep(s, graph, False, &leaf_views)
    if not s.refs_are_positions:
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
        s.pre_indexes[s.n_pre_indexes] = index
        s.n_pre_indexes += 1


cdef void spread_pre_memory(SchedCore s, ggml_cgraph * graph) noexcept:
    """pre_memory and pre_offset of the tensors of graph, split last and allocated since
    (unchanged since: fp_build's condition), from pass 1's list."""
    cdef int k, index
    cdef int n = graph.n_leafs + graph.n_nodes
    cdef const ggml_tensor * t
    memset(s.pre_memory, 0, n * sizeof(void *))
    memset(s.pre_offset, 0, n * sizeof(size_t))
    for k in range(s.n_pre_indexes):
        index = s.pre_indexes[k]
        t = graph.leafs[index] if index < graph.n_leafs else graph.nodes[index - graph.n_leafs]
        s.pre_memory[index] = memory_key(s, t, &s.pre_offset[index])


cdef int add_outside(SchedCore s, ggml_tensor * t, ggml_backend_buffer_type * buft,
                     Py_ssize_t slot) except? -1:
    """Keep a source outside the graph (its buft and hash slot); its split_src.ref."""
    cdef outside_source * o
    if s.n_outside == s.outside_capacity:
        safe_realloc(<void **>&s.outside, 2 * s.outside_capacity + 16, sizeof(outside_source),
                     _TABLES)
        s.outside_capacity = 2 * s.outside_capacity + 16
    o = &s.outside[s.n_outside]
    o.tensor = t
    o.buft = buft
    o.slot = slot
    s.n_outside += 1
    return -1 - s.n_outside        # -2 - its index


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
    s.n_outside = 0
    s.n_pre_indexes = 0
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
        s.node_slots[graph.n_nodes + i] = h
        if not exact or not ggml_is_node_from(graph, t, 0):
            t.order = -2 - i        # (hashed_ref)
        ref = graph.n_nodes + i if t.order < 0 else t.order  # (a node too)
        s.leaf_refs[i] = ref
        leaf_views[0] |= t.view_src != NULL
        record_tensor(s, ref, t)
        if s.hv_tensor_backend_ids[h] == -1:
            find_weights(s, t, &weights)
            s.hv_tensor_backend_ids[h] = backend_id_from_cur(s, t, &s.hv_tensor_causes[h],
                                                             &weights)
        s.dense_ids[ref] = s.hv_tensor_backend_ids[h]
    s.n_compute = 0
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
        s.node_slots[i] = h
        if exact:
            s.node_refs[i] = t.order    # i, or its last position (the order sweep's)
        # what its readers record of it (before its sources: a node may read itself)
        record_tensor(s, t.order, t)
        s.node_bits[i] = NODE_INPUT if t.flags & GGML_TENSOR_FLAG_INPUT else 0
        if ggml_is_view_op(t.op):
            s.node_bits[i] |= NODE_VIEW_OP
            if (s.hv_tensor_backend_ids[h] != -1
                    and (s.hv_tensor_causes[h] == CAUSE_USR
                         or s.hv_tensor_causes[h] == CAUSE_USR_AWAY)):
                s.node_bits[i] |= NODE_USER
        else:
            s.compute_nodes[s.n_compute] = i
            if exact:
                s.compute_refs[s.n_compute] = t.order
            s.compute_slots[s.n_compute] = h
            s.compute_ops[s.n_compute] = <uint16_t>t.op
            s.n_compute += 1
        if t.view_src != NULL:
            # else pass 4 hashes it, only where ggml would (read only for NODE_VIEW)
            s.view_refs[i] = hashed_ref(s, graph, t.view_src, i)
            if s.view_refs[i] == -1 and not exact:
                return False        # a base that is a later node, or outside the graph
            s.node_bits[i] |= NODE_VIEW | (
                NODE_BASE_LATER if t.op != OP_NONE and ggml_is_computed_from(graph, t.view_src, i)
                else 0)
        m = source_mask(t)
        s.src_begin[i] = k
        if k + GGML_MAX_SRC > s.src_capacity:
            safe_realloc(<void **>&s.srcs, 2 * (k + GGML_MAX_SRC), sizeof(split_src), _TABLES)
            s.src_capacity = 2 * (k + GGML_MAX_SRC)
        weights.j = -1
        while m:
            j = lowest_bit(m)
            m &= m - 1
            src = t.src[j]
            ref = hashed_ref(s, graph, src, i)
            if ref != -1:
                bits = s.dense_bits[ref]
                # a node reading itself is out of order, but for ggml_cast's CPY, whose
                # src[1] is itself (its destination; computed as one op)
                if ref == i and not (j == 1 and t.op == OP_CPY):
                    bits |= SRC_NOT_BEFORE
                buft = NULL
                if bits & SRC_WEIGHTS and bits & SRC_MEMORY:
                    buft = s.dense_bufts[ref]
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
                s.node_bits[i] |= NODE_WEIGHTS
                note_weights(&weights, j, bits, buft)
            e = &s.srcs[k]
            k += 1
            e.ref = ref
            e.j = j
            e.bits = bits
        # the backend its location implies (after its sources: whether it reads weights)
        if (s.hv_tensor_backend_ids[h] == -1
                and cur_may_choose(t, s.node_bits[i] & NODE_WEIGHTS)):
            s.hv_tensor_backend_ids[h] = backend_id_from_cur(s, t, &s.hv_tensor_causes[h],
                                                             &weights)
        s.dense_ids[t.order] = s.hv_tensor_backend_ids[h]
    s.src_begin[graph.n_nodes] = k
    return True


cdef bint expand(SchedCore s, ggml_cgraph * graph, bint down, bint skip_cpu) except -1:
    """One sweep of pass 2: give unassigned nodes the backend of the last
    assigned node before them (down) or after them (up). With skip_cpu the
    CPU (lowest priority) is not expanded, so it is used only where needed.
    True where it leaves a node unassigned (a sweep changes nothing else, so once
    none is left the sweeps after it have nothing to do)."""
    cdef int cur_backend_id = -1, k, b
    cdef int skipped = s.n_backends - 1 if skip_cpu else -1
    cdef int c = 0 if down else s.n_compute - 1
    cdef int step = 1 if down else -1
    cdef bint left = False
    cdef int ref
    cdef const int * refs = compute_refs_of(s)
    for k in range(s.n_compute):
        ref = refs[c]
        b = s.dense_ids[ref]
        if b != -1:
            cur_backend_id = -1 if b == skipped else b
        else:
            if cur_backend_id != -1:
                set_if_supported(s, graph.nodes[s.compute_nodes[c]], s.compute_ops[c],
                                 ref, s.compute_slots[c], cur_backend_id)
            left |= s.dense_ids[ref] == -1
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
    for c in range(s.n_compute):
        i = s.compute_nodes[c]
        ref = refs[c]
        h = s.compute_slots[c]
        node = graph.nodes[i]
        cur = s.dense_ids[ref]
        if cur == -1:
            n_supported_best = -1
            for b in range(s.n_backends):
                if not backend_supports_op(s.backends[b], node):
                    continue
                n_supported = 0
                for k in range(s.src_begin[i], s.src_begin[i + 1]):
                    e = &s.srcs[k]
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
                for k in range(s.src_begin[i], s.src_begin[i + 1]):
                    if not src_readable(s, graph, &s.srcs[k], b):
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
    cdef int8_t * ids = s.dense_ids
    cdef const int * refs = node_refs_of(s)
    for i in range(graph.n_nodes):
        h = s.node_slots[i]
        ref = node_ref(refs, i)
        bits = s.node_bits[i]
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
                set_backend(s, ref, h, ids[s.view_refs[i]] if s.view_refs[i] != -1
                            else backend_of(s, node.view_src), CAUSE_4_VSRC)
        for k in range(s.src_begin[i], s.src_begin[i + 1]):
            e = &s.srcs[k]
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


cdef inline void name_copy(SchedCore s, ggml_tensor * t, const ggml_tensor * of, int backend_id,
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
        split.inputs = <ggml_tensor **>malloc(s.max_split_inputs * sizeof(ggml_tensor *))
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
    for k in range(s.src_begin[i], s.src_begin[i + 1]):
        e = &s.srcs[k]
        seen = False
        for prev in range(s.src_begin[i], k):
            if src_tensor(s, graph, &s.srcs[prev]) == src_tensor(s, graph, e):
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
    if s.n_graph_inputs == s.max_graph_inputs:
        raise SchedulerError(
            f"graph input '{tensor_name(src)}' is more than the {s.max_graph_inputs} "
            f"graph inputs a parallel scheduler holds (max_graph_inputs)",
            "too-many-graph-inputs")
    gi = &s.graph_inputs[s.n_graph_inputs]
    gi.tensor = src
    gi.slot = src_id
    gi.backend_id = src_backend_id
    gi.flags = src.flags
    for c in range(s.n_copies):
        if c == s.cur_copy:
            cpy = src       # the original is the current copy
        else:
            cpy = new_sched_tensor(s, src, SCHED_TENSOR_COPY, src_backend_id, c)
        # inputs and outputs: ggml-alloc must not overwrite them
        cpy.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
        copy_slot(s, src_id, src_backend_id, c)[0] = cpy
    s.n_graph_inputs += 1
    return 0


cdef int add_split_input(SchedCore s, sched_split * split, ggml_tensor * node, int i, int j,
                         ggml_tensor * src, Py_ssize_t src_id, int backend_id) except -1:
    """Pass 5: source j of node (the i-th), src, which the split's backend cannot read,
    is read from its copy on that backend, made (and listed as the split's input) the
    first time."""
    cdef int c
    cdef ggml_tensor * cpy
    if copy_slot(s, src_id, backend_id, 0)[0] == NULL:
        if split.n_inputs == s.max_split_inputs:
            raise SchedulerError(
                f"node '{tensor_name(node)}' alone needs more than the {s.max_split_inputs} "
                f"inputs a split holds (max_split_inputs)", "too-many-split-inputs")
        for c in range(s.n_copies):
            cpy = new_sched_tensor(s, src, SCHED_TENSOR_COPY, backend_id, c)
            if s.n_copies > 1:
                cpy.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
            copy_slot(s, src_id, backend_id, c)[0] = cpy
        split.inputs[split.n_inputs] = src
        split.n_inputs += 1
    return record_rewiring(s, node, i, j, src, copy_slot(s, src_id, backend_id, s.cur_copy)[0])


cdef int pass5_split(SchedCore s, ggml_cgraph * graph) except -1:
    """Pass 5: cut the graph where the backend changes and replace every source
    that the split's backend cannot read by a copy on that backend."""
    cdef int i = 0, k, n_new
    cdef int cur_backend_id, node_backend_id, src_backend_id
    cdef bint need_new_split
    cdef ggml_tensor * node
    cdef sched_split * split
    cdef split_src * e
    cdef int8_t * ids = s.dense_ids
    cdef const int * refs = node_refs_of(s)

    s.n_splits = 0
    s.away_views = []
    new_split(s, 0, -2)
    split = &s.splits[0]
    # the first split's backend is that of the first non-view node
    while i < graph.n_nodes:
        if not s.node_bits[i] & NODE_VIEW_OP:
            split.backend_id = ids[node_ref(refs, i)]
            break
        i += 1
    cur_backend_id = split.backend_id

    while i < graph.n_nodes:
        node = graph.nodes[i]
        if s.node_bits[i] & NODE_VIEW_OP:
            if s.node_bits[i] & NODE_USER:
                note_view_assignment(s, node, i, s.node_slots[i])
            i += 1
            continue
        node_backend_id = ids[node_ref(refs, i)]

        # a new split where a weight needs copying (its memory can then be
        # reused) or where the node's new inputs would overflow the input list
        need_new_split = False
        if node_backend_id == cur_backend_id and split.n_inputs > 0:
            if s.node_bits[i] & NODE_WEIGHTS:
                for k in range(s.src_begin[i], s.src_begin[i + 1]):
                    e = &s.srcs[k]
                    if (e.bits & SRC_WEIGHTS
                            and src_backend(s, e) != cur_backend_id
                            and not src_readable(s, graph, e, cur_backend_id)):
                        need_new_split = True
                        break
            if not need_new_split and split.n_inputs + GGML_MAX_SRC > s.max_split_inputs:
                # ggml checks only a full list and aborts when a node brings two
                # inputs to 29; counting gives the same splits where ggml works
                # (and is needed only when the node's sources could overflow it)
                n_new = count_new_inputs(s, graph, i, cur_backend_id)
                need_new_split = n_new > 0 and split.n_inputs + n_new > s.max_split_inputs

        if node_backend_id != cur_backend_id or need_new_split:
            split.i_end = i
            new_split(s, i, node_backend_id)
            split = &s.splits[s.n_splits - 1]
            cur_backend_id = node_backend_id

        # find the inputs that are not on the split's backend
        for k in range(s.src_begin[i], s.src_begin[i + 1]):
            e = &s.srcs[k]
            # ggml assumes nodes come after what they read; a graph that does not
            # would compute garbage
            if e.bits & SRC_NOT_BEFORE:
                raise GraphError(order_message(node, i, src_tensor(s, graph, e)))
            src_backend_id = src_backend(s, e)
            if src_backend_id == -1:
                raise SchedulerError(f"source '{tensor_name(src_tensor(s, graph, e))}' of node "
                                     f"'{tensor_name(node)}' has no backend", "source-without-backend")
            if e.bits & SRC_INPUT and s.n_copies > 1 and not s.copy_all_inputs:
                add_graph_input(s, src_tensor(s, graph, e), src_slot(s, e), src_backend_id)
            if src_backend_id != cur_backend_id and not src_readable(s, graph, e, cur_backend_id):
                add_split_input(s, split, node, i, e.j, src_tensor(s, graph, e), src_slot(s, e),
                                cur_backend_id)
        i += 1
    split.i_end = graph.n_nodes
    if s.n_copies > 1 and s.copy_all_inputs:
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
            add_graph_input(s, leaf, s.node_slots[graph.n_nodes + i],
                            s.dense_ids[s.leaf_refs[i]])
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
    if n <= s.ids_capacity:
        return 0
    arrays[0] = &s.node_backend_ids
    arrays[1] = &s.leaf_backend_ids
    arrays[2] = &s.prev_node_backend_ids
    arrays[3] = &s.prev_leaf_backend_ids
    for k in range(4):
        safe_realloc(<void **>arrays[k], n, sizeof(int), _TABLES)
        memset(arrays[k][0] + s.ids_capacity, 0, (n - s.ids_capacity) * sizeof(int))
    s.ids_capacity = n
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
    cdef ggml_cgraph * gc = &s.graph
    cdef const int * refs = node_refs_of(s)

    # the previous ids stay for the change check of alloc_graph
    tmp_ids = s.node_backend_ids
    s.node_backend_ids = s.prev_node_backend_ids
    s.prev_node_backend_ids = tmp_ids
    tmp_ids = s.leaf_backend_ids
    s.leaf_backend_ids = s.prev_leaf_backend_ids
    s.prev_leaf_backend_ids = tmp_ids

    cdef int size = max(graph.n_nodes, graph.n_leafs) + s.n_splits * s.max_split_inputs * 2 * s.n_copies
    s.debug_prev_graph_size = s.debug_graph_size
    s.debug_graph_size = size
    grow_ids(s, size)
    if s.graph_capacity < size:
        safe_realloc(<void **>&gc.nodes, size, sizeof(ggml_tensor *), _TABLES)
        safe_realloc(<void **>&gc.leafs, size, sizeof(ggml_tensor *), _TABLES)
        s.graph_capacity = size
    gc.size = size

    for i in range(s.n_splits):
        split = &s.splits[i]
        for j in range(split.n_inputs):
            input = split.inputs[j]
            id = hash_id(s, input)
            dep = new_sched_tensor(s, input, SCHED_TENSOR_DEP, s.hv_tensor_backend_ids[id], 0)
            s.node_backend_ids[n] = s.hv_tensor_backend_ids[id]
            gc.nodes[n] = dep
            n += 1
            s.node_backend_ids[n] = split.backend_id
            gc.nodes[n] = copy_slot(s, id, split.backend_id, s.cur_copy)[0]
            n += 1
        for j in range(split.i_start, split.i_end):
            s.node_backend_ids[n] = s.dense_ids[node_ref(refs, j)]
            gc.nodes[n] = graph.nodes[j]
            n += 1

    if s.n_copies > 1:
        # (rotate_copy_slot finds the graph inputs' copies here, n_copies a graph input)
        for i in range(s.n_graph_inputs):
            id = s.graph_inputs[i].slot
            b = s.graph_inputs[i].backend_id
            for c in range(s.n_copies):
                s.leaf_backend_ids[l] = b
                gc.leafs[l] = copy_slot(s, id, b, c)[0]
                l += 1
        for i in range(s.n_splits):
            split = &s.splits[i]
            for j in range(split.n_inputs):
                id = hash_id(s, split.inputs[j])
                for c in range(s.n_copies):
                    s.leaf_backend_ids[l] = split.backend_id
                    gc.leafs[l] = copy_slot(s, id, split.backend_id, c)[0]
                    l += 1

    for i in range(graph.n_leafs):
        s.leaf_backend_ids[l] = s.dense_ids[s.leaf_refs[i]]
        gc.leafs[l] = graph.leafs[i]
        l += 1
    gc.n_nodes = n
    gc.n_leafs = l
    return 0


_MAX_BACKENDS_C = 64         # the C limit; Scheduler holds ggml's 16 (max_backends)
_MAX_LIMIT = 1 << 16         # split inputs, graph inputs and copies
_INT32_MAX = (1 << 31) - 1


cdef void clear_tables(SchedCore s) noexcept:
    """Forget every assignment, cause and copy of the hash set's tensors."""
    ggml_hash_set_reset(&s.hash_set)
    memset(s.hv_tensor_backend_ids, -1, s.hash_set.size * sizeof(int8_t))
    memset(s.hv_tensor_causes, 0, s.hash_set.size * sizeof(uint8_t))
    memset(s.hv_tensor_copies, 0,
           s.hash_set.size * s.n_backends * s.n_copies * sizeof(ggml_tensor *))
    s.tables_fresh = True
    s.keys_stale = False


cdef int sched_reset(SchedCore s) except -1:
    """ggml_backend_sched_reset: forget assignments and copies (once per split). A
    reusable plan keeps its tables until something needs them cleared (forget_plan):
    the next alloc_graph of the same graph may take the plan again."""
    if not s.is_reset:
        if s.plan_reusable:
            s.reset_deferred = True
        else:
            clear_tables(s)
        s.user_assignments = {}
        s.is_reset = True
    s.is_alloc = False
    return 0


cdef int forget_plan(SchedCore s) except -1:
    """The kept plan will not be reused: do a deferred reset now, with the user
    assignments made since."""
    cdef Py_ssize_t h
    s.plan_reusable = False
    if s.reset_deferred:
        s.reset_deferred = False
        clear_tables(s)
        for t, b in s.user_assignments.values():
            h = hash_id(s, (<Tensor>t).ptr)
            s.hv_tensor_backend_ids[h] = b
            s.hv_tensor_causes[h] = CAUSE_USR
    return 0


cdef inline ggml_tensor * sibling_copy(SchedCore s, ggml_tensor * cpy, int slot) noexcept:
    """The copy of the same tensor on the same backend for copy slot `slot`: a split
    input's copies are made together, one per slot, in order (add_split_input)."""
    cdef Context arena = s.arena
    return ggml_context_tensor(&arena.ctx, cpy.id - s.infos[cpy.id].copy_id + slot)


cdef int prepare_rotation(SchedCore s) except -1:
    """Can the plan just allocated move to another copy slot in place (rotate_copy_slot)?
    It can when each graph input is memory of its own in the compute buffers, as its
    copies are; then the graph copy's views of graph inputs are listed, to follow them.
    (Else the allocator places the moved plan, as it would a fresh split's.)"""
    cdef int i, k
    cdef ggml_tensor * t
    cdef ggml_cgraph * gc = &s.graph
    s.n_input_views = 0
    s.rotates_in_place = False
    for i in range(s.n_graph_inputs):
        t = s.graph_inputs[i].tensor
        if t.view_src != NULL or t.buffer == NULL or _memory(s, t.buffer) != NULL:
            return 0
    for k in range(-gc.n_leafs, gc.n_nodes):
        t = gc.nodes[k] if k >= 0 else gc.leafs[~k]
        if t.view_src == NULL or not t.view_src.flags & GGML_TENSOR_FLAG_INPUT:
            continue
        for i in range(s.n_graph_inputs):
            if t.view_src == s.graph_inputs[i].tensor:
                if s.n_input_views == s.input_views_cap:
                    safe_realloc(<void **>&s.input_views, 2 * s.input_views_cap + 8,
                                 sizeof(ggml_tensor *), _TABLES)
                    s.input_views_cap = 2 * s.input_views_cap + 8
                s.input_views[s.n_input_views] = t
                s.n_input_views += 1
                break
    s.rotates_in_place = True
    return 0


cdef int alloc_again(SchedCore s) except -1:
    """Allocate the kept plan, moved to another copy slot, as alloc_graph allocates a
    fresh split of the same graph there (which leaves the previous backend ids and graph
    size equal to the new ones). 1 ok, 0 failed."""
    memcpy(s.prev_node_backend_ids, s.node_backend_ids, s.graph.n_nodes * sizeof(int))
    memcpy(s.prev_leaf_backend_ids, s.leaf_backend_ids, s.graph.n_leafs * sizeof(int))
    s.debug_prev_graph_size = s.debug_graph_size
    return sched_alloc_splits(s)


cdef int init_moved(ggml_tensor * t) except -1:
    """A tensor moved within a buffer whose init_tensor slot runs: run it, as a
    placement there does."""
    if t.buffer.pyobj != NULL and (<Buffer>t.buffer.pyobj)._has_init_tensor:
        (<Buffer>t.buffer.pyobj).init_tensor(tensor_handle(t))
    return 0


cdef int rotate_copy_slot(SchedCore s, bint move_memory) except -1:
    """Pipeline parallelism: move the kept plan to the next copy slot, as a fresh split
    and allocation there leave it (ggml allocates every slot's copies, each at its own
    place in the graph copy: only which tensor stands where changes). Each graph input
    becomes the new slot's copy of itself, and the copy that held that slot takes the
    input's old one; nodes read their split inputs from the new slot's copies.
    move_memory: the input and that copy swap their memory, and the input's views
    follow (a level-1 reuse; a re-pointed plan is placed anew after this)."""
    cdef int old = s.cur_copy, slot = s.next_copy, i, j, n = 0
    cdef ggml_tensor * t
    cdef ggml_tensor * other
    cdef ggml_backend_buffer * buffer
    cdef char * data
    cdef graph_input * gi
    cdef sched_split * split
    cdef ggml_cgraph * gc = &s.graph
    cdef uint64_t stamp = new_epoch()
    s.cur_copy = slot
    s.next_copy = (slot + 1) % s.n_copies
    for i in range(s.n_graph_inputs):
        gi = &s.graph_inputs[i]
        t = gi.tensor
        other = copy_slot(s, gi.slot, gi.backend_id, slot)[0]
        copy_slot(s, gi.slot, gi.backend_id, slot)[0] = t
        copy_slot(s, gi.slot, gi.backend_id, old)[0] = other
        s.infos[other.id].copy_id = old
        name_copy(s, other, t, gi.backend_id, old)
        gc.leafs[i * s.n_copies + slot] = t
        gc.leafs[i * s.n_copies + old] = other
        if move_memory:
            buffer, data = t.buffer, t.data
            t.buffer, t.data = other.buffer, other.data
            other.buffer, other.data = buffer, data
            t.gen = other.gen = stamp
    if move_memory:
        for i in range(s.n_input_views):
            t = s.input_views[i]
            t.buffer = t.view_src.buffer
            t.data = t.view_src.data + t.view_offs
            t.gen = stamp
    for i in range(s.n_splits):
        split = &s.splits[i]
        for j in range(split.n_inputs):
            gc.nodes[n + 2 * j + 1] = sibling_copy(s, gc.nodes[n + 2 * j + 1], slot)
        n += 2 * split.n_inputs + split.i_end - split.i_start
    for i in range(s.n_rewired):
        s.rewired[i].copy = sibling_copy(s, s.rewired[i].copy, slot)
    apply_rewirings(s)
    s.plan_epoch = mutation_epoch()
    # last, once the plan stands whole: these may call Python, and be interrupted
    for i in range(s.n_graph_inputs if move_memory else 0):
        gi = &s.graph_inputs[i]
        init_moved(gi.tensor)
        init_moved(copy_slot(s, gi.slot, gi.backend_id, old)[0])
    return 0


cdef bint try_reuse(SchedCore s, Graph g) except -1:
    """Take the kept plan (and its allocation) for g again when the scheduler was reset
    since it was made, g is the graph it was made for, nothing it depends on changed
    and the user assignments are the plan's. O(1) when nothing at all changed since."""
    if not (s.reset_deferred and s.plan_reusable and s.graph_reuse
            and s.last_graph_obj is g and s.user_assignments == s.plan_assignments):
        return False
    if not graph_unchanged_since(g, s.plan_epoch):
        return False
    s.plan_epoch = mutation_epoch()
    s.reset_deferred = False
    s.is_reset = False
    s.n_graph_reuses += 1
    return True


# ---------------------------------------------------------------------------
# graph reuse, level 2: a newly built graph equal to the planned one takes its plan.
# The plan's graph is described once (its fingerprint: every node and leaf as the
# split and the allocator read it, sources and views by position), and a new graph is
# compared with it in one pass over its nodes and leafs. An equal graph then gets the
# plan re-pointed at its own tensors: the splits' inputs, the graph copy, the arena's
# copies and dependency views, and the rewiring of pass 5; the hash set's keys when
# they are next read; and the allocation a fresh split would get, replayed from the
# one recorded.
#
# Tensors are named by reference: an index in a table of the compared graph's tensors,
# [NULL, its nodes, its leafs, the tensors outside the plan's graph that it reads]
# (fp_table), so that comparing a source is one load, and no decoding.

cdef enum:
    FP_NONE = 0         # no plan to describe (or one a level-2 reuse cannot take)
    FP_BUILDABLE = 1    # a fresh plan, allocated: pass 1's arrays are its graph's
    FP_BUILT = 2


cdef int fp_check_layout() except -1:
    """The compare reads op and flags as one word, ne, nb and op_params as one block, and
    what it reads of every tensor within its first FP_TENSOR_BYTES."""
    cdef ggml_tensor t
    cdef char * base = <char *>&t
    if not (<char *>&t.op == base and <char *>&t.flags == base + 4
            and <char *>&t.op_params[GGML_MAX_OP_PARAMS] == <char *>&t.ne[0] + FP_LAYOUT_WORDS * 8
            and FP_LAYOUT_WORDS * 8 == LAYOUT_BYTES
            and <char *>&t.src[GGML_MAX_SRC] <= base + FP_TENSOR_BYTES
            and <char *>(&t.layout + 1) <= base + FP_TENSOR_BYTES
            and <char *>(&t.view_src + 1) <= base + FP_TENSOR_BYTES
            and <char *>(&t.buffer + 1) <= base + FP_TENSOR_BYTES
            and <char *>(&t.data + 1) <= base + FP_TENSOR_BYTES):
        raise ImportError("ggml_py._sched: ggml_tensor's layout is not the one graph reuse reads")
    return 0

fp_check_layout()


cdef uint32_t fp_ref(SchedCore s, const uint32_t * refs, ggml_tensor * t) except? 0xffffffff:
    """The reference of t in the plan's graph: refs gives one per hash slot (0: none);
    any other tensor is an outside one, named by its place in fp_outside (kept alive)."""
    cdef Py_ssize_t h
    if t == NULL:
        return 0
    h = slot_of(s, t)
    if h != -1 and refs[h] != 0:
        return refs[h]
    if s.fp_n_outside % 16 == 0:
        safe_realloc(<void **>&s.fp_outside, s.fp_n_outside + 16, sizeof(void *), _TABLES)
    s.fp_outside[s.fp_n_outside] = t
    s.fp_n_outside += 1
    s.fp_keep.append(tensor_handle(t))
    return 1 + s.fp_n_nodes + s.fp_n_leafs + s.fp_n_outside - 1


cdef int fp_record(SchedCore s, const uint32_t * refs, ggml_tensor * t, fp_tensor * r,
                   int pre, dict layouts) except -1:
    """Describe t; pre is its index in pass 1's pre_memory / pre_offset."""
    cdef int j
    cdef ggml_backend_buffer * memory = s.pre_memory[pre]
    cdef uint32_t * more
    r.head = (<uint64_t *>t)[0]
    for j in range(GGML_PY_FIRST_SOURCES):
        r.src[j] = fp_ref(s, refs, t.src[j])
    r.more_src = 0
    if source_mask(t) >> GGML_PY_FIRST_SOURCES:
        if s.fp_n_more % 64 == 0:
            safe_realloc(<void **>&s.fp_more_srcs, s.fp_n_more + 64,
                         FP_MORE_SOURCES * sizeof(uint32_t), _TABLES)
        more = &s.fp_more_srcs[s.fp_n_more * FP_MORE_SOURCES]
        for j in range(GGML_PY_FIRST_SOURCES, GGML_MAX_SRC):
            more[j - GGML_PY_FIRST_SOURCES] = fp_ref(s, refs, t.src[j])
        s.fp_n_more += 1
        r.more_src = s.fp_n_more
    r.view_src = fp_ref(s, refs, t.view_src)
    # its memory before the allocation as pass 1 saw it, as the tensor's own fields
    # hold it: none (NULL, NULL), outside any buffer (NULL, address), or in a buffer
    r.buffer = memory
    r.data = memory.base + s.pre_offset[pre] if memory != NULL else <char *>s.pre_offset[pre]
    r.view_offs = t.view_offs
    # type, ne, nb and op_params: one of the graph's few distinct layouts
    key = (t.type, (<char *>&t.ne[0])[:FP_LAYOUT_WORDS * 8])
    index = layouts.get(key)
    if index is None:
        index = layouts[key] = s.fp_n_layouts
        if s.fp_n_layouts % 64 == 0:
            safe_realloc(<void **>&s.fp_layouts, s.fp_n_layouts + 64, sizeof(fp_layout), _TABLES)
        s.fp_layouts[s.fp_n_layouts].type = t.type
        memcpy(s.fp_layouts[s.fp_n_layouts].words, &t.ne[0], FP_LAYOUT_WORDS * 8)
        s.fp_n_layouts += 1
    r.layout = index
    r.layout_id = t.layout
    return 0


cdef int fp_entry_of(SchedCore s, size_t slot) except -1:
    """The index in fp_entries (sorted by slot, as fp_build makes them) of a key's slot."""
    cdef int lo = 0, hi = s.fp_n_entries - 1, mid
    while lo <= hi:
        mid = (lo + hi) >> 1
        if <size_t>s.fp_entries[mid].slot < slot:
            lo = mid + 1
        elif <size_t>s.fp_entries[mid].slot > slot:
            hi = mid - 1
        else:
            return mid
    raise SchedulerError("graph reuse: a split input is not in the scheduler's hash set",
                         "internal")


cdef int fp_record_allocation(SchedCore s) except -1:
    """Record where the plan's allocation left the graph copy (it is still in place: the
    plan's graph is unchanged since), for an equal graph to take without the allocator's
    walk over the plan; fp_n_places is -1 where it cannot be replayed."""
    cdef int n_chunks = s.galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS
    safe_realloc(<void **>&s.fp_places, s.graph.n_nodes + s.graph.n_leafs + 1,
                 sizeof(recorded_place), _TABLES)
    safe_realloc(<void **>&s.fp_chunks, n_chunks, sizeof(void *), _TABLES)
    memcpy(s.fp_chunks, s.galloc.c_chunks, n_chunks * sizeof(void *))
    s.fp_n_places = s.galloc.c_record_places(&s.graph, s.fp_places)
    return 0


cdef int fp_place(SchedCore s) except -1:
    """Allocate the re-pointed graph copy as a fresh split's allocation would: the
    recorded places, or (not replayable, or the compute buffers were allocated anew)
    the allocator's alloc_graph, which needs no fit check for a graph equal to the one
    the reservation placed."""
    owner = (s.last_graph_obj, s.arena)
    if s.fp_n_places >= 0 and memcmp(s.fp_chunks, s.galloc.c_chunks,
                                     s.galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS * sizeof(void *)) == 0:
        return s.galloc.c_replay_places(&s.graph, s.fp_places, s.fp_n_places, owner)
    return s.galloc.c_alloc_graph(&s.graph, owner, True)


cdef int fp_build(SchedCore s) except -1:
    """Describe the plan's graph (s.last_graph_obj, unchanged since its plan) and give its
    nodes their sources back (a new graph takes the plan, or a fresh split follows)."""
    cdef Graph g = <Graph>s.last_graph_obj
    cdef ggml_cgraph * cg = &g.graph
    cdef int nn = cg.n_nodes, nl = cg.n_leafs, i, j, k, n
    cdef size_t h
    cdef uint32_t * refs
    cdef Context arena = s.arena
    cdef int nbc = s.n_backends * s.n_copies
    cdef dict layouts = {}
    cdef graph_input * gi

    # the rewiring, by position, before it is undone
    safe_realloc(<void **>&s.fp_rewirings, s.n_rewired + 1, sizeof(sched_rewiring), _TABLES)
    memcpy(s.fp_rewirings, s.rewired, s.n_rewired * sizeof(sched_rewiring))
    s.fp_n_rewirings = s.n_rewired
    undo_rewiring(s)

    refs = <uint32_t *>checked_calloc(s.hash_set.size, sizeof(uint32_t), "the fingerprint")
    try:
        for i in range(nn):
            refs[s.node_slots[i]] = 1 + i
        for k in range(nl):
            h = ggml_hash_find(&s.hash_set, cg.leafs[k])
            refs[h] = 1 + nn + k
        s.fp_n_nodes = nn
        s.fp_n_leafs = nl
        s.fp_n_outside = 0
        s.fp_keep = []
        s.fp_n_layouts = 0
        s.fp_n_more = 0
        safe_realloc(<void **>&s.fp_tensors, nn + nl + 1, sizeof(fp_tensor), _TABLES)
        spread_pre_memory(s, cg)
        for i in range(nn):
            fp_record(s, refs, cg.nodes[i], &s.fp_tensors[i], nl + i, layouts)
        for k in range(nl):
            fp_record(s, refs, cg.leafs[k], &s.fp_tensors[nn + k], k, layouts)

        # every key of the hash set
        n = 0
        for h in range(s.hash_set.size):
            n += ggml_bitset_get(s.hash_set.used, h)
        safe_realloc(<void **>&s.fp_entries, n + 1, sizeof(fp_entry), _TABLES)
        safe_realloc(<void **>&s.fp_tmp_ids, n + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.fp_tmp_causes, n + 1, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.fp_tmp_copies, n * nbc + 1, sizeof(void *), _TABLES)
        n = 0
        for h in range(s.hash_set.size):
            if ggml_bitset_get(s.hash_set.used, h):
                s.fp_entries[n].slot = h
                s.fp_entries[n].ref = fp_ref(s, refs, s.hash_set.keys[h])
                n += 1
        s.fp_n_entries = n
        # the graph inputs as the user made them: the split marked them input and output
        # (one outside the graph is compared as the very tensor, flags aside)
        for i in range(s.n_graph_inputs):
            gi = &s.graph_inputs[i]
            gi.fp_entry = fp_entry_of(s, gi.slot)
            if 0 < refs[gi.slot] <= <uint32_t>(nn + nl):
                (<int32_t *>&s.fp_tensors[refs[gi.slot] - 1].head)[1] = gi.flags

        # the splits' inputs, with their names and entries
        n = 0
        for i in range(s.n_splits):
            n += s.splits[i].n_inputs
        safe_realloc(<void **>&s.fp_inputs, n + 1, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.fp_input_names, n + 1, GGML_MAX_NAME, _TABLES)
        safe_realloc(<void **>&s.fp_input_entries, n + 1, sizeof(int), _TABLES)
        n = 0
        for i in range(s.n_splits):
            for j in range(s.splits[i].n_inputs):
                s.fp_inputs[n] = fp_ref(s, refs, s.splits[i].inputs[j])
                s.fp_input_entries[n] = fp_entry_of(s, ggml_hash_find(&s.hash_set, s.splits[i].inputs[j]))
                memcpy(&s.fp_input_names[n * GGML_MAX_NAME], s.splits[i].inputs[j].name,
                       GGML_MAX_NAME)
                n += 1
        s.fp_n_inputs = n

        # what the arena's copies and dependency views are of
        safe_realloc(<void **>&s.fp_arena_of, arena.ctx.n_tensors + 1, sizeof(uint32_t), _TABLES)
        for i in range(arena.ctx.n_tensors):
            s.fp_arena_of[i] = fp_ref(s, refs, s.infos[i].of)
        s.fp_n_arena = arena.ctx.n_tensors

        s.fp_assignments = [(fp_ref(s, refs, (<Tensor>t).ptr), b)
                            for t, b in s.plan_assignments.values()]
    finally:
        free(refs)
    # the buffers of the pre-allocated tensors, whose release or re-purposing is a change
    buffers = {<size_t>s.fp_tensors[i].buffer for i in range(nn + nl)} - {0}
    safe_realloc(<void **>&s.fp_buffers, len(buffers) + 1, sizeof(void *), _TABLES)
    for i, addr in enumerate(buffers):
        s.fp_buffers[i] = <ggml_backend_buffer *><size_t>addr
    s.fp_n_buffers = len(buffers)
    # the tables of the graph compared and of the one re-pointed to last
    n = 1 + nn + nl + s.fp_n_outside
    safe_realloc(<void **>&s.fp_table, n, sizeof(ggml_tensor *), _TABLES)
    safe_realloc(<void **>&s.fp_cur_table, n, sizeof(ggml_tensor *), _TABLES)
    s.fp_table[0] = NULL
    memcpy(&s.fp_table[1 + nn + nl], s.fp_outside, s.fp_n_outside * sizeof(void *))
    memcpy(s.fp_cur_table, s.fp_table, n * sizeof(ggml_tensor *))
    fp_record_allocation(s)
    s.fp_epoch = s.plan_epoch
    s.fp_state = FP_BUILT
    return 0


cdef inline bint fp_stamped_after(const ggml_tensor * t, uint64_t epoch) noexcept:
    if t.gen > epoch or (t.buffer != NULL and t.buffer.gen > epoch):
        return True
    t = t.view_src
    return t != NULL and (t.gen > epoch or (t.buffer != NULL and t.buffer.gen > epoch))


cdef inline uint32_t fp_src(SchedCore s, const fp_tensor * r, int j) noexcept:
    """The reference of source j of r's tensor."""
    if j < GGML_PY_FIRST_SOURCES:
        return r.src[j]
    if r.more_src == 0:
        return 0
    return s.fp_more_srcs[(r.more_src - 1) * FP_MORE_SOURCES + j - GGML_PY_FIRST_SOURCES]


cdef inline bint fp_tensor_matches(const ggml_tensor * t, const fp_tensor * r,
                                   ggml_tensor ** table, const fp_layout * layouts,
                                   const uint32_t * more_srcs) noexcept:
    """Does t have r's op, flags, sources, view, memory and layout? Every difference is
    or-ed into one word; the layout is compared by its id (interned: equal ids are
    equal layouts), field by field where either has none. All but that lies in the
    tensor's first FP_TENSOR_BYTES, but a view's offset."""
    cdef int j
    cdef const fp_layout * lay
    cdef const uint64_t * words
    cdef uint64_t diff = (<const uint64_t *>t)[0] ^ r.head
    for j in range(GGML_PY_FIRST_SOURCES):
        diff |= <uint64_t>t.src[j] ^ <uint64_t>table[r.src[j]]
    if r.more_src:
        more_srcs += (r.more_src - 1) * FP_MORE_SOURCES
        for j in range(GGML_PY_FIRST_SOURCES, GGML_MAX_SRC):
            diff |= (<uint64_t>t.src[j]
                     ^ <uint64_t>table[more_srcs[j - GGML_PY_FIRST_SOURCES]])
    else:
        # (most tensors) the other slots must be NULL, as t's source mask says
        diff |= t.src_mask >> GGML_PY_FIRST_SOURCES
    diff |= <uint64_t>t.view_src ^ <uint64_t>table[r.view_src]
    diff |= (<uint64_t>t.buffer ^ <uint64_t>r.buffer) | (<uint64_t>t.data ^ <uint64_t>r.data)
    if r.view_src:
        # a view's offset (past FP_TENSOR_BYTES): only views have one that matters
        diff |= <uint64_t>t.view_offs ^ <uint64_t>r.view_offs
    if t.layout == r.layout_id and r.layout_id != 0:
        return diff == 0
    lay = &layouts[r.layout]
    words = <const uint64_t *>&t.ne[0]
    diff |= <uint64_t>(t.type ^ lay.type)
    for j in range(FP_LAYOUT_WORDS):
        diff |= words[j] ^ lay.words[j]
    return diff == 0


cdef inline void fp_prefetch(const ggml_tensor * t, const fp_tensor * r) noexcept:
    """Ask for what fp_tensor_matches will read of t: its first FP_TENSOR_BYTES, and the
    offset of a view (as the plan's record says t is one)."""
    prefetch_bytes(t, FP_TENSOR_BYTES)
    if r.view_src:
        prefetch(&t.view_offs)


cdef inline bint fp_is_leaf_before(ggml_cgraph * g, const ggml_tensor * t, int k) noexcept:
    """Is t a leaf of g before position k? (fp_matches gives leaf k the order -2 - k.)"""
    cdef int p = -2 - t.order
    return 0 <= p < k and g.leafs[p] == t


cdef bint fp_matches(SchedCore s, ggml_cgraph * g) noexcept:
    """Is g the graph the fingerprint describes, in a world the plan still holds in?
    One pass over g's nodes and leafs (fp_table is made g's on the way); their orders
    are set too (a leaf's is -2 - its position), which finds a tensor at two places of
    g or one both in g and outside the plan's graph: the plan's keys are then not g's,
    one to one."""
    cdef int i, n = g.n_nodes
    cdef ggml_tensor * t
    cdef ggml_tensor ** table = s.fp_table
    if g.n_nodes != s.fp_n_nodes or g.n_leafs != s.fp_n_leafs or world_epoch() > s.fp_epoch:
        return False
    for i in range(s.fp_n_outside):
        if fp_stamped_after(s.fp_outside[i], s.fp_epoch):
            return False
    if buffers_epoch() > s.fp_epoch:        # (a weight a buffer each: many)
        for i in range(s.fp_n_buffers):
            if s.fp_buffers[i].gen > s.fp_epoch:
                return False
    memcpy(&table[1], g.nodes, n * sizeof(ggml_tensor *))
    memcpy(&table[1 + n], g.leafs, g.n_leafs * sizeof(ggml_tensor *))
    for i in range(n):
        t = g.nodes[i]
        if i + PREFETCH_AHEAD < n:
            fp_prefetch(g.nodes[i + PREFETCH_AHEAD], &s.fp_tensors[i + PREFETCH_AHEAD])
        if not fp_tensor_matches(t, &s.fp_tensors[i], table, s.fp_layouts, s.fp_more_srcs) or (
                ggml_is_node_from(g, t, 0) and t.order < i):
            return False
        t.order = i
    for i in range(g.n_leafs):
        t = g.leafs[i]
        if i + PREFETCH_AHEAD < g.n_leafs:
            fp_prefetch(g.leafs[i + PREFETCH_AHEAD], &s.fp_tensors[n + i + PREFETCH_AHEAD])
        if (not fp_tensor_matches(t, &s.fp_tensors[n + i], table, s.fp_layouts,
                                      s.fp_more_srcs)
                or ggml_is_node_from(g, t, 0) or fp_is_leaf_before(g, t, i)):
            return False
        t.order = -2 - i
    for i in range(s.fp_n_outside):
        t = s.fp_outside[i]
        if ggml_is_node_from(g, t, 0) or fp_is_leaf_before(g, t, g.n_leafs):
            return False
    for i in range(s.fp_n_inputs):
        if strncmp(table[s.fp_inputs[i]].name, &s.fp_input_names[i * GGML_MAX_NAME],
                   GGML_MAX_NAME) != 0:
            return False
    return True


cdef bint fp_assignments_match(SchedCore s) except -1:
    """Are the user assignments made since the reset the plan's, by position (in the
    graph fp_matches compared)?"""
    if not s.fp_assignments and not s.user_assignments:
        return True
    return ({<size_t>s.fp_table[ref]: b for ref, b in s.fp_assignments}
            == {addr: b for addr, (t, b) in s.user_assignments.items()})


cdef bint fp_repoint_keys(SchedCore s, ggml_tensor ** table) noexcept:
    """Re-make the hash set with table's tensors as keys and the plan's values; False
    (the set is then to be cleared) where two keys would be one tensor (fp_matches
    excludes that)."""
    cdef int e, c, nbc = s.n_backends * s.n_copies
    cdef size_t h
    cdef ggml_tensor * t
    cdef ggml_tensor ** copies
    cdef ggml_tensor ** kept
    for e in range(s.fp_n_entries):
        h = s.fp_entries[e].slot
        s.fp_tmp_ids[e] = s.hv_tensor_backend_ids[h]
        s.fp_tmp_causes[e] = s.hv_tensor_causes[h]
        copies = copy_slot(s, h, 0, 0)
        kept = &s.fp_tmp_copies[e * nbc]
        for c in range(nbc):            # (a handful: no memcpy call)
            kept[c] = copies[c]
            copies[c] = NULL
        s.hv_tensor_backend_ids[h] = -1
        s.hv_tensor_causes[h] = 0
        s.hash_set.used[h >> 5] &= ~((<ggml_bitset_t>1) << (h & 31))
    for e in range(s.fp_n_entries):
        t = table[s.fp_entries[e].ref]
        h = ggml_hash_find(&s.hash_set, t)
        if h == GGML_HASHSET_FULL or ggml_bitset_get(s.hash_set.used, h):
            return False
        ggml_bitset_set(s.hash_set.used, h)
        s.hash_set.keys[h] = t
        s.hv_tensor_backend_ids[h] = s.fp_tmp_ids[e]
        s.hv_tensor_causes[h] = s.fp_tmp_causes[e]
        copies = copy_slot(s, h, 0, 0)
        kept = &s.fp_tmp_copies[e * nbc]
        for c in range(nbc):
            copies[c] = kept[c]
        s.fp_entries[e].slot = h
    for e in range(s.n_graph_inputs):
        s.graph_inputs[e].slot = s.fp_entries[s.graph_inputs[e].fp_entry].slot
    return True


cdef int fp_ensure_keys(SchedCore s) except -1:
    """Key the hash set by the tensors of the graph the plan was re-pointed to last,
    where that was put off (a re-pointing leaves the keys to whoever reads them)."""
    if s.keys_stale:
        s.keys_stale = False
        if not fp_repoint_keys(s, s.fp_cur_table):
            clear_tables(s)
            raise SchedulerError("graph reuse: the hash set could not be re-keyed", "internal")
    return 0


cdef int fp_repoint(SchedCore s, Graph graph) except -1:
    """Point everything of the plan but the hash set's keys (fp_ensure_keys) at the
    tensors of graph (the one fp_matches compared last), as a fresh split would."""
    cdef ggml_cgraph * g = &graph.graph
    cdef ggml_cgraph * gc = &s.graph
    cdef ggml_tensor ** table = s.fp_table
    cdef int i, j, k = 0, n = 0
    cdef sched_split * split
    cdef sched_rewiring * r
    cdef ggml_tensor * t
    cdef ggml_tensor * of
    cdef graph_input * gi
    cdef Context arena = s.arena
    for i in range(s.n_splits):
        split = &s.splits[i]
        for j in range(split.n_inputs):
            split.inputs[j] = table[s.fp_inputs[k]]
            k += 1
        n += 2 * split.n_inputs
        memcpy(&gc.nodes[n], &g.nodes[split.i_start],
               (split.i_end - split.i_start) * sizeof(ggml_tensor *))
        n += split.i_end - split.i_start
    memcpy(&gc.leafs[gc.n_leafs - g.n_leafs], g.leafs, g.n_leafs * sizeof(ggml_tensor *))
    # the arena: copies name their tensor only in infos; a dependency view is made
    # anew (ggml_view_tensor of the new input, unplaced)
    for i in range(s.fp_n_arena):
        of = table[s.fp_arena_of[i]]
        s.infos[i].of = of
        if s.infos[i].kind == SCHED_TENSOR_DEP:
            t = ggml_context_tensor(&arena.ctx, i)
            tensor_set_src(t, 0, of)
            t.view_src = of.view_src if of.view_src != NULL else of
            t.view_offs = of.view_offs if of.view_src != NULL else 0
            t.buffer = NULL
            t.data = t.view_src.data + t.view_offs if t.view_src.data != NULL else NULL
            tensor_changed(t)
    for i in range(s.fp_n_rewirings):
        r = &s.fp_rewirings[i]
        # (fp_matches found the node's source where the plan's was; the plan may have
        # moved to another copy slot since it was described)
        record_rewiring(s, g.nodes[r.node], r.node, r.src,
                        table[fp_src(s, &s.fp_tensors[r.node], r.src)],
                        sibling_copy(s, r.copy, s.cur_copy))
    apply_rewirings(s)
    # each graph input is the current slot's copy of itself, marked as the split marks it
    for i in range(s.n_graph_inputs):
        gi = &s.graph_inputs[i]
        t = table[s.fp_entries[gi.fp_entry].ref]
        t.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
        copy_slot(s, gi.slot, gi.backend_id, s.cur_copy)[0] = t
        gc.leafs[i * s.n_copies + s.cur_copy] = t
        gi.tensor = t
    # as a split of an equal graph leaves them: the previous ids are the same
    memcpy(s.prev_node_backend_ids, s.node_backend_ids, gc.n_nodes * sizeof(int))
    memcpy(s.prev_leaf_backend_ids, s.leaf_backend_ids, gc.n_leafs * sizeof(int))
    # the hash set's keys are to be this table's (g may change before they are read)
    s.fp_table, s.fp_cur_table = s.fp_cur_table, s.fp_table
    s.keys_stale = True
    s.debug_prev_graph_size = s.debug_graph_size
    s.last_graph = g
    s.last_graph_obj = graph
    return 0


cdef bint try_reuse_rebuilt(SchedCore s, Graph g) except -1:
    """Level 2: take the kept plan for g, a graph other than the plan's but equal to it,
    re-pointed at g's tensors, and allocate it as a fresh split would be. False (and the
    caller splits afresh) where g is not equal or the plan cannot be re-pointed."""
    if not (s.reset_deferred and s.plan_reusable and s.graph_reuse
            and s.last_graph_obj is not g and s.fp_state != FP_NONE):
        return False
    if s.fp_state == FP_BUILDABLE:
        if not graph_unchanged_since(<Graph>s.last_graph_obj, s.plan_epoch):
            return False
        fp_build(s)
    if not (fp_matches(s, &g.graph) and fp_assignments_match(s)):
        return False
    undo_rewiring(s)
    fp_repoint(s, g)
    s.plan_assignments = dict(s.user_assignments)
    s.reset_deferred = False
    s.is_reset = False
    s.n_graph_reuses += 1
    s.n_graph_rebuilt_reuses += 1
    return True


cdef int check_graph_fits(SchedCore s, ggml_cgraph * graph) except -1:
    """ggml asserts that the hash set has a slot for every node and leaf."""
    if graph.n_nodes + graph.n_leafs > <int>s.hash_set.size:
        raise SchedulerError(
            f"the graph has {graph.n_nodes} nodes and {graph.n_leafs} leafs, more than the "
            f"{s.hash_set.size} slots of the scheduler's hash set (graph_size {s.graph_size}); "
            f"graph_size must count nodes and leafs", "hash-set-too-small")
    return 0


cdef int sched_split_graph(SchedCore s, Graph g) except -1:
    """ggml_backend_sched_split_graph. The previous split's rewiring is undone first
    (whatever graph it was). On error the split leaves nothing in the graph and the
    scheduler is left reset-able: the next reset() clears what it assigned."""
    cdef ggml_cgraph * graph = &g.graph
    if try_reuse(s, g):
        return 0
    forget_plan(s)
    fp_ensure_keys(s)
    s.fp_state = FP_NONE
    # a plan made from fresh tables depends on nothing but the graph and these
    s.plan_assignments = dict(s.user_assignments) if s.tables_fresh else None
    s.tables_fresh = False
    undo_rewiring(s)
    retire_arena(s)
    if s.split_pending:
        s.plan_stale = True
    s.split_pending = True
    s.n_splits = 0
    s.n_graph_inputs = 0
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


# ---------------------------------------------------------------------------
# allocation (ggml_backend_sched_alloc_splits / _alloc_graph)

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
    cdef bint changed = (s.plan_stale
                         or _ids_changed(s, s.node_backend_ids, s.prev_node_backend_ids, s.graph.n_nodes)
                         or _ids_changed(s, s.leaf_backend_ids, s.prev_leaf_backend_ids, s.graph.n_leafs))
    s.split_pending = False
    s.plan_stale = False
    cdef bint unexpected
    cdef int b
    # the galloc keeps the tensors it places alive: the user's graph and the copies
    owner = (s.last_graph_obj, s.arena)
    if not changed and s.galloc.c_alloc_graph(&s.graph, owner):
        return 1
    # a reallocation (ggml: GGML_SCHED_DEBUG_REALLOC aborts on the unexpected ones)
    unexpected = not changed and s.debug_prev_graph_size == s.debug_graph_size
    s.n_reallocs += 1
    s.n_unexpected_reallocs += unexpected
    if s.debug_realloc > 0 and (unexpected or s.debug_realloc > 1):
        msg = (f"unexpected graph reallocation (graph size = {s.debug_graph_size}, nodes = "
               f"{s.graph.n_nodes}, leafs = {s.graph.n_leafs}, debug_realloc = {s.debug_realloc})")
        if s.realloc_raises:
            raise SchedulerError(msg, "unexpected-realloc")
        import warnings
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    # the reallocation may move split inputs: wait for queued work first
    for b in range(s.n_backends):
        (<object>s.backends[b].pyobj).synchronize()
    if not s.galloc.c_reserve_n(&s.graph, s.node_backend_ids, s.leaf_backend_ids):
        return 0
    return s.galloc.c_alloc_graph(&s.graph, owner, True)     # the graph just planned fits


cdef int sched_alloc_graph(SchedCore s, Graph graph) except -1:
    """ggml_backend_sched_alloc_graph: split on the next copy slot, then allocate
    (the caller checked that no graph is allocated)."""
    check_graph_fits(s, &graph.graph)      # before the copy slot moves, as ggml checks it
    if try_reuse(s, graph):
        # the kept placements are in place (pipeline parallelism: moved to the next slot)
        if s.n_copies > 1:
            rotate_copy_slot(s, s.rotates_in_place)
            if not s.rotates_in_place:
                if not alloc_again(s):
                    return 0
                s.plan_epoch = mutation_epoch()
        s.is_alloc = True
        return 1
    if try_reuse_rebuilt(s, graph):
        # the plan's backends, and a graph equal to one the reservation placed: no
        # change for sched_alloc_splits to find
        if s.n_copies > 1:
            rotate_copy_slot(s, False)
        if s.n_copies == 1 or s.rotates_in_place:
            fp_place(s)
        elif not alloc_again(s):
            return 0
        if s.n_copies > 1:
            prepare_rotation(s)            # the new graph's views of its inputs
        s.is_alloc = True
        s.plan_epoch = mutation_epoch()
        return 1
    s.cur_copy = s.next_copy
    s.next_copy = (s.next_copy + 1) % s.n_copies
    sched_split_graph(s, graph)
    if not sched_alloc_splits(s):
        return 0
    s.is_alloc = True
    # reusable when made from a reset state; with pipeline parallelism each alloc_graph
    # moves to the next copy slot, which a kept plan does by itself where it can
    s.plan_reusable = s.plan_assignments is not None
    if s.n_copies > 1:
        prepare_rotation(s)
    s.plan_epoch = mutation_epoch()
    s.fp_state = FP_BUILDABLE if s.plan_reusable else FP_NONE
    return 1


# ---------------------------------------------------------------------------
# Python face of the core (the public API is ggml_py.sched.Scheduler)

cdef class SchedCore:
    """The scheduler's C state. Use ggml_py.Scheduler, which checks arguments
    and adds the Pythonic API; this class holds the passes and the arrays."""

    def __cinit__(self):
        self.backends = NULL
        self.bufts = NULL
        self.hash_set.keys = NULL
        self.hash_set.used = NULL
        self.hv_tensor_backend_ids = NULL
        self.hv_tensor_causes = NULL
        self.hv_tensor_copies = NULL
        self.splits = NULL
        self.graph_inputs = NULL
        self.input_views = NULL
        self.n_input_views = self.input_views_cap = 0
        self.infos = NULL
        self.node_slots = NULL
        self.outside = NULL
        self.n_outside = self.outside_capacity = 0
        self.node_bits = NULL
        self.view_refs = NULL
        self.node_refs = NULL
        self.compute_refs = NULL
        self.compute_ops = NULL
        self.dense_ids = NULL
        self.src_begin = NULL
        self.srcs = NULL
        memset(&self.graph, 0, sizeof(ggml_cgraph))
        self.fp_tensors = NULL
        self.fp_entries = NULL
        self.fp_tmp_ids = NULL
        self.fp_tmp_causes = NULL
        self.fp_tmp_copies = NULL
        self.fp_inputs = NULL
        self.fp_input_names = NULL
        self.fp_arena_of = NULL
        self.fp_rewirings = NULL
        self.fp_outside = NULL
        self.fp_input_entries = NULL
        self.fp_places = NULL
        self.fp_chunks = NULL
        self.fp_layouts = NULL
        self.fp_more_srcs = NULL
        self.fp_buffers = NULL
        self.fp_table = NULL
        self.fp_cur_table = NULL
        self.pre_memory = NULL
        self.pre_indexes = NULL
        self.n_pre_indexes = 0
        self.pre_offset = NULL
        self.dense_bufts = NULL
        self.dense_bits = NULL
        self.leaf_refs = NULL
        self.compute_nodes = NULL
        self.compute_slots = NULL

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
        self.graph_size = int_arg(graph_size, "graph_size", 1, _INT32_MAX)
        self.max_split_inputs = int_arg(max_split_inputs, "max_split_inputs", 1, _MAX_LIMIT)
        self.max_graph_inputs = int_arg(max_graph_inputs, "max_graph_inputs", 0, _MAX_LIMIT)
        self.n_copies = int_arg(n_copies, "n_copies", 1, _MAX_LIMIT) if parallel else 1
        self.debug_realloc = int_arg(debug_realloc, "debug_realloc", 0, 2)
        self.realloc_raises = realloc_raises
        self.copy_all_inputs = copy_all_inputs
        self.op_offload = op_offload
        self._keep = backends + bufts
        self.n_backends = len(backends)
        # the tables hold a slot per hash slot: refuse what this machine cannot hold
        # before touching any (the reset writes them all)
        cdef size_t n = ggml_hash_size(self.graph_size)
        table_bytes = n * (sizeof(void *) + sizeof(int8_t) + 1 +
                           self.n_backends * self.n_copies * sizeof(void *))
        check_memory_available(table_bytes, f"a scheduler with graph_size {self.graph_size}, "
                               f"{self.n_backends} backends and {self.n_copies} copies: its tables")
        self.backends = <ggml_backend **>checked_calloc(self.n_backends, sizeof(ggml_backend *),
                                                        "the scheduler's backend table")
        self.bufts = <ggml_backend_buffer_type **>checked_calloc(
            self.n_backends, sizeof(void *), "the scheduler's buffer type table")
        for b in range(self.n_backends):
            self.backends[b] = &(<Backend>backends[b]).c
            self.bufts[b] = &(<BufferType>bufts[b]).c
        ggml_hash_set_init(&self.hash_set, self.graph_size)
        self.hv_tensor_backend_ids = <int8_t *>checked_calloc(n, sizeof(int8_t), "scheduler tables")
        self.hv_tensor_causes = <uint8_t *>checked_calloc(n, 1, "scheduler tables")
        self.hv_tensor_copies = <ggml_tensor **>checked_calloc(
            n * self.n_backends * self.n_copies, sizeof(void *), "scheduler tables")
        self.splits_capacity = 16
        self.splits = <sched_split *>checked_calloc(self.splits_capacity, sizeof(sched_split),
                                                    "scheduler tables")
        self.graph_inputs = <graph_input *>checked_calloc(max(self.max_graph_inputs, 1),
                                                          sizeof(graph_input), "scheduler tables")
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
        self.graph.n_nodes = 0
        self.graph.n_leafs = 0
        self.n_graph_inputs = 0
        self.last_graph = NULL
        self.last_graph_obj = None
        self.galloc.close()
        sched_reset(self)

    def __dealloc__(self):
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
        free(self.node_backend_ids)
        free(self.leaf_backend_ids)
        free(self.prev_node_backend_ids)
        free(self.prev_leaf_backend_ids)
        free(self.graph.nodes)
        free(self.graph.leafs)
        free(self.graph_inputs)
        free(self.input_views)
        free(self.infos)
        free(self.node_slots)
        free(self.outside)
        free(self.node_bits)
        free(self.view_refs)
        free(self.node_refs)
        free(self.compute_refs)
        free(self.compute_ops)
        free(self.dense_ids)
        free(self.src_begin)
        free(self.srcs)
        free(self.rewired)
        free(self.fp_tensors)
        free(self.fp_entries)
        free(self.fp_tmp_ids)
        free(self.fp_tmp_causes)
        free(self.fp_tmp_copies)
        free(self.fp_inputs)
        free(self.fp_input_names)
        free(self.fp_arena_of)
        free(self.fp_rewirings)
        free(self.fp_outside)
        free(self.fp_input_entries)
        free(self.fp_places)
        free(self.fp_chunks)
        free(self.fp_layouts)
        free(self.fp_more_srcs)
        free(self.fp_buffers)
        free(self.fp_table)
        free(self.fp_cur_table)
        free(self.pre_memory)
        free(self.pre_indexes)
        free(self.pre_offset)
        free(self.dense_bufts)
        free(self.dense_bits)
        free(self.leaf_refs)
        free(self.compute_nodes)
        free(self.compute_slots)

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
            self.graph.n_nodes = 0
            self.graph.n_leafs = 0
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
        ok = self.galloc.c_reserve_n(&self.graph, self.node_backend_ids, self.leaf_backend_ids)
        self.split_pending = self.plan_stale = False    # the plan is the last split's
        return bool(ok)

    def reserve_n_size(self):
        """Buffer sizes per backend the current graph copy would need (a dry run)."""
        cdef size_t * sizes = <size_t *>checked_calloc(self.n_backends, sizeof(size_t),
                                                       "the size table")
        try:
            self.galloc.c_reserve_n_size(&self.graph, self.node_backend_ids, self.leaf_backend_ids, sizes)
            return [sizes[i] for i in range(self.n_backends)]
        finally:
            free(sizes)

    def synchronize_copy(self):
        """After a synchronize with no graph allocated, start again at copy slot 0."""
        if not self.is_alloc:
            self.next_copy = 0

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
                        tensor_handle(copy_slot(self, h, split.backend_id, self.cur_copy)[0])))
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
                w[2] = <uintptr_t>copy_slot(self, h, split.backend_id, self.cur_copy)[0]
                w += 3
                k += 1
        return key

    def get_graph_inputs(self):
        return [tensor_handle(self.graph_inputs[i].tensor) for i in range(self.n_graph_inputs)]

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
        return ([tensor_handle(self.graph.nodes[i]) for i in range(self.graph.n_nodes)],
                [self.node_backend_ids[i] for i in range(self.graph.n_nodes)],
                [tensor_handle(self.graph.leafs[i]) for i in range(self.graph.n_leafs)],
                [self.leaf_backend_ids[i] for i in range(self.graph.n_leafs)])

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
        cdef ggml_cgraph * c = &self.graph
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
            "node_backends": [_plan_name(names, self.node_backend_ids[i])
                              for i in range(c.n_nodes)],
            "leafs": [_plan_token(self, c.leafs[i], names) for i in range(c.n_leafs)],
            "leaf_backends": [_plan_name(names, self.leaf_backend_ids[i])
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


from ggml_py._alloc cimport tensor_location_list    # (here: the plan's reads, kept together)


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
