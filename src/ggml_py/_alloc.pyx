"""Graph allocator of ggml_py: a port of ggml-alloc.c (ggml 0.10.1).

Three allocators, as in ggml:

- TensorAllocator (ggml_tallocr): places tensors one after the other in one
  buffer; for weights.
- dyn_tallocr (ggml_dyn_tallocr): plans offsets in a compute buffer that may
  be split into up to 16 chunks, with a sorted free list per chunk, best-fit
  choice and merging of neighbouring free blocks. It handles numbers only.
- GraphAllocator (ggml_gallocr): walks a graph in ggml's order, gives every
  tensor an address (reusing a parent's memory in place where ggml allows),
  frees tensors after their last use, then allocates one buffer per chunk and
  points the tensors into them.

Sizes and offsets must equal ggml's byte for byte (the scheduler's plans are
compared with ggml's), so the control flow follows ggml's closely, including
its quirks; each function names the ggml function it ports. Where ggml would
assert or crash, this port raises instead and stays usable.
"""

cimport cython
from libc.stdlib cimport calloc, free
from libc.string cimport memset
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t, INT64_MIN, SIZE_MAX

from ggml_py._ggml cimport *
from ggml_py._core cimport (prefetch, prefetch_sources, prefetch_placement, PREFETCH_AHEAD,
                            source_mask, lowest_bit,
                            size_arg, index_arg, items_arg, tensor_name,
                            ggml_graph_check_order, GGML_PY_MAX_BYTES, ggml_nbytes,
                            tensor_handle, Tensor, Graph, safe_realloc, new_epoch,
                            graph_tensor)
from ggml_py._backend cimport (BufferType, Buffer, _live, buffer_reset, tensor_alloc_at,
                               view_init_c)

from ggml_py._backend import filled_slots
from ggml_py._core import OP_IDS

# the flags that decide where a node may be placed (inputs first, outputs never freed)
cdef int32_t _PLACEMENT_FLAGS = GGML_TENSOR_FLAG_INPUT | GGML_TENSOR_FLAG_OUTPUT
from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, SchedulerError,
                            UnknownNameError)

# ---------------------------------------------------------------------------
# in-place ops (ggml_op_can_inplace): the backends of these ops accept dst == src

INPLACE_OPS = (
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB",
    "MUL", "DIV", "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK",
    "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX", "SOFT_MAX_BACK",
)

cdef bint _INPLACE[GGML_OP_COUNT_MAX]
for _op in INPLACE_OPS:
    _INPLACE[OP_IDS[_op]] = True


cdef bint ggml_op_can_inplace(int op) noexcept nogil:
    return 0 <= op < GGML_OP_COUNT_MAX and _INPLACE[op]


def op_can_inplace(op):
    """Whether ggml-alloc may give a node of this op (name or id) its parent's memory."""
    if isinstance(op, str):
        if op not in OP_IDS:
            raise UnknownNameError(f"unknown ggml op {op!r}")
        return ggml_op_can_inplace(OP_IDS[op])
    return ggml_op_can_inplace(index_arg(op, "op id", GGML_OP_COUNT_MAX))


cdef inline size_t aligned_offset(size_t base, size_t offset, size_t alignment) noexcept nogil:
    """Port of aligned_offset: offset rounded up so that base + offset is aligned."""
    return offset + (alignment - ((base + offset) % alignment)) % alignment


cdef inline str _buft_name(const ggml_backend_buffer_type * buft):
    return buft.name.decode("utf-8", errors="replace")


cdef size_t _buft_alloc_size(BufferType buft, ggml_tensor * t) except? 0:
    """ggml_backend_buft_get_alloc_size through the Python slot, checked (the
    allocators' slow path: ggml_nbytes serves most buffer types)."""
    cdef size_t size = size_arg(buft.get_alloc_size(tensor_handle(t)),
                                f"{type(buft).__name__}.get_alloc_size('{tensor_name(t)}')")
    if size > GGML_PY_MAX_BYTES:
        raise AllocationError(f"tensor '{tensor_name(t)}' needs {size} bytes, more than "
                              f"{GGML_PY_MAX_BYTES}")
    return size


# ---------------------------------------------------------------------------
# linear allocator (ggml_tallocr)

cdef class TensorAllocator:
    """Places tensors one after another in `buffer`, each padded to the buffer
    type's alignment (ggml_tallocr). Used for weights and other long-lived data."""

    def __init__(self, Buffer buffer not None):
        self.buffer = _live(buffer)
        self.base = buffer.c.base
        self.alignment = buffer.c.buft.alignment
        self.offset = aligned_offset(<size_t>self.base, 0, self.alignment)

    def alloc(self, Tensor tensor not None):
        """Port of ggml_tallocr_alloc. ggml aborts when the buffer is full; this raises
        AllocationError and leaves the allocator as it was."""
        cdef ggml_tensor * t = tensor.ptr
        _live(self.buffer)
        cdef size_t size = _buft_alloc_size(self.buffer.buffer_type, t)
        cdef size_t padded = aligned_offset(0, size, self.alignment)   # GGML_PAD
        if self.offset > self.buffer.c.size or padded > self.buffer.c.size - self.offset:
            raise AllocationError(
                f"not enough space in the {self.buffer.buffer_type.name} buffer to allocate "
                f"'{tensor.name}' (needed {padded}, available {self.buffer.c.size - self.offset})")
        tensor_alloc_at(&self.buffer.c, t, self.base + self.offset, size)
        tensor.owner.keep(self.buffer)      # the tensor's context keeps its memory alive
        self.offset += padded
        return self


# ---------------------------------------------------------------------------
# dynamic allocator (ggml_dyn_tallocr): offsets only

cdef buffer_address ADDRESS_INVALID = buffer_address(-1, SIZE_MAX)
# the plan of a tensor the allocator does not place (a view, a tensor with data, no source)
cdef tensor_alloc TENSOR_ALLOC_NONE = tensor_alloc(-1, ADDRESS_INVALID, 0)


cdef int dyn_insert_block(tallocr_chunk * chunk, size_t offset, size_t size) except -1:
    """Port of ggml_dyn_tallocr_insert_block: keep the free list sorted by offset."""
    cdef int i, pos = 0
    if chunk.n_free_blocks >= MAX_FREE_BLOCKS:
        # ggml asserts "out of free blocks"
        raise AllocationError(f"graph allocation: more than {MAX_FREE_BLOCKS} free blocks "
                              f"in one chunk (memory too fragmented)")
    while pos < chunk.n_free_blocks and chunk.free_blocks[pos].offset < offset:
        pos += 1
    i = chunk.n_free_blocks
    while i > pos:
        chunk.free_blocks[i] = chunk.free_blocks[i - 1]
        i -= 1
    chunk.free_blocks[pos].offset = offset
    chunk.free_blocks[pos].size = size
    chunk.n_free_blocks += 1
    return 0


cdef inline void dyn_remove_block(tallocr_chunk * chunk, int idx) noexcept nogil:
    """Port of ggml_dyn_tallocr_remove_block (ggml also copies the slot past the
    end, which is never read again; this stops one short)."""
    cdef int i
    for i in range(idx, chunk.n_free_blocks - 1):
        chunk.free_blocks[i] = chunk.free_blocks[i + 1]
    chunk.n_free_blocks -= 1


