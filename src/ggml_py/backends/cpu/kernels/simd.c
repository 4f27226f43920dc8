// The hot loops of the CPU executor, compiled once per instruction set: with
// GP_SIMD_AVX2 (and -mavx2 -mfma -mf16c) this file defines gp_simd_avx2, with
// GP_SIMD_AVX512 too (and AVX-512's flags) gp_simd_avx512, without either
// gp_simd_baseline (plain C that runs on any CPU). Nothing here is called unless the
// CPU has the instruction set (gp_isa_set checks CPUID).
//
// The tile table (gp_simd.tile) holds every weight type's dot tile: the float types' and
// q8_0 / q4_0's are here, the other block types' (AVX2 / AVX-512 builds) in dot-k.c and
// dot-legacy.c, made from their vec_dot's block step (dot-tile.h).
//
// Dot tiles (gp_dot_tile in cpu-impl.h) compute rm x rn dot products at once, so that
// each weight row loaded feeds rn products and each activation row rm: the register
// tiles are 8x1 (matrix-vector; 2x1 q8_0, 4x1 q4_0: measured at 4096 x 4096) and 4x3
// (f32/f16/bf16) or 4x2 (q8_0/q4_0) otherwise.
// Each product keeps one 8-lane accumulator, summed in a fixed order, whatever the
// tile: results do not depend on tiling or threads.
//   f32/f16/bf16: lane l sums a[k] * b[k] over k = l mod 8, one FMA per step; then
//                 ggml's hsum_float_8; then the k % 8 tail, in order.
//   q8_0/q4_0:    ggml's AVX2 vec_dot_q8_0_q8_0 / q4_0_q8_0 per product exactly: per
//                 block, integer pair sums (8 lanes of 4 products) times d_a * d_b,
//                 FMA-accumulated, then hsum_float_8.
// The baseline keeps the float lanes with separate multiplies and adds, and sums a q8_0
// block's integer products at once (exact) before scaling.

#include "cpu-impl.h"
#include "dot-tile.h"

#include <pthread.h>
#include <stdlib.h>

#ifdef GP_SIMD_AVX2
#include <immintrin.h>
#endif
#define GP_SIMD_STR_(x) #x
#define GP_SIMD_STR(x)  GP_SIMD_STR_(x)

#define INLINE static inline __attribute__((always_inline))

// ---------------------------------------------------------------------------
// element loads of the float weight types

INLINE float load1_f32(const char * a, int64_t k)  { return ((const float *)a)[k]; }
INLINE float load1_f16(const char * a, int64_t k)  { return gp_h2f(((const uint16_t *)a)[k]); }
INLINE float load1_bf16(const char * a, int64_t k) { return gp_bf2f(((const uint16_t *)a)[k]); }

#ifdef GP_SIMD_AVX2

INLINE __m256 load8_f32(const char * a, int64_t k) { return _mm256_loadu_ps((const float *)a + k); }
INLINE __m256 load8_f16(const char * a, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)a + k)));
}
INLINE __m256 load8_bf16(const char * a, int64_t k) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)a + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// an f16 scale: F16C, as ggml's GGML_CPU_FP16_TO_FP32 on x86 (the bits of gp_h2f)
INLINE float scale_f16(const uint8_t * p) { return _cvtsh_ss(gp_load_le16(p)); }

