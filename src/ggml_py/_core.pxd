# Tensor and graph core: type traits, op names, the hash set, the tensor arena
# and the graph. See _core.pyx for details.

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t, UINT64_MAX
from ggml_py._ggml cimport *

cdef enum:
    CTX_BLOCK_SHIFT = 12
    CTX_BLOCK = 1 << CTX_BLOCK_SHIFT    # tensors per arena block (pointers stay stable)
    ARENA_BLOCK_BYTES = 1 << 21         # each block: 2 MiB aligned, a header, the tensors
    ARENA_HEADER_BYTES = 64             # (a cache line: the tensors stay aligned to them)

# The header of an arena block: where its tensors are numbered among all the arena's.
# Live blocks hold distinct numbers, kept small (a freed block's number is reused):
# the hash key of a tensor is its number (ggml_hash).
cdef struct arena_header:
    uint64_t first_key          # the number of the block's first tensor

cdef extern from *:
    """
    #define GGML_PY_MAX_BYTES (((size_t)1) << 62)
    """
    # the largest tensor extent or allocation: sums of a few never wrap size_t
    const size_t GGML_PY_MAX_BYTES

cdef struct ggml_type_traits:
    const char * name
    int64_t blck_size           # 0 = removed/unsupported type
    size_t type_size
    bint is_quantized

cdef int GGML_TYPE_COUNT
cdef int GGML_OP_COUNT
cdef ggml_type_traits TYPE_TRAITS[64]
cdef const char * OP_NAMES[GGML_OP_COUNT_MAX]

# ---- tensor facts (ggml.c) ----
cdef inline size_t ggml_nbytes(const ggml_tensor * t) noexcept nogil:
    # in line: the graph allocator asks it of every node at every alloc_graph
    cdef int i
    cdef size_t nbytes
    cdef int64_t blck = TYPE_TRAITS[t.type].blck_size
    for i in range(GGML_MAX_DIMS):
        if t.ne[i] <= 0:
            return 0
    if blck == 1:
        nbytes = TYPE_TRAITS[t.type].type_size
        for i in range(GGML_MAX_DIMS):
            nbytes += (t.ne[i] - 1) * t.nb[i]
    else:
        nbytes = t.ne[0] * t.nb[0] // blck
        for i in range(1, GGML_MAX_DIMS):
            nbytes += (t.ne[i] - 1) * t.nb[i]
    return nbytes
cdef size_t ggml_row_size(int type, int64_t ne) noexcept nogil
cdef int64_t ggml_nelements(const ggml_tensor * t) noexcept nogil

cdef inline uint64_t ggml_acc_region_end(const ggml_tensor * t) noexcept nogil:
    """One past the last byte of a (t.src[0]) that ACC t adds its b (t.src[1]) to, with
    the strides and offset of its op_params (32-bit words, nb0 a's element size): ggml's
    CPU kernel asserts that it is within a, and aborts. 0 for an empty b; saturates."""
    cdef const ggml_tensor * b = t.src[1]
    cdef uint64_t stride[4]
    cdef uint64_t end
    cdef int i
    if b == NULL or ggml_nelements(b) == 0:
        return 0
    stride[0] = TYPE_TRAITS[t.src[0].type].type_size
    for i in range(3):
        stride[i + 1] = <uint32_t>t.op_params[i]
    end = <uint64_t><uint32_t>t.op_params[3] + stride[0]
    for i in range(GGML_MAX_DIMS):
        if b.ne[i] > 1 and stride[i] != 0:
            if <uint64_t>(b.ne[i] - 1) > (UINT64_MAX - end) // stride[i]:
                return UINT64_MAX
            end += <uint64_t>(b.ne[i] - 1) * stride[i]
    return end
cdef int64_t ggml_nrows(const ggml_tensor * t) noexcept nogil
cdef bint ggml_is_contiguous_n(const ggml_tensor * t, int n) noexcept nogil
cdef bint ggml_is_contiguous(const ggml_tensor * t) noexcept nogil
cdef bint ggml_is_contiguous_1(const ggml_tensor * t) noexcept nogil

