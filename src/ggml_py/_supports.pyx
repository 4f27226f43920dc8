"""Every backend's supports_op rule, in C, each registered under a name.

The scheduler asks a backend's supports_op for every node of every split, so each rule is
a nogil C function behind the backend's `supports_op_fn` slot, with a per-op table that
answers the ops it decides without a call (GGML_PY_OP_YES / _NO) and sends the others to
the function (GGML_PY_OP_FN). A backend picks its rule by name (`use_rule`):

  cpu, rpc-cpu-server  ggml 0.10.1's ggml-cpu: the types and layouts its kernels take (a
                       ggml RPC server on a CPU runs the same kernels);
  opencl               ggml_py's OpenCL backend: exactly what its kernels
                       (backends/opencl/kernels.py) compute;
  cuda, metal, vulkan, ggml-opencl
                       ggml 0.10.1's ggml-cuda, ggml-metal, ggml-vulkan and ggml-opencl
                       device supports_op, for the planner's simulated devices
                       (models/devices). Where a rule reads the hardware, the answer is a
                       documented typical device's (see each rule).

Op and type ids are ggml 0.10.1's, from the vocabulary header (ggml-py-vocab.h).
"""

cimport cython
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport strcmp, strncpy

from ggml_py._ggml cimport *
from ggml_py._core cimport (Tensor, TYPE_TRAITS, ggml_nelements, ggml_nbytes, ggml_is_view_op,
                            ggml_is_contiguous, ggml_is_contiguous_1, ggml_is_contiguous_n,
                            ggml_acc_region_end)
from ggml_py._backend cimport Backend

from ggml_py.errors import UnknownNameError


# ---------------------------------------------------------------------------
# shared tests of types and layouts

cdef inline bint _has(uint64_t mask, int type) noexcept nogil:
    return 0 <= type < 64 and (mask >> type) & 1


cdef inline uint64_t _bit(int type) noexcept nogil:
    return 1ULL << type


cdef inline bint _f32_f16(int t) noexcept nogil:
    return t == TYPE_F32 or t == TYPE_F16


cdef inline bint _is_float(int t) noexcept nogil:
    return t == TYPE_F32 or t == TYPE_F16 or t == TYPE_BF16


cdef inline bint _type_is(const ggml_tensor * t, int type) noexcept nogil:
    return t != NULL and t.type == type


cdef inline bint _absent_or(const ggml_tensor * t, int type) noexcept nogil:
    return t == NULL or t.type == type


cdef inline bint _packed(const ggml_tensor * t) noexcept nogil:
    """Are t's rows packed (nb[0] its element size)? Most ggml-cpu kernels assert it."""
    return t == NULL or t.nb[0] == TYPE_TRAITS[t.type].type_size


cdef inline bint _contiguous_rows(const ggml_tensor * t) noexcept nogil:
    """ggml_is_contiguous_rows: one block per row, or packed rows."""
    return t.ne[0] == TYPE_TRAITS[t.type].blck_size or t.nb[0] == TYPE_TRAITS[t.type].type_size


cdef inline bint _divides(int64_t a, int64_t b) noexcept nogil:
    """b > 0 and a is a multiple of b (a broadcast the kernels handle)."""
    return b > 0 and a % b == 0


cdef inline bint _is_copy(int o) noexcept nogil:
    return o == OP_DUP or o == OP_CONT or o == OP_CPY


cdef inline bint _is_binary(int o) noexcept nogil:
    return o == OP_ADD or o == OP_SUB or o == OP_MUL or o == OP_DIV


cdef inline uint64_t _legacy_quants() noexcept nogil:
    """q4_0, q4_1, q5_0, q5_1, q8_0: the block types every GPU backend reads and writes."""
    return (_bit(TYPE_Q4_0) | _bit(TYPE_Q4_1) | _bit(TYPE_Q5_0)
            | _bit(TYPE_Q5_1) | _bit(TYPE_Q8_0))


cdef inline uint64_t _k_and_iq_quants() noexcept nogil:
    """The K-quants and i-quants a GPU backend's matrix kernels read."""
    return (_bit(TYPE_Q2_K) | _bit(TYPE_Q3_K) | _bit(TYPE_Q4_K)
            | _bit(TYPE_Q5_K) | _bit(TYPE_Q6_K) | _bit(TYPE_IQ1_S)
            | _bit(TYPE_IQ1_M) | _bit(TYPE_IQ2_XXS) | _bit(TYPE_IQ2_XS)
            | _bit(TYPE_IQ2_S) | _bit(TYPE_IQ3_XXS) | _bit(TYPE_IQ3_S)
            | _bit(TYPE_IQ4_XS) | _bit(TYPE_IQ4_NL) | _bit(TYPE_MXFP4))


# ---------------------------------------------------------------------------
# cpu / rpc-cpu-server: ggml 0.10.1's CPU backend

# Type facts of ggml's CPU backend (ggml-cpu.c type_traits_cpu, ops.cpp dispatch), as
# bit masks over type ids. vec_dot_type: the type src1 of a MUL_MAT is converted to
# (-1: no dot product, the type cannot be a matrix).
cdef uint64_t QUANT_DEQUANT = 0        # quantized types the kernels can read (to_float)
cdef uint64_t FROM_FLOAT = 0           # types the kernels can write from f32 (from_float)
cdef int VEC_DOT_TYPE[64]


cdef void _init_cpu_type_facts() noexcept:
    global QUANT_DEQUANT, FROM_FLOAT
    cdef int i, t, v
    for i in range(64):
        VEC_DOT_TYPE[i] = -1
    for i in range(GGML_PY_N_TYPE_INFOS):
        # ggml-cpu's weight types, with their vec_dot types (the one list of types): the
        # floats, q8_0, and every type whose dot takes another type's rows
        t, v = ggml_py_type_infos[i].id, ggml_py_type_infos[i].vec_dot_type
        if v == t and not (_is_float(t) or t == TYPE_Q8_0):
            continue
        VEC_DOT_TYPE[t] = v
        if not _is_float(t):
            QUANT_DEQUANT |= _bit(t)
    QUANT_DEQUANT |= _bit(TYPE_Q8_1)
    # the iq2/iq3/iq1 kinds have no from_float in the CPU backend
    FROM_FLOAT = (_bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_I32) | _legacy_quants()
                  | _bit(TYPE_Q8_1) | _bit(TYPE_MXFP4) | _bit(TYPE_NVFP4)
                  | _bit(TYPE_Q1_0) | _bit(TYPE_Q2_K) | _bit(TYPE_Q3_K)
                  | _bit(TYPE_Q4_K) | _bit(TYPE_Q5_K) | _bit(TYPE_Q6_K)
                  | _bit(TYPE_Q8_K) | _bit(TYPE_IQ4_NL)
                  | _bit(TYPE_IQ4_XS) | _bit(TYPE_TQ1_0) | _bit(TYPE_TQ2_0))


_init_cpu_type_facts()