#define FLOAT_TILE(T)                                                                      \
INLINE void tile_##T(int64_t k, const char * a, size_t lda, const int RM,                  \
                     const void * const * b, const int RN, float * const * c) {            \
    __m256 acc[8][3];                                                                      \
    const float * bj[3];                                                                   \
    for (int j = 0; j < RN; j++) {                                                         \
        bj[j] = (const float *)b[j];                                                       \
        for (int i = 0; i < RM; i++) acc[i][j] = _mm256_setzero_ps();                      \
    }                                                                                      \
    const int64_t k8 = k & ~(int64_t)7;                                                    \
    /* matrix-vector: fetch the next rows while these stream (rows are read in parallel,  \
       which the hardware prefetchers follow less well than one sequential stream) */      \
    const char * pf = a + RM * lda;                                                        \
    const size_t pf_step = RN == 1 ? RM * lda / (size_t)(k8 / 8 + 1) : 0;                  \
    for (int64_t kk = 0; kk < k8; kk += 8) {                                               \
        if (RN == 1) {                                                                     \
            for (size_t o = 0; o < pf_step; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);    \
            pf += pf_step;                                                                 \
        }                                                                                  \
        __m256 bv[3];                                                                      \
        for (int j = 0; j < RN; j++) bv[j] = _mm256_loadu_ps(bj[j] + kk);                  \
        for (int i = 0; i < RM; i++) {                                                     \
            __m256 av = load8_##T(a + i * lda, kk);                                        \
            for (int j = 0; j < RN; j++) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]); \
        }                                                                                  \
    }                                                                                      \
    for (int j = 0; j < RN; j++) {                                                         \
        for (int i = 0; i < RM; i++) {                                                     \
            float s = hsum8(acc[i][j]);                                                    \
            for (int64_t kk = k8; kk < k; kk++) s += load1_##T(a + i * lda, kk) * bj[j][kk]; \
            c[j][i] = s;                                                                   \
        }                                                                                  \
    }                                                                                      \
}

// the integer pair sums of ggml's mul_sum_i8_pairs_float: 8 lanes of 4 products each
// (AVX-512 VNNI sums them in one instruction; the 16-bit pair sums of the two-step form
// cannot saturate for these values, so both give the same integers)
INLINE __m256 i8_pair_sums(__m256i ax, __m256i x, __m256i y) {
    const __m256i sy  = _mm256_sign_epi8(y, x);
#ifdef GP_SIMD_AVX512
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
#else
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
#endif
}

