// Dot products of the K-quant weight types (q2_K .. q6_K) with q8_K rows, compiled once
// per instruction set as simd.c: with GP_SIMD_AVX2 (and -mavx2 -mfma -mf16c) this file
// defines the gp_vec_dot_*_q8_K_avx2 functions, without it the _baseline ones.
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

#ifdef GP_SIMD_AVX2
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))

#ifndef GP_SIMD_AVX2

// ---------------------------------------------------------------------------
// baseline

// the 8 integer lanes of one block: lane l sums scale[k / 16] * a[k] * q8[k] over k = l mod 8
INLINE void lanes8(const int8_t * a, const int8_t * q8, const int * scale, int32_t * lane) {
    for (int l = 0; l < 8; l++) lane[l] = 0;
    for (int k = 0; k < QK_K; k += 8) {
        for (int l = 0; l < 8; l++) lane[l] += scale[k / 16] * (a[k + l] * q8[k + l]);
    }
}

INLINE float q8k_d(const uint8_t * yb) { return kq_load_f32(yb + Q8K_D); }

// sum of bsums[j] * m[j / 2] (q4_K / q5_K: one min per 32 values)
INLINE int bsums_mins(const uint8_t * yb, const uint8_t * m) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += kq_load_i16(yb + Q8K_BSUMS + 2 * j) * m[j / 2];
    return s;
}

void gp_vec_dot_q2_K_q8_K_baseline(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q2_K_BYTES, y += Q8_K_BYTES) {
        const uint8_t * sc = x + Q2K_SCALES;
        const int8_t * q8 = (const int8_t *)(y + Q8K_QS);
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += kq_load_i16(y + Q8K_BSUMS + 2 * j) * (sc[j] >> 4);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            const int shift = 2 * ((g / 2) % 4);
            const uint8_t * q2 = x + Q2K_QS + (g / 8) * 32 + (g % 2) * 16;
            int part = 0;
            for (int l = 0; l < 16; l++) part += q8[16 * g + l] * ((q2[l] >> shift) & 3);
            isum += (sc[g] & 0x0F) * part;
        }
        const float dall = q8k_d(y) * gp_h2f(gp_load_le16(x + Q2K_D));
        const float dmin = q8k_d(y) * gp_h2f(gp_load_le16(x + Q2K_DMIN));
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

