"""Graph reuse: the scheduler takes a kept plan again instead of splitting.

Level 1: alloc_graph / split_graph of the very graph the plan was made for, unchanged
since (the mutation epochs of _core), with the plan's user assignments. Level 2: a newly
built graph equal to the plan's (its fingerprint, below). Both leave the scheduler as a
fresh split and allocation of the graph would, pipeline parallelism's copy slots
included (rotate_copy_slot). Reuse is correct only where the fingerprint covers what the
passes of _sched.pyx read: tests/test_sched_reads.py checks their declared reads
(_sched.TENSOR_READS) against it.
"""

from libc.stdlib cimport free
from libc.string cimport memcpy, memcmp, strncmp
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from ggml_py._ggml cimport *
from ggml_py._core cimport (Context, Tensor, Graph, tensor_handle, ggml_hash_find, ggml_bitset_get,
                            ggml_bitset_set, world_epoch, buffers_epoch, ggml_context_tensor,
                            ggml_is_node_from, mutation_epoch, tensor_set_src, tensor_changed,
                            graph_unchanged_since, LAYOUT_BYTES, new_epoch, source_mask,
                            PREFETCH_AHEAD, prefetch, prefetch_bytes, checked_calloc,
                            safe_realloc)
from ggml_py._backend cimport Buffer
from ggml_py._alloc cimport GGML_VBUFFER_MAX_CHUNKS
from ggml_py._schedtypes cimport *
from ggml_py._sched cimport (hash_id, copy_slot, slot_of, unallocated_memory, name_copy,
                             record_rewiring, apply_rewirings, undo_rewiring, clear_tables,
                             spread_pre_memory)

from ggml_py.errors import SchedulerError

_TABLES = "the scheduler's tables"          # what safe_realloc names when a table cannot grow

# The fields of a graph's tensors that the passes read (_sched.TENSOR_READS) and the
# fingerprint does not compare tensor by tensor (fp_record / fp_tensor_matches), and why
# none of them can change the plan (tests/test_sched_reads.py: every other field read is)
NOT_COMPARED = {
    "order": "fp_matches sets it on every node and leaf as pass 1 finds it (a node's "
             "position, a leaf's -2 - position), refusing a tensor at two places",
    "name": "only the split inputs' names reach the plan (their copies are named after "
            "them): fp_matches compares those (input_names); other reads are error messages",
    "id": "read of the scheduler's own arena tensors only (their index in the arena)",
    "owner": "read of a node's source only to tell the scheduler's own copies apart",
}


