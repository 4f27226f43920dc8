// Dot products of the K-quant weight types (q2_K .. q6_K) with q8_K rows, compiled once
// per instruction set as simd.c: with GP_SIMD_AVX2 (and -mavx2 -mfma -mf16c) this file
// defines the gp_vec_dot_*_q8_K_avx2 functions and the gp_dot_tile_*_avx2 tiles of
// several rows and columns (_avx512 in the AVX-512 build, the same code; its VNNI adds
// the scaled pair sums in one instruction, the same integers), without it the _baseline
// vec_dots. The AVX2 vec_dots are their tiles at 1 x 1 (dot-tile.h's BLOCK_TILE).
//
// Both keep ggml 0.10.1's float order, so that results carry its bits:
//  * baseline: ggml-cpu's generic C code. q3_K..q6_K sum integer products into 8 lanes
//    (lane l: positions l mod 8, times the group's scale), scale the lanes per block into
//    8 float sums (q4_K / q5_K subtract the mins from one running float per block) and
//    add the lanes at the end; q2_K takes one float step per block.
//  * avx2: ggml's x86 __AVX2__ code. Per block, 8 int32 lanes (lane t: bytes 4t..4t+3 of
//    every 32 values, times their scales) are converted and FMA-accumulated with the
//    block's d; the mins go through their own FMAs (q2_K into the same accumulator, q4_K
//    into 4 lanes, q5_K into one float, which ggml's build contracts into an FMA too);
//    then ggml's hsum_float_8. The integer steps never saturate for any bytes (K-quant
//    values are at most 6 bits), so only the lanes' contents matter, not their order.

#include "cpu-impl.h"
#include "block-k.h"
#include "dot-tile.h"

#ifdef GP_SIMD_AVX2
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))
// fixed-count inner loops, unrolled so that shifts and shuffles become constants
#define UNROLL _Pragma("GCC unroll 8")

#ifndef GP_SIMD_AVX2

// ---------------------------------------------------------------------------
// baseline

// the 8 integer lanes of one block: lane l sums scale[k / 16] * a[k] * q8[k] over k = l mod 8.
// Exact in int32, so grouped freely: per group of 16, the two products of each lane fit
// an int16 (|a| <= 32), and only their sum is scaled.
INLINE void lanes8(const int8_t * a, const int8_t * q8, const int16_t * scale, int32_t * lane) {
    int32_t acc[8] = {0};
    for (int g = 0; g < 16; g++) {
        const int16_t sc = scale[g];        // int16 x int16: a widening multiply
        int16_t t[8];
        for (int l = 0; l < 8; l++) {
            t[l] = (int16_t)(a[16 * g + l] * q8[16 * g + l] + a[16 * g + 8 + l] * q8[16 * g + 8 + l]);
        }
        for (int l = 0; l < 8; l++) acc[l] += sc * t[l];
    }
    memcpy(lane, acc, sizeof(acc));
}

INLINE float q8k_d(const uint8_t * yb) { return kq_load_f32(yb + Q8K_D); }

// sum of bsums[j] * m[j / 2] (q4_K / q5_K: one min per 32 values)
INLINE int bsums_mins(const uint8_t * yb, const uint8_t * m) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += kq_load_i16(yb + Q8K_BSUMS + 2 * j) * m[j / 2];
    return s;
}

// q2_K / q3_K values: 32 per (half, shift) from the 2-bit bytes; q3_K (hm != NULL)
// subtracts 4 where the hmask bit is clear
INLINE void decode_2bit(const uint8_t * qs, const uint8_t * hm, int8_t * a) {
    for (int c = 0; c < 8; c++) {
        const uint8_t * q = qs + (c / 4) * 32;
        const int shift = 2 * (c % 4);
        for (int l = 0; l < 32; l++) a[32 * c + l] = (int8_t)((q[l] >> shift) & 3);
        if (hm) {
            for (int l = 0; l < 32; l++) a[32 * c + l] = (int8_t)(a[32 * c + l] - ((((hm[l] >> c) & 1) ^ 1) << 2));
        }
    }
}

