// Row conversions of ggml's legacy block types (q4_1, q5_0, q5_1, q8_1) and of the
// non-linear ones (iq4_nl, iq4_xs, mxfp4), with ggml 0.10.1's bits (block-quants.h).
//
// Numerics, as ggml-base and ggml-cpu (x86) compute them:
//  * f16 scales are written by ggml's software conversion (ggml_compute_fp32_to_fp16,
//    also what this ggml-cpu build uses for q8_1): round to nearest even like gp_f2h, but
//    a NaN becomes 0x7E00 with its sign (gp_f2h_sw);
//  * a float becomes a small integer by a C cast, which x86 does with cvttss2si:
//    truncation, INT32_MIN when out of range or NaN, then the low byte (gp_x86_i32);
//  * float arithmetic is single operations in ggml's order, no FMA (ggml-base has none).
//
// q8_1 has no dequantisation in ggml; gp_dequantize_row_q8_1 gives d * q.
// ggml-cpu's iq4_nl quantiser (the one pass of quantize_row_iq4_nl_ref) leaves the
// indices of a block with no value above 1e-15 as they were: those of the previous block
// of the row; for the first block ggml leaves stack garbage, here index 8 (the value
// nearest zero, which ggml_quantize_chunk writes). Either way the block's scale is 0.

#include "legacy-impl.h"

// byte offsets inside the blocks
_Static_assert(2 + 2 + 16 == Q4_1_BYTES, "q4_1: d, m, nibbles");
_Static_assert(2 + 4 + 16 == Q5_0_BYTES, "q5_0: d, fifth bits, nibbles");
_Static_assert(2 + 2 + 4 + 16 == Q5_1_BYTES, "q5_1: d, m, fifth bits, nibbles");
_Static_assert(2 + 2 + 32 == Q8_1_BYTES, "q8_1: d, s, values");
_Static_assert(2 + 16 == IQ4_NL_BYTES, "iq4_nl: d, nibbles");
_Static_assert(2 + 2 + 4 + 128 == IQ4_XS_BYTES, "iq4_xs: d, scales_h, scales_l, nibbles");
_Static_assert(1 + 16 == MXFP4_BYTES, "mxfp4: e8m0, nibbles");

const int8_t gp_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t gp_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ---------------------------------------------------------------------------
// helpers

static inline void store_le32(uint8_t * p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// the low 4 bits of 32 values as nibbles, the fifth bits into qh
static inline void pack_q5(const uint8_t * q, uint8_t * qh, uint8_t * qs) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    store_le32(qh, h);
}

// the (int8_t) and (uint8_t) casts of a float, as x86 does them
static inline int8_t cast_i8(float v)  { return (int8_t)gp_x86_i32(v); }
static inline uint8_t cast_u8(float v) { return (uint8_t)gp_x86_i32(v); }

// ---------------------------------------------------------------------------
// q4_1, q5_1: d = (max - min) / nmax, value = q * d + min

// One block -> q[32] (ggml's casts: q4_1 takes (int8_t) capped at 15, q5_1 (uint8_t));
// returns d, *min the minimum.
static float affine_block(const float * xb, int nmax, uint8_t * q, float * min_out) {
    float min = 3.40282347e+38f, max = -3.40282347e+38f;
    for (int j = 0; j < 32; j++) {
        if (xb[j] < min) min = xb[j];
        if (xb[j] > max) max = xb[j];
    }
    const float d  = (max - min) / (float)nmax;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = (xb[j] - min) * id + 0.5f;
        q[j] = nmax == 15 ? (uint8_t)GP_MIN(15, cast_i8(v)) : cast_u8(v);
    }
    *min_out = min;
    return d;
}

static void dequantize_affine(const uint8_t * x, float * y, int64_t n, int q5) {
    const size_t bytes = q5 ? Q5_1_BYTES : Q4_1_BYTES;
    uint8_t q[32];
    for (int64_t b = 0; b < n / 32; b++, x += bytes, y += 32) {
        const float d = gp_h2f(gp_load_le16(x));
        const float m = gp_h2f(gp_load_le16(x + 2));
        gp_unpack_nibbles(x + (q5 ? 8 : 4), q5 ? x + 4 : NULL, q);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d + m;
    }
}

