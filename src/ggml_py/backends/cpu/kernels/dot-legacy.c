// Dot products of the legacy and non-linear block types with their vec_dot types
// (block-quants.h), compiled once per instruction set as simd.c: with GP_SIMD_AVX2 (and
// -mavx2 -mfma -mf16c) this file defines the gp_vec_dot_*_avx2 functions (_avx512 in the
// AVX-512 build, the same code), and with them the gp_dot_tile_* tiles of several rows
// and columns (dot-tile.h's BLOCK_TILE, whose 1 x 1 tile is the vec_dot); without it
// the gp_vec_dot_*_baseline ones.
//
// Integer products within a block are exact in any order; what decides the bits is the
// float part, which follows ggml 0.10.1:
//   baseline: the generic C code (ggml-cpu/quants.c): per block, the integer sum times
//             the scales, added to one float sum (no FMA);
//   avx2:     the x86 AVX2 code (ggml-cpu/arch/x86/quants.c): 8 lanes of integer pair
//             sums, converted and FMA-accumulated with the block's scale, hsum_float_8
//             at the end. The builds of ggml-cpu fuse q4_1 / q5_1's m * s into their
//             running sum (an FMA the compiler contracts), and so do these.
// The AVX2 signed products go through ggml's sign trick (|x| times y with x's sign), so
// a y byte of -128 against a negative x counts as +128 there, as in ggml, and not in the
// baseline; ggml's quantisers write -128 only into degenerate blocks (tiny values, whose
// scale rounds to 0, or inf / NaN).
//
// The unpacking: 16 bytes of nibbles are loaded into both halves of a register, the upper
// half shifted by 4, then masked (and looked up, for the table types) in one go.

#include "legacy-impl.h"
#include "dot-tile.h"

#ifdef GP_SIMD_AVX2
#include <immintrin.h>
#include <pthread.h>
#endif
#define DOT(T, V) GP_SIMD_FN(gp_vec_dot_##T##_##V)

// q8_K's float d (little-endian)
static inline float q8_K_scale(const uint8_t * blk) { return gp_u2f(gp_load_le32(blk)); }

#ifdef GP_SIMD_AVX2

#define INLINE static inline __attribute__((always_inline))

// Scales. F16C gives the bits of ggml's conversions, but the vector units are what these
// loops are short of: q5_0, iq4_nl and mxfp4 broadcast their scales straight from
// tables (as ggml reads its own), built once; q4_1 / q5_1 convert two halves at a time.

// the f16 at p (lane 0) and the one after it (lane 1); 4 bytes at p are inside the block
INLINE __m128 halves2(const uint8_t * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}
INLINE float scale_f16(const uint8_t * p) { return _mm_cvtss_f32(halves2(p)); }

static float h2f_table[1 << 16];         // every half's float
static float e8m0_table[256];            // every e8m0 exponent's 2^(e - 128)
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void build_tables(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) h2f_table[h] = gp_h2f((uint16_t)h);
    for (uint32_t e = 0; e < 256; e++) e8m0_table[e] = gp_e8m0_half((uint8_t)e);
}
// a scale from the tables in all 8 lanes (a broadcast load: no vector work)
INLINE __m256 f16_table8(const uint8_t * p) { return _mm256_broadcast_ss(&h2f_table[gp_load_le16(p)]); }
INLINE __m256 e8m0_table8(const uint8_t * p) { return _mm256_broadcast_ss(&e8m0_table[*p]); }

// 16 bytes in both halves, the upper half shifted right by 4 bits (a 32-bit shift: the
// bits that come down from the next byte are above the nibble the callers keep)
INLINE __m256i nibble_halves(const uint8_t * qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_srlv_epi32(b, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
}

// 32 nibbles as bytes 0..15 (low nibbles first)
INLINE __m256i nibbles32(const uint8_t * qs) {
    return _mm256_and_si256(nibble_halves(qs), _mm256_set1_epi8(0x0F));
}

// the 32 fifth bits as bytes 0xFF (set) / 0x00
INLINE __m256i bits32(const uint8_t * qh) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)gp_load_le32(qh)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

// 32 nibbles looked up in a 16-entry int8 table (in both halves of table)
INLINE __m256i lookup32(const uint8_t * qs, __m256i table) {
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

// unsigned x times signed y: 16 sums of two products (int16, no saturation here)
INLINE __m256i us8_pairs(__m256i ux, __m256i y) { return _mm256_maddubs_epi16(ux, y); }
// signed x times signed y, through ggml's sign trick
INLINE __m256i i8_pairs(__m256i x, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}
// 8 sums of four products, as floats: unsigned x times signed y, and signed by signed.
// AVX-512 VNNI sums the four in one instruction; the pair sums above cannot saturate for
// these blocks' values, so both forms give the same integers.
#ifdef GP_SIMD_AVX512
INLINE __m256 quads_us8(__m256i ux, __m256i y) {
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, y));
}
INLINE __m256 quads_i8(__m256i x, __m256i y) {
    return quads_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}
