// ggml 0.10.1's vocabulary, listed once: element types, ops, unary ops, GLU ops and named
// values (rope modes, precisions). The C kernels include this header, Cython cimports its
// tables (_ggml.pxd), and ggml_py._core builds its name tables from them: a new type or op
// is one line here, plus its kernels.
//
//   X(ID, id, name, blck_size, type_size, vec_dot_type)
//
// id is ggml's enum value; blck_size elements take type_size bytes (blck_size 0: a type
// ggml_py knows only by name); vec_dot_type is the type ggml-cpu converts src1 of a
// MUL_MAT to when the weights have this type (ggml-cpu.c's type_traits_cpu).

#pragma once

#include <stddef.h>
#include <stdint.h>

#define GGML_PY_TYPES(X)                             \
    X(F32,     0,  "f32",     1,   4,   F32)         \
    X(F16,     1,  "f16",     1,   2,   F16)         \
    X(Q4_0,    2,  "q4_0",    32,  18,  Q8_0)        \
    X(Q4_1,    3,  "q4_1",    32,  20,  Q8_1)        \
    X(Q5_0,    6,  "q5_0",    32,  22,  Q8_0)        \
    X(Q5_1,    7,  "q5_1",    32,  24,  Q8_1)        \
    X(Q8_0,    8,  "q8_0",    32,  34,  Q8_0)        \
    X(Q8_1,    9,  "q8_1",    32,  36,  Q8_1)        \
    X(Q2_K,    10, "q2_K",    256, 84,  Q8_K)        \
    X(Q3_K,    11, "q3_K",    256, 110, Q8_K)        \
    X(Q4_K,    12, "q4_K",    256, 144, Q8_K)        \
    X(Q5_K,    13, "q5_K",    256, 176, Q8_K)        \
    X(Q6_K,    14, "q6_K",    256, 210, Q8_K)        \
    X(Q8_K,    15, "q8_K",    256, 292, Q8_K)        \
    X(IQ2_XXS, 16, "iq2_xxs", 0,   0,   Q8_K)         \
    X(IQ2_XS,  17, "iq2_xs",  0,   0,   Q8_K)         \
    X(IQ3_XXS, 18, "iq3_xxs", 0,   0,   Q8_K)         \
    X(IQ1_S,   19, "iq1_s",   0,   0,   Q8_K)         \
    X(IQ4_NL,  20, "iq4_nl",  32,  18,  Q8_0)        \
    X(IQ3_S,   21, "iq3_s",   0,   0,   Q8_K)         \
    X(IQ2_S,   22, "iq2_s",   0,   0,   Q8_K)         \
    X(IQ4_XS,  23, "iq4_xs",  256, 136, Q8_K)        \
    X(I8,      24, "i8",      1,   1,   I8)          \
    X(I16,     25, "i16",     1,   2,   I16)         \
    X(I32,     26, "i32",     1,   4,   I32)         \
    X(I64,     27, "i64",     1,   8,   I64)         \
    X(F64,     28, "f64",     1,   8,   F64)         \
    X(IQ1_M,   29, "iq1_m",   0,   0,   Q8_K)         \
    X(BF16,    30, "bf16",    1,   2,   BF16)        \
    X(TQ1_0,   34, "tq1_0",   256, 54,  Q8_K)        \
    X(TQ2_0,   35, "tq2_0",   256, 66,  Q8_K)        \
    X(MXFP4,   39, "mxfp4",   32,  17,  Q8_0)        \
    X(NVFP4,   40, "nvfp4",   0,   0,   Q8_0)         \
    X(Q1_0,    41, "q1_0",    0,   0,   Q8_0)

#define GGML_PY_TYPE_COUNT 42           // ggml's GGML_TYPE_COUNT: ids run below it

#define GGML_PY_TYPE_ENUM_(ID, id, name, blck, size, vdt) GGML_PY_TYPE_##ID = id,
enum ggml_py_type { GGML_PY_TYPES(GGML_PY_TYPE_ENUM_) };
#undef GGML_PY_TYPE_ENUM_

typedef struct ggml_py_type_info {
    int          id;
    const char * name;
    int64_t      blck_size;             // 0: known by name only
    size_t       type_size;
    int          vec_dot_type;
} ggml_py_type_info;

