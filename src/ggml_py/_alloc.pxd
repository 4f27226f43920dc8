# Graph allocator: port of ggml-alloc.c (ggml 0.10.1). See _alloc.pyx.
#
# The scheduler cimports GraphAllocator and calls its cdef methods with its
# graph copy and the per-node / per-leaf backend ids, exactly where ggml's
# scheduler calls ggml_gallocr_reserve_n / _reserve_n_size / _alloc_graph.

cimport cython
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

# hash_node.bits: what planning reads of a tensor, and its state
cdef enum:
    HN_INPUT = GGML_TENSOR_FLAG_INPUT       # the tensor's own flag values
    HN_OUTPUT = GGML_TENSOR_FLAG_OUTPUT
    HN_VIEW = 1 << 4            # has a view_src: takes its memory, is never planned
    HN_VIEW_USE = 1 << 5        # ... and is not the scheduler's op NONE dependency view
    HN_INPLACE = 1 << 6         # its op may run in a parent's memory
    HN_HAS_MEMORY = 1 << 7      # data or a buffer from outside (not placed by this allocator)
    HN_HAS_DATA = 1 << 8        # data from outside
    HN_ALLOCATED = 1 << 9       # planned here and not freed yet (ggml: hash_node.allocated)
    HN_PLANNED = 1 << 10        # has an address and size from this plan

# per-tensor state while a graph is planned (ggml: struct hash_node, found by a hash
# of the tensor's address). Here one sweep over the graph gives every tensor it reaches
# a dense record, with what planning reads of the tensor struct (flags, sources, view
# source) copied in, so that the planning passes touch compact, contiguous data only.
cdef struct hash_node:
    ggml_tensor * tensor
    size_t nbytes               # ggml_nbytes, for a tensor that may be planned
    size_t size                 # alloc size in buffer_id's type (once PLANNED)
    buffer_address addr
    int buffer_id
    int n_children
    int n_views
    int view_src                # record of tensor.view_src, -1 for none
    int first_src               # its sources: src_refs[first_src : first_src + n_src]
    int n_src
    int pos                     # the tensor's graph position (node i, n_nodes + leaf i), or -1
    unsigned int bits           # HN_* facts and state

# a source of a record: the source's record and its slot in tensor.src
cdef struct src_ref:
    int rec
    int slot

# where a planned tensor goes, remembered for alloc_graph (ggml: struct tensor_alloc)
cdef struct tensor_alloc:
    int buffer_id
    buffer_address addr
    size_t size_max             # 0 = pre-allocated, unused, or view

# the plan of a node (ggml: struct node_alloc). ggml keeps a tensor_alloc per source slot;
# a source's plan is the plan of the graph position it has (a node before, or a leaf), so
# here a slot names that position, and checks and placements done there are not redone
cdef struct node_alloc:
    tensor_alloc dst
    int32_t flags               # the node's INPUT/OUTPUT flags when planned (not in ggml)
    int32_t layout              # its layout id when planned, where dst holds ggml_nbytes
                                # of that layout (else 0): an equal id fits, unmeasured
    int32_t src[GGML_MAX_SRC]   # SRC_NONE, a graph position (node i, or n_nodes + leaf i),
                                # or SRC_OUTSIDE - i: outside_allocs[i] (a source outside
                                # the graph)

cdef enum:
    SRC_NONE = -1               # no source, or no plan (a view, data from outside)
    SRC_OUTSIDE = -2

# an init_tensor call of alloc_graph (a tensor it may point at memory, and its plan),
# listed by the pass that checks the plan against the graph and made by the next
cdef struct pending_init:
    ggml_tensor * tensor
    const tensor_alloc * ta

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