void GP_SIMD_FN(gp_vec_dot_q2_K_q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    int8_t a[QK_K];
    int16_t scale[16];
    int32_t lane[8];
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q2_K_BYTES, y += Q8_K_BYTES) {
        const uint8_t * sc = x + Q2K_SCALES;
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += kq_load_i16(y + Q8K_BSUMS + 2 * j) * (sc[j] >> 4);
        decode_2bit(x + Q2K_QS, NULL, a);
        for (int j = 0; j < 16; j++) scale[j] = sc[j] & 0x0F;
        // ggml sums the scaled integer products in one int; any grouping gives it
        lanes8(a, (const int8_t *)(y + Q8K_QS), scale, lane);
        int isum = 0;
        for (int l = 0; l < 8; l++) isum += lane[l];
        const float dall = q8k_d(y) * gp_h2f(gp_load_le16(x + Q2K_D));
        const float dmin = q8k_d(y) * gp_h2f(gp_load_le16(x + Q2K_DMIN));
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

void GP_SIMD_FN(gp_vec_dot_q3_K_q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    int8_t a[QK_K], sc8[16];
    int16_t scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += Q3_K_BYTES, y += Q8_K_BYTES) {
        decode_2bit(x + Q3K_QS, x + Q3K_HMASK, a);
        kq_q3_scales(x + Q3K_SCALES, sc8);
        for (int j = 0; j < 16; j++) scale[j] = sc8[j];
        lanes8(a, (const int8_t *)(y + Q8K_QS), scale, lane);
        const float d = gp_h2f(gp_load_le16(x + Q3K_D)) * q8k_d(y);
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lane[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

// q4_K and q5_K (qh != NULL adds the fifth bits)
INLINE void dot_k4(int64_t n, float * s, const uint8_t * x, const uint8_t * y, size_t bytes,
                   int qs_off, int qh_off) {
    int8_t a[QK_K];
    uint8_t sm[16];
    int16_t scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++, x += bytes, y += Q8_K_BYTES) {
        // group g: nibble g % 2 of bytes (g / 2) * 32.., plus bit g of qh as 16
        for (int g = 0; g < 8; g++) {
            const uint8_t * qs = x + qs_off + (g / 2) * 32;
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) a[32 * g + l] = (int8_t)((qs[l] >> shift) & 0x0F);
            if (qh_off) {
                const uint8_t * qh = x + qh_off;
                for (int l = 0; l < 32; l++) a[32 * g + l] = (int8_t)(a[32 * g + l] + (((qh[l] >> g) & 1) << 4));
            }
        }
        kq_k4_scales(x + Q4K_SCALES, sm);
        for (int j = 0; j < 16; j++) scale[j] = sm[j / 2];
        const int summ = bsums_mins(y, sm + 8);
        lanes8(a, (const int8_t *)(y + Q8K_QS), scale, lane);
        const float d = gp_h2f(gp_load_le16(x + Q4K_D)) * q8k_d(y);
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lane[l];
        const float dmin = gp_h2f(gp_load_le16(x + Q4K_DMIN)) * q8k_d(y);
        sumf -= dmin * (float)summ;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

void GP_SIMD_FN(gp_vec_dot_q4_K_q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    dot_k4(n, s, vx, vy, Q4_K_BYTES, Q4K_QS, 0);
}

void GP_SIMD_FN(gp_vec_dot_q5_K_q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    dot_k4(n, s, vx, vy, Q5_K_BYTES, Q5K_QS, Q5K_QH);
}

void GP_SIMD_FN(gp_vec_dot_q6_K_q8_K)(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    int8_t a[QK_K];
    int16_t scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += Q6_K_BYTES, y += Q8_K_BYTES) {
        // per 128 values, part p (32 values): nibble p / 2 of ql bytes 32 * (p % 2)..,
        // top bits 2p of qh
        for (int h = 0; h < 2; h++) {
            const uint8_t * ql = x + Q6K_QL + 64 * h;
            const uint8_t * qh = x + Q6K_QH + 32 * h;
            for (int p = 0; p < 4; p++) {
                int8_t * ap = a + 128 * h + 32 * p;
                for (int l = 0; l < 32; l++) {
                    const int lo = (ql[l + 32 * (p % 2)] >> (4 * (p / 2))) & 0x0F;
                    ap[l] = (int8_t)((lo | (((qh[l] >> (2 * p)) & 3) << 4)) - 32);
                }
            }
        }
        for (int j = 0; j < 16; j++) scale[j] = (int8_t)x[Q6K_SCALES + j];
        lanes8(a, (const int8_t *)(y + Q8K_QS), scale, lane);
        const float d = gp_h2f(gp_load_le16(x + Q6K_D)) * q8k_d(y);
        for (int l = 0; l < 8; l++) sums[l] += d * (float)lane[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

#else

// ---------------------------------------------------------------------------
// AVX2

INLINE __m256i load32(const uint8_t * p) { return _mm256_loadu_si256((const __m256i *)p); }

// per byte, the width-bit field at bit `from` moved to bit `to` (constants): one 16-bit
// shift, whose spill across bytes the mask drops, since the field fits its byte both ways
INLINE __m256i field_to(__m256i v, int from, int to, int width) {
    const __m256i m = _mm256_set1_epi8((char)(((1 << width) - 1) << to));
    if (from > to) v = _mm256_srli_epi16(v, from - to);
    if (from < to) v = _mm256_slli_epi16(v, to - from);
    return _mm256_and_si256(v, m);
}

// q8_K's d times an f16 scale (F16C: the bits of ggml's table lookup)
INLINE float block_d(const uint8_t * xh, const uint8_t * yb) {
    const float yd = kq_load_f32(yb + Q8K_D);
    return _mm_cvtss_f32(_mm_mul_ss(_mm_set_ss(yd), _mm_cvtph_ps(_mm_cvtsi32_si128(gp_load_le16(xh)))));
}

// {d, dmin} for the f16 pair at xh: d = q8_K's d * xh[0], dmin = -(q8_K's d) * xh[1]
// (ggml negates before the product), both converted at once
INLINE __m128 block_d_dmin(const uint8_t * xh, const uint8_t * yb) {
    const __m128 yd = _mm_xor_ps(_mm_set1_ps(kq_load_f32(yb + Q8K_D)), _mm_set_ps(0.0f, 0.0f, -0.0f, 0.0f));
    return _mm_mul_ps(yd, _mm_cvtph_ps(_mm_cvtsi32_si128((int)kq_load_le32(xh))));
}

// Byte-shuffle controls picking int16 elements of a vector whose two 128-bit halves hold
// the same 8 scales: row i < 8 puts element i in every 16-bit lane (q4_K / q5_K: one
// scale per 32 values); row 8 + i puts element 2i in the low half and 2i + 1 in the high
// half (one scale per 16 values). Kept in memory: built in registers, they would cost
// every call a prologue longer than a block.
#define PICK(e) (uint16_t)((2 * (e) + 1) << 8 | 2 * (e))
#define PICK8(e) PICK(e), PICK(e), PICK(e), PICK(e), PICK(e), PICK(e), PICK(e), PICK(e)
static const uint16_t pick_rows[12][16] __attribute__((aligned(32))) = {
    {PICK8(0), PICK8(0)}, {PICK8(1), PICK8(1)}, {PICK8(2), PICK8(2)}, {PICK8(3), PICK8(3)},
    {PICK8(4), PICK8(4)}, {PICK8(5), PICK8(5)}, {PICK8(6), PICK8(6)}, {PICK8(7), PICK8(7)},
    {PICK8(0), PICK8(1)}, {PICK8(2), PICK8(3)}, {PICK8(4), PICK8(5)}, {PICK8(6), PICK8(7)},
};
#undef PICK8
#undef PICK

INLINE __m256i pick_row(int r) { return _mm256_load_si256((const __m256i *)pick_rows[r]); }

// scale 2i of the 8 for the low 16 values of a 32-value chunk, 2i + 1 for the high 16
INLINE __m256i scale_pair(__m256i scales, int i) { return _mm256_shuffle_epi8(scales, pick_row(8 + i)); }

// q2_K and q3_K share the 2-bit layout and 16-value groups; sc16 holds the 16 scales as
// int16. Returns the block's 8 int32 lanes; for q3_K, hbits are the hmask bytes.
INLINE __m256i sum_2bit(const uint8_t * qs, const int8_t * q8, __m128i sc16lo, __m128i sc16hi,
                        const uint8_t * hmask) {
    // q3_K: value - 4 where the third bit is clear, as a product with (~hmask bit) * 4
    const __m256i nh = hmask ? _mm256_xor_si256(load32(hmask), _mm256_set1_epi8(-1)) : _mm256_setzero_si256();
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    UNROLL for (int j = 0; j < 2; j++) {
        const __m128i half = j ? sc16hi : sc16lo;
        const __m256i scales = _mm256_set_m128i(half, half);
        const __m256i bits = load32(qs + 32 * j);
        UNROLL for (int k = 0; k < 4; k++) {
            const __m256i q = field_to(bits, 2 * k, 0, 2);
            const __m256i y8 = load32((const uint8_t *)(q8 + 128 * j + 32 * k));
            __m256i p = _mm256_maddubs_epi16(q, y8);
            if (hmask) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(field_to(nh, 4 * j + k, 2, 1), y8));
            sumi[k % 2] = madd_add(sumi[k % 2], scale_pair(scales, k), p);
        }
    }
    return _mm256_add_epi32(sumi[0], sumi[1]);
}

// Each type's vec_dot as a per-product state and a block step (dot-tile.h's BLOCK_TILE
// makes the tiles and the vec_dot of them): x, y point at one weight / q8_K block.

typedef struct { __m256 acc; } acc8_state;
INLINE void acc8_init(acc8_state * st) { st->acc = _mm256_setzero_ps(); }
INLINE float acc8_fin(const acc8_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    (void)x, (void)y, (void)left;
    return hsum8(st->acc);
}

#define q2_K_init acc8_init
#define q2_K_fin  acc8_fin
INLINE void q2_K_step(acc8_state * st, const uint8_t * x, const uint8_t * y) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128 dd = block_d_dmin(x + Q2K_D, y);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(x + Q2K_SCALES));
    const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    const __m256i prod = _mm256_madd_epi16(mins, load32(y + Q8K_BSUMS));
    st->acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), _mm256_cvtepi32_ps(prod), st->acc);

    const __m256i sc = _mm256_cvtepi8_epi16(_mm_and_si128(raw, m4));
    const __m256i sumi = sum_2bit(x + Q2K_QS, (const int8_t *)(y + Q8K_QS), _mm256_castsi256_si128(sc),
                                  _mm256_extracti128_si256(sc, 1), NULL);
    st->acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), st->acc);
}

