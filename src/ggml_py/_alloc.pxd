# Graph allocator: port of ggml-alloc.c (ggml 0.10.1). See _alloc.pyx.
#
# The scheduler cimports GraphAllocator and calls its cdef methods with its
# graph copy and the per-node / per-leaf backend ids, exactly where ggml's
# scheduler calls ggml_gallocr_reserve_n / _reserve_n_size / _alloc_graph.

from libc.stdint cimport int32_t

from ggml_py._ggml cimport *
from ggml_py._backend cimport BufferType, Buffer

cdef enum:
    GGML_VBUFFER_MAX_CHUNKS = 16    # chunks of one compute buffer
    MAX_FREE_BLOCKS = 256           # free blocks per chunk

# where a tensor lives inside a chunked compute buffer (ggml: struct buffer_address)
cdef struct buffer_address:
    int chunk
    size_t offset

cdef struct free_block:
    size_t offset
    size_t size

# one chunk of a dynamic allocator: its free list (sorted by offset) and its high-water mark
cdef struct tallocr_chunk:
    free_block free_blocks[MAX_FREE_BLOCKS]
    int n_free_blocks
    size_t max_size

# port of struct ggml_dyn_tallocr: offsets only, no memory
cdef struct dyn_tallocr:
    size_t alignment
    size_t max_chunk_size
    tallocr_chunk * chunks[GGML_VBUFFER_MAX_CHUNKS]
    int n_chunks

# per-tensor state while a graph is planned (ggml: struct hash_node)
cdef struct hash_node:
    int n_children
    int n_views
    int buffer_id
    buffer_address addr
    bint allocated

# where a planned tensor goes, remembered for alloc_graph (ggml: struct tensor_alloc)
cdef struct tensor_alloc:
    int buffer_id
    buffer_address addr
    size_t size_max             # 0 = pre-allocated, unused, or view

cdef struct node_alloc:
    tensor_alloc dst
    tensor_alloc src[GGML_MAX_SRC]
    int32_t flags               # the node's INPUT/OUTPUT flags when planned (not in ggml)

# where alloc_graph left one tensor of a graph: graph.nodes[index] (index >= 0) or
# graph.leafs[~index], pointed at data in buffer (the scheduler's graph reuse replays these)
cdef struct recorded_place:
    int index
    bint own                    # in this allocator's buffers (else a view of other memory)
    bint init                   # placed by address in a buffer whose init_tensor slot runs
    ggml_backend_buffer * buffer
    char * data

cdef bint ggml_op_can_inplace(int op) noexcept nogil


cdef class TensorAllocator:
    """Port of ggml_tallocr: a linear allocator into one buffer (weights)."""
    cdef readonly Buffer buffer
    cdef char * base
    cdef size_t alignment
    cdef readonly size_t offset


cdef class VBuffer:
    """Port of struct vbuffer: a compute buffer made of up to 16 chunk buffers."""
    cdef ggml_backend_buffer * chunks[GGML_VBUFFER_MAX_CHUNKS]
    cdef list owners                    # the Buffer objects behind chunks[]
    cdef size_t chunk_size(self, int chunk) noexcept
    cdef size_t total_size(self) noexcept


cdef class GraphAllocator:
    """Port of ggml_gallocr."""
    cdef int n_buffers
    cdef list bufts                     # BufferType per buffer id (may repeat)
    cdef ggml_backend_buffer_type ** c_bufts
    cdef bint * nbytes_sized            # per id: get_alloc_size is ggml_nbytes (no Python call)
    cdef dyn_tallocr ** buf_tallocs     # shared between ids of the same buffer type
    cdef list buffers                   # VBuffer or None per id (shared like buf_tallocs)
    cdef ggml_backend_buffer ** c_chunks  # [n_buffers * 16] mirror of buffers' chunks

    cdef ggml_hash_set hash_set
    cdef hash_node * hash_values        # [hash_set.size]

    cdef node_alloc * node_allocs
    cdef int n_nodes
    cdef int node_allocs_cap
    cdef tensor_alloc * leaf_allocs     # ggml: struct leaf_alloc { tensor_alloc leaf; }
    cdef int n_leafs
    cdef int leaf_allocs_cap
    cdef bint valid                     # False after a failed or interrupted reserve
    cdef ggml_tensor ** placed          # what the last alloc_graph pointed into the buffers
    cdef int n_placed
    cdef int placed_cap
    cdef object placed_owner            # keeps the placed tensors alive (their graph)
    cdef readonly object last_error     # message of the last failed buffer allocation
    cdef readonly int last_error_id     # ... and the buffer id it was for (-1: none)

    # the scheduler's entry points (1 = ok, 0 = failed, like ggml's bool results)
    cdef int c_reserve_n(self, ggml_cgraph * graph, const int * node_buffer_ids,
                       const int * leaf_buffer_ids) except -1
    cdef int c_reserve_n_size(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, size_t * sizes) except -1
    cdef int c_alloc_graph(self, ggml_cgraph * graph, object owner, bint fits=*) except -1
    cdef size_t c_buffer_size(self, int buffer_id) except? 0
    cdef int c_record_places(self, ggml_cgraph * graph, recorded_place * out) except -1
    cdef int c_replay_places(self, ggml_cgraph * graph, const recorded_place * places, int n,
                             object owner) except -1

    # internals
    cdef int grow_placed(self) except -1
    cdef int unplace(self) except -1
    cdef int _id(self, buffer_id) except -1
    cdef size_t alloc_size(self, int buffer_id, ggml_tensor * t) except? 0
    cdef hash_node * hash_get(self, ggml_tensor * t) except NULL
    cdef bint is_own(self, ggml_tensor * t) except -1
    cdef bint is_allocated(self, ggml_tensor * t) except -1
    cdef bint tensor_alloc_fits(self, ggml_tensor * t, tensor_alloc * ta) except -1
    cdef int allocate_node(self, ggml_tensor * node, int buffer_id, bint is_leaf) except -1
    cdef int free_node(self, ggml_tensor * node) except -1
    cdef int free_extra_space(self, ggml_tensor * node, ggml_tensor * parent) except -1
    cdef int alloc_graph_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                              const int * leaf_buffer_ids) except -1
    cdef int reserve_n_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, bint no_alloc) except -1
    cdef int set_tensor_alloc(self, tensor_alloc * ta, ggml_tensor * t) except -1
    cdef bint needs_realloc(self, ggml_cgraph * graph) except -1
    cdef int init_tensor(self, ggml_tensor * tensor, tensor_alloc * ta) except -1
    cdef int vbuffer_alloc(self, int i) except -1
    cdef void sync_chunks(self, int i)
