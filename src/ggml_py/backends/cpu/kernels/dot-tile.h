// Dot tiles (gp_dot_tile, cpu-impl.h) of every weight type, for the hot-loop files
// (simd.c, dot-k.c, dot-legacy.c; compiled once per instruction set):
//
//   TILE_DISPATCH(name, tile, TM, TN, MV)
//       the definition (external; prefix `static` for a file's own) of an rm x rn
//       gp_dot_tile `name` that cuts its request into register tiles of
//       constant sizes for the always-inline tile(k, a, lda, RM, b, RN, c): up to MV
//       weight rows when there is one column (matrix-vector), up to TM x TN otherwise
//   BLOCK_TILE(T, QK, XB, YB, S, STATE, PF)
//       the tile of a type read by a per-product block step (dot-k.c, dot-legacy.c):
//       tile_T runs, for every product (i, j), the type's vec_dot: T_init(&st), then
//       T_step(&st, x, y) per S blocks (QK values: XB weight bytes, YB activation bytes),
//       then T_fin(&st, x, y, left) with the `left` < S blocks after them. Each product
//       keeps its own state and float order, so c[j][i] has the bits of the type's
//       vec_dot (which is this tile at 1 x 1); the compiler shares what the steps of one
//       block have in common (a weight block's loads and unpacking across the columns,
//       an activation block's across the rows). PF: with one column, prefetch the next
//       weight rows while these stream.

#pragma once

#define TILE_MAX_M 8
#define TILE_MAX_N 3

// one constant-size call of the dispatch below, compiled only where the shape is used
#define TILE_CASE_(tile, M, N, TM, TN, MV)                                                 \
    case N * 16 + M:                                                                       \
        if ((N == 1 && M <= MV) || (N > 1 && N <= TN && M <= TM)) tile(k, ai, lda, M, bj, N, cc); \
        break;

#define TILE_DISPATCH(name, tile, TM, TN, MV)                                              \
void name(int64_t k, const char * a, size_t lda, int rm,                            \
                 const void * const * b, int rn, float * const * c) {                      \
    float * cc[TILE_MAX_N];                                                                \
    for (int j0 = 0; j0 < rn; j0 += TN) {                                                  \
        const int n = GP_MIN(TN, rn - j0);                                                 \
        const int mstep = n == 1 ? MV : TM;                                                \
        for (int i0 = 0; i0 < rm; i0 += mstep) {                                           \
            const int m = GP_MIN(mstep, rm - i0);                                          \
            for (int j = 0; j < n; j++) cc[j] = c[j0 + j] + i0;                            \
            const char * ai = a + i0 * lda;                                                \
            const void * const * bj = b + j0;                                              \
            switch (n * 16 + m) {                                                          \
            TILE_CASE_(tile, 1, 1, TM, TN, MV) TILE_CASE_(tile, 2, 1, TM, TN, MV)          \
            TILE_CASE_(tile, 3, 1, TM, TN, MV) TILE_CASE_(tile, 4, 1, TM, TN, MV)          \
            TILE_CASE_(tile, 5, 1, TM, TN, MV) TILE_CASE_(tile, 6, 1, TM, TN, MV)          \
            TILE_CASE_(tile, 7, 1, TM, TN, MV) TILE_CASE_(tile, 8, 1, TM, TN, MV)          \
            TILE_CASE_(tile, 1, 2, TM, TN, MV) TILE_CASE_(tile, 2, 2, TM, TN, MV)          \
            TILE_CASE_(tile, 3, 2, TM, TN, MV) TILE_CASE_(tile, 4, 2, TM, TN, MV)          \
            TILE_CASE_(tile, 1, 3, TM, TN, MV) TILE_CASE_(tile, 2, 3, TM, TN, MV)          \
            TILE_CASE_(tile, 3, 3, TM, TN, MV) TILE_CASE_(tile, 4, 3, TM, TN, MV)          \
            default: break;                                                                \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
}

#ifdef GP_SIMD_AVX2
#include <immintrin.h>

// acc plus the int32 pair sums of sc * p (int16 lanes): AVX-512 VNNI in one instruction;
// the sums are exact either way (the block types' products are far from int32's range)
static inline __attribute__((always_inline)) __m256i madd_add(__m256i acc, __m256i sc, __m256i p) {
#ifdef GP_SIMD_AVX512
    return _mm256_dpwssd_epi32(acc, sc, p);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(sc, p));
#endif
}

// ggml's hsum_float_8 (arch/x86): the sum of 8 float lanes, in its order
static inline __attribute__((always_inline)) float hsum8(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

#define TILE_PREFETCH_(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define TILE_PREFETCH_(p) __builtin_prefetch(p)
#endif

#define BLOCK_TILE(T, QK, XB, YB, S, STATE, PF)                                            \
static inline __attribute__((always_inline))                                               \
void tile_##T(int64_t k, const char * a, size_t lda, const int RM,                         \
              const void * const * b, const int RN, float * const * c) {                   \
    STATE st[TILE_MAX_M][TILE_MAX_N];                                                      \
    for (int i = 0; i < RM; i++)                                                           \
        for (int j = 0; j < RN; j++) T##_init(&st[i][j]);                                  \
    const int64_t nb = k / (QK);                                                           \
    const uint8_t * x = (const uint8_t *)a;                                                \
    const uint8_t * y[TILE_MAX_N];                                                         \
    for (int j = 0; j < RN; j++) y[j] = (const uint8_t *)b[j];                             \
    const char * pf = a + RM * lda;                                                        \
    const size_t pf_step = (PF) && RN == 1 ? RM * lda / (size_t)(nb / (S) + 1) : 0;        \
    int64_t ib = 0;                                                                        \
    for (; ib + (S) <= nb; ib += (S)) {                                                    \
        for (size_t o = 0; o < pf_step; o += 64) TILE_PREFETCH_(pf + o);                   \
        pf += pf_step;                                                                     \
        for (int i = 0; i < RM; i++)                                                       \
            for (int j = 0; j < RN; j++)                                                   \
                T##_step(&st[i][j], x + i * lda + ib * (XB), y[j] + ib * (YB));            \
    }                                                                                      \
    for (int j = 0; j < RN; j++)                                                           \
        for (int i = 0; i < RM; i++)                                                       \
            c[j][i] = T##_fin(&st[i][j], x + i * lda + ib * (XB), y[j] + ib * (YB), nb - ib); \
}                                                                                          \
/* the type's vec_dot: the tile at 1 x 1 */                                                \
static inline __attribute__((always_inline))                                               \
void vec_dot_tile_##T(int64_t n, float * s, const void * x, const void * y) {              \
    tile_##T(n, (const char *)x, 0, 1, &y, 1, &s);                                         \
}