#else
INLINE __m256 quads(__m256i pairs) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
INLINE __m256 quads_us8(__m256i ux, __m256i y) { return quads(us8_pairs(ux, y)); }
INLINE __m256 quads_i8(__m256i x, __m256i y) { return quads(i8_pairs(x, y)); }
#endif

// Each type's vec_dot as a per-product state and a block step (dot-tile.h's BLOCK_TILE
// makes the tiles and the vec_dot of them): x, y point at one weight / activation block.

typedef struct { __m256 acc; } acc8_state;
INLINE void acc8_init(acc8_state * st) { st->acc = _mm256_setzero_ps(); }
INLINE float acc8_fin(const acc8_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    (void)x, (void)y, (void)left;
    return hsum8(st->acc);
}

// q4_1 / q5_1 (q5 = 1) against q8_1: hsum of d_x d_y * pair sums, plus the sum of m * s.
// (d, m) and (d, s) are converted as pairs: lane 0 of their product is d_x d_y, lane 1 of
// the FMA chain the sum of m * s, rounded once a step as ggml's contracted code.
typedef struct { __m256 acc; __m128 summs; } affine_state;
INLINE void affine_init(affine_state * st) { st->acc = _mm256_setzero_ps(); st->summs = _mm_setzero_ps(); }
INLINE float affine_fin(const affine_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    (void)x, (void)y, (void)left;
    return hsum8(st->acc) + _mm_cvtss_f32(_mm_movehdup_ps(st->summs));
}
INLINE void affine_step(affine_state * st, const uint8_t * x, const uint8_t * y, int q5) {
    const __m128 dmx = halves2(x), dsy = halves2(y);
    st->summs = _mm_fmadd_ps(dmx, dsy, st->summs);
    __m256i qx = nibbles32(x + (q5 ? 8 : 4));
    if (q5) qx = _mm256_or_si256(qx, _mm256_and_si256(bits32(x + 4), _mm256_set1_epi8(0x10)));
    const __m256i qy = _mm256_loadu_si256((const __m256i *)(y + 4));
    const __m256 d = _mm256_broadcastss_ps(_mm_mul_ss(dmx, dsy));
    st->acc = _mm256_fmadd_ps(d, quads_us8(qx, qy), st->acc);
}
#define q4_1_init affine_init
#define q4_1_fin  affine_fin
#define q5_1_init affine_init
#define q5_1_fin  affine_fin
INLINE void q4_1_step(affine_state * st, const uint8_t * x, const uint8_t * y) { affine_step(st, x, y, 0); }
INLINE void q5_1_step(affine_state * st, const uint8_t * x, const uint8_t * y) { affine_step(st, x, y, 1); }

INLINE void q5_0_init(acc8_state * st) {
    pthread_once(&tables_once, build_tables);
    acc8_init(st);
}
#define q5_0_fin acc8_fin
INLINE void q5_0_step(acc8_state * st, const uint8_t * x, const uint8_t * y) {
    // a clear fifth bit makes the byte nibble - 16
    const __m256i hi = _mm256_andnot_si256(bits32(x + 2), _mm256_set1_epi8((char)0xF0));
    const __m256i qx = _mm256_or_si256(nibbles32(x + 6), hi);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)(y + 2));
    const __m256 d = _mm256_mul_ps(f16_table8(x), f16_table8(y));
    st->acc = _mm256_fmadd_ps(d, quads_i8(qx, qy), st->acc);
}

// iq4_nl / mxfp4 against q8_0: two blocks a step into two accumulators, an odd last
// block in scalar code
typedef struct { __m256 acc0, acc1; } table_state;
INLINE void table_init(table_state * st) {
    pthread_once(&tables_once, build_tables);
    st->acc0 = _mm256_setzero_ps();
    st->acc1 = _mm256_setzero_ps();
}

// one iq4_nl / mxfp4 block against q8_0 into acc
INLINE __m256 table_block(const uint8_t * xb, const uint8_t * yb, int mx, __m256 acc) {
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(mx ? gp_kvalues_mxfp4 : gp_kvalues_iq4nl)));
    const __m256i qx = lookup32(xb + (mx ? 1 : 2), table);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb + 2));
    const __m256 d = _mm256_mul_ps(f16_table8(yb), mx ? e8m0_table8(xb) : f16_table8(xb));
    return _mm256_fmadd_ps(d, quads_i8(qx, qy), acc);
}

