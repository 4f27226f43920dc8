# The OpenCL backend's supports_op, in C: the types, shapes and layouts its kernels
# (ggml_py/backends/opencl_kernels.py) handle. The scheduler asks it for every node of
# every split, so it is a C rule behind the backend's supports_op_fn slot, as ggml's
# backends answer: no Python call while a graph is split.

from libc.stdint cimport int64_t, uint32_t

from ggml_py._ggml cimport *
from ggml_py._core cimport (Tensor, TYPE_TRAITS, ggml_nelements, ggml_nbytes, ggml_is_view_op,
                            ggml_acc_region_end)
from ggml_py._backend cimport Backend

from ggml_py._core import OP_IDS as _OP_IDS, UNARY_OP_NAMES as _UNARY_OP_NAMES
from ggml_py.backends import opencl_kernels as _K

cdef int ROPE_NORMAL = GGML_PY_ROPE_TYPE_NORMAL, ROPE_NEOX = GGML_PY_ROPE_TYPE_NEOX
cdef int64_t SORT_MAX = _K.SORT_MAX, FA_D = _K.FA_D

# the unary ops k_map1 computes, by id (the kernels' own list)
cdef bint UNARY_OK[GGML_PY_UNARY_OP_COUNT]


cdef void _init_unary_ok():
    for u, name in enumerate(_UNARY_OP_NAMES):
        UNARY_OK[u] = name in _K.UNARY_SUPPORTED


_init_unary_ok()

# the ops the rule answers for (every other op: no)
OPENCL_OPS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "DUP", "CONT", "CPY", "REPEAT",
              "CONCAT", "DIAG_MASK_INF", "SUM_ROWS", "MEAN", "SET_ROWS", "ARGSORT", "TOP_K",
              "SUM", "ACC", "PAD", "ARANGE", "TIMESTEP_EMBEDDING", "FLASH_ATTN_EXT", "ADD",
              "SUB", "MUL", "DIV", "SQR", "SQRT", "CLAMP", "SCALE", "UNARY", "GLU", "NORM",
              "RMS_NORM", "SOFT_MAX", "ROPE", "GET_ROWS", "MUL_MAT", "MUL_MAT_ID")


cdef inline bint _float(int t) noexcept nogil:
    return t == TYPE_F32 or t == TYPE_F16


cdef inline bint _plain(int t) noexcept nogil:
    return t == TYPE_F32 or t == TYPE_F16 or t == TYPE_I32


cdef inline bint _divides(int64_t a, int64_t b) noexcept nogil:
    """b > 0 and a is a multiple of b (a broadcast the kernels handle)."""
    return b > 0 and a % b == 0


cdef inline bint _absent_or(const ggml_tensor * t, int type) noexcept nogil:
    return t == NULL or t.type == type


cdef bint acc_region(const ggml_tensor * t, int64_t r[4]) noexcept nogil:
    """ACC's (offset, nb1, nb2, nb3) in f32 elements of dst's flat order; False when they
    are not whole elements or the region of src1 reaches past dst."""
    cdef int i
    r[0] = <uint32_t>t.op_params[3]
    for i in range(3):
        r[i + 1] = <uint32_t>t.op_params[i]
    for i in range(4):
        if r[i] % 4:
            return False
        r[i] //= 4
    return ggml_acc_region_end(t) <= ggml_nbytes(t)


cdef bint _flash_attn_ok(const ggml_tensor * t) noexcept nogil:
    cdef const ggml_tensor * q = t.src[0]
    cdef const ggml_tensor * k = t.src[1]
    cdef const ggml_tensor * v = t.src[2]
    cdef const ggml_tensor * mask = t.src[3]
    cdef const ggml_tensor * sinks = t.src[4]
    cdef int i
    if k == NULL or v == NULL:
        return False
    if not (q.type == TYPE_F32 and k.type == TYPE_F16 and v.type == TYPE_F16 and t.type == TYPE_F32
            and q.ne[0] == k.ne[0] and k.ne[0] <= FA_D and v.ne[0] <= FA_D
            and k.ne[1] == v.ne[1]):
        return False
    for i in range(2, 4):
        if not (_divides(q.ne[i], k.ne[i]) and _divides(q.ne[i], v.ne[i])):
            return False
    if mask != NULL and not (_float(mask.type) and mask.ne[0] >= k.ne[1]
                             and mask.ne[1] >= q.ne[1] and _divides(q.ne[2], mask.ne[2])
                             and _divides(q.ne[3], mask.ne[3])):
        return False
    return sinks == NULL or (sinks.type == TYPE_F32 and sinks.ne[0] >= q.ne[2])