cdef inline bint _unary_types(int a, int d) noexcept nogil:
    """unary-ops.cpp: same float type, or f16/bf16 into f32."""
    return (a == d and _is_float(a)) or (d == TYPE_F32 and (a == TYPE_F16 or a == TYPE_BF16))


cdef inline bint _binary_types(int a, int b, int d) noexcept nogil:
    """binary-ops.cpp's type combinations (ADD, SUB, MUL, DIV)."""
    if a == b and b == d and _is_float(a):
        return True
    return b == TYPE_F32 and ((a == TYPE_BF16 and (d == TYPE_BF16 or d == TYPE_F32)) or
                           (a == TYPE_F16 and (d == TYPE_F16 or d == TYPE_F32)))


cdef inline bint _cpy_types(int a, int d) noexcept nogil:
    """ggml_compute_forward_dup: what converts into what."""
    if a == d:
        return True
    if a == TYPE_F16 or a == TYPE_BF16:
        return _is_float(d) or (_has(FROM_FLOAT, d) and TYPE_TRAITS[d].is_quantized)
    if a == TYPE_F32:
        return _is_float(d) or d == TYPE_I32 or (_has(FROM_FLOAT, d) and TYPE_TRAITS[d].is_quantized)
    if a == TYPE_I32:
        return d == TYPE_F32
    return _has(QUANT_DEQUANT, a) and d == TYPE_F32


cdef bint _cpu_matmul_ok(const ggml_tensor * t, const ggml_tensor * a, const ggml_tensor * b) noexcept nogil:
    """MUL_MAT / MUL_MAT_ID on the CPU: src1 is f32 or already src0's vec_dot_type, the
    rows are packed, the result is f32 with growing strides (ggml-cpu asserts these)."""
    if b == NULL or not (0 <= a.type < 64) or VEC_DOT_TYPE[a.type] < 0:
        return False
    if b.type != TYPE_F32 and b.type != VEC_DOT_TYPE[a.type]:
        return False
    return (t.type == TYPE_F32 and _packed(a) and _packed(b) and _packed(t)
            and t.nb[0] <= t.nb[1] and t.nb[1] <= t.nb[2] and t.nb[2] <= t.nb[3])


cdef bint _cpu_flash_attn_ok(const ggml_tensor * t) noexcept nogil:
    cdef const ggml_tensor * q = t.src[0]
    cdef const ggml_tensor * k = t.src[1]
    cdef const ggml_tensor * v = t.src[2]
    if k == NULL or v == NULL or q.type != TYPE_F32 or t.type != TYPE_F32:
        return False
    if not (0 <= k.type < 64) or VEC_DOT_TYPE[k.type] < 0 or not _has(FROM_FLOAT, VEC_DOT_TYPE[k.type]):
        return False
    if not (_is_float(v.type) or _has(QUANT_DEQUANT, v.type)):
        return False
    return (_absent_or(t.src[3], TYPE_F16) and _absent_or(t.src[4], TYPE_F32)
            and (t.op_params[3] == GGML_PY_PREC_DEFAULT or t.op_params[3] == GGML_PY_PREC_F32)
            and _packed(q) and _packed(k) and _packed(v))


cdef bint _cpu_layout_ok(const ggml_tensor * t) noexcept nogil:
    """The layouts ggml-cpu's kernel for t asserts (it aborts on the others, taking the
    server down) or silently assumes (it would compute garbage): mostly packed rows,
    for some ops whole contiguity. ggml_py's own kernels take any strides."""
    cdef int op = t.op
    cdef const ggml_tensor * s0 = t.src[0]
    cdef const ggml_tensor * s1 = t.src[1]
    if _is_copy(op):
        if TYPE_TRAITS[t.type].is_quantized and s0.type != t.type:      # dup_to_q
            return ggml_is_contiguous(t) and _packed(s0)
        if TYPE_TRAITS[s0.type].is_quantized and s0.type != t.type:     # dup_from_q
            return _packed(t) and (t.ne[0] % TYPE_TRAITS[s0.type].blck_size == 0
                                   or ggml_is_contiguous(t))
        return True
    if op == OP_GLU or op == OP_LEAKY_RELU:
        return (ggml_is_contiguous_1(s0) and (s1 == NULL or ggml_is_contiguous_1(s1))
                and ggml_is_contiguous_1(t))
    if op == OP_SCALE or op == OP_DIAG_MASK_INF:
        return ggml_is_contiguous(s0) and ggml_is_contiguous(t)
    if op == OP_ACC:     # and b's region inside a
        return (ggml_is_contiguous(s0) and ggml_is_contiguous(t) and _packed(s1)
                and ggml_acc_region_end(t) <= ggml_nbytes(s0))
    if op == OP_ROPE:
        return _packed(t) and s0.nb[0] == t.nb[0]
    if op == OP_SOFT_MAX:
        return _packed(s0) and _packed(s1) and _packed(t)
    if op == OP_GET_ROWS or op == OP_SET_ROWS:
        return _packed(s0) and _packed(t)
    if (op == OP_UNARY or _is_binary(op) or op == OP_SQR
            or op == OP_SQRT or op == OP_LOG or op == OP_SIN
            or op == OP_COS or op == OP_CLAMP or op == OP_REPEAT
            or op == OP_NORM or op == OP_RMS_NORM or op == OP_SUM_ROWS
            or op == OP_CUMSUM or op == OP_SUM or op == OP_MEAN
            or op == OP_ARGMAX or op == OP_ARGSORT or op == OP_TOP_K
            or op == OP_TIMESTEP_EMBEDDING):
        return _packed(s0) and _packed(t)
    return True