# ---- argument checks of the public API (they raise ArgumentError and friends) ----
cpdef size_t size_arg(object value, what) except? 0
cpdef int64_t int_arg(object value, what, object lo, object hi) except? -1
cpdef Py_ssize_t index_arg(object value, what, object n) except? -1
cpdef bytes name_arg(object value, what, bint allow_empty=*)
cpdef object instance_arg(object value, cls, what, bint optional=*)
cpdef list items_arg(object value, what, object of=*, object limit=*)
cdef void * checked_calloc(size_t n, size_t size, what) except NULL
cdef int safe_realloc(void ** p, size_t n, size_t size, what) except -1

cdef inline bint ggml_is_view_op(int op) noexcept nogil:
    # VIEW, RESHAPE, PERMUTE, TRANSPOSE
    return op == OP_RESHAPE or op == OP_VIEW or op == OP_PERMUTE or op == OP_TRANSPOSE

# ---- hash set (port of ggml-impl.h's open addressing set on tensor pointers) ----
cdef size_t ggml_hash_size(size_t min_sz) noexcept nogil
cdef int ggml_hash_set_init(ggml_hash_set * hs, size_t min_sz) except -1
cdef void ggml_hash_set_free(ggml_hash_set * hs) noexcept nogil
cdef void ggml_hash_set_reset(ggml_hash_set * hs) noexcept nogil
cdef dict hash_probe_stats(const ggml_hash_set * hs)

cdef inline size_t ggml_bitset_size(size_t n) noexcept nogil:
    return (n + 31) >> 5

cdef inline bint ggml_bitset_get(const ggml_bitset_t * bs, size_t i) noexcept nogil:
    return (bs[i >> 5] >> (i & 31)) & 1

cdef inline void ggml_bitset_set(ggml_bitset_t * bs, size_t i) noexcept nogil:
    bs[i >> 5] |= (<ggml_bitset_t>1) << (i & 31)