INLINE void table_step(table_state * st, const uint8_t * x, const uint8_t * y, int mx) {
    const size_t bytes = mx ? MXFP4_BYTES : IQ4_NL_BYTES;
    st->acc0 = table_block(x, y, mx, st->acc0);
    st->acc1 = table_block(x + bytes, y + Q8_0_BYTES, mx, st->acc1);
}

INLINE float table_fin(const table_state * st, const uint8_t * xb, const uint8_t * yb, int64_t left, int mx) {
    float sum = hsum8(_mm256_add_ps(st->acc0, st->acc1));
    if (left) {
        const int8_t * table8 = mx ? gp_kvalues_mxfp4 : gp_kvalues_iq4nl;
        const uint8_t * qs = xb + (mx ? 1 : 2);
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (int8_t)yb[2 + j] * table8[qs[j] & 0x0F] + (int8_t)yb[18 + j] * table8[qs[j] >> 4];
        }
        const float d = scale_f16(yb) * (mx ? gp_e8m0_half(xb[0]) : scale_f16(xb));
        sum += (float)sumi * d;
    }
    return sum;
}
#define iq4_nl_init table_init
#define mxfp4_init  table_init
INLINE void iq4_nl_step(table_state * st, const uint8_t * x, const uint8_t * y) { table_step(st, x, y, 0); }
INLINE void mxfp4_step(table_state * st, const uint8_t * x, const uint8_t * y) { table_step(st, x, y, 1); }
INLINE float iq4_nl_fin(const table_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    return table_fin(st, x, y, left, 0);
}
INLINE float mxfp4_fin(const table_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    return table_fin(st, x, y, left, 1);
}

#define iq4_xs_init acc8_init
#define iq4_xs_fin  acc8_fin
INLINE void iq4_xs_step(acc8_state * st, const uint8_t * x, const uint8_t * y) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)gp_kvalues_iq4nl));
    const uint32_t sl = gp_load_le32(x + 4);
    const uint16_t sh = gp_load_le16(x + 2);
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // (exact: any order)
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ib++) {
        const __m256i qx = lookup32(x + 8 + 16 * ib, table);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(y + 4 + 32 * ib));
        const __m256i ls = _mm256_set1_epi16((short)(gp_iq4_xs_scale(sl, sh, ib) - 32));
        sumi[ib % 2] = madd_add(sumi[ib % 2], ls, i8_pairs(qx, qy));
    }
    const __m256 d = _mm256_set1_ps(scale_f16(x) * q8_K_scale(y));
    st->acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[0], sumi[1])), st->acc);
}

// tiles: L_TM x L_TN with columns; with one column, 4 weight rows at a time for the
// 32-value types, 1 for iq4_xs (as the K-quants), and the next rows prefetched
// (measured at 4096 x 4096 weights by 1 column: iq4_nl 2 rows 560 us, 4 rows 517 us,
// 8 rows slower again; iq4_xs 1 row 562 us, 2 rows 576 us)
#ifndef L_TM
#ifdef GP_SIMD_AVX512
#define L_TM 4
#define L_TN 3
#else
#define L_TM 4
#define L_TN 2
#endif
#define L_PF 1
#endif

