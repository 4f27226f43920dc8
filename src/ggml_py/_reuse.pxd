# Graph reuse: the kept plan taken again for the same graph (level 1) or for a rebuilt,
# equal one (level 2, through the fingerprint of the plan's graph). See _reuse.pyx.

from libc.stdint cimport int8_t, uint8_t, int32_t, uint32_t, uint64_t
from ggml_py._ggml cimport *
from ggml_py._schedtypes cimport sched_rewiring
from ggml_py._alloc cimport recorded_place

# graph reuse, level 2: a tensor of the planned graph as the plan depends on it. Tensors
# are named by reference: an index in the table of the compared graph's tensors
# [NULL, nodes, leafs, tensors outside the graph] (0: none)
cdef enum:
    FP_LAYOUT_WORDS = 16    # ne, nb and op_params: 128 bytes side by side in ggml_tensor
    FP_TENSOR_BYTES = 128   # what the compare reads of a tensor with a layout id

cdef struct fp_tensor:             # 64 bytes: one cache line
    uint64_t head                   # op and flags (the tensor's first 8 bytes)
    uint32_t src[GGML_PY_FIRST_SOURCES]
    uint32_t more_src               # 0: the other source slots are NULL; else 1 + its row
                                    # of more_srcs (few tensors have more sources)
    uint32_t view_src
    uint32_t layout                 # index in layouts
    int32_t layout_id               # the tensor's (t.layout; 0: none, compare layouts')
    ggml_backend_buffer * buffer    # memory before the allocation, as buffer and data
    char * data                     # hold it: none (NULL, NULL), an address (NULL, data)
    size_t view_offs                # or in a buffer; and a view's offset

cdef enum:
    FP_MORE_SOURCES = GGML_MAX_SRC - GGML_PY_FIRST_SOURCES     # a row of more_srcs

# type, ne, nb and op_params of a tensor: the few distinct ones of a graph, shared
cdef struct fp_layout:
    int type
    uint64_t words[FP_LAYOUT_WORDS]

# a key of the hash set, by reference
cdef struct fp_entry:
    Py_ssize_t slot
    uint32_t ref

cdef enum:
    FP_NONE = 0         # no plan to describe (or one a level-2 reuse cannot take)
    FP_BUILDABLE = 1    # a fresh plan, allocated: pass 1's arrays are its graph's
    FP_BUILT = 2

# The fingerprint of the plan's graph (made at the first alloc_graph of another graph)
# and what re-points the plan at an equal graph. SchedCore holds it by value (its `fp`);
# the Python objects it keeps alive are SchedCore.fp_keep and fp_assignments.
cdef struct sched_fingerprint:
    uint8_t state                       # FP_NONE / FP_BUILDABLE / FP_BUILT
    uint64_t epoch                      # the fingerprint is true at this epoch
    fp_tensor * tensors                 # [n_nodes + n_leafs]: nodes, leafs
    uint32_t * more_srcs                # [n_more][FP_MORE_SOURCES]: the later
    int n_more                          # source slots of the few that use them
    int n_nodes
    int n_leafs
    fp_layout * layouts                 # [n_layouts]
    int n_layouts
    ggml_backend_buffer ** buffers      # [n_buffers]: of the pre-allocated ones
    int n_buffers
    # the reference tables: of the graph compared last, and of the one re-pointed to last
    ggml_tensor ** table                # [1 + n_nodes + n_leafs + n_outside]
    ggml_tensor ** cur_table            # (the hash set's keys, when re-keyed)
    fp_entry * entries                  # [n_entries]: every key of the hash set
    int n_entries
    int * tmp_ids                       # [n_entries]: their values while the
    uint8_t * tmp_causes                # set is re-made
    ggml_tensor ** tmp_copies           # [n_entries][n_backends][n_copies]
    uint32_t * inputs                   # [n_inputs]: the splits' inputs
    char * input_names                  # [n_inputs][GGML_MAX_NAME]: copies are
    int n_inputs                        # named after them
    int * input_entries                 # [n_inputs]: each input's entries index
    uint32_t * arena_of                 # [n_arena]: what each arena tensor is of
    int n_arena
    sched_rewiring * rewirings          # [n_rewirings]: node, src and copy
    int n_rewirings
    ggml_tensor ** outside              # [n_outside]: tensors outside the graph
    int n_outside
    # the allocation, replayed for an equal graph: where it left the graph copy's leafs
    # and nodes (-1: not replayable), and the allocator's chunks it points into
    recorded_place * places             # [n_places]
    int n_places
    ggml_backend_buffer ** chunks       # [galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS]
    # the hash set is re-keyed when read (fp_ensure_keys), not at each re-pointing: while
    # keys_stale, its keys are an earlier graph's, entries say where each entry is, and
    # cur_table names the tensors of the graph re-pointed to last
    bint keys_stale

# (after the struct: _schedcore.pxd cimports it to hold it by value)
from ggml_py._core cimport Graph
from ggml_py._schedcore cimport SchedCore

cdef void fingerprint_free(sched_fingerprint * fp) noexcept
cdef int sched_reset(SchedCore s) except -1
cdef int forget_plan(SchedCore s) except -1
cdef int fp_ensure_keys(SchedCore s) except -1
cdef bint try_reuse(SchedCore s, Graph g) except -1
cdef bint try_reuse_rebuilt(SchedCore s, Graph g) except -1
cdef int fp_place(SchedCore s) except -1
cdef int prepare_rotation(SchedCore s) except -1
cdef int rotate_copy_slot(SchedCore s, bint move_memory) except -1