cdef inline size_t ggml_hash(const ggml_tensor * p) noexcept nogil:
    """A tensor's hash key: its number in the arena, read from its block's header
    (ggml's key is the address / 16). The tensors of a graph, made together, have keys
    that follow one another: their home slots do too, and a graph's lookups stream
    through a compact part of the table. (With the address, the arena's blocks, 2 MiB
    aligned and a power of two apart, fell on the same runs of ggml's tables, whose
    primes lie just above powers of two, and every key of a later block met one of an
    earlier block's: issue 36.) Only a tensor of an arena (or NULL) has a key."""
    cdef uintptr_t a = <uintptr_t>p
    cdef uintptr_t block = a & ~(<uintptr_t>ARENA_BLOCK_BYTES - 1)
    if p == NULL:
        return 0
    # (the header is shorter than a tensor: the offset / the tensor size is its index)
    return <size_t>((<const arena_header *>block).first_key + (a - block) // sizeof(ggml_tensor))

cdef extern from "ggml_py/ggml-py-types.h":
    uint64_t ggml_py_mod_magic(uint64_t size) noexcept nogil
    uint64_t ggml_py_mod(uint64_t key, uint64_t magic, uint64_t size) noexcept nogil

cdef inline size_t ggml_hash_home(const ggml_hash_set * hs, const ggml_tensor * key) noexcept nogil:
    """The slot where a lookup of key starts: ggml_hash(key) % hs.size (without dividing)."""
    return ggml_py_mod(ggml_hash(key), hs.size_magic, hs.size)

cdef enum:
    GGML_HASH_DRAWS = 32        # slots drawn at random before a lookup walks slot by slot

cdef inline size_t ggml_hash_draw(const ggml_hash_set * hs, uint64_t key, uint64_t k) noexcept nogil:
    """The k-th slot (1 <= k <= GGML_HASH_DRAWS) a lookup of key tries after its home:
    drawn from key and k (a mix of both), every one independent of the others.

    ggml moves one slot on (linear probing). With keys in runs that clusters: where two
    runs of home slots overlap (blocks of tensors numbered a multiple of the size apart),
    every key of one finds its home taken and one slot on taken too, and the runs merge
    into one that each insertion walks to its end (issue 36: at 100k nodes half the
    table was one run, 15 us a node). So is any fixed step through a table whose keys lie
    in runs. Slots drawn at random scatter the keys that meet (each draw finds a free
    slot as often as the table has them), while keys that do not meet keep their home
    slot and the lookups their order."""
    cdef uint64_t x = (key + k * <uint64_t>0x9E3779B97F4A7C15) * <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 31
    return ggml_py_mod(x >> 1, hs.size_magic, hs.size)

cdef inline size_t ggml_hash_walk_step(const ggml_hash_set * hs, uint64_t key) noexcept nogil:
    """How far a lookup of key steps once its draws are spent: a step coprime to the
    size (every size below 2^31 + 11 is one of ggml's primes), so that the walk reaches
    every slot, drawn from the key so that it crosses runs of keys instead of walking
    them."""
    cdef uint64_t x = (key ^ (key >> 29)) * <uint64_t>0x94D049BB133111EB
    if hs.size > <size_t>2147483659 or hs.size < 3:
        return 1
    return 1 + <size_t>((x ^ (x >> 32)) % (hs.size - 1))

cdef inline size_t ggml_hash_probe(const ggml_hash_set * hs, uint64_t key, uint64_t k,
                                   size_t prev, size_t step) noexcept nogil:
    """The slot a lookup of key reads k-th after its home (k >= 1; prev: the one before,
    step: ggml_hash_walk_step's): GGML_HASH_DRAWS slots drawn at random
    (ggml_hash_draw), then a walk from the last one drawn round the whole table.
    ggml_hash_find, the probe counts and HashSet.probe_slots all follow it."""
    if k <= GGML_HASH_DRAWS:
        return ggml_hash_draw(hs, key, k)
    return prev + step - hs.size if prev + step >= hs.size else prev + step

cdef inline bint _hash_stop(const ggml_hash_set * hs, size_t i, const ggml_tensor * key) noexcept nogil:
    return not ggml_bitset_get(hs.used, i) or hs.keys[i] == key

cdef inline size_t ggml_hash_find(const ggml_hash_set * hs, const ggml_tensor * key) noexcept nogil:
    """Slot of key, or where it would go; GGML_HASHSET_FULL when absent and full: its
    home slot, then the slots of ggml_hash_probe (the walk reaches every slot)."""
    cdef size_t i = ggml_hash_home(hs, key)
    cdef size_t step
    cdef uint64_t k, hk
    if _hash_stop(hs, i, key):
        return i
    hk = ggml_hash(key)
    step = ggml_hash_walk_step(hs, hk)
    for k in range(1, GGML_HASH_DRAWS + 1 + hs.size):
        i = ggml_hash_probe(hs, hk, k, i, step)
        if _hash_stop(hs, i, key):
            return i
    return GGML_HASHSET_FULL

cdef inline bint ggml_hash_contains(const ggml_hash_set * hs, const ggml_tensor * key) noexcept nogil:
    cdef size_t i = ggml_hash_find(hs, key)
    return i != GGML_HASHSET_FULL and ggml_bitset_get(hs.used, i)

cdef inline size_t ggml_hash_insert(ggml_hash_set * hs, ggml_tensor * key) noexcept nogil:
    """Slot of a new key; GGML_HASHSET_ALREADY_EXISTS or GGML_HASHSET_FULL otherwise."""
    cdef size_t i = ggml_hash_find(hs, key)
    if i == GGML_HASHSET_FULL:
        return GGML_HASHSET_FULL
    if ggml_bitset_get(hs.used, i):
        return GGML_HASHSET_ALREADY_EXISTS
    ggml_bitset_set(hs.used, i)
    hs.keys[i] = key
    return i

cdef inline size_t ggml_hash_find_or_insert(ggml_hash_set * hs, ggml_tensor * key) noexcept nogil:
    """Slot of key, inserting it if needed; GGML_HASHSET_FULL when it cannot be added
    (ggml aborts there)."""
    cdef size_t i = ggml_hash_find(hs, key)
    if i == GGML_HASHSET_FULL:
        return GGML_HASHSET_FULL
    if not ggml_bitset_get(hs.used, i):
        ggml_bitset_set(hs.used, i)
        hs.keys[i] = key
    return i

# ---- tensor arena (ggml_context with no_alloc: metadata only) ----
cdef struct ggml_context:
    ggml_tensor ** blocks       # [n_blocks] of CTX_BLOCK tensors each
    int n_blocks
    int n_tensors
    void * pyobj                # the owning Context (borrowed)
    bint no_layout_ids          # its tensors get no layout id (layout_changed): the
                                # scheduler's copies, which graph reuse never compares by id

cdef int ggml_context_init(ggml_context * ctx) except -1
cdef void ggml_context_free(ggml_context * ctx) noexcept nogil
cdef void ggml_context_reset(ggml_context * ctx) noexcept nogil
cdef ggml_tensor * ggml_new_tensor_impl(ggml_context * ctx, int type, int n_dims,
                                        const int64_t * ne, ggml_tensor * view_src,
                                        size_t view_offs) except NULL
cdef ggml_tensor * ggml_dup_tensor_layout(ggml_context * ctx, const ggml_tensor * src) except NULL
cdef ggml_tensor * ggml_view_tensor(ggml_context * ctx, ggml_tensor * src) except NULL
cdef inline ggml_tensor * ggml_context_tensor(ggml_context * ctx, int i) noexcept nogil:
    return &ctx.blocks[i >> CTX_BLOCK_SHIFT][i & (CTX_BLOCK - 1)]
cdef void ggml_set_name(ggml_tensor * t, const char * name) noexcept nogil
cdef void ggml_join_name(ggml_tensor * t, const char * a, const char * b, const char * c,
                         const char * d) noexcept nogil

# ---- a tensor's sources ----
# Most of a tensor's GGML_MAX_SRC source slots are NULL: the hot loops walk the set bits
# of its source mask (kept in the tensor's first cache line). Every write of a source
# slot goes through tensor_set_src, or rescans the slots after writing several
# (scan_sources).
cdef extern from *:
    int lowest_bit "__builtin_ctz" (unsigned int m) noexcept nogil   # m != 0
cdef extern from "ggml_py/ggml-py-types.h":
    uint16_t scan_sources "ggml_py_scan_sources" (const ggml_tensor * t) noexcept nogil
    void tensor_set_src "ggml_py_set_src" (ggml_tensor * t, int j, ggml_tensor * src) noexcept nogil
    ggml_tensor * src_owner "ggml_py_src_owner" (ggml_tensor ** slot, int j) noexcept nogil

cdef inline uint32_t source_mask(const ggml_tensor * t) noexcept nogil:
    return t.src_mask

# ---- passes over tensors that are not in the caches ----
# The sweeps over a graph's tensor structs (scattered in memory) ask for the lines they
# will read a few tensors ahead instead of waiting for each.
cdef extern from *:
    void prefetch "__builtin_prefetch" (const void * p) noexcept nogil

cdef enum:
    # tensors a pass asks for before it reads them: at 42k-106k nodes 32 made the split
    # 6-7% faster than 16 and graph reuse's fingerprint 15-25%; once the split's tables
    # shrank, 48 made it 4-10% faster again than 32 (64 no better; the fingerprint and
    # graphs that fit in the caches the same)
    PREFETCH_AHEAD = 48

cdef inline void prefetch_bytes(const void * p, size_t n) noexcept nogil:
    """Ask for the cache lines of [p, p + n) (n > 0) ahead of reading them."""
    cdef const char * c = <const char *>p
    cdef size_t off = 0
    while off < n:
        prefetch(c + off)
        off += 64
    if (<size_t>c & 63) + n > off:
        prefetch(c + n - 1)

cdef inline void prefetch_placement(const ggml_tensor * t) noexcept nogil:
    """... of what placing or unplacing t writes: buffer and data, and the stamp."""
    prefetch(&t.buffer)
    prefetch(&t.gen)

cdef inline void prefetch_memory(const ggml_tensor * t) noexcept nogil:
    """... of t's buffer struct (the split reads its usage and owner): a second stage,
    once t's first line is in."""
    if t.buffer != NULL:
        prefetch(t.buffer)

cdef inline void prefetch_sources(const ggml_tensor * t, uint32_t sources) noexcept nogil:
    """... of the first line of each of t's sources (sources: its source_mask) and of
    its view source: what the split and the allocator read of them (ggml-py-types.h
    keeps it there)."""
    while sources:
        prefetch(t.src[lowest_bit(sources)])
        sources &= sources - 1
    if t.view_src != NULL:
        prefetch(t.view_src)

cdef inline const ggml_tensor * prefetch_leaf_ahead(const ggml_cgraph * g, int i) noexcept nogil:
    """How a sweep over g's leafs asks ahead at leaf i: for the first line of leaf
    i + PREFETCH_AHEAD, and for the buffer struct of leaf i + PREFETCH_AHEAD / 2 (its line
    in by then). Returns leaf i + PREFETCH_AHEAD (NULL past the end), for the caller's
    own requests."""
    if i + PREFETCH_AHEAD // 2 < g.n_leafs:
        prefetch_memory(g.leafs[i + PREFETCH_AHEAD // 2])
    if i + PREFETCH_AHEAD < g.n_leafs:
        prefetch(g.leafs[i + PREFETCH_AHEAD])
        return g.leafs[i + PREFETCH_AHEAD]
    return NULL

cdef inline const ggml_tensor * prefetch_node_ahead(const ggml_cgraph * g, int i) noexcept nogil:
    """How a sweep over g's nodes asks ahead at node i: for the first line of node
    i + 2 * PREFETCH_AHEAD, and for its sources' when it is node i + PREFETCH_AHEAD (its
    line in by then). Returns node i + PREFETCH_AHEAD (NULL past the end), for the
    caller's own requests."""
    cdef const ggml_tensor * t
    if i + 2 * PREFETCH_AHEAD < g.n_nodes:
        prefetch(g.nodes[i + 2 * PREFETCH_AHEAD])
    if i + PREFETCH_AHEAD < g.n_nodes:
        t = g.nodes[i + PREFETCH_AHEAD]
        prefetch_sources(t, source_mask(t))
        return t
    return NULL

# ---- graph ----

cdef inline ggml_tensor * graph_tensor(const ggml_cgraph * g, int pos) noexcept nogil:
    """The tensor at a position of g's tensors in [nodes, leafs] order: node pos, or leaf
    pos - n_nodes."""
    return g.nodes[pos] if pos < g.n_nodes else g.leafs[pos - g.n_nodes]

cdef inline bint ggml_is_node_from(const ggml_cgraph * g, const ggml_tensor * t, int i) noexcept nogil:
    """Is t a node of g at position i or later? t.order says where the last pass over
    g put it; it is trusted only where g.nodes[t.order] is t."""
    cdef int p = t.order
    return i <= p < g.n_nodes and g.nodes[p] == t

# The order rules (ggml runs and allocates nodes in order, so a graph that breaks them
# would compute garbage): a node comes after every node it reads, and after the base a
# computing node writes into; a tensor that is not a node (a leaf) may not show the
# memory of a node the graph computes. op NONE nodes (the scheduler's dependency
# views) read nothing. The orders of g's nodes must be set.

cdef inline bint ggml_computes(const ggml_tensor * t) noexcept nogil:
    """Does a graph run a kernel for t? (View ops and NONE only name memory.)"""
    return t.op != OP_NONE and not ggml_is_view_op(t.op)

cdef inline bint ggml_is_computed_from(const ggml_cgraph * g, const ggml_tensor * t,
                                       int i) noexcept nogil:
    """Does g compute t at position i or later?"""
    return ggml_computes(t) and ggml_is_node_from(g, t, i)

cdef inline bint ggml_views_computed_node(const ggml_cgraph * g,
                                          const ggml_tensor * t) noexcept nogil:
    """Is t (not a node of g) a view of memory g computes?"""
    return (t.view_src != NULL and not ggml_is_node_from(g, t, 0)
            and ggml_is_computed_from(g, t.view_src, 0))

cdef int ggml_graph_check_order(ggml_cgraph * g) except -1
cdef str order_message(const ggml_tensor * node, int i, const ggml_tensor * src)
cdef str leaf_view_message(const ggml_tensor * t)
cdef int ggml_graph_init(ggml_cgraph * g, int size) except -1
cdef void ggml_graph_free(ggml_cgraph * g) noexcept nogil
cdef void ggml_graph_clear(ggml_cgraph * g) noexcept nogil
cdef int ggml_build_forward_expand(ggml_cgraph * g, ggml_tensor * t) except -1

# ---- mutation epochs (graph reuse) ----
# One process-wide counter, advanced by every change a plan may depend on that is made
# through the API: a tensor's op, type, shape, strides, sources, view, flags,
# op_params or placement stamp the tensor (t.gen), a buffer released or re-purposed
# stamps the buffer (b.gen), a graph's nodes stamp the graph, and a backend's op or
# buffer-type tables stamp the world. A plan made at epoch E is current while no
# tensor of its graph (nor their view bases and buffers), the graph and the world
# carry a stamp above E.
cdef uint64_t mutation_epoch() noexcept nogil
cdef enum:
    LAYOUT_BYTES = 128      # ne, nb and op_params lie side by side in ggml_tensor
cdef int layout_changed(ggml_tensor * t) except -1
cdef uint64_t world_epoch() noexcept nogil
cdef uint64_t buffers_epoch() noexcept nogil      # the last stamp of any buffer (b.gen)
cdef void tensor_changed(ggml_tensor * t) noexcept nogil
cdef uint64_t new_epoch() noexcept nogil    # one stamp for tensors changed together
cdef void world_changed() noexcept nogil
cdef void buffer_changed(ggml_backend_buffer * b) noexcept nogil
cdef uint64_t graph_changed() noexcept nogil

# ---- Python handles ----
cdef class Context:
    cdef ggml_context ctx
    cdef readonly str label
    """The label it was made with (its repr shows it)."""
    cdef dict _refs                     # id -> buffer its tensors point into (kept alive)
    cdef Tensor wrap(self, ggml_tensor * t)

cdef class Tensor:
    cdef ggml_tensor * ptr
    cdef readonly object owner          # keeps the arena that holds ptr alive
    """The Context whose arena holds the tensor (the same as context)."""

cdef class Graph:
    cdef ggml_cgraph graph
    cdef readonly Context context       # where its tensors live (may be None)
    """The Context the graph was made for (None: none given)."""
    cdef set _owners                    # contexts of tensors added from elsewhere
    cdef readonly uint64_t generation   # mutation epoch of its last change (graph_changed)
    """Mutation epoch of the graph's last change (graph reuse compares it)."""
    cdef object __weakref__

cdef Tensor tensor_handle(ggml_tensor * t)
cdef ggml_tensor * tensor_ptr(object t, what=*) except NULL
cdef str tensor_name(const ggml_tensor * t)
cdef bint graph_unchanged_since(Graph g, uint64_t epoch) noexcept
cdef bint nodes_unchanged_since(ggml_tensor ** nodes, int n, uint64_t epoch) noexcept nogil