# ---------------------------------------------------------------------------
# level 1, and the reset it defers

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
    cdef ggml_cgraph * gc = &s.graph_copy.graph
    s.pipeline.n_input_views = 0
    s.pipeline.rotates_in_place = False
    for i in range(s.pipeline.n_graph_inputs):
        t = s.pipeline.graph_inputs[i].tensor
        if t.view_src != NULL or t.buffer == NULL or unallocated_memory(s, t.buffer) != NULL:
            return 0
    for k in range(-gc.n_leafs, gc.n_nodes):
        t = gc.nodes[k] if k >= 0 else gc.leafs[~k]
        if t.view_src == NULL or not t.view_src.flags & GGML_TENSOR_FLAG_INPUT:
            continue
        for i in range(s.pipeline.n_graph_inputs):
            if t.view_src == s.pipeline.graph_inputs[i].tensor:
                if s.pipeline.n_input_views == s.pipeline.input_views_cap:
                    safe_realloc(<void **>&s.pipeline.input_views, 2 * s.pipeline.input_views_cap + 8,
                                 sizeof(ggml_tensor *), _TABLES)
                    s.pipeline.input_views_cap = 2 * s.pipeline.input_views_cap + 8
                s.pipeline.input_views[s.pipeline.n_input_views] = t
                s.pipeline.n_input_views += 1
                break
    s.pipeline.rotates_in_place = True
    return 0


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
    cdef int old = s.pipeline.cur_copy, slot = s.pipeline.next_copy, i, j, n = 0
    cdef ggml_tensor * t
    cdef ggml_tensor * other
    cdef ggml_backend_buffer * buffer
    cdef char * data
    cdef graph_input * gi
    cdef sched_split * split
    cdef ggml_cgraph * gc = &s.graph_copy.graph
    cdef uint64_t stamp = new_epoch()
    s.pipeline.cur_copy = slot
    s.pipeline.next_copy = (slot + 1) % s.pipeline.n_copies
    for i in range(s.pipeline.n_graph_inputs):
        gi = &s.pipeline.graph_inputs[i]
        t = gi.tensor
        other = copy_slot(s, gi.slot, gi.backend_id, slot)[0]
        copy_slot(s, gi.slot, gi.backend_id, slot)[0] = t
        copy_slot(s, gi.slot, gi.backend_id, old)[0] = other
        s.infos[other.id].copy_id = old
        name_copy(s, other, t, gi.backend_id, old)
        gc.leafs[i * s.pipeline.n_copies + slot] = t
        gc.leafs[i * s.pipeline.n_copies + old] = other
        if move_memory:
            buffer, data = t.buffer, t.data
            t.buffer, t.data = other.buffer, other.data
            other.buffer, other.data = buffer, data
            t.gen = other.gen = stamp
    if move_memory:
        for i in range(s.pipeline.n_input_views):
            t = s.pipeline.input_views[i]
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
    for i in range(s.pipeline.n_graph_inputs if move_memory else 0):
        gi = &s.pipeline.graph_inputs[i]
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
# (fp.table), so that comparing a source is one load, and no decoding.

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
    any other tensor is an outside one, named by its place in fp.outside (kept alive)."""
    cdef Py_ssize_t h
    if t == NULL:
        return 0
    h = slot_of(s, t)
    if h != -1 and refs[h] != 0:
        return refs[h]
    if s.fp.n_outside % 16 == 0:
        safe_realloc(<void **>&s.fp.outside, s.fp.n_outside + 16, sizeof(void *), _TABLES)
    s.fp.outside[s.fp.n_outside] = t
    s.fp.n_outside += 1
    s.fp_keep.append(tensor_handle(t))
    return 1 + s.fp.n_nodes + s.fp.n_leafs + s.fp.n_outside - 1


cdef int fp_record(SchedCore s, const uint32_t * refs, ggml_tensor * t, fp_tensor * r,
                   int pre, dict layouts) except -1:
    """Describe t; pre is its index in pass 1's pre_memory / pre_offset."""
    cdef int j
    cdef ggml_backend_buffer * memory = s.sweep.pre_memory[pre]
    cdef uint32_t * more
    r.head = (<uint64_t *>t)[0]
    for j in range(GGML_PY_FIRST_SOURCES):
        r.src[j] = fp_ref(s, refs, t.src[j])
    r.more_src = 0
    if source_mask(t) >> GGML_PY_FIRST_SOURCES:
        if s.fp.n_more % 64 == 0:
            safe_realloc(<void **>&s.fp.more_srcs, s.fp.n_more + 64,
                         FP_MORE_SOURCES * sizeof(uint32_t), _TABLES)
        more = &s.fp.more_srcs[s.fp.n_more * FP_MORE_SOURCES]
        for j in range(GGML_PY_FIRST_SOURCES, GGML_MAX_SRC):
            more[j - GGML_PY_FIRST_SOURCES] = fp_ref(s, refs, t.src[j])
        s.fp.n_more += 1
        r.more_src = s.fp.n_more
    r.view_src = fp_ref(s, refs, t.view_src)
    # its memory before the allocation as pass 1 saw it, as the tensor's own fields
    # hold it: none (NULL, NULL), outside any buffer (NULL, address), or in a buffer
    r.buffer = memory
    cdef size_t offset = s.sweep.pre_offset[pre]
    r.data = memory.base + offset if memory != NULL else <char *>offset
    r.view_offs = t.view_offs
    # type, ne, nb and op_params: one of the graph's few distinct layouts
    key = (t.type, (<char *>&t.ne[0])[:FP_LAYOUT_WORDS * 8])
    index = layouts.get(key)
    if index is None:
        index = layouts[key] = s.fp.n_layouts
        if s.fp.n_layouts % 64 == 0:
            safe_realloc(<void **>&s.fp.layouts, s.fp.n_layouts + 64, sizeof(fp_layout), _TABLES)
        s.fp.layouts[s.fp.n_layouts].type = t.type
        memcpy(s.fp.layouts[s.fp.n_layouts].words, &t.ne[0], FP_LAYOUT_WORDS * 8)
        s.fp.n_layouts += 1
    r.layout = index
    r.layout_id = t.layout
    return 0