void gp_dequantize_row_q4_1(const void * x, float * y, int64_t n) { dequantize_affine(x, y, n, 0); }
void gp_dequantize_row_q5_1(const void * x, float * y, int64_t n) { dequantize_affine(x, y, n, 1); }

static void quantize_affine(const float * x, uint8_t * y, int64_t n, int q5) {
    const size_t bytes = q5 ? Q5_1_BYTES : Q4_1_BYTES;
    uint8_t q[32];
    float min;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += bytes) {
        const float d = affine_block(x, q5 ? 31 : 15, q, &min);
        gp_store_le16(y, gp_f2h_sw(d));
        gp_store_le16(y + 2, gp_f2h_sw(min));
        if (q5) {
            pack_q5(q, y + 4, y + 8);
        } else {
            // ggml ORs the high nibble onto the whole low value (capped at 15, so it fits)
            for (int j = 0; j < 16; j++) y[4 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        }
    }
}

void gp_quantize_row_q4_1_ref(const float * x, void * y, int64_t n) { quantize_affine(x, y, n, 0); }
void gp_quantize_row_q5_1_ref(const float * x, void * y, int64_t n) { quantize_affine(x, y, n, 1); }

// the CPU backend has no other quantiser for these
void gp_quantize_row_q4_1(const float * x, void * y, int64_t n) { gp_quantize_row_q4_1_ref(x, y, n); }
void gp_quantize_row_q5_1(const float * x, void * y, int64_t n) { gp_quantize_row_q5_1_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q5_0: d = (the first value of largest magnitude) / -16, value = (q - 16) * d

void gp_dequantize_row_q5_0(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    uint8_t q[32];
    for (int64_t b = 0; b < n / 32; b++, x += Q5_0_BYTES, y += 32) {
        const float d = gp_h2f(gp_load_le16(x));
        gp_unpack_nibbles(x + 6, x + 2, q);
        for (int j = 0; j < 32; j++) y[j] = (float)((int32_t)q[j] - 16) * d;
    }
}

void gp_quantize_row_q5_0_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    uint8_t q[32];
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += Q5_0_BYTES) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max  = x[j];
            }
        }
        const float d  = max / -16.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)GP_MIN(31, cast_i8(x[j] * id + 16.5f));
        gp_store_le16(y, gp_f2h_sw(d));
        pack_q5(q, y + 2, y + 6);
    }
}

void gp_quantize_row_q5_0(const float * x, void * y, int64_t n) { gp_quantize_row_q5_0_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q8_1: q8_0 with s = d * (sum of the values), for the dots of q4_1 / q5_1

static void quantize_q8_1(const float * x, uint8_t * y, int64_t n, int cpu) {
    int8_t q[32];
    int32_t sum;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += Q8_1_BYTES) {
        const float d = gp_q8_block(x, q, cpu, &sum);
        gp_store_le16(y, gp_f2h_sw(d));
        gp_store_le16(y + 2, gp_f2h_sw((float)sum * d));
        memcpy(y + 4, q, 32);
    }
}

void gp_quantize_row_q8_1_ref(const float * x, void * y, int64_t n) { quantize_q8_1(x, y, n, 0); }
void gp_quantize_row_q8_1(const float * x, void * y, int64_t n)     { quantize_q8_1(x, y, n, 1); }

void gp_dequantize_row_q8_1(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += Q8_1_BYTES, y += 32) {
        const float d = gp_h2f(gp_load_le16(x));
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)x[4 + j] * d;
    }
}

// ---------------------------------------------------------------------------
// mxfp4: e8m0 exponent e, value = kvalues_mxfp4[q] * 2^(e - 128)