cdef int dyn_new_chunk(dyn_tallocr * alloc, size_t min_size) except -2:
    """Port of ggml_dyn_tallocr_new_chunk: index of a new chunk, -1 when all 16 exist.

    A chunk holds max_chunk_size bytes, more when one tensor is larger; the
    16th is unbounded (SIZE_MAX/2), so the allocation never runs out of chunks.
    """
    if alloc.n_chunks >= GGML_VBUFFER_MAX_CHUNKS:
        return -1
    cdef tallocr_chunk * chunk = <tallocr_chunk *>calloc(1, sizeof(tallocr_chunk))
    if chunk == NULL:
        raise AllocationError("cannot allocate a graph allocator chunk")
    chunk.n_free_blocks = 1
    chunk.free_blocks[0].offset = 0
    chunk.free_blocks[0].size = min_size if min_size > alloc.max_chunk_size else alloc.max_chunk_size
    if alloc.n_chunks == GGML_VBUFFER_MAX_CHUNKS - 1:
        chunk.free_blocks[0].size = SIZE_MAX // 2
    alloc.chunks[alloc.n_chunks] = chunk
    alloc.n_chunks += 1
    return alloc.n_chunks - 1


cdef buffer_address dyn_alloc(dyn_tallocr * alloc, size_t size) except *:
    """Port of ggml_dyn_tallocr_alloc.

    First the best fit (smallest sufficient block, the later one on ties)
    among the blocks that are not the last of their chunk; failing that, the
    last block of the chunk that wastes least or grows least (reuse factor);
    failing that, a new chunk.
    """
    if size > GGML_PY_MAX_BYTES or alloc.alignment > GGML_PY_MAX_BYTES:
        # offsets are sums of sizes: past this they could wrap size_t (ggml's would)
        raise AllocationError(f"graph allocation: {size} bytes at alignment {alloc.alignment} "
                              f"exceed the {GGML_PY_MAX_BYTES}-byte limit of one tensor")
    size = aligned_offset(0, size, alloc.alignment)
    cdef int c, i
    cdef int best_chunk = -1, best_block = -1
    cdef size_t best_size
    cdef tallocr_chunk * chunk
    cdef free_block * block
    cdef int64_t best_reuse, reuse
    cdef bint better_reuse, better_fit

    for c in range(alloc.n_chunks):
        chunk = alloc.chunks[c]
        best_size = SIZE_MAX
        for i in range(chunk.n_free_blocks - 1):
            block = &chunk.free_blocks[i]
            if block.size >= size and block.size <= best_size:
                best_chunk = c
                best_block = i
                best_size = block.size

    if best_block == -1:
        # the last block of a chunk may grow the chunk: prefer the chunk whose
        # high-water mark already covers the tensor with the least left over,
        # else the one that grows least
        best_reuse = INT64_MIN
        for c in range(alloc.n_chunks):
            chunk = alloc.chunks[c]
            if chunk.n_free_blocks > 0:
                block = &chunk.free_blocks[chunk.n_free_blocks - 1]
                # ggml computes this in size_t and converts: wraps to negative on growth
                reuse = <int64_t>(chunk.max_size - block.offset - size)
                better_reuse = best_reuse < 0 and reuse > best_reuse
                better_fit = reuse >= 0 and reuse < best_reuse
                if block.size >= size and (better_reuse or better_fit):
                    best_chunk = c
                    best_block = chunk.n_free_blocks - 1
                    best_reuse = reuse

    if best_block == -1:
        best_chunk = dyn_new_chunk(alloc, size)
        best_block = 0
    if best_chunk == -1:
        # cannot happen (the last chunk is unbounded); ggml aborts
        raise AllocationError(f"graph allocation: not enough space to allocate {size} bytes")

    chunk = alloc.chunks[best_chunk]
    block = &chunk.free_blocks[best_block]
    cdef buffer_address addr = buffer_address(best_chunk, block.offset)
    block.offset += size
    block.size -= size
    if block.size == 0:
        dyn_remove_block(chunk, best_block)
    if addr.offset + size > chunk.max_size:
        chunk.max_size = addr.offset + size
    return addr


cdef int dyn_free_bytes(dyn_tallocr * alloc, buffer_address addr, size_t size) except -1:
    """Port of ggml_dyn_tallocr_free_bytes: merge with the block ending where this
    one starts (then maybe the next), or with the block starting where it ends
    (then maybe the previous), else insert a new block."""
    size = aligned_offset(0, size, alloc.alignment)
    cdef tallocr_chunk * chunk = alloc.chunks[addr.chunk]
    cdef free_block * block
    cdef free_block * other
    cdef int i
    for i in range(chunk.n_free_blocks):
        block = &chunk.free_blocks[i]
        if block.offset + block.size == addr.offset:
            block.size += size
            if i < chunk.n_free_blocks - 1:
                other = &chunk.free_blocks[i + 1]
                if block.offset + block.size == other.offset:
                    block.size += other.size
                    dyn_remove_block(chunk, i + 1)
            return 0
        if addr.offset + size == block.offset:
            block.offset = addr.offset
            block.size += size
            if i > 0:
                other = &chunk.free_blocks[i - 1]
                if other.offset + other.size == block.offset:
                    other.size += block.size
                    dyn_remove_block(chunk, i)
            return 0
    dyn_insert_block(chunk, addr.offset, size)
    return 0


cdef void dyn_reset(dyn_tallocr * alloc) noexcept nogil:
    """Port of ggml_dyn_tallocr_reset: drop every chunk (they are made again on demand)."""
    cdef int i
    for i in range(GGML_VBUFFER_MAX_CHUNKS):
        free(alloc.chunks[i])
        alloc.chunks[i] = NULL
    alloc.n_chunks = 0


cdef dyn_tallocr * dyn_new(size_t alignment, size_t max_buffer_size) except NULL:
    cdef dyn_tallocr * alloc = <dyn_tallocr *>calloc(1, sizeof(dyn_tallocr))
    if alloc == NULL:
        raise AllocationError("cannot allocate a graph allocator")
    alloc.alignment = alignment
    # clamped so that sums of chunk sizes cannot overflow (as ggml)
    alloc.max_chunk_size = max_buffer_size if max_buffer_size < SIZE_MAX // 2 else SIZE_MAX // 2
    return alloc


cdef void dyn_free(dyn_tallocr * alloc) noexcept nogil:
    if alloc != NULL:
        dyn_reset(alloc)
        free(alloc)


cdef inline size_t dyn_max_size(dyn_tallocr * alloc, int chunk) noexcept nogil:
    return alloc.chunks[chunk].max_size if chunk < alloc.n_chunks else 0


# ---------------------------------------------------------------------------
# virtual buffer (struct vbuffer): one Buffer per chunk

cdef class VBuffer:
    """The chunk buffers of one compute buffer. Dropping it frees them (ggml_vbuffer_free)."""

    def __cinit__(self):
        self.owners = []

    cdef size_t chunk_size(self, int chunk) noexcept:
        """ggml_vbuffer_chunk_size: 0 for a chunk that was never allocated."""
        return self.chunks[chunk].size if self.chunks[chunk] != NULL else 0

    cdef size_t total_size(self) noexcept:
        """ggml_vbuffer_size: the chunks up to the first missing one."""
        cdef size_t size = 0
        cdef int i
        for i in range(GGML_VBUFFER_MAX_CHUNKS):
            if self.chunks[i] == NULL:
                break
            size += self.chunks[i].size
        return size

    @property
    def buffers(self):
        return list(self.owners)

    def release(self):
        """Give every chunk's memory back (ggml_vbuffer_free)."""
        for b in self.owners:
            b.release()


cdef Buffer _zero_size_buffer(BufferType buft):
    """ggml_backend_buft_alloc_buffer's dummy buffer for size 0: no memory and a
    NULL base. The buffer type's alloc_buffer is not called."""
    cdef Buffer b = Buffer.__new__(Buffer)
    b.buffer_type = buft
    b.c.buft = &buft.c
    return b