cdef int fp_entry_of(SchedCore s, size_t slot) except -1:
    """The index in fp.entries (sorted by slot, as fp_build makes them) of a key's slot."""
    cdef int lo = 0, hi = s.fp.n_entries - 1, mid
    while lo <= hi:
        mid = (lo + hi) >> 1
        if <size_t>s.fp.entries[mid].slot < slot:
            lo = mid + 1
        elif <size_t>s.fp.entries[mid].slot > slot:
            hi = mid - 1
        else:
            return mid
    raise SchedulerError("graph reuse: a split input is not in the scheduler's hash set",
                         "internal")


cdef int fp_record_allocation(SchedCore s) except -1:
    """Record where the plan's allocation left the graph copy (it is still in place: the
    plan's graph is unchanged since), for an equal graph to take without the allocator's
    walk over the plan; fp.n_places is -1 where it cannot be replayed."""
    cdef int n_chunks = s.galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS
    safe_realloc(<void **>&s.fp.places, s.graph_copy.graph.n_nodes + s.graph_copy.graph.n_leafs + 1,
                 sizeof(recorded_place), _TABLES)
    safe_realloc(<void **>&s.fp.chunks, n_chunks, sizeof(void *), _TABLES)
    memcpy(s.fp.chunks, s.galloc.c_chunks, n_chunks * sizeof(void *))
    s.fp.n_places = s.galloc.c_record_places(&s.graph_copy.graph, s.fp.places)
    return 0


cdef int fp_place(SchedCore s) except -1:
    """Allocate the re-pointed graph copy as a fresh split's allocation would: the
    recorded places, or (not replayable, or the compute buffers were allocated anew)
    the allocator's alloc_graph, which needs no fit check for a graph equal to the one
    the reservation placed."""
    owner = (s.last_graph_obj, s.arena)
    if s.fp.n_places >= 0 and memcmp(s.fp.chunks, s.galloc.c_chunks,
                                     s.galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS * sizeof(void *)) == 0:
        return s.galloc.c_replay_places(&s.graph_copy.graph, s.fp.places, s.fp.n_places, owner)
    return s.galloc.c_alloc_graph(&s.graph_copy.graph, owner, True)