cdef bint _cpu_types_ok(const ggml_tensor * t) noexcept nogil:
    """The types ggml-cpu's kernels take for t's op."""
    cdef int op = t.op, d = t.type, a, u
    cdef const ggml_tensor * s0 = t.src[0]
    cdef const ggml_tensor * s1 = t.src[1]
    if op == OP_NONE or ggml_is_view_op(op):
        return 1
    if op == OP_ARANGE:
        return d == TYPE_F32
    if s0 == NULL:
        return 0
    a = s0.type
    if _is_copy(op):
        return _cpy_types(a, d)
    if _is_binary(op):
        if s1 == NULL:
            return 0
        if op == OP_ADD and TYPE_TRAITS[a].is_quantized and _has(QUANT_DEQUANT, a):
            return s1.type == TYPE_F32 and d == a          # add_q_f32
        return _binary_types(a, s1.type, d)
    if (op == OP_SQR or op == OP_SQRT or op == OP_LOG
            or op == OP_SIN or op == OP_COS):
        return _unary_types(a, d)
    if op == OP_UNARY:
        u = t.op_params[0]
        if (u == UNARY_OP_GELU or u == UNARY_OP_GELU_ERF
                or u == UNARY_OP_GELU_QUICK or u == UNARY_OP_SILU):
            return a == d and _f32_f16(a)
        return 0 <= u < GGML_PY_UNARY_OP_COUNT and _unary_types(a, d)
    if op == OP_GLU:
        u = t.op_params[0]
        if u == GLU_OP_SWIGLU_OAI:
            return a == TYPE_F32 and d == TYPE_F32 and _absent_or(s1, TYPE_F32)
        return 0 <= u < GGML_PY_GLU_OP_COUNT and a == d and _f32_f16(a) and _absent_or(s1, a)
    if op == OP_MUL_MAT:
        return _cpu_matmul_ok(t, s0, s1)
    if op == OP_MUL_MAT_ID:
        return _cpu_matmul_ok(t, s0, s1) and _type_is(t.src[2], TYPE_I32)
    if op == OP_GET_ROWS:
        if not _type_is(s1, TYPE_I32):
            return 0
        if a == TYPE_I32:
            return d == TYPE_I32
        return d == TYPE_F32 and (_is_float(a) or _has(QUANT_DEQUANT, a))
    if op == OP_SET_ROWS:
        return (a == TYPE_F32 and s1 != NULL and (s1.type == TYPE_I32 or s1.type == TYPE_I64)
                and _has(FROM_FLOAT, d))
    if op == OP_SOFT_MAX:
        return (a == TYPE_F32 and d == TYPE_F32 and (s1 == NULL or _f32_f16(s1.type))
                and _absent_or(t.src[2], TYPE_F32))
    if op == OP_ROPE:
        return _f32_f16(a) and d == a and _type_is(s1, TYPE_I32) and _absent_or(t.src[2], TYPE_F32)
    if op == OP_FLASH_ATTN_EXT:
        return _cpu_flash_attn_ok(t)
    if op == OP_SUM:
        return _is_float(a) and d == a
    if op == OP_REPEAT:
        return d == a and (_is_float(a) or a == TYPE_I16 or a == TYPE_I32)
    if op == OP_CONCAT:
        return s1 != NULL and s1.type == a and d == a
    if op == OP_CLAMP or op == OP_LEAKY_RELU:
        return _f32_f16(a) and d == a
    if op == OP_ACC:
        return a == TYPE_F32 and _type_is(s1, TYPE_F32) and d == TYPE_F32
    if op == OP_ARGSORT or op == OP_TOP_K or op == OP_ARGMAX:
        return a == TYPE_F32 and d == TYPE_I32
    if (op == OP_SCALE or op == OP_NORM or op == OP_RMS_NORM
            or op == OP_DIAG_MASK_INF or op == OP_SUM_ROWS
            or op == OP_MEAN or op == OP_PAD or op == OP_CUMSUM
            or op == OP_TIMESTEP_EMBEDDING):
        return a == TYPE_F32 and d == TYPE_F32
    return 0


cdef int cpu_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """Can ggml 0.10.1's CPU backend (or an RPC server on one) compute `t`? ggml-cpu's
    supports_op answers yes to nearly everything and its kernels abort on the rest; this
    answers from the kernels' dispatch and asserts (ops.cpp, unary-ops.cpp, binary-ops.cpp,
    ggml-cpu.c) for the ops it knows, and no for ops it has not been checked against."""
    return _cpu_types_ok(t) and (t.src[0] == NULL or _cpu_layout_ok(t))


# ops the rule above answers for; every other op is "no" for a CPU server
CPU_OPS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "ARANGE", "DUP", "CONT",
           "CPY", "ADD", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "UNARY",
           "GLU", "MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "SET_ROWS", "SOFT_MAX", "ROPE",
           "FLASH_ATTN_EXT", "SUM", "REPEAT", "CONCAT", "CLAMP", "LEAKY_RELU", "ACC",
           "ARGSORT", "TOP_K", "ARGMAX", "SCALE", "NORM", "RMS_NORM", "DIAG_MASK_INF",
           "SUM_ROWS", "MEAN", "PAD", "CUMSUM", "TIMESTEP_EMBEDDING")


# ---------------------------------------------------------------------------
# the unary ops the OpenCL kernels compute, by id: filled from the kernels' own list
# (backends/opencl/kernels.py UNARY_SUPPORTED) when a backend first takes the rule, since
# the kernels' package imports this module
cdef bint OPENCL_UNARY_OK[GGML_PY_UNARY_OP_COUNT]


cdef void _learn_opencl_unary_ops():
    from ggml_py.backends.opencl.kernels import UNARY_SUPPORTED
    for u in range(GGML_PY_UNARY_OP_COUNT):
        OPENCL_UNARY_OK[u] = ggml_py_unary_op_names[u].decode() in UNARY_SUPPORTED


# opencl: ggml_py's OpenCL backend (the kernels of backends/opencl/kernels.py)

# limits of the kernels: the program's #defines are made from these
OPENCL_SORT_MAX = 2048      # longest row ARGSORT / TOP_K sort in local memory
OPENCL_FA_D = 256           # largest flash-attention head size (DK and DV)
cdef int64_t SORT_MAX = OPENCL_SORT_MAX, FA_D = OPENCL_FA_D


cdef inline bint _plain(int t) noexcept nogil:
    return t == TYPE_F32 or t == TYPE_F16 or t == TYPE_I32


cdef bint opencl_acc_region(const ggml_tensor * t, int64_t r[4]) noexcept nogil:
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


cdef bint _opencl_flash_attn_ok(const ggml_tensor * t) noexcept nogil:
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
    if mask != NULL and not (_f32_f16(mask.type) and mask.ne[0] >= k.ne[1]
                             and mask.ne[1] >= q.ne[1] and _divides(q.ne[2], mask.ne[2])
                             and _divides(q.ne[3], mask.ne[3])):
        return False
    return sinks == NULL or (sinks.type == TYPE_F32 and sinks.ne[0] >= q.ne[2])