# ---------------------------------------------------------------------------
# graph allocator (ggml_gallocr)

cdef const int * _ids_ptr(object ids, int * zero) except? NULL:
    """The C int array inside an array.array of buffer ids (kept alive by the
    caller); NULL for None (every tensor in buffer 0), `zero` for an empty one."""
    cdef int[::1] view
    if ids is None:
        return NULL
    if len(ids) == 0:
        return zero
    view = ids
    return &view[0]


MAX_BUFFER_IDS = 1024


cdef inline bint _needs_plan(const hash_node * hn) noexcept nogil:
    """Not yet planned, and neither memory from outside nor a view (its view_src's memory)."""
    return not hn.bits & (HN_HAS_MEMORY | HN_ALLOCATED | HN_VIEW)


cdef inline bint placed_here(GraphAllocator galloc, const ggml_tensor * t) noexcept:
    """Did galloc place t (it is in one of its compute buffers)? Planning treats such a
    tensor as unallocated: the plan is of the graph as a whole, and placing a graph
    first takes back the last one's placements (ggml treats them as data from outside)."""
    return t.buffer != NULL and t.buffer.allocator == <void *>galloc


cdef inline int record_placed(GraphAllocator galloc, ggml_tensor * t) except -1:
    """Note that galloc pointed t into one of its buffers (see unplace)."""
    if galloc.n_placed == galloc.placed_cap:
        galloc.grow_placed()
    galloc.placed[galloc.n_placed] = t
    galloc.n_placed += 1
    return 0


cdef inline ggml_tensor * _recorded_tensor(ggml_cgraph * graph, const recorded_place * p) noexcept:
    return graph.nodes[p.index] if p.index >= 0 else graph.leafs[~p.index]


cdef inline bint _fits(GraphAllocator galloc, const ggml_tensor * t,
                       const tensor_alloc * ta) except -1:
    """Port of ggml_gallocr_node_needs_realloc, which despite its name answers whether the
    recorded place still serves: it does for a tensor that now has data or is a view,
    not for one that had data at planning time and lost it, and otherwise when the
    tensor is no larger than planned."""
    if t.data != NULL or t.view_src != NULL:
        return True
    if ta.buffer_id < 0:
        return False
    return ta.size_max >= galloc.alloc_size(ta.buffer_id, <ggml_tensor *>t)


cdef inline int _place(GraphAllocator galloc, ggml_tensor * t, const tensor_alloc * ta,
                       uint64_t stamp) except -1:
    """galloc.init_tensor with its common cases in line, each tensor stamped `stamp` (one
    batch, see new_epoch): a view of memory, and a planned tensor in a chunk without an
    init_tensor slot. The rest (errors, released buffers, Python slots) is init_tensor's."""
    cdef ggml_tensor * vs = t.view_src
    cdef ggml_backend_buffer * chunk
    if vs != NULL:
        if t.buffer == NULL and vs.buffer != NULL and vs.data != NULL:
            t.buffer = vs.buffer                        # ggml_backend_view_init
            t.data = vs.data + t.view_offs
            t.gen = stamp
            if vs.buffer.allocator == <void *>galloc:
                record_placed(galloc, t)
            return 0
    elif t.data != NULL:
        return 0                                        # memory from outside
    elif t.buffer == NULL and ta.buffer_id >= 0 and ta.addr.chunk >= 0:
        chunk = galloc.c_chunks[ta.buffer_id * GGML_VBUFFER_MAX_CHUNKS + ta.addr.chunk]
        if (chunk != NULL and ta.size_max <= chunk.size
                and ta.addr.offset <= chunk.size - ta.size_max
                and (chunk.pyobj == NULL or not (<Buffer>chunk.pyobj)._has_init_tensor)):
            t.buffer = chunk                            # tensor_alloc_at
            t.data = chunk.base + ta.addr.offset
            t.gen = stamp
            record_placed(galloc, t)
            return 0
    return galloc.init_tensor(t, ta)