#define q3_K_init acc8_init
#define q3_K_fin  acc8_fin
INLINE void q3_K_step(acc8_state * st, const uint8_t * x, const uint8_t * y) {
    uint32_t w[4];
    const float d = block_d(x + Q3K_D, y);
    kq_q3_words(x + Q3K_SCALES, w);
    const __m128i sc8 = _mm_sub_epi8(_mm_set_epi32((int)w[3], (int)w[2], (int)w[1], (int)w[0]), _mm_set1_epi8(32));
    const __m256i sc = _mm256_cvtepi8_epi16(sc8);
    const __m256i sumi = sum_2bit(x + Q3K_QS, (const int8_t *)(y + Q8K_QS), _mm256_castsi256_si128(sc),
                                  _mm256_extracti128_si256(sc, 1), x + Q3K_HMASK);
    st->acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st->acc);
}

// q4_K / q5_K: the block's mins as 4 int32 lanes (ggml pairs the bsums of each 32 values
// in int16 first), and the 8 scale lanes
INLINE __m256i k4_scales(const uint8_t * x, const uint8_t * y, __m128i * min_prod) {
    uint32_t w[4];
    kq_k4_words(x + Q4K_SCALES, w);
    const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)w[3], (int)w[2], (int)w[1], (int)w[0]));
    const __m256i bsums = load32(y + Q8K_BSUMS);
    const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    *min_prod = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), pairs);
    const __m128i sc = _mm256_castsi256_si128(ms);
    return _mm256_set_m128i(sc, sc);
}