void gp_dequantize_row_mxfp4(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += MXFP4_BYTES, y += 32) {
        const float d = gp_e8m0_half(x[0]);
        for (int j = 0; j < 16; j++) {
            y[j]      = (float)gp_kvalues_mxfp4[x[1 + j] & 0x0F] * d;
            y[j + 16] = (float)gp_kvalues_mxfp4[x[1 + j] >> 4] * d;
        }
    }
}

// the first index of least |kvalues_mxfp4[i] * d - v|
static inline uint8_t mxfp4_index(float v, float d) {
    int   best = 0;
    float err  = fabsf((float)gp_kvalues_mxfp4[0] * d - v);
    for (int i = 1; i < 16; i++) {
        const float e = fabsf((float)gp_kvalues_mxfp4[i] * d - v);
        if (e < err) {
            best = i;
            err  = e;
        }
    }
    return (uint8_t)best;
}

void gp_quantize_row_mxfp4_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += MXFP4_BYTES) {
        float amax = 0;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        }
        // floor(log2(amax)) - 2 + 127 through the (uint8_t) cast; log2f as ggml calls it
        // (libm), since near powers of two its rounding decides the floor
        const uint8_t e = amax > 0 ? cast_u8(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = gp_e8m0_half(e);
        y[0] = e;
        for (int j = 0; j < 16; j++) {
            y[1 + j] = (uint8_t)(mxfp4_index(x[j], d) | (mxfp4_index(x[j + 16], d) << 4));
        }
    }
}

void gp_quantize_row_mxfp4(const float * x, void * y, int64_t n) { gp_quantize_row_mxfp4_ref(x, y, n); }

// ---------------------------------------------------------------------------
// iq4_nl, iq4_xs: value = d * kvalues_iq4nl[q]; iq4_xs has 8 sub-blocks of 32 with 6-bit
// scales (ls - 32) under one f16 d

static void dequantize_iq4(const uint8_t * qs, float d, float * y) {
    for (int j = 0; j < 16; j++) {
        y[j]      = d * (float)gp_kvalues_iq4nl[qs[j] & 0x0F];
        y[j + 16] = d * (float)gp_kvalues_iq4nl[qs[j] >> 4];
    }
}

void gp_dequantize_row_iq4_nl(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / 32; b++, x += IQ4_NL_BYTES, y += 32) {
        dequantize_iq4(x + 2, gp_h2f(gp_load_le16(x)), y);
    }
}

void gp_dequantize_row_iq4_xs(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += IQ4_XS_BYTES) {
        const float d = gp_h2f(gp_load_le16(x));
        const uint32_t sl = gp_load_le32(x + 4);
        const uint16_t sh = gp_load_le16(x + 2);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            dequantize_iq4(x + 8 + 16 * ib, d * (float)(gp_iq4_xs_scale(sl, sh, ib) - 32), y);
        }
    }
}

// ggml's best_index_int8 over the (sorted) iq4 values: the nearest, a tie to the upper
static inline uint8_t iq4_index(float v) {
    const int8_t * k = gp_kvalues_iq4nl;
    if (v <= k[0]) return 0;
    if (v >= k[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < k[mid]) hi = mid; else lo = mid;
    }
    return (uint8_t)(v - k[hi - 1] < k[hi] - v ? hi - 1 : hi);
}

// ggml's nearest_int: round to even through the float mantissa (|v| < 2^22)
static inline int nearest_int(float v) {
    const uint32_t i = gp_f2u(v + 12582912.0f);
    return (int)(i & 0x007FFFFF) - 0x00400000;
}

// with scale 1/id: (sum of w q x, sum of w q q) over a sub-block, w = x^2; indices into L
static inline void iq4_fit(const float * xb, float id, uint8_t * L, float * sumqx, float * sumq2) {
    float sx = 0, s2 = 0;
    for (int j = 0; j < 32; j++) {
        const uint8_t l = iq4_index(id * xb[j]);
        const float q = (float)gp_kvalues_iq4nl[l];
        const float w = xb[j] * xb[j];
        if (L) L[j] = l;
        sx += w * q * xb[j];
        s2 += w * q * q;
    }
    *sumqx = sx;
    *sumq2 = s2;
}