cdef int opencl_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """Can ggml_py's OpenCL kernels compute `t`?"""
    cdef int o = t.op, d = t.type, i, u
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    cdef const ggml_tensor * m
    cdef int64_t r[4]
    if o == OP_NONE or ggml_is_view_op(o):
        return 1
    if o == OP_ARANGE:
        return d == TYPE_F32
    if a == NULL:
        return 0
    if _is_copy(o):
        if ggml_nelements(a) != ggml_nelements(t):
            return 0
        if d == TYPE_Q8_0:
            return (_f32_f16(a.type) and t.ne[0] % 32 == 0
                    and t.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
                    and t.nb[1] >= t.nb[0] * (t.ne[0] // 32))
        return (a.type == d and _plain(d)) or (_f32_f16(a.type) and _f32_f16(d))
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
    if (o == OP_DIAG_MASK_INF or o == OP_SUM_ROWS or o == OP_MEAN
            or o == OP_SUM or o == OP_NORM or o == OP_RMS_NORM
            or o == OP_TIMESTEP_EMBEDDING):
        return a.type == TYPE_F32 and d == TYPE_F32
    if o == OP_SET_ROWS:
        if b == NULL or a.type != TYPE_F32 or not (b.type == TYPE_I32 or b.type == TYPE_I64):
            return 0
        if d == TYPE_Q8_0:
            return t.ne[0] % 32 == 0 and t.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
        return _f32_f16(d)
    if o == OP_ARGSORT or o == OP_TOP_K:
        return (a.type == TYPE_F32 and d == TYPE_I32 and 0 < a.ne[0] <= SORT_MAX
                and (o == OP_TOP_K or t.op_params[0] == 0 or t.op_params[0] == 1))
    if o == OP_ACC:
        return (b != NULL and a.type == TYPE_F32 and b.type == TYPE_F32 and d == TYPE_F32
                and opencl_acc_region(t, r))
    if o == OP_PAD:
        return _f32_f16(a.type) and _f32_f16(d)
    if o == OP_FLASH_ATTN_EXT:
        return _opencl_flash_attn_ok(t)
    if _is_binary(o):
        if b == NULL or not (_f32_f16(a.type) and _f32_f16(b.type) and _f32_f16(d)):
            return 0
        for i in range(4):
            if not _divides(a.ne[i], b.ne[i]):
                return 0
        return 1
    if o == OP_SQR or o == OP_SQRT or o == OP_CLAMP or o == OP_SCALE:
        return _f32_f16(a.type) and _f32_f16(d)
    if o == OP_UNARY:
        u = t.op_params[0]
        return (0 <= u < GGML_PY_UNARY_OP_COUNT and OPENCL_UNARY_OK[u]
                and _f32_f16(a.type) and _f32_f16(d))
    if o == OP_GLU:
        u = t.op_params[0]
        if not (0 <= u < GGML_PY_GLU_OP_COUNT and _f32_f16(d)):
            return 0
        for i in range(GGML_MAX_SRC):
            if t.src[i] != NULL and not _f32_f16(t.src[i].type):
                return 0
        return 1
    if o == OP_SOFT_MAX:
        m = b
        return (a.type == TYPE_F32 and d == TYPE_F32
                and (m == NULL or (_f32_f16(m.type) and m.ne[1] >= a.ne[1]
                                   and _divides(a.ne[2], m.ne[2]) and _divides(a.ne[3], m.ne[3])))
                and _absent_or(t.src[2], TYPE_F32))
    if o == OP_ROPE:
        u = t.op_params[2]                          # mode
        i = t.op_params[1]                          # n_dims
        return ((u == GGML_PY_ROPE_TYPE_NORMAL or u == GGML_PY_ROPE_TYPE_NEOX)
                and _f32_f16(a.type) and d == a.type
                and b != NULL and b.type == TYPE_I32 and a.ne[0] % 2 == 0 and i % 2 == 0
                and 0 < i <= a.ne[0] and _absent_or(t.src[2], TYPE_F32))
    if o == OP_GET_ROWS:
        if b == NULL or b.type != TYPE_I32:
            return 0
        if a.type == TYPE_I32:
            return d == TYPE_I32
        if a.type == TYPE_Q8_0:
            return _f32_f16(d) and a.nb[0] == TYPE_TRAITS[TYPE_Q8_0].type_size
        return _f32_f16(a.type) and _f32_f16(d)
    if o == OP_MUL_MAT or o == OP_MUL_MAT_ID:
        if b == NULL or not ((_f32_f16(a.type) or a.type == TYPE_Q8_0)
                             and a.nb[0] == TYPE_TRAITS[a.type].type_size
                             and _f32_f16(b.type) and d == TYPE_F32):
            return 0
        if o == OP_MUL_MAT:
            return _divides(b.ne[2], a.ne[2]) and _divides(b.ne[3], a.ne[3])
        return t.src[2] != NULL and t.src[2].type == TYPE_I32
    return 0


# the ops the rule answers for (every other op: no); the backend's kernel dispatch
# (OpenCLBackend._compute_node) has a branch for each, checked by tests/test_supports.py
OPENCL_OPS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "DUP", "CONT", "CPY", "REPEAT",
              "CONCAT", "DIAG_MASK_INF", "SUM_ROWS", "MEAN", "SET_ROWS", "ARGSORT", "TOP_K",
              "SUM", "ACC", "PAD", "ARANGE", "TIMESTEP_EMBEDDING", "FLASH_ATTN_EXT", "ADD",
              "SUB", "MUL", "DIV", "SQR", "SQRT", "CLAMP", "SCALE", "UNARY", "GLU", "NORM",
              "RMS_NORM", "SOFT_MAX", "ROPE", "GET_ROWS", "MUL_MAT", "MUL_MAT_ID")


# ---------------------------------------------------------------------------
# cuda, metal, vulkan, ggml-opencl: ggml 0.10.1's GPU backends, for the planner
#
# Each rule is its backend's device supports_op, ported for the ops ggml_py's graphs build
# (the ops only other programs build, such as SSM_SCAN or CONV_2D, are "no" here). The
# `*_ALWAYS` ops are the ones the backend takes whatever their tensors.

cdef inline bint _one_of(int type, uint64_t types) noexcept nogil:
    return _has(types, type)


# cuda (ggml-cuda.cu, fattn.cu). Typical device: an Ampere-class GPU (compute capability
# 8.x) built with CUDA >= 11.7 (CUB: ARGSORT and TOP_K of any width) and without
# GGML_CUDA_FA_ALL_QUANTS. Not ported: the row-split buffers of --split-mode row, and the
# rule that an op whose source lives on another CUDA device is not supported.

CUDA_ALWAYS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "ADD", "ADD_ID", "ADD1",
               "SUB", "MUL", "DIV", "SCALE", "SQR", "SQRT", "SIN", "COS", "CLAMP", "LOG",
               "CONT", "DIAG_MASK_INF", "SOFT_MAX", "PAD", "ARANGE", "TIMESTEP_EMBEDDING",
               "LEAKY_RELU", "ARGMAX", "COUNT_EQUAL", "NORM", "RMS_NORM", "L2_NORM",
               "ARGSORT", "TOP_K", "CUMSUM", "FILL", "TRI", "DIAG", "UPSCALE", "IM2COL")
CUDA_DECIDED = ("UNARY", "GLU", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "GET_ROWS", "SET_ROWS",
                "SET", "CPY", "DUP", "REPEAT", "CONCAT", "ROPE", "ACC", "SUM", "SUM_ROWS",
                "MEAN", "GROUP_NORM", "ROLL", "FLASH_ATTN_EXT")


@cython.cdivision(True)
cdef bint _cuda_flash_attn_ok(const ggml_tensor * t) noexcept nogil:
    """fattn.cu's choice of kernel finds one (on compute capability 8.x: whenever the head
    sizes, K/V types and mask shape pass)."""
    cdef const ggml_tensor * q = t.src[0]
    cdef const ggml_tensor * k = t.src[1]
    cdef const ggml_tensor * v = t.src[2]
    cdef const ggml_tensor * mask = t.src[3]
    cdef int64_t dk = k.ne[0], gqa = q.ne[2] // k.ne[2] if k.ne[2] > 0 else 0
    cdef float max_bias = (<const float *>t.op_params)[1]
    cdef bint gqa_opt = gqa >= 2 and mask != NULL and max_bias == 0.0 and k.ne[1] % 256 == 0
    cdef int i, j
    cdef const ggml_tensor * x
    for j in range(4):                  # the GQA kernels read 16-byte aligned rows
        x = t.src[j]
        if x != NULL and not TYPE_TRAITS[x.type].is_quantized:
            for i in range(1, 4):
                if x.nb[i] % 16 != 0:
                    gqa_opt = False
    if dk == 40 or dk == 64 or dk == 72 or dk == 80 or dk == 96 or dk == 112 or dk == 128 or dk == 256:
        if v.ne[0] != dk:
            return False
    elif dk == 320:
        if v.ne[0] != 256 or not gqa_opt or gqa % 32 != 0:
            return False
    elif dk == 512 or dk == 576:
        if v.ne[0] != 512 or not gqa_opt:
            return False
    else:
        return False
    if k.type != v.type:
        return False
    if not _one_of(k.type, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_Q4_0) | _bit(TYPE_Q8_0)
                   | _bit(TYPE_BF16)):
        return False
    return mask == NULL or mask.ne[2] == 1