cdef int opencl_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """Can the OpenCL kernels compute `t`?"""
    cdef int o = t.op, d = t.type, i, u
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    cdef const ggml_tensor * m
    cdef int64_t r[4]
    if o == 0 or ggml_is_view_op(o):
        return 1
    if o == OP_ARANGE:
        return d == TYPE_F32
    if a == NULL:
        return 0
    if o == OP_DUP or o == OP_CONT or o == OP_CPY:
        if ggml_nelements(a) != ggml_nelements(t):
            return 0
        if d == TYPE_Q8_0:
            return (_float(a.type) and t.ne[0] % 32 == 0
                    and t.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
                    and t.nb[1] >= t.nb[0] * (t.ne[0] // 32))
        return (a.type == d and _plain(d)) or (_float(a.type) and _float(d))
    if o == OP_REPEAT:
        if not (a.type == d and _plain(d)):
            return 0
        for i in range(4):
            if not _divides(t.ne[i], a.ne[i]):
                return 0
        return 1
    if o == OP_CONCAT:
        return (b != NULL and a.type == b.type and b.type == d and _plain(d)
                and 0 <= t.op_params[0] < 4)
    if (o == OP_DIAG_MASK_INF or o == OP_SUM_ROWS or o == OP_MEAN or o == OP_SUM or o == OP_NORM
            or o == OP_RMS_NORM or o == OP_TIMESTEP_EMBEDDING):
        return a.type == TYPE_F32 and d == TYPE_F32
    if o == OP_SET_ROWS:
        if b == NULL or a.type != TYPE_F32 or not (b.type == TYPE_I32 or b.type == TYPE_I64):
            return 0
        if d == TYPE_Q8_0:
            return t.ne[0] % 32 == 0 and t.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
        return _float(d)
    if o == OP_ARGSORT or o == OP_TOP_K:
        return (a.type == TYPE_F32 and d == TYPE_I32 and 0 < a.ne[0] <= SORT_MAX
                and (o == OP_TOP_K or t.op_params[0] == 0 or t.op_params[0] == 1))
    if o == OP_ACC:
        return (b != NULL and a.type == TYPE_F32 and b.type == TYPE_F32 and d == TYPE_F32
                and acc_region(t, r))
    if o == OP_PAD:
        return _float(a.type) and _float(d)
    if o == OP_FLASH_ATTN_EXT:
        return _flash_attn_ok(t)
    if o == OP_ADD or o == OP_SUB or o == OP_MUL or o == OP_DIV:
        if b == NULL or not (_float(a.type) and _float(b.type) and _float(d)):
            return 0
        for i in range(4):
            if not _divides(a.ne[i], b.ne[i]):
                return 0
        return 1
    if o == OP_SQR or o == OP_SQRT or o == OP_CLAMP or o == OP_SCALE:
        return _float(a.type) and _float(d)
    if o == OP_UNARY:
        u = t.op_params[0]
        return 0 <= u < GGML_PY_UNARY_OP_COUNT and UNARY_OK[u] and _float(a.type) and _float(d)
    if o == OP_GLU:
        u = t.op_params[0]
        if not (0 <= u < GGML_PY_GLU_OP_COUNT and _float(d)):
            return 0
        for i in range(GGML_MAX_SRC):
            if t.src[i] != NULL and not _float(t.src[i].type):
                return 0
        return 1
    if o == OP_SOFT_MAX:
        m = b
        return (a.type == TYPE_F32 and d == TYPE_F32
                and (m == NULL or (_float(m.type) and m.ne[1] >= a.ne[1]
                                   and _divides(a.ne[2], m.ne[2]) and _divides(a.ne[3], m.ne[3])))
                and _absent_or(t.src[2], TYPE_F32))
    if o == OP_ROPE:
        u = t.op_params[2]                          # mode
        i = t.op_params[1]                          # n_dims
        return ((u == ROPE_NORMAL or u == ROPE_NEOX) and _float(a.type) and d == a.type
                and b != NULL and b.type == TYPE_I32 and a.ne[0] % 2 == 0 and i % 2 == 0
                and 0 < i <= a.ne[0] and _absent_or(t.src[2], TYPE_F32))
    if o == OP_GET_ROWS:
        if b == NULL or b.type != TYPE_I32:
            return 0
        if a.type == TYPE_I32:
            return d == TYPE_I32
        if a.type == TYPE_Q8_0:
            return _float(d) and a.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
        return _float(a.type) and _float(d)
    if o == OP_MUL_MAT or o == OP_MUL_MAT_ID:
        if b == NULL or not ((a.type == TYPE_F32 or a.type == TYPE_F16 or a.type == TYPE_Q8_0)
                             and a.nb[0] == TYPE_TRAITS[a.type].type_size
                             and _float(b.type) and d == TYPE_F32):
            return 0
        if o == OP_MUL_MAT:
            return _divides(b.ne[2], a.ne[2]) and _divides(b.ne[3], a.ne[3])
        return t.src[2] != NULL and t.src[2].type == TYPE_I32
    return 0


def acc_offsets(Tensor t not None):
    """ACC's [offset, nb1, nb2, nb3] in f32 elements (the kernel's arguments), or None
    where the OpenCL kernel cannot run it."""
    cdef int64_t r[4]
    if t.ptr.src[1] == NULL or not acc_region(t.ptr, r):
        return None
    return [r[0], r[1], r[2], r[3]]


def use_opencl_rules(Backend backend not None):
    """Make `backend` answer supports_op with the OpenCL rule (in C, during the split)."""
    known = {_OP_IDS[n] for n in OPENCL_OPS}
    backend.c.supports_op_fn = opencl_supports_op
    for i in range(GGML_OP_COUNT_MAX):
        backend.c.supports_op_table[i] = GGML_PY_OP_FN if i in known else GGML_PY_OP_NO