@cython.final
cdef class GraphAllocator:
    """Plans and allocates the compute memory of graphs (ggml_gallocr).

    `buffer_types` has one BufferType per buffer id (per backend in the
    scheduler); ids with the same buffer type share one planner and one buffer,
    as in ggml_gallocr_new_n.
    """

    def __init__(self, buffer_types):
        bufts = items_arg(buffer_types, "a graph allocator's buffer types", BufferType,
                          MAX_BUFFER_IDS)
        if not bufts:
            raise ArgumentError("a graph allocator needs at least one buffer type")
            if (<BufferType>b).c.alignment == 0:
                raise ArgumentError("a buffer type was never initialised (BufferType.__init__)")
        cdef int n = len(bufts), i, j
        self.bufts = bufts
        self.c_bufts = <ggml_backend_buffer_type **>calloc(n, sizeof(ggml_backend_buffer_type *))
        self.nbytes_sized = <bint *>calloc(n, sizeof(bint))
        self.buf_tallocs = <dyn_tallocr **>calloc(n, sizeof(dyn_tallocr *))
        self.c_chunks = <ggml_backend_buffer **>calloc(n * GGML_VBUFFER_MAX_CHUNKS,
                                                       sizeof(ggml_backend_buffer *))
        if (self.c_bufts == NULL or self.nbytes_sized == NULL or self.buf_tallocs == NULL
                or self.c_chunks == NULL):
            raise AllocationError("cannot allocate a graph allocator")
        self.n_buffers = n
        self.buffers = [None] * n
        cdef BufferType bt
        for i in range(n):
            bt = bufts[i]
            self.c_bufts[i] = &bt.c
            # the default get_alloc_size is ggml_nbytes: answer it in C
            self.nbytes_sized[i] = "get_alloc_size" not in filled_slots(type(bt))
            for j in range(i):
                if bufts[j] is bt:
                    self.buf_tallocs[i] = self.buf_tallocs[j]
                    break
            if self.buf_tallocs[i] == NULL:
                self.buf_tallocs[i] = dyn_new(bt.c.alignment, bt.c.max_size)
        self.valid = False
        self.last_error = None
        self.last_error_id = -1
        self.last_cause = None

    def __del__(self):
        # as ggml_gallocr_free, but no tensor is left pointing at the freed buffers
        self.close()

    def close(self):
        """Take back every placement and release the compute buffers (ggml_gallocr_free).
        The allocator stays usable: the next reserve allocates again."""
        self.unplace()
        for i in range(self.n_buffers):
            if self.buffers[i] is not None:
                (<VBuffer>self.buffers[i]).release()
                self.buffers[i] = None
                self.sync_chunks(i)
        self.valid = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        cdef int i, j
        cdef bint shared
        if self.buf_tallocs != NULL:
            for i in range(self.n_buffers):
                shared = False
                for j in range(i):
                    if self.buf_tallocs[j] == self.buf_tallocs[i]:
                        shared = True
                        break
                if not shared:
                    dyn_free(self.buf_tallocs[i])
        free(self.buf_tallocs)
        free(self.c_bufts)
        free(self.nbytes_sized)
        free(self.c_chunks)
        free(self.recs)
        free(self.graph_recs)
        free(self.src_refs)
        free(self.node_allocs)
        free(self.leaf_allocs)
        free(self.outside_allocs)
        free(self.placed)
        free(self.pending)

    # --- placements --------------------------------------------------------------
    # The tensors alloc_graph points into this allocator's buffers are recorded, with
    # what keeps them alive (placed_owner), so that no tensor is left pointing at a
    # buffer that is reallocated or freed: each is "unplaced" first, and reading it
    # afterwards is a clear error instead of a read of freed memory.

    cdef int grow_placed(self) except -1:
        safe_realloc(<void **>&self.placed, 2 * self.placed_cap + 64, sizeof(ggml_tensor *),
                     "the graph allocator's placement table")
        self.placed_cap = 2 * self.placed_cap + 64
        return 0

    cdef int not_placing(self) except -1:
        """Refuse a plan or a placement asked for while alloc_graph places a graph, or
        c_replay_places replays one (from a buffer's init_tensor slot): the placements
        under way point into the plan and the buffers."""
        if self.placing:
            raise AllocationError("the graph allocator was called again while it places a "
                                  "graph (from a buffer's init_tensor slot)")
        return 0

    cdef int unplace(self) except -1:
        """Give back every placement of the last alloc_graph that is still this
        allocator's (the tensor was not placed elsewhere since)."""
        cdef int k
        cdef ggml_tensor * t
        cdef uint64_t stamp = new_epoch() if self.n_placed else 0
        for k in range(self.n_placed):
            if k + PREFETCH_AHEAD < self.n_placed:
                prefetch_placement(self.placed[k + PREFETCH_AHEAD])
            t = self.placed[k]
            if t.buffer != NULL and t.buffer.allocator == <void *>self:
                t.buffer = NULL
                t.data = NULL
                t.written = 0           # its bytes are the next placement's
                t.gen = stamp
        self.n_placed = 0
        self.placed_owner = None
        return 0

    # --- helpers -------------------------------------------------------------

    cdef size_t alloc_size(self, int buffer_id, ggml_tensor * t) except? 0:
        """ggml_backend_buft_get_alloc_size of buffer id's type."""
        if self.nbytes_sized[buffer_id]:
            return ggml_nbytes(t)
        return _buft_alloc_size(<BufferType>self.bufts[buffer_id], t)

    cdef size_t rec_alloc_size(self, int buffer_id, const hash_node * hn) except? 0:
        """alloc_size of a record's tensor, from the record where it is ggml_nbytes."""
        if self.nbytes_sized[buffer_id]:
            return hn.nbytes
        return _buft_alloc_size(<BufferType>self.bufts[buffer_id], hn.tensor)

    cdef int rec_of(self, ggml_tensor * t) except -1:
        """The record of t (ggml_gallocr_hash_get), made on first sight. While a graph is
        indexed, a tensor's `order` field holds its record index: trusted only where that
        record names the tensor, so a stale order (another graph's) costs a new record."""
        cdef int k = t.order
        cdef hash_node * r
        if 0 <= k < self.n_recs and self.recs[k].tensor == t:
            return k
        if self.n_recs == self.recs_cap:
            safe_realloc(<void **>&self.recs, 2 * self.recs_cap + 64, sizeof(hash_node),
                         "the graph allocator's tensor records")
            self.recs_cap = 2 * self.recs_cap + 64
        k = self.n_recs
        self.n_recs += 1
        t.order = k
        r = &self.recs[k]
        memset(r, 0, sizeof(hash_node))
        r.tensor = t
        r.view_src = -1
        r.pos = -1
        r.bits = t.flags & _PLACEMENT_FLAGS            # HN_INPUT, HN_OUTPUT
        if t.view_src != NULL:
            r.bits |= HN_VIEW if t.op == 0 else HN_VIEW | HN_VIEW_USE
        if ggml_op_can_inplace(t.op):
            r.bits |= HN_INPLACE
        if not placed_here(self, t):
            if t.data != NULL:
                r.bits |= HN_HAS_DATA | HN_HAS_MEMORY
            elif t.buffer != NULL:
                r.bits |= HN_HAS_MEMORY
        if not r.bits & (HN_VIEW | HN_HAS_MEMORY):
            r.nbytes = ggml_nbytes(t)           # while the struct is in the cache
        return k

    cdef int index_graph(self, ggml_cgraph * graph) except -1:
        """One sweep over the graph: a record for every tensor it reaches (its nodes and
        leafs in graph order, with sources and view sources outside it), its sources as
        record indices. Nothing here calls Python, so no other thread can
        renumber a shared tensor (a weight) between its record and its uses."""
        cdef int n = graph.n_nodes, total = graph.n_nodes + graph.n_leafs
        cdef int i, j, k, first, src, done
        cdef uint32_t m
        cdef ggml_tensor * t
        if self.graph_recs_cap < total:
            safe_realloc(<void **>&self.graph_recs, total, sizeof(int),
                         "the graph allocator's tensor records")
            self.graph_recs_cap = total
        if self.recs_cap < total:
            safe_realloc(<void **>&self.recs, total + total // 8 + 64, sizeof(hash_node),
                         "the graph allocator's tensor records")
            self.recs_cap = total + total // 8 + 64
        self.n_recs = 0
        self.n_src_refs = 0
        done = 0
        for i in range(total):
            # two stages ahead: a tensor's struct, then (once it is in) its sources'
            if i + 2 * PREFETCH_AHEAD < total:
                _prefetch_tensor(graph_tensor(graph, i + 2 * PREFETCH_AHEAD))
            if i + PREFETCH_AHEAD < total:
                t = graph_tensor(graph, i + PREFETCH_AHEAD)
                prefetch_sources(t, source_mask(t))
            k = self.rec_of(graph_tensor(graph, i))
            self.graph_recs[i] = k
            if self.recs[k].pos < 0:
                self.recs[k].pos = i
            # the sources of the new records, while their structs are in the cache (a
            # source outside the graph makes a record, whose sources follow)
            while done < self.n_recs:
                t = self.recs[done].tensor
                first = self.n_src_refs
                m = source_mask(t)
                while m:
                    j = lowest_bit(m)
                    m &= m - 1
                    src = self.rec_of(t.src[j])
                    if self.n_src_refs == self.src_refs_cap:
                        safe_realloc(<void **>&self.src_refs, 2 * self.src_refs_cap + 3 * total + 64,
                                     sizeof(src_ref), "the graph allocator's source table")
                        self.src_refs_cap = 2 * self.src_refs_cap + 3 * total + 64
                    self.src_refs[self.n_src_refs] = src_ref(src, j)
                    self.n_src_refs += 1
                src = -1 if t.view_src == NULL else self.rec_of(t.view_src)
                self.recs[done].view_src = src
                self.recs[done].first_src = first
                self.recs[done].n_src = self.n_src_refs - first
                done += 1
        return 0

    cdef void sync_chunks(self, int i):
        """Mirror buffers[i]'s chunk pointers into c_chunks (for the C-level loops)."""
        cdef ggml_backend_buffer ** row = &self.c_chunks[i * GGML_VBUFFER_MAX_CHUNKS]
        cdef int c
        vb = self.buffers[i]
        for c in range(GGML_VBUFFER_MAX_CHUNKS):
            row[c] = NULL if vb is None else (<VBuffer>vb).chunks[c]

    # --- planning (ggml_gallocr_allocate_node, _free_node, _alloc_graph_impl) ---
    # These read the records and source lists of index_graph, not the tensors (but for
    # the layouts of in-place candidates, and alloc sizes asked of Python); a record index k stands
    # for ggml's tensor pointer and its hash_node.

    cdef int free_extra_space(self, int k, int parent) except -1:
        """Port of ggml_gallocr_free_extra_space: a node placed in its parent's memory
        gives back the aligned tail it does not need."""
        cdef hash_node * hn = &self.recs[k]
        cdef hash_node * p_hn = &self.recs[parent]
        cdef size_t parent_size = p_hn.size
        hn.size = self.rec_alloc_size(hn.buffer_id, hn)
        hn.bits |= HN_PLANNED
        cdef size_t node_size = hn.size
        if parent_size < node_size:
            raise AllocationError(f"in-place node '{tensor_name(hn.tensor)}' ({node_size} bytes) "
                                  f"is larger than its parent '{tensor_name(p_hn.tensor)}' "
                                  f"({parent_size} bytes)")
        cdef dyn_tallocr * p_alloc = self.buf_tallocs[p_hn.buffer_id]
        # aligned, so that the freed tail keeps the free list aligned
        parent_size = aligned_offset(0, parent_size, p_alloc.alignment)
        node_size = aligned_offset(0, node_size, p_alloc.alignment)
        cdef buffer_address p_addr
        if parent_size > node_size:
            p_addr = p_hn.addr
            p_addr.offset += node_size
            dyn_free_bytes(p_alloc, p_addr, parent_size - node_size)
        return 0

    cdef int allocate_node(self, int k, int buffer_id, bint is_leaf) except -1:
        """Port of ggml_gallocr_allocate_node: plan record k in buffer `buffer_id`, in the
        memory of a parent when the op works in place and nothing else needs the parent."""
        cdef hash_node * hn = &self.recs[k]
        cdef hash_node * p_hn
        cdef int e, parent
        if not _needs_plan(hn):
            return 0
        if buffer_id < 0 or buffer_id >= self.n_buffers:
            # ggml asserts buffer_id >= 0: the scheduler left the tensor without a backend
            kind = "leaf-without-backend" if is_leaf else "tensor-without-backend"
            raise SchedulerError(f"{'leaf' if is_leaf else 'tensor'} '{tensor_name(hn.tensor)}' "
                                 f"has no backend (buffer id {buffer_id}) but needs memory from "
                                 f"the graph allocator", kind=kind)
        hn.bits |= HN_ALLOCATED

        if hn.bits & HN_INPLACE:
            for e in range(hn.first_src, hn.first_src + hn.n_src):
                parent = self.src_refs[e].rec
                p_hn = &self.recs[parent]
                # only memory planned here can be reused (never a view's: ggml's branch
                # for view parents cannot be reached), and outputs must survive the graph
                if not p_hn.bits & HN_ALLOCATED or p_hn.bits & HN_OUTPUT:
                    continue
                if (p_hn.n_children == 1 and p_hn.n_views == 0
                        and _same_layout(hn.tensor, p_hn.tensor)):
                    hn.buffer_id = p_hn.buffer_id
                    hn.addr = p_hn.addr
                    p_hn.bits &= ~HN_ALLOCATED      # the parent is not freed: node owns it now
                    self.free_extra_space(k, parent)
                    return 0

        hn.buffer_id = buffer_id
        hn.size = self.rec_alloc_size(buffer_id, hn)
        hn.bits |= HN_PLANNED
        hn.addr = dyn_alloc(self.buf_tallocs[buffer_id], hn.size)
        return 0

    cdef int free_node(self, int k) except -1:
        """Port of ggml_gallocr_free_node; graph outputs are never freed."""
        cdef hash_node * hn = &self.recs[k]
        if hn.bits & HN_OUTPUT:
            return 0
        dyn_free_bytes(self.buf_tallocs[hn.buffer_id], hn.addr, hn.size)
        hn.bits &= ~HN_ALLOCATED
        return 0

    cdef int alloc_graph_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                              const int * leaf_buffer_ids) except -1:
        """Port of ggml_gallocr_alloc_graph_impl: plan every tensor of the indexed graph.

        Order (it decides every offset): all leafs; then, in one pass over the
        nodes, count children and views and plan the INPUT tensors; then per
        node: its not-yet-planned sources, the node itself, and the release of
        sources (or their view sources) that nothing reads any more.
        """
        cdef int i, e, k, src, bid
        cdef int n = graph.n_nodes
        cdef hash_node * recs = self.recs       # index_graph made them all: no realloc
        cdef const src_ref * refs = self.src_refs
        cdef const int * graph_recs = self.graph_recs
        cdef hash_node * hn
        cdef hash_node * p_hn
        cdef hash_node * vs_hn

        # leafs: possibly unused by the graph, but the application may want them
        for i in range(graph.n_leafs):
            self.allocate_node(graph_recs[n + i],
                               leaf_buffer_ids[i] if leaf_buffer_ids != NULL else 0, True)

        # count children and views; inputs are planned first so nothing overwrites them
        for i in range(n):
            k = graph_recs[i]
            hn = &recs[k]
            bid = node_buffer_ids[i] if node_buffer_ids != NULL else 0
            # an op NONE view is the scheduler's dependency node ("dep:"): it holds
            # its source alive through src[0] but is not itself a use of its memory
            if hn.bits & HN_VIEW_USE:
                recs[hn.view_src].n_views += 1
            if hn.bits & HN_INPUT:
                self.allocate_node(k, bid, False)
            for e in range(hn.first_src, hn.first_src + hn.n_src):
                src = refs[e].rec
                recs[src].n_children += 1
                if recs[src].bits & HN_INPUT:
                    self.allocate_node(src, bid, False)

        for i in range(n):
            k = graph_recs[i]
            hn = &recs[k]
            bid = node_buffer_ids[i] if node_buffer_ids != NULL else 0
            # sources first (only leafs and outside tensors can still be unplanned)
            for e in range(hn.first_src, hn.first_src + hn.n_src):
                if _needs_plan(&recs[refs[e].rec]):
                    self.allocate_node(refs[e].rec, bid, False)
            self.allocate_node(k, bid, False)
            # release sources nothing reads any more
            for e in range(hn.first_src, hn.first_src + hn.n_src):
                src = refs[e].rec
                p_hn = &recs[src]
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    if p_hn.view_src >= 0:
                        vs_hn = &recs[p_hn.view_src]
                        vs_hn.n_views -= 1
                        if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.bits & HN_ALLOCATED:
                            self.free_node(p_hn.view_src)
                    elif p_hn.bits & HN_ALLOCATED:
                        self.free_node(src)
        return 0

    cdef int set_tensor_alloc(self, tensor_alloc * ta, int k) except -1:
        """Remember where record k's tensor goes; nothing for views and tensors with data.
        (A tensor in an outside buffer but without data yet was not planned: ggml records
        its zeroed hash_node, buffer 0 at offset 0, and so does this.)"""
        cdef hash_node * hn = &self.recs[k]
        if hn.bits & (HN_VIEW | HN_HAS_DATA):
            ta[0] = TENSOR_ALLOC_NONE
        else:
            ta.buffer_id = hn.buffer_id
            ta.addr = hn.addr
            ta.size_max = hn.size if hn.bits & HN_PLANNED else self.alloc_size(hn.buffer_id,
                                                                               hn.tensor)
        return 0

    cdef int reserve_n_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, bint no_alloc) except -1:
        """Port of ggml_gallocr_reserve_n_impl: plan the graph, record the plan, and
        (unless no_alloc) allocate each buffer whose chunks must grow."""
        cdef int i, j, e, k, c
        cdef int n = graph.n_nodes
        cdef hash_node * hn
        cdef hash_node * src_hn
        cdef node_alloc * na
        cdef bint realloc
        cdef size_t new_size, cur_chunk, new_chunk

        self.not_placing()
        # anything below may raise: until the end, the old plan is not usable
        self.valid = False

        for i in range(self.n_buffers):
            dyn_reset(self.buf_tallocs[i])
        self.index_graph(graph)
        self.alloc_graph_impl(graph, node_buffer_ids, leaf_buffer_ids)

        # record the plan of every node and its sources
        if self.node_allocs_cap < n:
            free(self.node_allocs)
            self.node_allocs = <node_alloc *>calloc(n, sizeof(node_alloc))
            self.node_allocs_cap = 0 if self.node_allocs == NULL else n
            if self.node_allocs == NULL:
                raise AllocationError("cannot allocate the graph allocator node table")
        self.n_nodes = n
        self.n_outside = 0
        for i in range(n):
            k = self.graph_recs[i]
            hn = &self.recs[k]
            na = &self.node_allocs[i]
            self.set_tensor_alloc(&na.dst, k)
            na.flags = hn.bits & _PLACEMENT_FLAGS
            # (layout ids are never reused: an equal id is an equal type, shape and strides)
            na.layout = 0
            if (na.dst.buffer_id >= 0 and self.nbytes_sized[na.dst.buffer_id]
                    and not hn.bits & (HN_VIEW | HN_HAS_DATA)
                    and ggml_nbytes(hn.tensor) <= na.dst.size_max):
                na.layout = hn.tensor.layout
            for j in range(GGML_MAX_SRC):
                na.src[j] = SRC_NONE
            for e in range(hn.first_src, hn.first_src + hn.n_src):
                k = self.src_refs[e].rec
                src_hn = &self.recs[k]
                if src_hn.pos >= 0:
                    na.src[self.src_refs[e].slot] = src_hn.pos
                elif not src_hn.bits & (HN_VIEW | HN_HAS_DATA):
                    if self.n_outside == self.outside_cap:
                        safe_realloc(<void **>&self.outside_allocs, 2 * self.outside_cap + 16,
                                     sizeof(tensor_alloc), "the graph allocator's plan")
                        self.outside_cap = 2 * self.outside_cap + 16
                    self.set_tensor_alloc(&self.outside_allocs[self.n_outside], k)
                    na.src[self.src_refs[e].slot] = SRC_OUTSIDE - self.n_outside
                    self.n_outside += 1
        if self.leaf_allocs_cap < graph.n_leafs:
            free(self.leaf_allocs)
            self.leaf_allocs = <tensor_alloc *>calloc(graph.n_leafs, sizeof(tensor_alloc))
            self.leaf_allocs_cap = 0 if self.leaf_allocs == NULL else graph.n_leafs
            if self.leaf_allocs == NULL:
                raise AllocationError("cannot allocate the graph allocator leaf table")
        self.n_leafs = graph.n_leafs
        for i in range(graph.n_leafs):
            self.set_tensor_alloc(&self.leaf_allocs[i], self.graph_recs[n + i])

        # (re)allocate the buffers whose chunks grew
        for i in range(self.n_buffers):
            # the same buffer type used again shares the buffer
            for j in range(i):
                if self.buf_tallocs[j] == self.buf_tallocs[i]:
                    self.buffers[i] = self.buffers[j]
                    self.sync_chunks(i)
                    break
            # even an empty buffer is allocated (a VBuffer without chunks), since
            # views are initialised from it
            vb = self.buffers[i]
            realloc = vb is None
            new_size = 0
            for c in range(self.buf_tallocs[i].n_chunks):
                cur_chunk = 0 if vb is None else (<VBuffer>vb).chunk_size(c)
                new_chunk = dyn_max_size(self.buf_tallocs[i], c)
                new_size += new_chunk
                if new_chunk > cur_chunk:
                    realloc = True
            if realloc:
                if vb is not None:
                    self.unplace()              # nothing may point into it any more
                    (<VBuffer>vb).release()     # ggml_vbuffer_free
                self.buffers[i] = None
                self.sync_chunks(i)
                if not no_alloc:
                    if not self.vbuffer_alloc(i):
                        return 0
        # a dry run's plan has no buffers behind it (ggml would place tensors in
        # missing chunks): the next alloc_graph plans again
        self.valid = not no_alloc
        return 1

    cdef int vbuffer_alloc(self, int i) except -1:
        """Port of ggml_vbuffer_alloc for buffer id i: one Buffer per planned chunk,
        through the buffer type's alloc_buffer. On failure the buffer stays None,
        last_error says why, and 0 is returned (ggml logs and returns false)."""
        cdef BufferType bt = self.bufts[i]
        cdef dyn_tallocr * talloc = self.buf_tallocs[i]
        cdef VBuffer vb = VBuffer()
        cdef int n
        cdef size_t size, total = 0
        cdef Buffer b
        for n in range(talloc.n_chunks):
            total += talloc.chunks[n].max_size
        for n in range(talloc.n_chunks):
            size = talloc.chunks[n].max_size
            if size == 0:
                b = _zero_size_buffer(bt)
            else:
                try:
                    got = bt.alloc_buffer(size)
                except Exception as e:
                    self.last_error = (f"failed to allocate {bt.name} buffer of size {total} "
                                       f"(chunk {n}: {size} bytes): {e}")
                    self.last_error_id = i
                    self.last_cause = e        # an RPCError keeps its type and endpoint
                    return 0
                if not isinstance(got, Buffer) or (<Buffer>got).c.size < size:
                    what = ("nothing" if got is None else
                            f"{(<Buffer>got).c.size} bytes" if isinstance(got, Buffer) else
                            type(got).__name__)
                    self.last_error = (f"failed to allocate {bt.name} buffer of size {total} "
                                       f"(chunk {n}: {size} bytes): alloc_buffer returned {what}")
                    self.last_error_id = i
                    return 0
                b = got
            b.c.usage = GGML_BACKEND_BUFFER_USAGE_COMPUTE
            b.c.allocator = <void *>self
            vb.chunks[n] = &b.c
            vb.owners.append(b)
        self.buffers[i] = vb
        self.sync_chunks(i)
        return 1

    # --- using a plan (ggml_gallocr_alloc_graph and its helpers) ---------------

    cdef int grow_pending(self, int need) except -1:
        safe_realloc(<void **>&self.pending, 2 * need + 64, sizeof(pending_init),
                     "the graph allocator's placement list")
        self.pending_cap = 2 * need + 64
        return 0

    cdef int list_inits(self, ggml_cgraph * graph, bint check) except -2:
        """The init_tensor calls of ggml_gallocr_alloc_graph's node loop, in its order, into
        `pending`, less those known to do nothing (a source placed at its own graph
        position before, a tensor with data, an initialised view); their number. With
        `check`, ggml_gallocr_needs_realloc on the way: -1 where the recorded plan does not
        fit `graph` (other node or leaf counts, or a node / source / leaf that grew or lost
        its data). One sweep reads each node once for both.

        ggml checks nodes and their sources only. A leaf that had data when the graph
        was planned and has none now (a parallel scheduler's copy slots of a placed
        graph input rotate between the input itself and fresh copies) then gets no
        place, and ggml's release build writes through buffers[-1]; checking leafs too
        makes it a reallocation instead."""
        cdef int i, j, src, n = graph.n_nodes, k = 0
        cdef uint32_t m
        cdef ggml_tensor * node
        cdef ggml_tensor * t
        cdef const node_alloc * na
        cdef const tensor_alloc * ta
        if check and (not self.valid or self.n_nodes != n or self.n_leafs != graph.n_leafs):
            # (not valid: a failed or interrupted reserve; ggml would go on with a broken plan)
            return -1
        if self.pending_cap < 2 * n:            # a node and a source each; more grow it
            self.grow_pending(2 * n)
        for i in range(n):
            if i + PREFETCH_AHEAD < n:
                _prefetch_tensor(graph.nodes[i + PREFETCH_AHEAD])
            node = graph.nodes[i]
            na = &self.node_allocs[i]
            if check and (not (node.layout == na.layout != 0 or _fits(self, node, &na.dst))
                          or (node.flags & _PLACEMENT_FLAGS) != na.flags):
                # (an input or output flag changed since the plan: the plan may overwrite
                # an output, or an input before it is read; ggml reuses such a plan)
                return -1
            if k + GGML_MAX_SRC + 1 > self.pending_cap:
                self.grow_pending(k + GGML_MAX_SRC + 1)
            m = source_mask(node)
            while m:
                j = lowest_bit(m)
                m &= m - 1
                t = node.src[j]
                src = na.src[j]
                if src >= 0 and graph_tensor(graph, src) == t:
                    # at the graph position whose plan it shares: checked there, and
                    # placed there when that comes first
                    if src < i or src >= n:
                        continue
                    ta = &self.node_allocs[src].dst
                else:
                    ta = self.src_alloc(src)
                    if check and not _fits(self, t, ta):
                        return -1
                if _may_init(t):
                    self.pending[k] = pending_init(t, ta)
                    k += 1
            if _may_init(node):
                self.pending[k] = pending_init(node, &na.dst)
                k += 1
        if check:
            for i in range(graph.n_leafs):
                if not _fits(self, graph.leafs[i], &self.leaf_allocs[i]):
                    return -1
        return k

    cdef const tensor_alloc * src_alloc(self, int src) noexcept:
        """The plan of a source: node_alloc.src's reference resolved."""
        if src >= self.n_nodes:
            return &self.leaf_allocs[src - self.n_nodes]
        if src >= 0:
            return &self.node_allocs[src].dst
        if src == SRC_NONE:
            return &TENSOR_ALLOC_NONE
        return &self.outside_allocs[SRC_OUTSIDE - src]

    cdef int init_tensor(self, ggml_tensor * tensor, const tensor_alloc * ta) except -1:
        """Port of ggml_gallocr_init_tensor: point a tensor at its planned memory. (Its
        planned extent, size_max, bounds the placement: the tensor fits in it.)"""
        cdef ggml_backend_buffer * chunk
        if tensor.view_src != NULL:
            # (a view the user initialised in a buffer released since is initialised again)
            if tensor.buffer == NULL or tensor.buffer.released:
                if tensor.view_src.buffer == NULL:
                    return 0            # allocated without ggml-backend: leave it
                tensor.buffer = NULL
                view_init_c(tensor)
                if tensor.buffer.allocator == <void *>self:
                    record_placed(self, tensor)
        elif tensor.data == NULL:
            if ta.buffer_id < 0 or ta.addr.chunk < 0:
                raise AllocationError(f"tensor '{tensor_name(tensor)}' has no planned place "
                                      f"(it had data when the graph was reserved)")
            chunk = self.c_chunks[ta.buffer_id * GGML_VBUFFER_MAX_CHUNKS + ta.addr.chunk]
            if chunk == NULL:
                raise AllocationError(f"tensor '{tensor_name(tensor)}': chunk {ta.addr.chunk} of the "
                                      f"{_buft_name(self.c_bufts[ta.buffer_id])} buffer is "
                                      f"not allocated")
            tensor_alloc_at(chunk, tensor, chunk.base + ta.addr.offset, ta.size_max)
            record_placed(self, tensor)
        return 0

    # --- the scheduler's entry points ------------------------------------------

    cdef int c_reserve_n(self, ggml_cgraph * graph, const int * node_buffer_ids,
                       const int * leaf_buffer_ids) except -1:
        """ggml_gallocr_reserve_n: plan and allocate; 1 ok, 0 a buffer failed (see last_error)."""
        self.last_error = None
        self.last_error_id = -1
        self.last_cause = None
        return self.reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, False)

    cdef int c_reserve_n_size(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, size_t * sizes) except -1:
        """ggml_gallocr_reserve_n_size: plan only; sizes[i] = planned size of buffer id i
        (ids sharing a buffer type each report the shared size, as ggml)."""
        cdef int i, c
        self.reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, True)
        for i in range(self.n_buffers):
            sizes[i] = 0
            for c in range(self.buf_tallocs[i].n_chunks):
                sizes[i] += self.buf_tallocs[i].chunks[c].max_size
        return 1

    cdef int c_alloc_graph(self, ggml_cgraph * graph, object owner, bint fits=False) except -1:
        """ggml_gallocr_alloc_graph: place the graph's tensors by the recorded plan.
        A plan that no longer fits is redone automatically with a single buffer;
        with several, 0 is returned and the caller must reserve again. `owner` keeps
        the tensors alive until they are unplaced (the graph). `fits`: the caller knows
        that the graph fits (the one just reserved, or equal to one placed by this plan),
        and the check is skipped."""
        cdef int i, n_pending
        cdef uint64_t stamp
        self.not_placing()
        # the last graph's placements first: a tensor of both is placed anew
        self.unplace()
        n_pending = self.list_inits(graph, not fits)
        if n_pending < 0:
            if self.n_buffers > 1 or not self.c_reserve_n(graph, NULL, NULL):
                return 0
            n_pending = self.list_inits(graph, False)
        for i in range(self.n_buffers * GGML_VBUFFER_MAX_CHUNKS):
            buffer_reset(self.c_chunks[i])          # ggml_backend_buffer_reset
        self.placed_owner = owner
        while self.placed_cap < graph.n_leafs + n_pending:
            self.grow_placed()
        stamp = new_epoch()
        self.placing = True
        try:
            for i in range(graph.n_leafs):
                if i + PREFETCH_AHEAD < graph.n_leafs:
                    prefetch_placement(graph.leafs[i + PREFETCH_AHEAD])
                _place(self, graph.leafs[i], &self.leaf_allocs[i], stamp)
            for i in range(n_pending):
                if i + PREFETCH_AHEAD < n_pending:
                    prefetch_placement(self.pending[i + PREFETCH_AHEAD].tensor)
                _place(self, self.pending[i].tensor, self.pending[i].ta, stamp)
        finally:
            self.placing = False
        return 1

    cdef int c_record_places(self, ggml_cgraph * graph, recorded_place * out) except -2:
        """What the last c_alloc_graph of `graph` left in its leafs and nodes: out[k] (room
        for n_leafs + n_nodes) for each one placed in this allocator's buffers or a view
        initialised in any buffer. Returns their number, or -1 where they are not all
        that alloc_graph placed (a placed tensor that is no leaf or node of the graph)."""
        cdef int i, n = 0, n_own = 0
        cdef ggml_tensor * t
        for i in range(-graph.n_leafs, graph.n_nodes):
            t = graph.nodes[i] if i >= 0 else graph.leafs[~i]
            if t.buffer == NULL or not (t.view_src != NULL or placed_here(self, t)):
                continue
            out[n].index = i
            out[n].own = placed_here(self, t)
            out[n].init = (out[n].own and t.view_src == NULL and t.buffer.pyobj != NULL
                           and (<Buffer>t.buffer.pyobj)._has_init_tensor)
            out[n].buffer = t.buffer
            out[n].data = t.data
            n_own += out[n].own
            n += 1
        return n if n_own == self.n_placed else -1

    cdef int c_replay_places(self, ggml_cgraph * graph, const recorded_place * places, int n,
                             object owner) except -1:
        """c_alloc_graph of a graph equal to the one c_record_places described (the same
        plan, unplaced tensors where it had them, the same memory elsewhere), by writing
        the recorded places: the placements it would make, without walking the plan.
        (The caller checked that the chunks are the ones recorded.)"""
        cdef int k
        cdef ggml_tensor * t
        cdef ggml_backend_buffer * b
        cdef uint64_t stamp
        self.not_placing()
        self.unplace()
        for k in range(self.n_buffers * GGML_VBUFFER_MAX_CHUNKS):
            buffer_reset(self.c_chunks[k])          # ggml_backend_buffer_reset
        self.placed_owner = owner
        while self.placed_cap < n:
            self.grow_placed()
        stamp = new_epoch()
        self.placing = True         # (the init_tensor slots may call back: not_placing)
        try:
            for k in range(n):
                if k + PREFETCH_AHEAD < n:
                    prefetch_placement(_recorded_tensor(graph, &places[k + PREFETCH_AHEAD]))
                t = _recorded_tensor(graph, &places[k])
                b = places[k].buffer
                t.buffer = b
                t.data = places[k].data
                t.gen = stamp
                if places[k].own:
                    self.placed[self.n_placed] = t
                    self.n_placed += 1
                    if places[k].init:
                        (<Buffer>b.pyobj).init_tensor(tensor_handle(t))
        finally:
            self.placing = False
        return 1

    cdef size_t c_buffer_size(self, int buffer_id) except? 0:
        """ggml_gallocr_get_buffer_size: 0 when unallocated or shared with an earlier id."""
        vb = self.buffers[buffer_id]
        if vb is None:
            return 0
        for i in range(buffer_id):
            if self.buffers[i] is vb:
                return 0
        return (<VBuffer>vb).total_size()

    # --- Python interface ------------------------------------------------------

    @property
    def buffer_types(self):
        return list(self.bufts)

    def _ids(self, ids, int n, what):
        """A list of buffer ids -> an array.array holding a C int array (None -> all 0).
        Ids outside 0..n_buffers-1 are refused when a tensor needs one."""
        import array
        if ids is None:
            return None
        try:
            arr = array.array("i", ids)
        except (OverflowError, TypeError, ValueError) as e:
            raise ArgumentError(f"{what} must be a list of buffer ids: {e}") from None
        if len(arr) != n:
            raise ArgumentError(f"{what}: {len(arr)} buffer ids for {n} tensors")
        return arr

    cdef int _id(self, buffer_id) except -1:
        return index_arg(buffer_id, "buffer id", self.n_buffers)

    def reserve(self, Graph graph not None):
        """ggml_gallocr_reserve: every tensor in buffer id 0. Raises AllocationError
        when a buffer cannot be allocated (the allocator stays usable)."""
        return self.reserve_n(graph, None, None)

    def reserve_n(self, Graph graph not None, node_ids=None, leaf_ids=None):
        """ggml_gallocr_reserve_n: plan `graph` with a buffer id per node and per leaf
        (None: all 0) and allocate the buffers that must grow. True, or AllocationError."""
        cdef int zero = 0
        ggml_graph_check_order(&graph.graph)
        n = self._ids(node_ids, graph.graph.n_nodes, "node_ids")
        l = self._ids(leaf_ids, graph.graph.n_leafs, "leaf_ids")
        if not self.c_reserve_n(&graph.graph, _ids_ptr(n, &zero), _ids_ptr(l, &zero)):
            raise AllocationError(self.last_error) from self.last_cause
        return True

    def reserve_n_size(self, Graph graph not None, node_ids=None, leaf_ids=None):
        """ggml_gallocr_reserve_n_size: plan only, return the size per buffer id."""
        cdef int zero = 0
        ggml_graph_check_order(&graph.graph)
        n = self._ids(node_ids, graph.graph.n_nodes, "node_ids")
        l = self._ids(leaf_ids, graph.graph.n_leafs, "leaf_ids")
        cdef size_t * sizes = <size_t *>calloc(self.n_buffers, sizeof(size_t))
        if sizes == NULL:
            raise AllocationError("cannot allocate the size table")
        try:
            self.c_reserve_n_size(&graph.graph, _ids_ptr(n, &zero), _ids_ptr(l, &zero), sizes)
            return [sizes[i] for i in range(self.n_buffers)]
        finally:
            free(sizes)

    def alloc_graph(self, Graph graph not None):
        """ggml_gallocr_alloc_graph: True when placed, False when the graph changed and
        several buffer ids are in use (reserve_n first). Raises AllocationError when an
        automatic re-reserve cannot allocate its buffer."""
        self.last_error = None
        self.last_error_id = -1
        self.last_cause = None
        ggml_graph_check_order(&graph.graph)
        if self.c_alloc_graph(&graph.graph, graph):
            return True
        if self.last_error is not None:
            raise AllocationError(self.last_error) from self.last_cause
        return False

    def get_buffer_size(self, buffer_id):
        """ggml_gallocr_get_buffer_size: 0 when not allocated or shared with an earlier id."""
        return self.c_buffer_size(self._id(buffer_id))

    def chunk_sizes(self, buffer_id):
        """Sizes of buffer id's chunk buffers; [] where get_buffer_size is 0 (no buffer,
        a buffer shared with an earlier id, or nothing allocated)."""
        cdef int i = self._id(buffer_id)
        if self.c_buffer_size(i) == 0:
            return []
        cdef VBuffer vb = self.buffers[i]
        out = []
        for c in range(GGML_VBUFFER_MAX_CHUNKS):
            if vb.chunks[c] == NULL:
                break
            out.append(vb.chunks[c].size)
        return out

    def buffer(self, buffer_id):
        """The VBuffer of buffer id (None before a reserve)."""
        return self.buffers[self._id(buffer_id)]

    def locations(self, tensors):
        """tensor_location of each tensor, as lists (the plan file's alloc entries)."""
        return [list(self.tensor_location(t)) for t in items_arg(tensors, "tensors", Tensor)]

    def tensor_location(self, Tensor tensor not None):
        """(buffer type name, offset from the buffer's base, chunk index) of a tensor's
        data, as in the `alloc` block of a plan file: chunk is None when the buffer is
        not one of this allocator's chunks, offset None when the tensor has no data,
        buffer type None when it has no buffer."""
        return tuple(tensor_location_list(self, tensor.ptr))

    def __repr__(self):
        names = ", ".join(b.name for b in self.bufts)
        return f"GraphAllocator([{names}])"