cdef int cuda_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """ggml-cuda's ggml_backend_cuda_device_supports_op for the ops of CUDA_DECIDED."""
    cdef int o = t.op, d = t.type
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    cdef int at = a.type
    cdef int bt
    cdef uint64_t matmul_types, rows_types
    if o == OP_UNARY:
        return 0 <= t.op_params[0] < GGML_PY_UNARY_OP_COUNT and ggml_is_contiguous(a)
    if o == OP_GLU:
        return 0 <= t.op_params[0] < GGML_PY_GLU_OP_COUNT and ggml_is_contiguous_1(a)
    if o == OP_MUL_MAT or o == OP_MUL_MAT_ID:
        if b.type == TYPE_F16 and at != TYPE_F16:
            return 0
        matmul_types = (_bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_Q1_0)
                        | _legacy_quants() | _k_and_iq_quants() | _bit(TYPE_NVFP4)
                        | _bit(TYPE_Q8_K))
        return _one_of(at, matmul_types)
    if o == OP_OUT_PROD:
        return d == TYPE_F32 and at == TYPE_F32 and b.type == TYPE_F32
    if o == OP_GET_ROWS:
        rows_types = (_bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_I32)
                      | _bit(TYPE_Q1_0) | _legacy_quants())
        return _one_of(at, rows_types)
    if o == OP_SET_ROWS:
        return (_one_of(d, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _legacy_quants()
                        | _bit(TYPE_IQ4_NL))
                and at == TYPE_F32 and (b.type == TYPE_I64 or b.type == TYPE_I32))
    if o == OP_SET:
        return (d == TYPE_F32 or d == TYPE_I32) and at == d and b.type == d
    if o == OP_CPY:
        bt = b.type
        if _is_float(at) and _is_float(bt):
            return 1
        if (at == TYPE_F32 and (bt == TYPE_Q8_0 or bt == TYPE_Q4_0 or bt == TYPE_Q4_1
                             or bt == TYPE_Q5_0 or bt == TYPE_Q5_1
                             or bt == TYPE_IQ4_NL or bt == TYPE_I32)):
            return 1
        if (bt == TYPE_F32 and (at == TYPE_Q8_0 or at == TYPE_Q4_0 or at == TYPE_Q4_1
                             or at == TYPE_Q5_0 or at == TYPE_Q5_1 or at == TYPE_I32)):
            return 1
        if at == TYPE_I32 and bt == TYPE_I32:
            return 1
        return at == bt and ggml_is_contiguous(a) and ggml_is_contiguous(b)
    if o == OP_DUP or o == OP_REPEAT or o == OP_CONCAT:
        return at != TYPE_I32 and at != TYPE_I16
    if o == OP_ROPE:
        return a.nb[0] == TYPE_TRAITS[at].type_size and ggml_is_contiguous_n(a, 2)
    if o == OP_ACC:
        return ggml_is_contiguous(a) and ggml_is_contiguous(b)
    if o == OP_SUM:
        return _contiguous_rows(a)
    if o == OP_SUM_ROWS or o == OP_MEAN or o == OP_GROUP_NORM:
        return ggml_is_contiguous(a)
    if o == OP_ROLL:
        return at == TYPE_F32
    if o == OP_FLASH_ATTN_EXT:
        return _cuda_flash_attn_ok(t)
    return 0


# metal (ggml-metal-device.m). Typical device: an Apple M2 or later (simdgroup reduction
# and matrix multiply, bfloat).

METAL_ALWAYS = ("NONE", "RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE", "CONCAT", "REPEAT", "ROPE",
                "ARGSORT", "TOP_K", "ARANGE", "ROLL", "DIAG", "ARGMAX")
METAL_DECIDED = ("SCALE", "FILL", "CLAMP", "SQR", "SQRT", "SIN", "COS", "LOG", "UNARY", "GLU",
                 "ADD", "SUB", "MUL", "DIV", "ADD_ID", "ACC", "SUM", "TRI", "SUM_ROWS",
                 "CUMSUM", "MEAN", "SOFT_MAX", "GROUP_NORM", "L2_NORM", "NORM", "RMS_NORM",
                 "UPSCALE", "PAD", "TIMESTEP_EMBEDDING", "LEAKY_RELU", "FLASH_ATTN_EXT",
                 "MUL_MAT", "MUL_MAT_ID", "SET", "CPY", "DUP", "CONT", "GET_ROWS", "SET_ROWS")


cdef bint _metal_copy_ok(int a, int d) noexcept nogil:
    """The conversions of Metal's copy kernels (CPY, DUP, CONT, SET)."""
    if a == TYPE_F32:
        return _one_of(d, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_Q1_0)
                       | _legacy_quants() | _bit(TYPE_IQ4_NL) | _bit(TYPE_I32))
    if a == TYPE_F16:
        return _f32_f16(d)
    if a == TYPE_BF16:
        return d == TYPE_F32 or d == TYPE_BF16
    if a == TYPE_Q1_0 or _one_of(a, _legacy_quants()):
        return _f32_f16(d)
    if a == TYPE_I32:
        return d == TYPE_F32 or d == TYPE_I32
    return False