void gp_vec_dot_q3_K_q8_K_baseline(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    int8_t a[QK_K], sc8[16];
    int scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += Q3_K_BYTES, y += Q8_K_BYTES) {
        for (int k = 0; k < QK_K; k++) {
            const int lo = (x[Q3K_QS + (k / 128) * 32 + k % 32] >> (2 * ((k / 32) % 4))) & 3;
            const int hi = (x[Q3K_HMASK + k % 32] >> (k / 32)) & 1;
            a[k] = (int8_t)(lo - (hi ? 0 : 4));
        }
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
    int scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++, x += bytes, y += Q8_K_BYTES) {
        for (int k = 0; k < QK_K; k++) {
            int v = (x[qs_off + (k / 64) * 32 + k % 32] >> (4 * ((k / 32) % 2))) & 0x0F;
            if (qh_off) v += ((x[qh_off + k % 32] >> (k / 32)) & 1) << 4;
            a[k] = (int8_t)v;
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

void gp_vec_dot_q4_K_q8_K_baseline(int64_t n, float * s, const void * vx, const void * vy) {
    dot_k4(n, s, vx, vy, Q4_K_BYTES, Q4K_QS, 0);
}

void gp_vec_dot_q5_K_q8_K_baseline(int64_t n, float * s, const void * vx, const void * vy) {
    dot_k4(n, s, vx, vy, Q5_K_BYTES, Q5K_QS, Q5K_QH);
}

void gp_vec_dot_q6_K_q8_K_baseline(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    int8_t a[QK_K];
    int scale[16];
    int32_t lane[8];
    float sums[8] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, x += Q6_K_BYTES, y += Q8_K_BYTES) {
        for (int k = 0; k < QK_K; k++) {
            const int h = k / 128, l = k % 32, part = (k % 128) / 32;
            const int lo = (x[Q6K_QL + 64 * h + l + 32 * (part & 1)] >> (4 * (part >> 1))) & 0x0F;
            const int hi = (x[Q6K_QH + 32 * h + l] >> (2 * part)) & 3;
            a[k] = (int8_t)((lo | (hi << 4)) - 32);
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

INLINE float hsum8(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

INLINE __m256i load32(const uint8_t * p) { return _mm256_loadu_si256((const __m256i *)p); }

// an f16 scale (F16C: the bits of ggml's table lookup) times q8_K's d
INLINE float block_d(const uint8_t * xh, const uint8_t * yb) {
    return kq_load_f32(yb + Q8K_D) * _cvtsh_ss(gp_load_le16(xh));
}

// byte-shuffle selecting int16 element i of each 128-bit half in every 16-bit lane
INLINE __m128i pick16(int i) { return _mm_set1_epi16((short)((2 * i + 1) << 8 | 2 * i)); }

// int16 scales (8 per 128-bit half, the same in both): element 2i for the low half,
// 2i + 1 for the high half, i.e. one scale per 16 values of a 32-byte chunk
INLINE __m256i scale_pair(__m256i scales, int i) {
    return _mm256_shuffle_epi8(scales, _mm256_set_m128i(pick16(2 * i + 1), pick16(2 * i)));
}

// q2_K and q3_K share the 2-bit layout and 16-value groups; sc16 holds the 16 scales as
// int16. Returns the block's 8 int32 lanes; for q3_K, hbits are the hmask bytes.
INLINE __m256i sum_2bit(const uint8_t * qs, const int8_t * q8, __m128i sc16lo, __m128i sc16hi,
                        const uint8_t * hmask) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i hbits = hmask ? load32(hmask) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
        const __m128i half = j ? sc16hi : sc16lo;
        const __m256i scales = _mm256_set_m128i(half, half);
        const __m256i bits = load32(qs + 32 * j);
        __m256i p[4];
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
            const __m256i y8 = load32((const uint8_t *)(q8 + 128 * j + 32 * k));
            p[k] = _mm256_maddubs_epi16(q, y8);
            if (hmask) {
                // 4 where the third bit is clear, subtracted as 4 * q8
                const int bit = 4 * j + k;
                const __m256i clear = _mm256_andnot_si256(hbits, _mm256_set1_epi8((char)(1 << bit)));
                const __m256i h = _mm256_slli_epi16(_mm256_srli_epi16(clear, bit), 2);
                p[k] = _mm256_sub_epi16(p[k], _mm256_maddubs_epi16(h, y8));
            }
            p[k] = _mm256_madd_epi16(scale_pair(scales, k), p[k]);
        }
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])));
    }
    return sumi;
}

void gp_vec_dot_q2_K_q8_K_avx2(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++, x += Q2_K_BYTES, y += Q8_K_BYTES) {
        const float d = block_d(x + Q2K_D, y);
        const float dmin = -kq_load_f32(y + Q8K_D) * _cvtsh_ss(gp_load_le16(x + Q2K_DMIN));
        const __m128i raw = _mm_loadu_si128((const __m128i *)(x + Q2K_SCALES));
        const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        const __m256i prod = _mm256_madd_epi16(mins, load32(y + Q8K_BSUMS));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

        const __m256i sc = _mm256_cvtepi8_epi16(_mm_and_si128(raw, m4));
        const __m256i sumi = sum_2bit(x + Q2K_QS, (const int8_t *)(y + Q8K_QS), _mm256_castsi256_si128(sc),
                                      _mm256_extracti128_si256(sc, 1), NULL);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

void gp_vec_dot_q3_K_q8_K_avx2(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    __m256 acc = _mm256_setzero_ps();
    int8_t sc8[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += Q3_K_BYTES, y += Q8_K_BYTES) {
        const float d = block_d(x + Q3K_D, y);
        kq_q3_scales(x + Q3K_SCALES, sc8);
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc8));
        const __m256i sumi = sum_2bit(x + Q3K_QS, (const int8_t *)(y + Q8K_QS), _mm256_castsi256_si128(sc),
                                      _mm256_extracti128_si256(sc, 1), x + Q3K_HMASK);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

// q4_K / q5_K: the block's mins as 4 int32 lanes (ggml pairs the bsums of each 32 values
// in int16 first), and the 8 scale lanes
INLINE __m256i k4_scales(const uint8_t * x, const uint8_t * y, __m128i * min_prod) {
    uint8_t sm[16];
    kq_k4_scales(x + Q4K_SCALES, sm);
    const __m256i ms = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
    const __m256i bsums = load32(y + Q8K_BSUMS);
    const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    *min_prod = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), pairs);
    const __m128i sc = _mm256_castsi256_si128(ms);
    return _mm256_set_m128i(sc, sc);
}