@cython.final       # direct calls between its methods: the C compiler inlines the small ones
cdef class GraphAllocator:
    """Port of ggml_gallocr."""
    cdef int n_buffers
    cdef list bufts                     # BufferType per buffer id (may repeat)
    cdef ggml_backend_buffer_type ** c_bufts
    cdef bint * nbytes_sized            # per id: get_alloc_size is ggml_nbytes (no Python call)
    cdef dyn_tallocr ** buf_tallocs     # shared between ids of the same buffer type
    cdef list buffers                   # VBuffer or None per id (shared like buf_tallocs)
    cdef ggml_backend_buffer ** c_chunks  # [n_buffers * 16] mirror of buffers' chunks

    # planning state (see hash_node): records of the tensors the graph reaches, the
    # records of its nodes and leafs (graph_recs[n_nodes + i] for leaf i), their sources
    cdef hash_node * recs
    cdef int n_recs
    cdef int recs_cap
    cdef int * graph_recs
    cdef int graph_recs_cap
    cdef src_ref * src_refs
    cdef int n_src_refs
    cdef int src_refs_cap

    cdef node_alloc * node_allocs
    cdef int n_nodes
    cdef int node_allocs_cap
    cdef tensor_alloc * leaf_allocs     # ggml: struct leaf_alloc { tensor_alloc leaf; }
    cdef int n_leafs
    cdef int leaf_allocs_cap
    cdef tensor_alloc * outside_allocs  # plans of sources outside the graph
    cdef int n_outside
    cdef int outside_cap
    cdef bint valid                     # False after a failed or interrupted reserve
    cdef pending_init * pending         # alloc_graph's init_tensor calls (list_inits)
    cdef int pending_cap
    cdef bint placing                   # alloc_graph or c_replay_places is placing a
                                        # graph (Python slots may run)
    cdef ggml_tensor ** placed          # what the last alloc_graph pointed into the buffers
    cdef int n_placed
    cdef int placed_cap
    cdef object placed_owner            # keeps the placed tensors alive (their graph)
    cdef readonly object last_error     # message of the last failed buffer allocation
    cdef readonly int last_error_id     # ... and the buffer id it was for (-1: none)
    cdef readonly object last_cause     # ... and the exception alloc_buffer raised, if any

    # the scheduler's entry points (1 = ok, 0 = failed, like ggml's bool results)
    cdef int c_reserve_n(self, ggml_cgraph * graph, const int * node_buffer_ids,
                       const int * leaf_buffer_ids) except -1
    cdef int c_reserve_n_size(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, size_t * sizes) except -1
    cdef int c_alloc_graph(self, ggml_cgraph * graph, object owner, bint fits=*) except -1
    cdef size_t c_buffer_size(self, int buffer_id) except? 0
    cdef int c_record_places(self, ggml_cgraph * graph, recorded_place * out) except -2
    cdef int c_replay_places(self, ggml_cgraph * graph, const recorded_place * places, int n,
                             object owner) except -1

    # internals
    cdef int grow_placed(self) except -1
    cdef int not_placing(self) except -1
    cdef int unplace(self) except -1
    cdef int _id(self, buffer_id) except -1
    cdef size_t alloc_size(self, int buffer_id, ggml_tensor * t) except? 0
    cdef size_t rec_alloc_size(self, int buffer_id, const hash_node * hn) except? 0
    cdef int rec_of(self, ggml_tensor * t) except -1
    cdef int index_graph(self, ggml_cgraph * graph) except -1
    cdef int allocate_node(self, int k, int buffer_id, bint is_leaf) except -1
    cdef int free_node(self, int k) except -1
    cdef int free_extra_space(self, int k, int parent) except -1
    cdef int alloc_graph_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                              const int * leaf_buffer_ids) except -1
    cdef int reserve_n_impl(self, ggml_cgraph * graph, const int * node_buffer_ids,
                            const int * leaf_buffer_ids, bint no_alloc) except -1
    cdef int set_tensor_alloc(self, tensor_alloc * ta, int k) except -1
    cdef int list_inits(self, ggml_cgraph * graph, bint check) except -2
    cdef int grow_pending(self, int need) except -1
    cdef const tensor_alloc * src_alloc(self, int src) noexcept
    cdef int init_tensor(self, ggml_tensor * tensor, const tensor_alloc * ta) except -1
    cdef int vbuffer_alloc(self, int i) except -1
    cdef void sync_chunks(self, int i)

cdef list tensor_location_list(GraphAllocator ga, const ggml_tensor * t)