cdef int metal_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """ggml-metal's ggml_metal_device_supports_op for the ops of METAL_DECIDED."""
    cdef int o = t.op, d = t.type, i
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    cdef int64_t hs
    if (o == OP_SCALE or o == OP_FILL or o == OP_CLAMP
            or o == OP_SQR or o == OP_SQRT or o == OP_SIN
            or o == OP_COS or o == OP_LOG):
        return _contiguous_rows(a) and _f32_f16(a.type)
    if o == OP_UNARY:
        return 0 <= t.op_params[0] < GGML_PY_UNARY_OP_COUNT and _contiguous_rows(a) and _f32_f16(a.type)
    if o == OP_GLU:
        return 0 <= t.op_params[0] < GGML_PY_GLU_OP_COUNT and ggml_is_contiguous_1(a) and a.type == TYPE_F32
    if _is_binary(o) or o == OP_ADD_ID or o == OP_ACC:
        return _contiguous_rows(a) and _contiguous_rows(b) and a.type == TYPE_F32
    if o == OP_SUM:
        return ggml_is_contiguous(a)
    if (o == OP_TRI or o == OP_SUM_ROWS or o == OP_CUMSUM
            or o == OP_MEAN or o == OP_SOFT_MAX or o == OP_GROUP_NORM
            or o == OP_L2_NORM or o == OP_NORM or o == OP_RMS_NORM):
        return _contiguous_rows(a)
    if (o == OP_UPSCALE or o == OP_TIMESTEP_EMBEDDING
            or o == OP_LEAKY_RELU):
        return a.type == TYPE_F32
    if o == OP_PAD:             # right padding only, no circular mode
        return (t.op_params[8] == 0 and t.op_params[0] == 0 and t.op_params[2] == 0
                and t.op_params[4] == 0 and t.op_params[6] == 0)
    if o == OP_FLASH_ATTN_EXT:
        hs = a.ne[0]
        if not (hs == 32 or hs == 40 or hs == 48 or hs == 64 or hs == 72 or hs == 80 or hs == 96
                or hs == 112 or hs == 128 or hs == 192 or hs == 256 or hs == 320 or hs == 512
                or hs == 576):
            return 0
        return (b.type == t.src[2].type
                and _one_of(b.type, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _legacy_quants()))
    if o == OP_MUL_MAT or o == OP_MUL_MAT_ID:
        return a.type != TYPE_NVFP4
    if _is_copy(o) or o == OP_SET:
        return _metal_copy_ok(a.type, d)
    if o == OP_GET_ROWS:
        return a.type != TYPE_NVFP4
    if o == OP_SET_ROWS:
        return a.type == TYPE_F32 and _one_of(d, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16)
                                           | _legacy_quants() | _bit(TYPE_IQ4_NL))
    return 0


# vulkan (ggml-vulkan.cpp). Typical device: a discrete GPU with subgroup shuffle, vote and
# arithmetic and the Vulkan memory model, 32-bit shader indexing (no tensor, source or
# result, above maxStorageBufferRange = 4 GiB - 1) and the matrix pipelines of every
# weight type. Every op is decided by the function: the size limit comes first, for views too.

VULKAN_MAX_TENSOR = (1 << 32) - 1
VULKAN_OPS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "UNARY", "GLU", "MUL_MAT",
              "MUL_MAT_ID", "FLASH_ATTN_EXT", "GET_ROWS", "SET_ROWS", "CONT", "CPY", "DUP",
              "REPEAT", "ROPE", "RMS_NORM", "NORM", "GROUP_NORM", "L2_NORM", "ADD", "SUB",
              "MUL", "DIV", "ADD_ID", "SQR", "SQRT", "SIN", "COS", "CLAMP", "LEAKY_RELU",
              "LOG", "TRI", "DIAG", "ARGSORT", "TOP_K", "ACC", "SET", "CONCAT", "ARANGE",
              "FILL", "SCALE", "PAD", "ROLL", "DIAG_MASK_INF", "SOFT_MAX", "SUM", "SUM_ROWS",
              "MEAN", "CUMSUM", "ARGMAX", "TIMESTEP_EMBEDDING")
VULKAN_ALWAYS = ()
VULKAN_DECIDED = VULKAN_OPS
cdef uint64_t VK_MAX_TENSOR = VULKAN_MAX_TENSOR


@cython.cdivision(True)
cdef inline bint _vk_dim01_contiguous(const ggml_tensor * t) noexcept nogil:
    if TYPE_TRAITS[t.type].blck_size == 0:
        return False
    return (t.nb[0] == TYPE_TRAITS[t.type].type_size
            and t.nb[1] == t.nb[0] * t.ne[0] // TYPE_TRAITS[t.type].blck_size
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


cdef inline bint _vk_copy_ok(const ggml_tensor * t) noexcept nogil:
    cdef const ggml_tensor * a = t.src[0]
    cdef int at = a.type
    cdef int bt = t.src[1].type if t.src[1] != NULL else at
    cdef uint64_t quants = _bit(TYPE_Q1_0) | _legacy_quants() | _bit(TYPE_IQ4_NL)
    if at == TYPE_F32 and _one_of(bt, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | quants):
        return True
    if bt == TYPE_F32 and _one_of(at, _bit(TYPE_F16) | quants):
        return True
    if (at == TYPE_F16 and bt == TYPE_F16) or (at == TYPE_F32 and bt == TYPE_I32) or (at == TYPE_I32 and bt == TYPE_F32):
        return True
    return (at == bt and (not TYPE_TRAITS[at].is_quantized
                          or (ggml_is_contiguous(a) and ggml_is_contiguous(t)))
            and TYPE_TRAITS[at].type_size % 2 == 0)


cdef int vulkan_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """ggml-vulkan's ggml_backend_vk_device_supports_op for the ops of VULKAN_OPS."""
    cdef int o = t.op, d = t.type, i, at
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    cdef uint64_t weights
    for i in range(GGML_MAX_SRC):
        if t.src[i] != NULL and ggml_nbytes(t.src[i]) > VK_MAX_TENSOR:
            return 0
    if ggml_nbytes(t) > VK_MAX_TENSOR:
        return 0
    if o == OP_NONE or ggml_is_view_op(o) or o == OP_RMS_NORM:
        return 1
    if o == OP_ARANGE:
        return d == TYPE_F32
    if o == OP_FILL:
        return _f32_f16(d)
    at = a.type
    if o == OP_UNARY:           # every unary op but EXPM1
        return (0 <= t.op_params[0] < GGML_PY_UNARY_OP_COUNT
                and t.op_params[0] != UNARY_OP_EXPM1
                and ggml_is_contiguous(a) and _f32_f16(at) and at == d)
    if o == OP_GLU:
        return 0 <= t.op_params[0] < GGML_PY_GLU_OP_COUNT and _f32_f16(at) and at == d
    if o == OP_MUL_MAT or o == OP_MUL_MAT_ID:
        weights = (_bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_Q1_0)
                   | _legacy_quants() | _k_and_iq_quants() | _bit(TYPE_NVFP4))
        if not _one_of(at, weights):
            return 0
        if (t.src[2].ne[3] if o == OP_MUL_MAT_ID else a.ne[3]) != b.ne[3]:
            return 0
        if not (_vk_dim01_contiguous(a) or _is_float(at)) or not (_vk_dim01_contiguous(b) or _f32_f16(b.type)):
            return 0
        return not (at == TYPE_BF16 and b.type == TYPE_F16)
    if o == OP_FLASH_ATTN_EXT:
        return (b.ne[0] % 8 == 0 and t.src[2].ne[0] % 8 == 0 and _absent_or(t.src[4], TYPE_F32)
                and at == TYPE_F32 and d == TYPE_F32 and _absent_or(t.src[3], TYPE_F16)
                and b.type == t.src[2].type
                and _one_of(b.type, _bit(TYPE_F32) | _bit(TYPE_F16) | _legacy_quants()
                            | _bit(TYPE_IQ4_NL)))
    if o == OP_GET_ROWS:
        weights = (_bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_I32) | _bit(TYPE_Q1_0)
                   | _legacy_quants() | _k_and_iq_quants() | _bit(TYPE_NVFP4))
        return _one_of(at, weights)
    if o == OP_SET_ROWS:
        return _one_of(d, _bit(TYPE_F32) | _bit(TYPE_F16) | _bit(TYPE_BF16) | _bit(TYPE_Q1_0)
                       | _legacy_quants() | _bit(TYPE_IQ4_NL))
    if _is_copy(o):
        return _vk_copy_ok(t)
    if o == OP_REPEAT:
        return TYPE_TRAITS[d].type_size == 4 and TYPE_TRAITS[at].type_size == 4
    if o == OP_ROPE:
        return _contiguous_rows(t) and _contiguous_rows(a)
    if o == OP_NORM or o == OP_GROUP_NORM:
        return ggml_is_contiguous(a)
    if o == OP_L2_NORM:
        return _contiguous_rows(a) and at == TYPE_F32 and d == TYPE_F32
    if _is_binary(o):
        return _f32_f16(at) and _f32_f16(b.type) and _f32_f16(d)
    if o == OP_ADD_ID:
        return at == TYPE_F32 and b.type == TYPE_F32 and t.src[2].type == TYPE_I32 and d == TYPE_F32
    if (o == OP_SQR or o == OP_SQRT or o == OP_SIN or o == OP_COS
            or o == OP_CLAMP or o == OP_PAD or o == OP_ROLL
            or o == OP_TIMESTEP_EMBEDDING):
        return at == TYPE_F32
    if (o == OP_LEAKY_RELU or o == OP_SCALE or o == OP_DIAG_MASK_INF
            or o == OP_ARGMAX):
        return ggml_is_contiguous(a) and at == TYPE_F32
    if o == OP_LOG or o == OP_TRI or o == OP_DIAG:
        return _f32_f16(at) and d == at
    if o == OP_ARGSORT:
        return ggml_is_contiguous(t) and ggml_is_contiguous(a)
    if o == OP_TOP_K:           # a top-k pipeline for rows of up to 2^10 - 1
        return ggml_is_contiguous(t) and ggml_is_contiguous(a) and t.ne[0] < 1024
    if o == OP_ACC:
        return at == TYPE_F32 and b.type == TYPE_F32 and d == TYPE_F32
    if o == OP_SET:
        return at == b.type and at == d and (at == TYPE_F32 or at == TYPE_I32)
    if o == OP_CONCAT:
        return TYPE_TRAITS[at].type_size == 4
    if o == OP_SOFT_MAX:
        return ggml_is_contiguous(a) and at == TYPE_F32 and (b == NULL or _f32_f16(b.type))
    if o == OP_SUM or o == OP_SUM_ROWS or o == OP_MEAN or o == OP_CUMSUM:
        return at == TYPE_F32 and _contiguous_rows(a)
    return 0