// the 8 int32 lanes of a q4_K / q5_K block (qh: the fifth bits, or NULL)
INLINE __m256i k4_sum(const uint8_t * qs, const uint8_t * qh, const int8_t * q8, __m256i scales) {
    const __m256i hbits = qh ? load32(qh) : _mm256_setzero_si256();
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    UNROLL for (int j = 0; j < 4; j++) {
        const __m256i bits = load32(qs + 32 * j);
        UNROLL for (int h = 0; h < 2; h++) {
            const int g = 2 * j + h;
            __m256i q = field_to(bits, 4 * h, 0, 4);
            if (qh) q = _mm256_or_si256(q, field_to(hbits, g, 4, 1));
            const __m256i sc = _mm256_shuffle_epi8(scales, pick_row(g));
            sumi[h] = madd_add(sumi[h], sc, _mm256_maddubs_epi16(q, load32((const uint8_t *)(q8 + 32 * g))));
        }
    }
    return _mm256_add_epi32(sumi[0], sumi[1]);
}

// q4_K: the mins in 4 lanes of their own; q5_K: in one float
typedef struct { __m256 acc; __m128 m; } k4_state;
INLINE void k4_init(k4_state * st) { st->acc = _mm256_setzero_ps(); st->m = _mm_setzero_ps(); }