cdef int fp_build(SchedCore s) except -1:
    """Describe the plan's graph (s.last_graph_obj, unchanged since its plan) and give its
    nodes their sources back (a new graph takes the plan, or a fresh split follows)."""
    cdef Graph g = <Graph>s.last_graph_obj
    cdef ggml_cgraph * cg = &g.graph
    cdef int nn = cg.n_nodes, nl = cg.n_leafs, i, j, k, n
    cdef size_t h
    cdef uint32_t * refs
    cdef Context arena = s.arena
    cdef int nbc = s.n_backends * s.pipeline.n_copies
    cdef dict layouts = {}
    cdef graph_input * gi

    # the rewiring, by position, before it is undone
    safe_realloc(<void **>&s.fp.rewirings, s.n_rewired + 1, sizeof(sched_rewiring), _TABLES)
    memcpy(s.fp.rewirings, s.rewired, s.n_rewired * sizeof(sched_rewiring))
    s.fp.n_rewirings = s.n_rewired
    undo_rewiring(s)

    refs = <uint32_t *>checked_calloc(s.hash_set.size, sizeof(uint32_t), "the fingerprint")
    try:
        for i in range(nn):
            refs[s.sweep.node_slots[i]] = 1 + i
        for k in range(nl):
            h = ggml_hash_find(&s.hash_set, cg.leafs[k])
            refs[h] = 1 + nn + k
        s.fp.n_nodes = nn
        s.fp.n_leafs = nl
        s.fp.n_outside = 0
        s.fp_keep = []
        s.fp.n_layouts = 0
        s.fp.n_more = 0
        safe_realloc(<void **>&s.fp.tensors, nn + nl + 1, sizeof(fp_tensor), _TABLES)
        spread_pre_memory(s, cg)
        for i in range(nn):
            fp_record(s, refs, cg.nodes[i], &s.fp.tensors[i], nl + i, layouts)
        for k in range(nl):
            fp_record(s, refs, cg.leafs[k], &s.fp.tensors[nn + k], k, layouts)

        # every key of the hash set
        n = 0
        for h in range(s.hash_set.size):
            n += ggml_bitset_get(s.hash_set.used, h)
        safe_realloc(<void **>&s.fp.entries, n + 1, sizeof(fp_entry), _TABLES)
        safe_realloc(<void **>&s.fp.tmp_ids, n + 1, sizeof(int), _TABLES)
        safe_realloc(<void **>&s.fp.tmp_causes, n + 1, sizeof(uint8_t), _TABLES)
        safe_realloc(<void **>&s.fp.tmp_copies, n * nbc + 1, sizeof(void *), _TABLES)
        n = 0
        for h in range(s.hash_set.size):
            if ggml_bitset_get(s.hash_set.used, h):
                s.fp.entries[n].slot = h
                s.fp.entries[n].ref = fp_ref(s, refs, s.hash_set.keys[h])
                n += 1
        s.fp.n_entries = n
        # the graph inputs as the user made them: the split marked them input and output
        # (one outside the graph is compared as the very tensor, flags aside)
        for i in range(s.pipeline.n_graph_inputs):
            gi = &s.pipeline.graph_inputs[i]
            gi.fp_entry = fp_entry_of(s, gi.slot)
            if 0 < refs[gi.slot] <= <uint32_t>(nn + nl):
                (<int32_t *>&s.fp.tensors[refs[gi.slot] - 1].head)[1] = gi.flags

        # the splits' inputs, with their names and entries
        n = 0
        for i in range(s.n_splits):
            n += s.splits[i].n_inputs
        safe_realloc(<void **>&s.fp.inputs, n + 1, sizeof(uint32_t), _TABLES)
        safe_realloc(<void **>&s.fp.input_names, n + 1, GGML_MAX_NAME, _TABLES)
        safe_realloc(<void **>&s.fp.input_entries, n + 1, sizeof(int), _TABLES)
        n = 0
        for i in range(s.n_splits):
            for j in range(s.splits[i].n_inputs):
                s.fp.inputs[n] = fp_ref(s, refs, s.splits[i].inputs[j])
                s.fp.input_entries[n] = fp_entry_of(
                    s, ggml_hash_find(&s.hash_set, s.splits[i].inputs[j]))
                memcpy(&s.fp.input_names[n * GGML_MAX_NAME], s.splits[i].inputs[j].name,
                       GGML_MAX_NAME)
                n += 1
        s.fp.n_inputs = n

        # what the arena's copies and dependency views are of
        safe_realloc(<void **>&s.fp.arena_of, arena.ctx.n_tensors + 1, sizeof(uint32_t), _TABLES)
        for i in range(arena.ctx.n_tensors):
            s.fp.arena_of[i] = fp_ref(s, refs, s.infos[i].of)
        s.fp.n_arena = arena.ctx.n_tensors

        s.fp_assignments = [(fp_ref(s, refs, (<Tensor>t).ptr), b)
                            for t, b in s.plan_assignments.values()]
    finally:
        free(refs)
    # the buffers of the pre-allocated tensors, whose release or re-purposing is a change
    buffers = {<size_t>s.fp.tensors[i].buffer for i in range(nn + nl)} - {0}
    safe_realloc(<void **>&s.fp.buffers, len(buffers) + 1, sizeof(void *), _TABLES)
    for i, addr in enumerate(buffers):
        s.fp.buffers[i] = <ggml_backend_buffer *><size_t>addr
    s.fp.n_buffers = len(buffers)
    # the tables of the graph compared and of the one re-pointed to last
    n = 1 + nn + nl + s.fp.n_outside
    safe_realloc(<void **>&s.fp.table, n, sizeof(ggml_tensor *), _TABLES)
    safe_realloc(<void **>&s.fp.cur_table, n, sizeof(ggml_tensor *), _TABLES)
    s.fp.table[0] = NULL
    memcpy(&s.fp.table[1 + nn + nl], s.fp.outside, s.fp.n_outside * sizeof(void *))
    memcpy(s.fp.cur_table, s.fp.table, n * sizeof(ggml_tensor *))
    fp_record_allocation(s)
    s.fp.epoch = s.plan_epoch
    s.fp.state = FP_BUILT
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
    return s.fp.more_srcs[(r.more_src - 1) * FP_MORE_SOURCES + j - GGML_PY_FIRST_SOURCES]


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
    One pass over g's nodes and leafs (fp.table is made g's on the way); their orders
    are set too (a leaf's is -2 - its position), which finds a tensor at two places of
    g or one both in g and outside the plan's graph: the plan's keys are then not g's,
    one to one."""
    cdef int i, n = g.n_nodes
    cdef ggml_tensor * t
    cdef ggml_tensor ** table = s.fp.table
    if g.n_nodes != s.fp.n_nodes or g.n_leafs != s.fp.n_leafs or world_epoch() > s.fp.epoch:
        return False
    for i in range(s.fp.n_outside):
        if fp_stamped_after(s.fp.outside[i], s.fp.epoch):
            return False
    if buffers_epoch() > s.fp.epoch:        # (a weight a buffer each: many)
        for i in range(s.fp.n_buffers):
            if s.fp.buffers[i].gen > s.fp.epoch:
                return False
    memcpy(&table[1], g.nodes, n * sizeof(ggml_tensor *))
    memcpy(&table[1 + n], g.leafs, g.n_leafs * sizeof(ggml_tensor *))
    for i in range(n):
        t = g.nodes[i]
        if i + PREFETCH_AHEAD < n:
            fp_prefetch(g.nodes[i + PREFETCH_AHEAD], &s.fp.tensors[i + PREFETCH_AHEAD])
        if not fp_tensor_matches(t, &s.fp.tensors[i], table, s.fp.layouts, s.fp.more_srcs) or (
                ggml_is_node_from(g, t, 0) and t.order < i):
            return False
        t.order = i
    for i in range(g.n_leafs):
        t = g.leafs[i]
        if i + PREFETCH_AHEAD < g.n_leafs:
            fp_prefetch(g.leafs[i + PREFETCH_AHEAD], &s.fp.tensors[n + i + PREFETCH_AHEAD])
        if (not fp_tensor_matches(t, &s.fp.tensors[n + i], table, s.fp.layouts,
                                      s.fp.more_srcs)
                or ggml_is_node_from(g, t, 0) or fp_is_leaf_before(g, t, i)):
            return False
        t.order = -2 - i
    for i in range(s.fp.n_outside):
        t = s.fp.outside[i]
        if ggml_is_node_from(g, t, 0) or fp_is_leaf_before(g, t, g.n_leafs):
            return False
    for i in range(s.fp.n_inputs):
        if strncmp(table[s.fp.inputs[i]].name, &s.fp.input_names[i * GGML_MAX_NAME],
                   GGML_MAX_NAME) != 0:
            return False
    return True


cdef bint fp_assignments_match(SchedCore s) except -1:
    """Are the user assignments made since the reset the plan's, by position (in the
    graph fp_matches compared)?"""
    if not s.fp_assignments and not s.user_assignments:
        return True
    return ({<size_t>s.fp.table[ref]: b for ref, b in s.fp_assignments}
            == {addr: b for addr, (t, b) in s.user_assignments.items()})


cdef bint fp_repoint_keys(SchedCore s, ggml_tensor ** table) noexcept:
    """Re-make the hash set with table's tensors as keys and the plan's values; False
    (the set is then to be cleared) where two keys would be one tensor (fp_matches
    excludes that)."""
    cdef int e, c, nbc = s.n_backends * s.pipeline.n_copies
    cdef size_t h
    cdef ggml_tensor * t
    cdef ggml_tensor ** copies
    cdef ggml_tensor ** kept
    for e in range(s.fp.n_entries):
        h = s.fp.entries[e].slot
        s.fp.tmp_ids[e] = s.hv_tensor_backend_ids[h]
        s.fp.tmp_causes[e] = s.hv_tensor_causes[h]
        copies = copy_slot(s, h, 0, 0)
        kept = &s.fp.tmp_copies[e * nbc]
        for c in range(nbc):            # (a handful: no memcpy call)
            kept[c] = copies[c]
            copies[c] = NULL
        s.hv_tensor_backend_ids[h] = -1
        s.hv_tensor_causes[h] = 0
        s.hash_set.used[h >> 5] &= ~((<ggml_bitset_t>1) << (h & 31))
    for e in range(s.fp.n_entries):
        t = table[s.fp.entries[e].ref]
        h = ggml_hash_find(&s.hash_set, t)
        if h == GGML_HASHSET_FULL or ggml_bitset_get(s.hash_set.used, h):
            return False
        ggml_bitset_set(s.hash_set.used, h)
        s.hash_set.keys[h] = t
        s.hv_tensor_backend_ids[h] = s.fp.tmp_ids[e]
        s.hv_tensor_causes[h] = s.fp.tmp_causes[e]
        copies = copy_slot(s, h, 0, 0)
        kept = &s.fp.tmp_copies[e * nbc]
        for c in range(nbc):
            copies[c] = kept[c]
        s.fp.entries[e].slot = h
    for e in range(s.pipeline.n_graph_inputs):
        s.pipeline.graph_inputs[e].slot = s.fp.entries[s.pipeline.graph_inputs[e].fp_entry].slot
    return True


cdef int fp_ensure_keys(SchedCore s) except -1:
    """Key the hash set by the tensors of the graph the plan was re-pointed to last,
    where that was put off (a re-pointing leaves the keys to whoever reads them)."""
    if s.fp.keys_stale:
        s.fp.keys_stale = False
        if not fp_repoint_keys(s, s.fp.cur_table):
            clear_tables(s)
            raise SchedulerError("graph reuse: the hash set could not be re-keyed", "internal")
    return 0


cdef int fp_repoint(SchedCore s, Graph graph) except -1:
    """Point everything of the plan but the hash set's keys (fp_ensure_keys) at the
    tensors of graph (the one fp_matches compared last), as a fresh split would."""
    cdef ggml_cgraph * g = &graph.graph
    cdef ggml_cgraph * gc = &s.graph_copy.graph
    cdef ggml_tensor ** table = s.fp.table
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
            split.inputs[j] = table[s.fp.inputs[k]]
            k += 1
        n += 2 * split.n_inputs
        memcpy(&gc.nodes[n], &g.nodes[split.i_start],
               (split.i_end - split.i_start) * sizeof(ggml_tensor *))
        n += split.i_end - split.i_start
    memcpy(&gc.leafs[gc.n_leafs - g.n_leafs], g.leafs, g.n_leafs * sizeof(ggml_tensor *))
    # the arena: copies name their tensor only in infos; a dependency view is made
    # anew (ggml_view_tensor of the new input, unplaced)
    for i in range(s.fp.n_arena):
        of = table[s.fp.arena_of[i]]
        s.infos[i].of = of
        if s.infos[i].kind == SCHED_TENSOR_DEP:
            t = ggml_context_tensor(&arena.ctx, i)
            tensor_set_src(t, 0, of)
            t.view_src = of.view_src if of.view_src != NULL else of
            t.view_offs = of.view_offs if of.view_src != NULL else 0
            t.buffer = NULL
            t.data = t.view_src.data + t.view_offs if t.view_src.data != NULL else NULL
            tensor_changed(t)
    for i in range(s.fp.n_rewirings):
        r = &s.fp.rewirings[i]
        # (fp_matches found the node's source where the plan's was; the plan may have
        # moved to another copy slot since it was described)
        record_rewiring(s, g.nodes[r.node], r.node, r.src,
                        table[fp_src(s, &s.fp.tensors[r.node], r.src)],
                        sibling_copy(s, r.copy, s.pipeline.cur_copy))
    apply_rewirings(s)
    # each graph input is the current slot's copy of itself, marked as the split marks it
    for i in range(s.pipeline.n_graph_inputs):
        gi = &s.pipeline.graph_inputs[i]
        t = table[s.fp.entries[gi.fp_entry].ref]
        t.flags |= GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
        copy_slot(s, gi.slot, gi.backend_id, s.pipeline.cur_copy)[0] = t
        gc.leafs[i * s.pipeline.n_copies + s.pipeline.cur_copy] = t
        gi.tensor = t
    # as a split of an equal graph leaves them: the previous ids are the same
    memcpy(s.graph_copy.prev_node_backend_ids, s.graph_copy.node_backend_ids,
           gc.n_nodes * sizeof(int))
    memcpy(s.graph_copy.prev_leaf_backend_ids, s.graph_copy.leaf_backend_ids,
           gc.n_leafs * sizeof(int))
    # the hash set's keys are to be this table's (g may change before they are read)
    s.fp.table, s.fp.cur_table = s.fp.cur_table, s.fp.table
    s.fp.keys_stale = True
    s.graph_copy.debug_prev_graph_size = s.graph_copy.debug_graph_size
    s.last_graph = g
    s.last_graph_obj = graph
    return 0


cdef bint try_reuse_rebuilt(SchedCore s, Graph g) except -1:
    """Level 2: take the kept plan for g, a graph other than the plan's but equal to it,
    re-pointed at g's tensors, and allocate it as a fresh split would be. False (and the
    caller splits afresh) where g is not equal or the plan cannot be re-pointed."""
    if not (s.reset_deferred and s.plan_reusable and s.graph_reuse
            and s.last_graph_obj is not g and s.fp.state != FP_NONE):
        return False
    if s.fp.state == FP_BUILDABLE:
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


cdef void fingerprint_free(sched_fingerprint * fp) noexcept:
    """Free the fingerprint's arrays (SchedCore's dealloc)."""
    free(fp.tensors)
    free(fp.more_srcs)
    free(fp.layouts)
    free(fp.buffers)
    free(fp.table)
    free(fp.cur_table)
    free(fp.entries)
    free(fp.tmp_ids)
    free(fp.tmp_causes)
    free(fp.tmp_copies)
    free(fp.inputs)
    free(fp.input_names)
    free(fp.input_entries)
    free(fp.arena_of)
    free(fp.rewirings)
    free(fp.outside)
    free(fp.places)
    free(fp.chunks)