# ggml-opencl (ggml-opencl.cpp): ggml's own OpenCL backend, not ggml_py's. Typical device:
# an Adreno 7xx-class GPU (the backend's main target) with the default build
# (GGML_OPENCL_SOA_Q: q4_0 weights are stored split, so GET_ROWS cannot read them) and a
# work-group size of 1024 for the argsort kernel.

GGML_OPENCL_ALWAYS = ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "DIAG", "SOFT_MAX",
                      "NORM", "IM2COL")
GGML_OPENCL_DECIDED = ("GET_ROWS", "SET_ROWS", "CPY", "DUP", "CONT", "SET", "SCALE", "ADD",
                       "MUL", "DIV", "SUB", "ADD_ID", "SQR", "SQRT", "UNARY", "GLU", "TRI",
                       "FILL", "CLAMP", "RMS_NORM", "L2_NORM", "REPEAT", "PAD", "CONCAT",
                       "TIMESTEP_EMBEDDING", "GROUP_NORM", "MUL_MAT", "MUL_MAT_ID",
                       "DIAG_MASK_INF", "ROPE", "ARGSORT", "SUM_ROWS", "CUMSUM", "MEAN",
                       "FLASH_ATTN_EXT")
GGML_OPENCL_ARGSORT_WG = 1024
cdef int ARGSORT_WG = GGML_OPENCL_ARGSORT_WG


cdef bint _ggml_opencl_flash_attn_ok(const ggml_tensor * t) noexcept nogil:
    cdef const ggml_tensor * q = t.src[0]
    cdef const ggml_tensor * k = t.src[1]
    cdef const ggml_tensor * v = t.src[2]
    cdef int64_t dk = q.ne[0], dv = v.ne[0]
    if not ((dk == dv and (dk == 40 or dk == 64 or dk == 80 or dk == 96 or dk == 112
                           or dk == 128 or dk == 192 or dk == 256))
            or (dk == 192 and dv == 128)):
        return False
    if k.type != v.type:
        return False
    if q.type == TYPE_F32 and t.type == TYPE_F32:
        return k.type == TYPE_F32 or k.type == TYPE_F16
    return q.type == TYPE_F16 and k.type == TYPE_F16 and t.type == TYPE_F16