INLINE __m256i load_q8_0(const uint8_t * blk) { return _mm256_loadu_si256((const __m256i *)(blk + 2)); }
// ggml's bytes_from_nibbles_32, minus 8
INLINE __m256i load_q4_0(const uint8_t * blk) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)(blk + 2));
    const __m256i bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    return _mm256_sub_epi8(_mm256_and_si256(bytes, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

#define QUANT_TILE(T, BYTES)                                                               \
INLINE void tile_##T(int64_t k, const char * a, size_t lda, const int RM,                  \
                     const void * const * b, const int RN, float * const * c) {            \
    __m256 acc[8][3];                                                                      \
    for (int j = 0; j < RN; j++)                                                           \
        for (int i = 0; i < RM; i++) acc[i][j] = _mm256_setzero_ps();                      \
    const int64_t nb = k / 32;                                                             \
    const char * pf = a + RM * lda;                     /* (as in FLOAT_TILE) */           \
    const size_t pf_step = RN == 1 ? RM * lda / (size_t)(nb + 1) : 0;                      \
    for (int64_t ib = 0; ib < nb; ib++) {                                                  \
        if (RN == 1) {                                                                     \
            for (size_t o = 0; o < pf_step; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);    \
            pf += pf_step;                                                                 \
        }                                                                                  \
        __m256i by[3];                                                                     \
        float   dy[3];                                                                     \
        for (int j = 0; j < RN; j++) {                                                     \
            const uint8_t * yb = (const uint8_t *)b[j] + ib * Q8_0_BYTES;                  \
            by[j] = load_q8_0(yb);                                                         \
            dy[j] = scale_f16(yb);                                                         \
        }                                                                                  \
        for (int i = 0; i < RM; i++) {                                                     \
            const uint8_t * xb = (const uint8_t *)(a + i * lda) + ib * BYTES;              \
            const __m256i qx = load_##T(xb);                                               \
            const __m256i ax = _mm256_sign_epi8(qx, qx);                                   \
            const float   dx = scale_f16(xb);                                              \
            for (int j = 0; j < RN; j++) {                                                 \
                const __m256 q = i8_pair_sums(ax, qx, by[j]);                              \
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[j]), q, acc[i][j]);     \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    for (int j = 0; j < RN; j++)                                                           \
        for (int i = 0; i < RM; i++) c[j][i] = hsum8(acc[i][j]);                           \
}

#else   // baseline: the same lanes in plain C

INLINE float hsum8(const float * v) {
    float r0 = v[4] + v[0], r1 = v[5] + v[1], r2 = v[6] + v[2], r3 = v[7] + v[3];
    r0 = r0 + r2;
    r1 = r1 + r3;
    return r0 + r1;
}

// Each weight row's 8 values of a step are converted once and feed every column; the
// fixed-size loops over 8 lanes compile to SSE2 vectors.
#define FLOAT_TILE(T)                                                                      \
INLINE void tile_##T(int64_t k, const char * a, size_t lda, const int RM,                  \
                     const void * const * b, const int RN, float * const * c) {            \
    float acc[8][3][8] = {{{0}}};                                                          \
    const int64_t k8 = k & ~(int64_t)7;                                                    \
    for (int64_t kk = 0; kk < k8; kk += 8) {                                               \
        for (int i = 0; i < RM; i++) {                                                     \
            float av[8];                                                                   \
            for (int l = 0; l < 8; l++) av[l] = load1_##T(a + i * lda, kk + l);            \
            for (int j = 0; j < RN; j++) {                                                 \
                const float * bj = (const float *)b[j] + kk;                               \
                for (int l = 0; l < 8; l++) acc[i][j][l] += av[l] * bj[l];                 \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    for (int j = 0; j < RN; j++) {                                                         \
        const float * bj = (const float *)b[j];                                            \
        for (int i = 0; i < RM; i++) {                                                     \
            float s = hsum8(acc[i][j]);                                                    \
            for (int64_t kk = k8; kk < k; kk++) s += load1_##T(a + i * lda, kk) * bj[kk];  \
            c[j][i] = s;                                                                   \
        }                                                                                  \
    }                                                                                      \
}

// a block's 32 values as int8 (q4_0: nibble - 8)
INLINE void unpack_q8_0(const uint8_t * blk, int8_t * q) { memcpy(q, blk + 2, 32); }
INLINE void unpack_q4_0(const uint8_t * blk, int8_t * q) {
    for (int m = 0; m < 16; m++) {
        q[m]      = (int8_t)((blk[2 + m] & 0x0F) - 8);
        q[m + 16] = (int8_t)((blk[2 + m] >> 4) - 8);
    }
}

// A block's integer dot product is exact in any order, so the baseline sums all 32
// products at once (a loop compilers vectorise) and scales once per block.
#define QUANT_TILE(T, BYTES)                                                               \
INLINE void tile_##T(int64_t k, const char * a, size_t lda, const int RM,                  \
                     const void * const * b, const int RN, float * const * c) {            \
    float acc[8][3] = {{0}};                                                               \
    const int64_t nb = k / 32;                                                             \
    for (int64_t ib = 0; ib < nb; ib++) {                                                  \
        for (int i = 0; i < RM; i++) {                                                     \
            const uint8_t * xb = (const uint8_t *)(a + i * lda) + ib * BYTES;              \
            int8_t xq[32];                                                                 \
            unpack_##T(xb, xq);                                                            \
            const float dx = gp_h2f(gp_load_le16(xb));                                     \
            for (int j = 0; j < RN; j++) {                                                 \
                const uint8_t * yb = (const uint8_t *)b[j] + ib * Q8_0_BYTES;              \
                const int8_t * yq = (const int8_t *)(yb + 2);                              \
                int32_t sum = 0;                                                           \
                for (int m = 0; m < 32; m++) sum += (int32_t)xq[m] * yq[m];                \
                acc[i][j] += dx * gp_h2f(gp_load_le16(yb)) * (float)sum;                   \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    for (int j = 0; j < RN; j++)                                                           \
        for (int i = 0; i < RM; i++) c[j][i] = acc[i][j];                                  \
}

#endif

FLOAT_TILE(f32)
FLOAT_TILE(f16)
FLOAT_TILE(bf16)
QUANT_TILE(q8_0, Q8_0_BYTES)
QUANT_TILE(q4_0, Q4_0_BYTES)

// ---------------------------------------------------------------------------
// rm x rn requests -> register tiles with constant sizes (dot-tile.h; the compiler keeps
// their accumulators in registers): rn = 1 takes up to MV rows at once, more columns up
// to TM rows and TN columns

#define DOT_FN(T, TM, TN, MV) static TILE_DISPATCH(dot_##T, tile_##T, TM, TN, MV)

DOT_FN(f32, 4, 3, 8)
DOT_FN(q8_0, 4, 2, 2)
DOT_FN(q4_0, 4, 2, 4)
#ifdef GP_SIMD_AVX2
DOT_FN(f16, 4, 3, 8)
DOT_FN(bf16, 4, 3, 8)
#else
// Without F16C a half costs a dozen integer operations: the weight rows are widened to
// float32 once per call (exactly) and go through the f32 tiles, the same sums.
static _Thread_local float * widened;
static _Thread_local size_t widened_cap;

#define WIDEN_DOT_FN(T, widen_row)                                                         \
static void dot_##T(int64_t k, const char * a, size_t lda, int rm,                         \
                    const void * const * b, int rn, float * const * c) {                   \
    const size_t need = (size_t)rm * (size_t)k;                                            \
    if (need > widened_cap) {                                                              \
        float * w = realloc(widened, need * sizeof(float));                                \
        if (!w) {                       /* (no memory: convert element by element) */      \
            for (int i = 0; i < rm; i++)                                                   \
                for (int j = 0; j < rn; j++) {                                             \
                    float s = 0;                                                           \
                    for (int64_t kk = 0; kk < k; kk++)                                     \
                        s += load1_##T(a + i * lda, kk) * ((const float *)b[j])[kk];       \
                    c[j][i] = s;                                                           \
                }                                                                          \
            return;                                                                        \
        }                                                                                  \
        widened = w;                                                                       \
        widened_cap = need;                                                                \
    }                                                                                      \
    for (int i = 0; i < rm; i++) widen_row((const uint16_t *)(a + i * lda), widened + i * k, k); \
    dot_f32(k, (const char *)widened, (size_t)k * sizeof(float), rm, b, rn, c);            \
}

// every half's float, as ggml's CPU keeps one where it has no F16C (256 KiB, built once)
static float h2f_table[1 << 16];
static pthread_once_t h2f_once = PTHREAD_ONCE_INIT;
static void build_h2f_table(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) h2f_table[h] = gp_h2f((uint16_t)h);
}

static void widen_f16(const uint16_t * x, float * y, int64_t n) {
    pthread_once(&h2f_once, build_h2f_table);
    for (int64_t i = 0; i < n; i++) y[i] = h2f_table[x[i]];
}
static void widen_bf16(const uint16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = gp_bf2f(x[i]);
}
WIDEN_DOT_FN(f16, widen_f16)
WIDEN_DOT_FN(bf16, widen_bf16)
#endif

// ---------------------------------------------------------------------------
// exp for SOFT_MAX and SiLU: AVX2 computes 2^n * p(r), r = x - n ln 2 (|r| <= ln2 / 2),
// p the degree-7 Taylor polynomial (relative error below 1e-8 on that interval, so
// results are within an ulp or two of expf); 2^n is applied as two powers so that
// overflow gives inf and underflow 0 or a subnormal. The baseline calls expf.

#ifdef GP_SIMD_AVX2
INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));  // NaN stays
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);           // ln 2, high part
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);                // and the rest
    __m256 q = _mm256_set1_ps(1.0f / 5040);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 720));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 120));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 24));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 6));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n);                     // -150 .. 128
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(q, s1), s2);
}
#endif