#define q4_K_init k4_init
INLINE void q4_K_step(k4_state * st, const uint8_t * x, const uint8_t * y) {
    const __m128 dd = block_d_dmin(x + Q4K_D, y);
    __m128i prod;
    const __m256i scales = k4_scales(x, y, &prod);
    st->m = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(prod), st->m);
    const __m256i sumi = k4_sum(x + Q4K_QS, NULL, (const int8_t *)(y + Q8K_QS), scales);
    st->acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), st->acc);
}
INLINE float q4_K_fin(const k4_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    (void)x, (void)y, (void)left;
    __m128 acc_m = _mm_add_ps(st->m, _mm_movehl_ps(st->m, st->m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return hsum8(st->acc) + _mm_cvtss_f32(acc_m);
}

#define q5_K_init k4_init
INLINE void q5_K_step(k4_state * st, const uint8_t * x, const uint8_t * y) {
    const __m128 dd = block_d_dmin(x + Q5K_D, y);
    __m128i prod;
    const __m256i scales = k4_scales(x, y, &prod);
    // one int for the mins, then summs + dmin * it in one rounding (ggml's build fuses it)
    const __m128i h = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
    const int mins = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
    st->m = _mm_fmadd_ss(_mm_movehdup_ps(dd), _mm_cvtsi32_ss(_mm_setzero_ps(), mins), st->m);
    const __m256i sumi = k4_sum(x + Q5K_QS, x + Q5K_QH, (const int8_t *)(y + Q8K_QS), scales);
    st->acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), st->acc);
}
INLINE float q5_K_fin(const k4_state * st, const uint8_t * x, const uint8_t * y, int64_t left) {
    (void)x, (void)y, (void)left;
    return hsum8(st->acc) + _mm_cvtss_f32(st->m);
}