cdef int ggml_opencl_supports_op(const ggml_backend * backend, const ggml_tensor * t) noexcept nogil:
    """ggml-opencl's ggml_opencl_supports_op for the ops of GGML_OPENCL_DECIDED."""
    cdef int o = t.op, d = t.type, u, at, cols
    cdef const ggml_tensor * a = t.src[0]
    cdef const ggml_tensor * b = t.src[1]
    if o == OP_TRI or o == OP_FILL:
        return d == TYPE_F32 and ggml_is_contiguous(t)
    at = a.type
    if o == OP_GET_ROWS:
        return _f32_f16(at)
    if o == OP_SET_ROWS:
        return at == TYPE_F32 and _f32_f16(d) and (b.type == TYPE_I64 or b.type == TYPE_I32)
    if _is_copy(o):
        return (_f32_f16(at) and _f32_f16(d)) or (at == TYPE_I32 and d == TYPE_I32)
    if o == OP_SET:
        return (d == TYPE_F32 or d == TYPE_I32) and at == d and b.type == d
    if o == OP_SCALE:
        return at == TYPE_F32 and ggml_is_contiguous(a)
    if _is_binary(o):                   # ADD alone mixes f32 sources into an f16 result
        if o == OP_ADD and d == TYPE_F16 and _f32_f16(at) and _f32_f16(b.type):
            return 1
        return at == b.type and at == d and _f32_f16(at)
    if o == OP_ADD_ID or o == OP_CLAMP or o == OP_MEAN:
        return at == TYPE_F32
    if o == OP_SQR or o == OP_SQRT:
        return _f32_f16(at) and ggml_is_contiguous(a)
    if o == OP_UNARY:
        u = t.op_params[0]
        if (u == UNARY_OP_GELU or u == UNARY_OP_SILU or u == UNARY_OP_RELU
                or u == UNARY_OP_GELU_ERF or u == UNARY_OP_GELU_QUICK):
            return ggml_is_contiguous(a) and at == TYPE_F32
        if u == UNARY_OP_SIGMOID:
            return ggml_is_contiguous(a)
        if (u == UNARY_OP_TANH or u == UNARY_OP_NEG or u == UNARY_OP_EXP
                or u == UNARY_OP_EXPM1 or u == UNARY_OP_SOFTPLUS):
            return _f32_f16(at)
        return 0
    if o == OP_GLU:
        return 0 <= t.op_params[0] < GGML_PY_GLU_OP_COUNT and ggml_is_contiguous_1(a) and _f32_f16(d)
    if o == OP_RMS_NORM:
        return t.ne[0] % 4 == 0 and _contiguous_rows(a)
    if o == OP_L2_NORM:
        return _contiguous_rows(a)
    if o == OP_REPEAT or o == OP_TIMESTEP_EMBEDDING:
        return at == TYPE_F32 and d == TYPE_F32
    if o == OP_PAD:
        return t.op_params[8] == 0 and at == TYPE_F32 and d == TYPE_F32
    if o == OP_CONCAT:
        return at == TYPE_F32 and b.type == TYPE_F32 and d == TYPE_F32
    if o == OP_GROUP_NORM:
        return ggml_is_contiguous(a)
    if o == OP_MUL_MAT:
        if at == TYPE_F16:
            return 1
        if at == TYPE_F32 or at == TYPE_Q8_0:
            return b.type == TYPE_F32
        if _one_of(at, _bit(TYPE_Q4_0) | _bit(TYPE_Q4_1) | _bit(TYPE_MXFP4)
                   | _bit(TYPE_IQ4_NL) | _bit(TYPE_Q4_K) | _bit(TYPE_Q5_K)
                   | _bit(TYPE_Q6_K)):
            return b.type == TYPE_F32 and ggml_is_contiguous(a) and ggml_is_contiguous(b)
        return 0
    if o == OP_MUL_MAT_ID:
        return (_one_of(at, _bit(TYPE_Q4_0) | _bit(TYPE_Q8_0) | _bit(TYPE_MXFP4))
                and b.type == TYPE_F32 and ggml_is_contiguous(a) and ggml_is_contiguous(b))
    if o == OP_DIAG_MASK_INF:
        return t.ne[3] == 1
    if o == OP_ROPE:            # multi-section and vision rope: float sources only
        u = t.op_params[2]
        return not (u & GGML_PY_ROPE_TYPE_MROPE) or _f32_f16(at)
    if o == OP_ARGSORT:
        cols = 1
        while cols < t.ne[0]:
            cols *= 2
        return cols <= ARGSORT_WG and at == TYPE_F32
    if o == OP_SUM_ROWS or o == OP_CUMSUM:
        return at == TYPE_F32 and ggml_is_contiguous(a)
    if o == OP_FLASH_ATTN_EXT:
        return _ggml_opencl_flash_attn_ok(t)
    return 0


# ---------------------------------------------------------------------------
# the registry: rules by name

cdef enum:
    N_RULES_MAX = 16

cdef Rule RULES[N_RULES_MAX]
cdef int N_RULES = 0


cdef int _op_id(str name) except -1:
    """The id of ggml op `name` in the vocabulary header's table."""
    cdef int i
    for i in range(GGML_PY_OP_COUNT):
        if ggml_py_op_names[i].decode() == name:
            return i
    raise UnknownNameError(f"unknown op {name!r}")


cdef void _register(str name, supports_op_fn fn, always, decided) except *:
    """Register rule `name`: the ops in `always` are supported whatever their tensors, the
    ops in `decided` are asked of `fn`, every other op is not supported."""
    global N_RULES
    cdef Rule * r = &RULES[N_RULES]
    cdef bytes b = name.encode()
    assert N_RULES < N_RULES_MAX and len(b) < sizeof(r.name)
    strncpy(r.name, b, sizeof(r.name))
    r.fn = fn
    for i in range(GGML_OP_COUNT_MAX):
        r.table[i] = GGML_PY_OP_NO
    for op in always:
        r.table[_op_id(op)] = GGML_PY_OP_YES
    for op in decided:
        r.table[_op_id(op)] = GGML_PY_OP_FN
    N_RULES += 1


_register("cpu", cpu_supports_op, (), CPU_OPS)
_register("rpc-cpu-server", cpu_supports_op, (), CPU_OPS)
_register("opencl", opencl_supports_op, (), OPENCL_OPS)
_register("cuda", cuda_supports_op, CUDA_ALWAYS, CUDA_DECIDED)
_register("metal", metal_supports_op, METAL_ALWAYS, METAL_DECIDED)
_register("vulkan", vulkan_supports_op, VULKAN_ALWAYS, VULKAN_DECIDED)
_register("ggml-opencl", ggml_opencl_supports_op, GGML_OPENCL_ALWAYS, GGML_OPENCL_DECIDED)

RULE_NAMES = tuple(RULES[i].name.decode() for i in range(N_RULES))


cdef const Rule * find_rule(const char * name) noexcept nogil:
    cdef int i
    for i in range(N_RULES):
        if strcmp(RULES[i].name, name) == 0:
            return &RULES[i]
    return NULL


cdef const Rule * _rule(name) except NULL:
    cdef const Rule * r = NULL
    if isinstance(name, str):
        r = find_rule(name.encode())
    if r == NULL:
        raise UnknownNameError(f"no supports_op rule named {name!r}; the rules are "
                               f"{', '.join(RULE_NAMES)}")
    return r


def rule_ops(name: str) -> dict:
    """The ops rule `name` may support: {op name: 'yes' (always) or 'fn' (its C function
    decides from the tensor)}; every other op is not supported."""
    cdef const Rule * r = _rule(name)
    return {ggml_py_op_names[i].decode(): ("yes" if r.table[i] == GGML_PY_OP_YES else "fn")
            for i in range(GGML_PY_OP_COUNT) if r.table[i] != GGML_PY_OP_NO}


def use_rule(Backend backend not None, name: str, unsupported_ops=()):
    """Make `backend` answer supports_op with rule `name` (in C, during the split), except
    for the op names in `unsupported_ops`, which it never runs."""
    cdef const Rule * r = _rule(name)
    if r.fn == opencl_supports_op:
        _learn_opencl_unary_ops()
    no = set()
    for op in unsupported_ops:
        if not isinstance(op, str) or op not in _OP_NAMES:
            raise UnknownNameError(f"backend {backend.name}: unknown op {op!r} in unsupported_ops")
        no.add(_op_id(op))
    backend.c.supports_op_fn = r.fn
    for i in range(GGML_OP_COUNT_MAX):
        backend.c.supports_op_table[i] = GGML_PY_OP_NO if i in no else r.table[i]


_OP_NAMES = frozenset(ggml_py_op_names[i].decode() for i in range(GGML_PY_OP_COUNT))


def acc_offsets(Tensor t not None):
    """ACC's [offset, nb1, nb2, nb3] in f32 elements (the OpenCL kernel's arguments), or
    None where the OpenCL kernel cannot run it."""
    cdef int64_t r[4]
    if t.ptr.src[1] == NULL or not opencl_acc_region(t.ptr, r):
        return None
    return [r[0], r[1], r[2], r[3]]