// T against V (blocks of QK values, XB / YB bytes), S blocks a step, MV rows for one column
#define L_TILE(T, V, QK, XB, YB, S, STATE, MV)                                             \
    BLOCK_TILE(T, QK, XB, YB, S, STATE, L_PF)                                              \
    void DOT(T, V)(int64_t n, float * s, const void * x, const void * y) { vec_dot_tile_##T(n, s, x, y); } \
    TILE_DISPATCH(GP_SIMD_FN(gp_dot_tile_##T), tile_##T, L_TM, L_TN, MV)

L_TILE(q4_1, q8_1, 32, Q4_1_BYTES, Q8_1_BYTES, 1, affine_state, 4)
L_TILE(q5_1, q8_1, 32, Q5_1_BYTES, Q8_1_BYTES, 1, affine_state, 4)
L_TILE(q5_0, q8_0, 32, Q5_0_BYTES, Q8_0_BYTES, 1, acc8_state, 4)
L_TILE(iq4_nl, q8_0, 32, IQ4_NL_BYTES, Q8_0_BYTES, 2, table_state, 4)
L_TILE(mxfp4, q8_0, 32, MXFP4_BYTES, Q8_0_BYTES, 2, table_state, 4)
L_TILE(iq4_xs, q8_K, QK_K, IQ4_XS_BYTES, Q8_K_BYTES, 1, acc8_state, 1)

#else   // baseline: ggml's generic C order

// sum of 32 products of int8
static inline int32_t dot32(const int8_t * a, const int8_t * b) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)a[j] * b[j];
    return s;
}

// sum of table[q] * y over 32 values, four bytes of nibbles a step (compilers that
// vectorise the plain loop gather the table values through the stack, far slower)
static inline int32_t dot32_table(const uint8_t * qs, const int8_t * table, const int8_t * y) {
    int32_t s = 0;
    for (int j = 0; j < 16; j += 4) {
        const uint32_t w = gp_load_le32(qs + j);
        for (int k = 0; k < 4; k++) {
            const uint32_t b = (w >> 8 * k) & 0xFF;
            s += table[b & 0x0F] * y[j + k] + table[b >> 4] * y[j + k + 16];
        }
    }
    return s;
}

static inline float dot_affine_q8_1(int64_t n, const uint8_t * x, const uint8_t * y, int q5) {
    const size_t bytes = q5 ? Q5_1_BYTES : Q4_1_BYTES;
    float sum = 0;
    uint8_t q[32];
    for (int64_t ib = 0; ib < n / 32; ib++, x += bytes, y += Q8_1_BYTES) {
        gp_unpack_nibbles(x + (q5 ? 8 : 4), q5 ? x + 4 : NULL, q);
        const int32_t sumi = dot32((const int8_t *)q, (const int8_t *)(y + 4));        // q < 32
        const float dd = gp_h2f(gp_load_le16(x)) * gp_h2f(gp_load_le16(y));
        sum += dd * (float)sumi + gp_h2f(gp_load_le16(x + 2)) * gp_h2f(gp_load_le16(y + 2));
    }
    return sum;
}

void DOT(q4_1, q8_1)(int64_t n, float * s, const void * x, const void * y) { *s = dot_affine_q8_1(n, x, y, 0); }
void DOT(q5_1, q8_1)(int64_t n, float * s, const void * x, const void * y) { *s = dot_affine_q8_1(n, x, y, 1); }

void DOT(q5_0, q8_0)(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx, * y = vy;
    float sum = 0;
    uint8_t q[32];
    int8_t v[32];
    for (int64_t ib = 0; ib < n / 32; ib++, x += Q5_0_BYTES, y += Q8_0_BYTES) {
        gp_unpack_nibbles(x + 6, x + 2, q);
        for (int j = 0; j < 32; j++) v[j] = (int8_t)(q[j] - 16);
        const int32_t sumi = dot32(v, (const int8_t *)(y + 2));
        sum += (gp_h2f(gp_load_le16(x)) * gp_h2f(gp_load_le16(y))) * (float)sumi;
    }
    *s = sum;
}

static inline float dot_table_q8_0(int64_t n, const uint8_t * x, const uint8_t * y, int mx) {
    const size_t bytes = mx ? MXFP4_BYTES : IQ4_NL_BYTES;
    float sum = 0;
    for (int64_t ib = 0; ib < n / 32; ib++, x += bytes, y += Q8_0_BYTES) {
        const int8_t * table = mx ? gp_kvalues_mxfp4 : gp_kvalues_iq4nl;
        const int32_t sumi = dot32_table(x + (mx ? 1 : 2), table, (const int8_t *)(y + 2));
        const float d = gp_h2f(gp_load_le16(y)) * (mx ? gp_e8m0_half(x[0]) : gp_h2f(gp_load_le16(x)));
        sum += d * (float)sumi;
    }
    return sum;
}

void DOT(iq4_nl, q8_0)(int64_t n, float * s, const void * x, const void * y) { *s = dot_table_q8_0(n, x, y, 0); }
void DOT(mxfp4, q8_0)(int64_t n, float * s, const void * x, const void * y)  { *s = dot_table_q8_0(n, x, y, 1); }

void DOT(iq4_xs, q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx, * y = vy;
    float sum = 0;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += IQ4_XS_BYTES, y += Q8_K_BYTES) {
        const float d4d8 = gp_h2f(gp_load_le16(x)) * q8_K_scale(y);
        const uint32_t sl = gp_load_le32(x + 4);
        const uint16_t sh = gp_load_le16(x + 2);
        for (int ib = 0; ib < 8; ib++) {
            const int32_t sumi = dot32_table(x + 8 + 16 * ib, gp_kvalues_iq4nl, (const int8_t *)(y + 4 + 32 * ib));
            sum += (d4d8 * (float)(gp_iq4_xs_scale(sl, sh, ib) - 32)) * (float)sumi;
        }
    }
    *s = sum;
}

#endif
