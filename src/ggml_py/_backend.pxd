# Backend interface: buffer types, buffers and backends (ggml-backend-impl.h
# roles). The C structs are in _ggml.pxd; see _backend.pyx for details.

from libc.stdint cimport int64_t, uint8_t, uintptr_t
from ggml_py._ggml cimport *
from ggml_py._core cimport Tensor, OP_GET_ROWS, OP_MUL_MAT, OP_MUL_MAT_ID, OP_ROPE, OP_ROPE_BACK

cdef class BufferType:
    cdef ggml_backend_buffer_type c
    cdef readonly object device         # owning backend's device name (informational)
    """The name of the device it belongs to (informational; None: not given)."""

cdef class Buffer:
    cdef ggml_backend_buffer c
    cdef readonly BufferType buffer_type
    """The buffer's type."""
    cdef object _memory                 # the bytes of a host buffer (numpy array) or None
    cdef bint _has_init_tensor          # its class fills the NULL slot init_tensor
    cdef bint _has_reset                # ... and reset (filled_slots)
    cdef bint _host_bytes_only          # its set_tensor is the base's, on host memory
    cdef void setup(self, BufferType buffer_type, size_t size, size_t base, object memory)

cdef Buffer _live(Buffer buffer)

# placing a tensor (ggml_backend_tensor_alloc, ggml_backend_view_init): the one port,
# used by Buffer.tensor_alloc / view_init and by the allocators
cdef int tensor_alloc_at(ggml_backend_buffer * buffer, ggml_tensor * tensor, char * addr,
                         size_t size) except -1
cdef int view_init_c(ggml_tensor * tensor) except -1
cdef int buffer_reset(ggml_backend_buffer * buffer) except -1

# the data-written mark (ggml_tensor.written): every write of a tensor's bytes through
# tensor_set / tensor_memset / tensor_copy (and the backends' asynchronous sets) marks it
# and its view source as written where they lie now; the Scheduler's check_inputs reads it
cdef inline void tensor_written(ggml_tensor * t) noexcept nogil:
    t.written = <uintptr_t>t.data
    if t.view_src != NULL:
        t.view_src.written = <uintptr_t>t.view_src.data

cdef inline bint tensor_is_written(const ggml_tensor * t) noexcept nogil:
    """Was the tensor (or, for a view, its view source) written where it lies now?"""
    if t.view_src != NULL:
        t = t.view_src
    return t.data != NULL and t.written == <uintptr_t>t.data

cdef class Backend:
    cdef ggml_backend c
    cdef readonly BufferType buffer_type
    """The buffer type its tensors are allocated in (its default)."""
    cdef list _bufts                    # keeps supported buffer types alive
    cdef _own(self, Tensor tensor)

# slow paths: ask the backend object (Python) when a table says GGML_PY_OP_ASK
cdef int ask_supports_op(ggml_backend * b, ggml_tensor * t) except -1
cdef int ask_offload_op(ggml_backend * b, ggml_tensor * t) except -1
cdef int ask_supports_buft(ggml_backend * b, ggml_backend_buffer_type * buft) except -1

cdef inline int64_t op_batch(const ggml_tensor * t) noexcept nogil:
    """The batch size offload_op compares with a backend's minimum."""
    if t.op == OP_GET_ROWS:
        return 0
    if t.op == OP_MUL_MAT:
        return t.ne[1]
    if t.op == OP_MUL_MAT_ID or t.op == OP_ROPE or t.op == OP_ROPE_BACK:
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]

cdef inline int backend_supports_op(ggml_backend * b, ggml_tensor * t) except -1:
    return backend_supports_op_of(b, t.op, t)

cdef inline int backend_supports_op_of(ggml_backend * b, int op, ggml_tensor * t) except -1:
    """backend_supports_op with t's op known (t.op): a backend whose table answers for
    op does not read t (the scheduler's passes keep the ops of a large graph's nodes
    apart from their structs, which are out of the caches by then)."""
    cdef uint8_t a = b.supports_op_table[op]
    if a == GGML_PY_OP_FN:
        return b.supports_op_fn(b, t)
    if a != GGML_PY_OP_ASK:
        return a
    return ask_supports_op(b, t)

cdef inline int backend_offload_op(ggml_backend * b, ggml_tensor * t) except -1:
    cdef uint8_t a = b.offload_op_table[t.op]
    if a == GGML_PY_OP_YES:
        return op_batch(t) >= b.offload_min_batch
    if a == GGML_PY_OP_NO:
        return 0
    return ask_offload_op(b, t)

cdef inline int backend_supports_buft(ggml_backend * b, ggml_backend_buffer_type * buft) except -1:
    cdef int i
    for i in range(b.n_supported_bufts):
        if b.supported_bufts[i] == buft:
            return 1
    if b.supports_host_bufts and buft.is_host:
        return 1
    if b.supports_buft_ask:
        return ask_supports_buft(b, buft)
    return 0