#define q6_K_init acc8_init
#define q6_K_fin  acc8_fin
INLINE void q6_K_step(acc8_state * st, const uint8_t * x, const uint8_t * y) {
    const float d = block_d(x + Q6K_D, y);
    const int8_t * q8 = (const int8_t *)(y + Q8K_QS);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + Q6K_SCALES)));
    // the -32 of every value, as 32 * scale * bsum per pair of 16-value groups
    const __m256i minus = _mm256_slli_epi32(_mm256_madd_epi16(load32(y + Q8K_BSUMS), sc16), 5);
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    UNROLL for (int j = 0; j < 2; j++) {
        // scales 8j..8j+7 in both halves, picked in pairs by scale_pair
        const __m256i scales = _mm256_permute2x128_si256(sc16, sc16, j ? 0x11 : 0x00);
        // part k (values 32k..32k+31 of these 128): nibble k / 2 of lo[k % 2], top
        // bits 2k, 2k + 1 of hi
        const __m256i lo[2] = {load32(x + Q6K_QL + 64 * j), load32(x + Q6K_QL + 64 * j + 32)};
        const __m256i hi = load32(x + Q6K_QH + 32 * j);
        __m256i q[4];
        UNROLL for (int k = 0; k < 4; k++) {
            q[k] = _mm256_or_si256(field_to(lo[k % 2], 4 * (k / 2), 0, 4), field_to(hi, 2 * k, 4, 2));
        }
        UNROLL for (int k = 0; k < 4; k++) {
            const __m256i sc = scale_pair(scales, k);
            sumi[k % 2] = madd_add(sumi[k % 2], sc, _mm256_maddubs_epi16(q[k], load32((const uint8_t *)(q8 + 128 * j + 32 * k))));
        }
    }
    const __m256i sum = _mm256_sub_epi32(_mm256_add_epi32(sumi[0], sumi[1]), minus);
    st->acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), st->acc);
}

// tiles: K_TM x K_TN with columns (the AVX-512 build has 32 vector registers for the 12
// products' states and the shared unpacking, AVX2 16); with one column K_MV rows at a
// time, the next rows prefetched (K_PF) as they stream (measured at 4096 x 4096 weights
// by 1 and 32 columns: q4_K n1 1 row 414-436 us, 2 rows 400-403 us, 4 rows 420 us;
// q6_K takes 1 row without prefetching, as its vec_dot read them: its 2-row tiles ran up
// to 3x slower in some runs, with weights that another program's run had pushed out of
// the caches, as bench_vs_ggml's alternation does; 1 row with the prefetch 0.97-1.14x
// ggml's time there, without it 0.90-0.92x)
#ifndef K_TM
#ifdef GP_SIMD_AVX512
#define K_TM 4
#define K_TN 3
#else
#define K_TM 2
#define K_TN 2
#endif
#define K_MV 2
#define K_PF 1
#endif

#define K_TILE(T, STATE, MV, PF)                                                           \
    BLOCK_TILE(T, QK_K, T##_BYTES_, Q8_K_BYTES, 1, STATE, PF)                            \
    void GP_SIMD_FN(gp_vec_dot_##T##_q8_K)(int64_t n, float * s, const void * x, const void * y) { \
        vec_dot_tile_##T(n, s, x, y);                                                      \
    }                                                                                      \
    TILE_DISPATCH(GP_SIMD_FN(gp_dot_tile_##T), tile_##T, K_TM, K_TN, MV)

#define q2_K_BYTES_ Q2_K_BYTES
#define q3_K_BYTES_ Q3_K_BYTES
#define q4_K_BYTES_ Q4_K_BYTES
#define q5_K_BYTES_ Q5_K_BYTES
#define q6_K_BYTES_ Q6_K_BYTES
K_TILE(q2_K, acc8_state, K_MV, K_PF)
K_TILE(q3_K, acc8_state, K_MV, K_PF)
K_TILE(q4_K, k4_state, K_MV, K_PF)
K_TILE(q5_K, k4_state, K_MV, K_PF)
K_TILE(q6_K, acc8_state, 1, 0)

#endif
