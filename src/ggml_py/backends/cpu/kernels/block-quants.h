// The block types of ggml 0.10.1 beyond q8_0 / q4_0: their layouts, row conversions and
// dot products, with ggml's numerics.
//
// Every type T here has (n is a whole number of T's blocks):
//   gp_dequantize_row_T(x, y, n)     ggml's to_float (dequantize_row_T), bit for bit
//   gp_quantize_row_T_ref(x, y, n)   ggml's from_float_ref (quantize_row_T_ref, which
//                                    ggml_quantize_chunk runs without an importance matrix)
//   gp_quantize_row_T(x, y, n)       ggml-cpu's from_float (x86 build): what CPY / SET_ROWS
//                                    write and how src1 of a MUL_MAT becomes the vec_dot type
// and the weight types a dot product with their vec_dot type (ggml-cpu's type traits):
//   gp_vec_dot_T_V_baseline / _avx2 / _avx512(n, s, x, y)
//                                    *s = row x (n values of T) . row y (n values of V)
// The _avx2 ones sum in the order of ggml's x86 AVX2 vec_dot, so that they give its bits
// (_avx512: the same code compiled with AVX-512's encodings, the same bits);
// the _baseline ones (any CPU) follow ggml's generic C code. Files: quants-legacy.c and
// quants-k.c hold the conversions, dot-legacy.c and dot-k.c the dots (compiled once per
// instruction set, as simd.c).
//
// Blocks are read and written byte by byte, little-endian, in ggml-common.h's layouts.

#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// elements per block and bytes per block (ggml-common.h)
#define QK4_1       32
#define QK5_0       32
#define QK5_1       32
#define QK8_1       32
#define QK_K        256
#define QK4_NL      32
#define QK_MXFP4    32
#define Q4_1_BYTES  20      // f16 d, f16 m, 16 bytes of nibbles
#define Q5_0_BYTES  22      // f16 d, 4 bytes of fifth bits, 16 bytes of nibbles
#define Q5_1_BYTES  24      // f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles
#define Q8_1_BYTES  36      // f16 d, f16 s (= d * sum of qs), 32 int8
#define Q2_K_BYTES  84      // 16 scales/mins, 64 bytes of 2-bit values, f16 d, f16 dmin
#define Q3_K_BYTES  110     // 32 bytes hmask, 64 bytes of 2-bit values, 12 bytes scales, f16 d
#define Q4_K_BYTES  144     // f16 d, f16 dmin, 12 bytes scales/mins, 128 bytes of nibbles
#define Q5_K_BYTES  176     // f16 d, f16 dmin, 12 bytes scales/mins, 32 bytes qh, 128 bytes qs
#define Q6_K_BYTES  210     // 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d
#define Q8_K_BYTES  292     // float d, 256 int8, 16 int16 bsums
#define IQ4_NL_BYTES 18     // f16 d, 16 bytes of nibbles (indices into the iq4_nl table)
#define IQ4_XS_BYTES 136    // f16 d, uint16 scales_h, 4 bytes scales_l, 128 bytes of nibbles
#define MXFP4_BYTES 17      // e8m0 exponent, 16 bytes of nibbles (fp4 e2m1 indices)

typedef void (*gp_to_float_fn)(const void * x, float * y, int64_t n);
typedef void (*gp_from_float_fn)(const float * x, void * y, int64_t n);
typedef void (*gp_vec_dot_fn)(int64_t n, float * s, const void * x, const void * y);

// the conversions of one type
#define GP_BLOCK_CONVERSIONS(T)                                          \
    void gp_dequantize_row_##T(const void * x, float * y, int64_t n);    \
    void gp_quantize_row_##T##_ref(const float * x, void * y, int64_t n); \
    void gp_quantize_row_##T(const float * x, void * y, int64_t n);

// the dot of a weight type T with its vec_dot type V, per instruction set
#define GP_BLOCK_DOT(T, V)                                                                    \
    void gp_vec_dot_##T##_##V##_baseline(int64_t n, float * s, const void * x, const void * y); \
    void gp_vec_dot_##T##_##V##_avx2(int64_t n, float * s, const void * x, const void * y);     \
    void gp_vec_dot_##T##_##V##_avx512(int64_t n, float * s, const void * x, const void * y);

GP_BLOCK_CONVERSIONS(q4_1)
GP_BLOCK_CONVERSIONS(q5_0)
GP_BLOCK_CONVERSIONS(q5_1)
GP_BLOCK_CONVERSIONS(q8_1)
GP_BLOCK_CONVERSIONS(iq4_nl)
GP_BLOCK_CONVERSIONS(iq4_xs)
GP_BLOCK_CONVERSIONS(mxfp4)
GP_BLOCK_CONVERSIONS(q2_K)
GP_BLOCK_CONVERSIONS(q3_K)
GP_BLOCK_CONVERSIONS(q4_K)
GP_BLOCK_CONVERSIONS(q5_K)
GP_BLOCK_CONVERSIONS(q6_K)
GP_BLOCK_CONVERSIONS(q8_K)

GP_BLOCK_DOT(q4_1, q8_1)
GP_BLOCK_DOT(q5_0, q8_0)
GP_BLOCK_DOT(q5_1, q8_1)
GP_BLOCK_DOT(iq4_nl, q8_0)
GP_BLOCK_DOT(iq4_xs, q8_K)
GP_BLOCK_DOT(mxfp4, q8_0)
GP_BLOCK_DOT(q2_K, q8_K)
GP_BLOCK_DOT(q3_K, q8_K)
GP_BLOCK_DOT(q4_K, q8_K)
GP_BLOCK_DOT(q5_K, q8_K)
GP_BLOCK_DOT(q6_K, q8_K)

// ggml's value tables: iq4_nl / iq4_xs nibbles, and mxfp4's e2m1 values doubled
extern const int8_t gp_kvalues_iq4nl[16];
extern const int8_t gp_kvalues_mxfp4[16];

#ifdef __cplusplus
}
#endif