cdef list tensor_location_list(GraphAllocator ga, const ggml_tensor * t):
    """GraphAllocator.tensor_location of a tensor struct, as the list that a plan file's
    alloc block writes for every tensor of the graph copy (read in one call)."""
    cdef ggml_backend_buffer * b = t.buffer
    cdef int i, c
    if b == NULL:
        return [None, None, None]
    offset = None if t.data == NULL else <size_t>(t.data - b.base)
    chunk = None
    for i in range(ga.n_buffers):
        for c in range(GGML_VBUFFER_MAX_CHUNKS):
            if ga.c_chunks[i * GGML_VBUFFER_MAX_CHUNKS + c] == b:
                chunk = c
                break
        if chunk is not None:
            break
    return [_buft_name(b.buft), offset, chunk]


cdef inline void _prefetch_tensor(const ggml_tensor * t) noexcept nogil:
    """Ask for the part of a tensor struct planning reads: the first line (flags, sources,
    view source, data and buffer, type), shape and strides."""
    prefetch(t)
    prefetch(&t.ne[0])
    prefetch(&t.nb[GGML_MAX_DIMS - 1])


cdef inline bint _same_layout(const ggml_tensor * a, const ggml_tensor * b) noexcept nogil:
    """ggml_are_same_layout: same type, shape and strides."""
    cdef int i
    if a.type != b.type:
        return False
    for i in range(GGML_MAX_DIMS):
        if a.ne[i] != b.ne[i] or a.nb[i] != b.nb[i]:
            return False
    return True


cdef inline bint _may_init(const ggml_tensor * t) noexcept nogil:
    """Could init_tensor point t at memory: a view not initialised (or in a released
    buffer), a tensor without data? (Only its own placement changes that.)"""
    if t.view_src != NULL:
        return t.buffer == NULL or t.buffer.released
    return t.data == NULL