// y = exp(x - max); returns the sum of y (in double, as ggml_vec_soft_max_f32)
static double exp_sum(const float * x, float * y, int64_t n, float max) {
    int64_t i = 0;
    double sum = 0.0;
#ifdef GP_SIMD_AVX2
    const __m256 vmax = _mm256_set1_ps(max);
    for (; i + 8 <= n; i += 8) {
        const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(y + i, v);
        sum += (double)hsum8(v);
    }
#endif
    for (; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += (double)y[i];
    }
    return sum;
}

// y = silu(x) * g = x / (1 + exp(-x)) * g (g NULL: silu(x))
static void silu_mul(const float * x, const float * g, float * y, int64_t n) {
    int64_t i = 0;
#ifdef GP_SIMD_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
        if (g) r = _mm256_mul_ps(r, _mm256_loadu_ps(g + i));
        _mm256_storeu_ps(y + i, r);
    }
#endif
    for (; i < n; i++) {
        const float r = x[i] / (1.0f + expf(-x[i]));
        y[i] = g ? r * g[i] : r;
    }
}

// ---------------------------------------------------------------------------
// f16 rows (F16C gives the bits of the scalar conversions in cpu-impl.h)

static void f16_to_f32(const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
#ifdef GP_SIMD_AVX2
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
#endif
    for (; i < n; i++) {
        y[i] = gp_h2f(x[i]);
    }
}

