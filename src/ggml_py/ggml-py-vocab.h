// ggml 0.10.1's element types, listed once. The C kernels include this header, Cython
// cimports its table (_ggml.pxd), and ggml_py._core builds its name tables from it: a
// new type is one line here, plus its kernels.
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
