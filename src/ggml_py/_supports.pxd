# Every backend's supports_op rule, in C, found by name (see _supports.pyx).

from libc.stdint cimport int64_t, uint8_t
from ggml_py._ggml cimport ggml_backend, ggml_tensor, GGML_OP_COUNT_MAX

ctypedef int (*supports_op_fn)(const ggml_backend * b, const ggml_tensor * t) noexcept nogil

cdef struct Rule:
    char name[32]
    supports_op_fn fn                       # decides the ops whose entry is GGML_PY_OP_FN
    uint8_t table[GGML_OP_COUNT_MAX]        # GGML_PY_OP_YES / _NO / _FN per op

# the rule registered under `name`; NULL when there is none
cdef const Rule * find_rule(const char * name) noexcept nogil

# the OpenCL kernels' ACC region: (offset, nb1, nb2, nb3) in f32 elements of dst
cdef bint opencl_acc_region(const ggml_tensor * t, int64_t r[4]) noexcept nogil