static void f32_to_f16(const float * x, uint16_t * y, int64_t n) {
    int64_t i = 0;
#ifdef GP_SIMD_AVX2
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++) {
        y[i] = gp_f2h(x[i]);
    }
}

static void round_f16(const float * x, float * y, int64_t n) {
    int64_t i = 0;
#ifdef GP_SIMD_AVX2
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        y[i] = gp_round_f16(x[i]);
    }
}

// ---------------------------------------------------------------------------
// FLASH_ATTN_EXT's V accumulation: m steps into one query row's accumulator, each
// acc = acc * ms[t] where ms[t] != 1 (a new maximum), then acc += v[t] * vs[t], as ggml's
// ggml_vec_scale_f16 / ggml_vec_mad_f16 (f16 accumulator: every step rounds to f16) and
// ggml_vec_scale_f32 / ggml_vec_mad_f32 do them. Each element sees the same operations in
// the same order as ggml's step-by-step loops; here a chunk of the accumulator stays in
// registers through all m steps. The vector part fuses the multiply-add, the tail (and the
// baseline) multiplies and adds separately, as ggml's scalar code.

INLINE float same1(float x) { return x; }

#ifdef GP_SIMD_AVX2
INLINE __m256 round8_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }
INLINE __m256 load8_h(const uint16_t * x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }
INLINE void store8_h(uint16_t * y, __m256 a) {
    _mm_storeu_si128((__m128i *)y, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
INLINE __m256 same8(__m256 x) { return x; }

// accumulator registers per pass: each step is a chain of dependent operations (an FMA and,
// for f16, the round trip through f16), so as many chains as the registers hold
#ifdef GP_SIMD_AVX512
#define ACC_REGS 16
#else
#define ACC_REGS 8
#endif

// NR registers of 8 values of type T at acc + i through the m steps
#define ACC_STEPS(NR, T, LOAD, ROUND, STORE)                                               \
    for (; i + 8 * (NR) <= n; i += 8 * (NR)) {                                             \
        __m256 a[NR];                                                                      \
        for (int r = 0; r < (NR); r++) a[r] = LOAD(acc + i + 8 * r);                       \
        for (int t = 0; t < m; t++) {                                                      \
            if (ms[t] != 1.0f) {                                                           \
                const __m256 vm = _mm256_set1_ps(ms[t]);                                   \
                for (int r = 0; r < (NR); r++) a[r] = ROUND(_mm256_mul_ps(a[r], vm));      \
            }                                                                              \
            const __m256 vv = _mm256_set1_ps(vs[t]);                                       \
            const T * x = (const T *)v[t] + i;                                             \
            for (int r = 0; r < (NR); r++)                                                 \
                a[r] = ROUND(_mm256_fmadd_ps(LOAD(x + 8 * r), vv, a[r]));                  \
        }                                                                                  \
        for (int r = 0; r < (NR); r++) STORE(acc + i + 8 * r, a[r]);                       \
    }
#define ACC_VECTOR(T, LOAD, ROUND, STORE) \
    ACC_STEPS(ACC_REGS, T, LOAD, ROUND, STORE) ACC_STEPS(1, T, LOAD, ROUND, STORE)
#else
#define ACC_VECTOR(T, LOAD, ROUND, STORE)
#endif

// acc_steps_f16 / _f32: the vector part (8-value loads LOAD8, rounding ROUND8, stores STORE8),
// then the tail one value at a time (LOAD1 widens, ROUND1 rounds, STORE1 narrows)
#define ACC_STEPS_FN(name, T, LOAD8, ROUND8, STORE8, LOAD1, ROUND1, STORE1)                 \
static void name(T * acc, const void * const * v, const float * ms, const float * vs, int m, int64_t n) { \
    int64_t i = 0;                                                                         \
    ACC_VECTOR(T, LOAD8, ROUND8, STORE8)                                                   \
    for (; i < n; i++) {                                                                   \
        float a = LOAD1(acc[i]);                                                           \
        for (int t = 0; t < m; t++) {                                                      \
            if (ms[t] != 1.0f) a = ROUND1(a * ms[t]);                                      \
            a = ROUND1(a + LOAD1(((const T *)v[t])[i]) * vs[t]);                           \
        }                                                                                  \
        acc[i] = STORE1(a);                                                                \
    }                                                                                      \
}

ACC_STEPS_FN(acc_steps_f16, uint16_t, load8_h, round8_f16, store8_h, gp_h2f, gp_round_f16, gp_f2h)
ACC_STEPS_FN(acc_steps_f32, float, _mm256_loadu_ps, same8, _mm256_storeu_ps, same1, same1, same1)

// FLASH_ATTN_EXT's tiled path (ggml's simd_gemm): nr (at most 6) float32 accumulators
// acc[r] of n values each plus the m float32 rows v[t] weighted by p[r][t], t in order,
// one FMA each; a V row's chunk, loaded once, feeds every accumulator
#ifdef GP_SIMD_AVX2
#define GEMM_CHUNKS (ACC_REGS / 4)      // registers of 8 per accumulator and pass
#define GEMM_ROWS   6
INLINE void gemm_pass(float * const * acc, const float * const * p, const int R, const void * const * v, int m,
                      int64_t i, const int C) {
    __m256 a[GEMM_ROWS][GEMM_CHUNKS];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) a[r][c] = _mm256_loadu_ps(acc[r] + i + 8 * c);
    for (int t = 0; t < m; t++) {
        const float * x = (const float *)v[t] + i;
        __m256 xv[GEMM_CHUNKS];
        for (int c = 0; c < C; c++) xv[c] = _mm256_loadu_ps(x + 8 * c);
        for (int r = 0; r < R; r++) {
            const __m256 pv = _mm256_set1_ps(p[r][t]);
            for (int c = 0; c < C; c++) a[r][c] = _mm256_fmadd_ps(xv[c], pv, a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) _mm256_storeu_ps(acc[r] + i + 8 * c, a[r][c]);
}
#define GEMM_PASSES(C)                                                                     \
    for (; i + 8 * (C) <= n; i += 8 * (C)) {                                               \
        switch (nr) {                                                                      \
            case 1: gemm_pass(acc, p, 1, v, m, i, C); break;                               \
            case 2: gemm_pass(acc, p, 2, v, m, i, C); break;                               \
            case 3: gemm_pass(acc, p, 3, v, m, i, C); break;                               \
            case 4: gemm_pass(acc, p, 4, v, m, i, C); break;                               \
            case 5: gemm_pass(acc, p, 5, v, m, i, C); break;                               \
            default: gemm_pass(acc, p, 6, v, m, i, C); break;                              \
        }                                                                                  \
    }
#endif

static void acc_gemm_f32(float * const * acc, const float * const * p, int nr, const void * const * v, int m,
                         int64_t n) {
    int64_t i = 0;
#ifdef GP_SIMD_AVX2
    GEMM_PASSES(GEMM_CHUNKS)
    GEMM_PASSES(1)
#endif
    for (; i < n; i++) {
        for (int r = 0; r < nr; r++) {
            float a = acc[r][i];
            for (int t = 0; t < m; t++) a += ((const float *)v[t])[i] * p[r][t];
            acc[r][i] = a;
        }
    }
}

#ifdef GP_SIMD_AVX512
static const gp_gemm gemm_q8_0 = {
    gp_gemm_q8_0_panel_size_avx512, gp_gemm_q8_0_pack_avx512, gp_gemm_q8_0_avx512,
};
#endif

const gp_simd GP_SIMD_FN(gp_simd) = {
    /* .name       = */ GP_SIMD_STR(GP_SIMD_SUFFIX),
    /* .tile       = */ {
        [GP_TYPE_F32]    = dot_f32,
        [GP_TYPE_F16]    = dot_f16,
        [GP_TYPE_BF16]   = dot_bf16,
        [GP_TYPE_Q8_0]   = dot_q8_0,
        [GP_TYPE_Q4_0]   = dot_q4_0,
#ifdef GP_SIMD_AVX2
        [GP_TYPE_Q4_1]   = GP_SIMD_FN(gp_dot_tile_q4_1),
        [GP_TYPE_Q5_0]   = GP_SIMD_FN(gp_dot_tile_q5_0),
        [GP_TYPE_Q5_1]   = GP_SIMD_FN(gp_dot_tile_q5_1),
        [GP_TYPE_Q2_K]   = GP_SIMD_FN(gp_dot_tile_q2_K),
        [GP_TYPE_Q3_K]   = GP_SIMD_FN(gp_dot_tile_q3_K),
        [GP_TYPE_Q4_K]   = GP_SIMD_FN(gp_dot_tile_q4_K),
        [GP_TYPE_Q5_K]   = GP_SIMD_FN(gp_dot_tile_q5_K),
        [GP_TYPE_Q6_K]   = GP_SIMD_FN(gp_dot_tile_q6_K),
        [GP_TYPE_IQ4_NL] = GP_SIMD_FN(gp_dot_tile_iq4_nl),
        [GP_TYPE_IQ4_XS] = GP_SIMD_FN(gp_dot_tile_iq4_xs),
        [GP_TYPE_MXFP4]  = GP_SIMD_FN(gp_dot_tile_mxfp4),
#endif
    },
    /* .f16_to_f32 = */ f16_to_f32,
    /* .f32_to_f16 = */ f32_to_f16,
    /* .round_f16  = */ round_f16,
    /* .exp_sum    = */ exp_sum,
    /* .silu_mul   = */ silu_mul,
    /* .acc_steps_f16 = */ acc_steps_f16,
    /* .acc_steps_f32 = */ acc_steps_f32,
    /* .acc_gemm_f32  = */ acc_gemm_f32,
    /* .vec_dot    = */ {
        [GP_TYPE_Q4_1]   = GP_SIMD_FN(gp_vec_dot_q4_1_q8_1),
        [GP_TYPE_Q5_0]   = GP_SIMD_FN(gp_vec_dot_q5_0_q8_0),
        [GP_TYPE_Q5_1]   = GP_SIMD_FN(gp_vec_dot_q5_1_q8_1),
        [GP_TYPE_Q2_K]   = GP_SIMD_FN(gp_vec_dot_q2_K_q8_K),
        [GP_TYPE_Q3_K]   = GP_SIMD_FN(gp_vec_dot_q3_K_q8_K),
        [GP_TYPE_Q4_K]   = GP_SIMD_FN(gp_vec_dot_q4_K_q8_K),
        [GP_TYPE_Q5_K]   = GP_SIMD_FN(gp_vec_dot_q5_K_q8_K),
        [GP_TYPE_Q6_K]   = GP_SIMD_FN(gp_vec_dot_q6_K_q8_K),
        [GP_TYPE_IQ4_NL] = GP_SIMD_FN(gp_vec_dot_iq4_nl_q8_0),
        [GP_TYPE_IQ4_XS] = GP_SIMD_FN(gp_vec_dot_iq4_xs_q8_K),
        [GP_TYPE_MXFP4]  = GP_SIMD_FN(gp_vec_dot_mxfp4_q8_0),
    },
#ifdef GP_SIMD_AVX512
    /* .gemm_q8_0  = */ &gemm_q8_0,
#else
    /* .gemm_q8_0  = */ NULL,
#endif
};