// the 8 int32 lanes of a q4_K / q5_K block (qh: the fifth bits, or NULL)
INLINE __m256i k4_sum(const uint8_t * qs, const uint8_t * qh, const int8_t * q8, __m256i scales) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i hbits = qh ? load32(qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = load32(qs + 32 * j);
        __m256i p[2];
        for (int h = 0; h < 2; h++) {
            const int g = 2 * j + h;
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 4 * h), m4);
            if (qh) {
                const __m256i b5 = _mm256_and_si256(hbits, _mm256_set1_epi8((char)(1 << g)));
                q = _mm256_add_epi8(q, _mm256_slli_epi16(_mm256_srli_epi16(b5, g), 4));
            }
            const __m256i sc = _mm256_shuffle_epi8(scales, _mm256_set_m128i(pick16(g), pick16(g)));
            p[h] = _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, load32((const uint8_t *)(q8 + 32 * g))));
        }
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
    }
    return sumi;
}

void gp_vec_dot_q4_K_q8_K_avx2(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++, x += Q4_K_BYTES, y += Q8_K_BYTES) {
        const float d = block_d(x + Q4K_D, y);
        const float dmin = -kq_load_f32(y + Q8K_D) * _cvtsh_ss(gp_load_le16(x + Q4K_DMIN));
        __m128i prod;
        const __m256i scales = k4_scales(x, y, &prod);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        const __m256i sumi = k4_sum(x + Q4K_QS, NULL, (const int8_t *)(y + Q8K_QS), scales);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    *s = hsum8(acc) + _mm_cvtss_f32(acc_m);
}

void gp_vec_dot_q5_K_q8_K_avx2(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++, x += Q5_K_BYTES, y += Q8_K_BYTES) {
        const float d = block_d(x + Q5K_D, y);
        const float dmin = -kq_load_f32(y + Q8K_D) * _cvtsh_ss(gp_load_le16(x + Q5K_DMIN));
        __m128i prod;
        const __m256i scales = k4_scales(x, y, &prod);
        // one int for the mins, then summs + dmin * it in one rounding (ggml's build fuses it)
        const __m128i h = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
        const int mins = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
        summs = _mm_fmadd_ss(_mm_set_ss(dmin), _mm_cvtsi32_ss(_mm_setzero_ps(), mins), summs);
        const __m256i sumi = k4_sum(x + Q5K_QS, x + Q5K_QH, (const int8_t *)(y + Q8K_QS), scales);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc) + _mm_cvtss_f32(summs);
}

void gp_vec_dot_q6_K_q8_K_avx2(int64_t n, float * s, const void * vx, const void * vy) {
    const uint8_t * x = vx;
    const uint8_t * y = vy;
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++, x += Q6_K_BYTES, y += Q8_K_BYTES) {
        const float d = block_d(x + Q6K_D, y);
        const int8_t * q8 = (const int8_t *)(y + Q8K_QS);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(x + Q6K_SCALES));
        // the -32 of every value, as 32 * scale * bsum per pair of 16-value groups
        const __m256i minus = _mm256_slli_epi32(_mm256_madd_epi16(load32(y + Q8K_BSUMS), _mm256_cvtepi8_epi16(sc8)), 5);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 2; j++) {
            const __m256i lo0 = load32(x + Q6K_QL + 64 * j), lo1 = load32(x + Q6K_QL + 64 * j + 32);
            const __m256i hi = load32(x + Q6K_QH + 32 * j);
            // part k: values 32k..32k+31 of these 128; top bits are bits 2k, 2k+1 of qh
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(lo0, m15), _mm256_slli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8(3)), 4)),
                _mm256_or_si256(_mm256_and_si256(lo1, m15), _mm256_slli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8(12)), 2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m15), _mm256_and_si256(hi, _mm256_set1_epi8(48))),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m15),
                                _mm256_srli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8((char)0xC0)), 2)),
            };
            __m256i p[4];
            for (int k = 0; k < 4; k++) {
                const int g = 8 * j + 2 * k;      // scales g (low 16 values), g + 1 (high 16)
                const __m128i pick = _mm_set_epi64x(0x0101010101010101LL * (g + 1), 0x0101010101010101LL * g);
                const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
                p[k] = _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q[k], load32((const uint8_t *)(q8 + 128 * j + 32 * k))));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        sumi = _mm256_sub_epi32(sumi, minus);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

#endif
