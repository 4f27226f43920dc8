# The passes of ggml_backend_sched_split_graph and the graph copy (see _sched.pyx), and
# the hash map access that graph reuse and SchedCore's Python face share with them.

from ggml_py._ggml cimport *
from ggml_py._core cimport Graph, ggml_hash_find_or_insert, ggml_hash_find, ggml_bitset_get
from ggml_py._schedtypes cimport *
from ggml_py._schedcore cimport SchedCore

# hash map access (ggml: hash_id / tensor_backend_id / tensor_copy macros)

cdef int hash_set_full(SchedCore s, ggml_tensor * t) except -1

cdef inline Py_ssize_t hash_id(SchedCore s, ggml_tensor * t) except -1:
    cdef size_t i = ggml_hash_find_or_insert(&s.hash_set, t)
    if i == GGML_HASHSET_FULL:
        hash_set_full(s, t)
    return <Py_ssize_t>i

cdef inline ggml_tensor ** copy_slot(SchedCore s, Py_ssize_t id, int backend_id, int copy_id) noexcept:
    return &s.hv_tensor_copies[(id * s.n_backends + backend_id) * s.pipeline.n_copies + copy_id]

cdef inline Py_ssize_t slot_of(SchedCore s, const ggml_tensor * t) noexcept:
    """t's hash slot, without inserting it (-1 when t is not in the hash set)."""
    cdef size_t i = ggml_hash_find(&s.hash_set, t)
    if i == GGML_HASHSET_FULL or not ggml_bitset_get(s.hash_set.used, i):
        return -1
    return <Py_ssize_t>i

cdef inline ggml_backend_buffer * unallocated_memory(SchedCore s, ggml_backend_buffer * b) noexcept:
    """b, unless it is one of this scheduler's compute buffers: a tensor placed there by
    an earlier allocation is placed anew by the next, so the split treats it as
    unallocated (ggml would take it for memory of its own, a graph's stale placement)."""
    return NULL if b != NULL and b.allocator == <void *>s.galloc else b

cdef int sched_tensor_backend_id(SchedCore s, ggml_tensor * t) noexcept

# the passes, one split
cdef int check_graph_fits(SchedCore s, ggml_cgraph * graph) except -1
cdef int split_passes(SchedCore s, Graph g) except -1
cdef void spread_pre_memory(SchedCore s, ggml_cgraph * graph) noexcept
cdef void name_copy(SchedCore s, ggml_tensor * t, const ggml_tensor * of, int backend_id,
                    int copy_id) noexcept

# the rewiring of the user's graph, and the tables and arena a split fills
cdef int record_rewiring(SchedCore s, ggml_tensor * node, int i, int j,
                         ggml_tensor * original, ggml_tensor * copy) except -1
cdef void apply_rewirings(SchedCore s) noexcept
cdef void undo_rewiring(SchedCore s) noexcept
cdef void retire_arena(SchedCore s) noexcept
cdef void clear_tables(SchedCore s) noexcept