#define GGML_PY_TYPE_INFO_(ID, id, name, blck, size, vdt) {id, name, blck, size, GGML_PY_TYPE_##vdt},
static const ggml_py_type_info ggml_py_type_infos[] = { GGML_PY_TYPES(GGML_PY_TYPE_INFO_) };
#undef GGML_PY_TYPE_INFO_

#define GGML_PY_N_TYPE_INFOS ((int)(sizeof(ggml_py_type_infos) / sizeof(ggml_py_type_infos[0])))

// ids in range, each listed once (every includer checks it at compile time)
#define GGML_PY_TYPE_CHECK_(ID, id, name, blck, size, vdt) \
    _Static_assert((id) >= 0 && (id) < GGML_PY_TYPE_COUNT, "type id " #ID " out of range");
GGML_PY_TYPES(GGML_PY_TYPE_CHECK_)
#undef GGML_PY_TYPE_CHECK_

// ---------------------------------------------------------------------------
// ops (ggml_op), unary ops (ggml_unary_op) and GLU ops (ggml_glu_op), in ggml's order:
// an op's id is its position. X(NAME)

#define GGML_PY_OPS(X)                                                                     \
    X(NONE) X(DUP) X(ADD) X(ADD_ID) X(ADD1) X(ACC) X(SUB) X(MUL) X(DIV) X(SQR) X(SQRT)         \
    X(LOG) X(SIN) X(COS) X(SUM) X(SUM_ROWS) X(CUMSUM) X(MEAN) X(ARGMAX) X(COUNT_EQUAL)         \
    X(REPEAT) X(REPEAT_BACK) X(CONCAT) X(SILU_BACK) X(NORM) X(RMS_NORM) X(RMS_NORM_BACK)       \
    X(GROUP_NORM) X(L2_NORM) X(MUL_MAT) X(MUL_MAT_ID) X(OUT_PROD) X(SCALE) X(SET) X(CPY)       \
    X(CONT) X(RESHAPE) X(VIEW) X(PERMUTE) X(TRANSPOSE) X(GET_ROWS) X(GET_ROWS_BACK)            \
    X(SET_ROWS) X(DIAG) X(DIAG_MASK_INF) X(DIAG_MASK_ZERO) X(SOFT_MAX) X(SOFT_MAX_BACK)        \
    X(ROPE) X(ROPE_BACK) X(CLAMP) X(CONV_TRANSPOSE_1D) X(IM2COL) X(IM2COL_BACK)                \
    X(IM2COL_3D) X(CONV_2D) X(CONV_3D) X(CONV_2D_DW) X(CONV_TRANSPOSE_2D) X(POOL_1D)           \
    X(POOL_2D) X(POOL_2D_BACK) X(UPSCALE) X(PAD) X(PAD_REFLECT_1D) X(ROLL) X(ARANGE)           \
    X(TIMESTEP_EMBEDDING) X(ARGSORT) X(TOP_K) X(LEAKY_RELU) X(TRI) X(FILL)                     \
    X(FLASH_ATTN_EXT) X(FLASH_ATTN_BACK) X(SSM_CONV) X(SSM_SCAN) X(WIN_PART) X(WIN_UNPART)     \
    X(GET_REL_POS) X(ADD_REL_POS) X(RWKV_WKV6) X(GATED_LINEAR_ATTN) X(RWKV_WKV7)               \
    X(SOLVE_TRI) X(GATED_DELTA_NET) X(UNARY) X(MAP_CUSTOM1) X(MAP_CUSTOM2) X(MAP_CUSTOM3)      \
    X(CUSTOM) X(CROSS_ENTROPY_LOSS) X(CROSS_ENTROPY_LOSS_BACK) X(OPT_STEP_ADAMW)               \
    X(OPT_STEP_SGD) X(GLU)

#define GGML_PY_UNARY_OPS(X)                                                               \
    X(ABS) X(SGN) X(NEG) X(STEP) X(TANH) X(ELU) X(RELU) X(SIGMOID) X(GELU) X(GELU_QUICK)     \
    X(SILU) X(HARDSWISH) X(HARDSIGMOID) X(EXP) X(EXPM1) X(SOFTPLUS) X(GELU_ERF) X(XIELU)     \
    X(FLOOR) X(CEIL) X(ROUND) X(TRUNC)

#define GGML_PY_GLU_OPS(X)                                                                 \
    X(REGLU) X(GEGLU) X(SWIGLU) X(SWIGLU_OAI) X(GEGLU_ERF) X(GEGLU_QUICK)

// named values of ggml.h, X(KIND, NAME, value): rope modes (GGML_ROPE_TYPE_*) and the
// precisions of MUL_MAT and FLASH_ATTN_EXT (enum ggml_prec)
#define GGML_PY_ROPE_TYPES(X) \
    X(ROPE_TYPE, NORMAL, 0) X(ROPE_TYPE, NEOX, 2) X(ROPE_TYPE, MROPE, 8) \
    X(ROPE_TYPE, VISION, 24) X(ROPE_TYPE, IMROPE, 40)
#define GGML_PY_PRECS(X) X(PREC, DEFAULT, 0) X(PREC, F32, 10)

#define GGML_PY_OP_ENUM_(NAME)       GGML_PY_OP_##NAME,
#define GGML_PY_UNARY_OP_ENUM_(NAME) GGML_PY_UNARY_OP_##NAME,
#define GGML_PY_GLU_OP_ENUM_(NAME)   GGML_PY_GLU_OP_##NAME,
#define GGML_PY_NAME_(NAME)          #NAME,
enum ggml_py_op       { GGML_PY_OPS(GGML_PY_OP_ENUM_) GGML_PY_OP_COUNT };
enum ggml_py_unary_op { GGML_PY_UNARY_OPS(GGML_PY_UNARY_OP_ENUM_) GGML_PY_UNARY_OP_COUNT };
enum ggml_py_glu_op   { GGML_PY_GLU_OPS(GGML_PY_GLU_OP_ENUM_) GGML_PY_GLU_OP_COUNT };
static const char * const ggml_py_op_names[]       = { GGML_PY_OPS(GGML_PY_NAME_) };
static const char * const ggml_py_unary_op_names[] = { GGML_PY_UNARY_OPS(GGML_PY_NAME_) };
static const char * const ggml_py_glu_op_names[]   = { GGML_PY_GLU_OPS(GGML_PY_NAME_) };
// enum ggml_py_<kind> { GGML_PY_<KIND>_<NAME> = value, ... }, ggml_py_<kind>_names and
// ggml_py_<kind>_values (of GGML_PY_N_<KIND>S entries) for each list of named values
#define GGML_PY_VALUE_ENUM_(KIND, NAME, v) GGML_PY_##KIND##_##NAME = v,
#define GGML_PY_VALUE_NAME_(KIND, NAME, v) #NAME,
#define GGML_PY_VALUE_(KIND, NAME, v)      v,
#define GGML_PY_NAMED_VALUES_(LIST, kind)                                   \
    enum ggml_py_##kind { LIST(GGML_PY_VALUE_ENUM_) };                      \
    static const char * const ggml_py_##kind##_names[] = { LIST(GGML_PY_VALUE_NAME_) }; \
    static const int ggml_py_##kind##_values[] = { LIST(GGML_PY_VALUE_) };
GGML_PY_NAMED_VALUES_(GGML_PY_ROPE_TYPES, rope_type)
GGML_PY_NAMED_VALUES_(GGML_PY_PRECS, prec)
#define GGML_PY_N_ROPE_TYPES ((int)(sizeof(ggml_py_rope_type_values) / sizeof(int)))
#define GGML_PY_N_PRECS      ((int)(sizeof(ggml_py_prec_values) / sizeof(int)))
#undef GGML_PY_VALUE_ENUM_
#undef GGML_PY_VALUE_NAME_
#undef GGML_PY_VALUE_
#undef GGML_PY_NAMED_VALUES_
#undef GGML_PY_OP_ENUM_
#undef GGML_PY_UNARY_OP_ENUM_
#undef GGML_PY_GLU_OP_ENUM_
#undef GGML_PY_NAME_

// ggml 0.10.1's vocabulary, id for id: its counts (GGML_OP_COUNT, GGML_UNARY_OP_COUNT,
// GGML_GLU_OP_COUNT) are one past its last entries. A newer ggml's unary and GLU ops come
// after them, as ggml appends those (a new unary op is one line at the end of its list).
// The names themselves are checked against ggml's own in tests/test_op_metadata.py.
_Static_assert(GGML_PY_OP_GLU + 1 == 96, "ggml 0.10.1 has 96 ops");
_Static_assert(GGML_PY_UNARY_OP_TRUNC + 1 == 22, "ggml 0.10.1 has 22 unary ops");
_Static_assert(GGML_PY_GLU_OP_GEGLU_QUICK + 1 == 6, "ggml 0.10.1 has 6 GLU ops");