// ggml's quantize_row_iq4_nl_impl without an importance matrix, over nsub sub-blocks of
// 32 values (1: iq4_nl, 8: iq4_xs). ntry 7: the scale search of ggml_quantize_chunk;
// -1: the single pass of ggml-cpu's iq4_nl quantiser. Writes the f16 d, the sub-block
// scales ls + 32 (nsub > 1) and the indices L, which the single pass leaves as they are
// in a sub-block with nothing above 1e-15.
static uint16_t iq4_quantize(const float * x, int nsub, int ntry, uint8_t * ls, uint8_t * L) {
    const int8_t * k = gp_kvalues_iq4nl;
    float scales[8];
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nsub; ib++) {
        const float * xb = x + 32 * ib;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max  = xb[j];
            }
        }
        if (amax < 1e-15f) {
            scales[ib] = 0;
            continue;
        }
        float d = ntry > 0 ? -max / (float)k[0] : max / (float)k[0];
        float sumqx, sumq2;
        iq4_fit(xb, 1 / d, L + 32 * ib, &sumqx, &sumq2);
        d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            iq4_fit(xb, (float)(itry + k[0]) / max, NULL, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale  = d;
        }
    }
    if (nsub == 1) {
        if (ntry > 0) {
            const float id = scales[0] != 0 ? 1 / scales[0] : 0;
            for (int j = 0; j < 32; j++) L[j] = iq4_index(id * x[j]);
        }
        return gp_f2h_sw(scales[0]);
    }
    const float d  = -max_scale / 32;
    const float id = d != 0 ? 1 / d : 0.0f;
    for (int ib = 0; ib < nsub; ib++) {
        const int l = GP_MAX(-32, GP_MIN(31, nearest_int(id * scales[ib])));
        const float dl  = d * (float)l;
        const float idl = dl != 0 ? 1 / dl : 0.0f;
        for (int j = 0; j < 32; j++) L[32 * ib + j] = iq4_index(idl * x[32 * ib + j]);
        ls[ib] = (uint8_t)(l + 32);
    }
    return gp_f2h_sw(d);
}

static inline void pack_iq4(const uint8_t * L, uint8_t * qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void quantize_iq4_nl(const float * x, uint8_t * y, int64_t n, int ntry) {
    uint8_t L[32];
    memset(L, 8, sizeof(L));
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += IQ4_NL_BYTES) {
        gp_store_le16(y, iq4_quantize(x, 1, ntry, NULL, L));
        pack_iq4(L, y + 2);
    }
}

void gp_quantize_row_iq4_nl_ref(const float * x, void * y, int64_t n) { quantize_iq4_nl(x, y, n, 7); }
void gp_quantize_row_iq4_nl(const float * x, void * y, int64_t n)     { quantize_iq4_nl(x, y, n, -1); }

void gp_quantize_row_iq4_xs_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    uint8_t L[QK_K], ls[8];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += IQ4_XS_BYTES) {
        gp_store_le16(y, iq4_quantize(x, 8, 7, ls, L));
        uint16_t sh = 0;
        for (int ib = 0; ib < 8; ib++) sh |= (uint16_t)((ls[ib] >> 4) << (2 * ib));
        gp_store_le16(y + 2, sh);
        for (int i = 0; i < 4; i++) y[4 + i] = (uint8_t)((ls[2 * i] & 0x0F) | ((ls[2 * i + 1] & 0x0F) << 4));
        for (int ib = 0; ib < 8; ib++) pack_iq4(L + 32 * ib, y + 8 + 16 * ib);
    }
}

// ggml-cpu quantises iq4_xs as ggml_quantize_chunk does
void gp_quantize_row_iq4_xs(const float * x, void * y, int64_t n) { gp_quantize_row_iq4_xs_ref(x, y, n); }
