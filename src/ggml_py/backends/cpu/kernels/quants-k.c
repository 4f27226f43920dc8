// Row conversions of the K-quant types (q2_K .. q6_K, q8_K) with ggml 0.10.1's numerics.
//
// The quantisers are ggml's reference ones (ggml-quants.c), which is also what ggml-cpu
// uses as from_float on x86 for every type here, q8_K included. They search scales in
// float32, so each expression keeps ggml's operation order; the library is built with
// -ffp-contract=off, and ggml-base (plain x86-64, no FMA) rounds every step as well.
//
// Rounding is ggml's nearest_int: add 1.5 * 2^23 and read the low mantissa bits. That is
// round-half-even for |v| < 2^22 and a deterministic, meaningless value otherwise (inf
// and NaN included), which is kept: degenerate blocks must give ggml's bytes too.
//
// f16 fields: reading is exact (gp_h2f, as ggml's software conversion); writing is
// nearest even, except that ggml-base's software conversion turns any NaN into 0x7E00.

#include "cpu-impl.h"
#include "block-k.h"

#define GROUP_MAX_EPS 1e-15f

static inline int nearest_int(float v) {
    uint32_t u = gp_f2u(v + 12582912.0f);
    return (int)(u & 0x007FFFFF) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

static inline uint16_t f2h_base(float f) {
    uint32_t u = gp_f2u(f);
    if ((u & 0x7FFFFFFF) > 0x7F800000) {
        return (uint16_t)(0x7E00 | ((u >> 16) & 0x8000));
    }
    return gp_f2h(f);
}

static inline float load_h(const uint8_t * p) { return gp_h2f(gp_load_le16(p)); }

// ---------------------------------------------------------------------------
// ggml's scale searches

// make_qkx2_quants: x ~ scale * L - mn with L in [0, nmax], minimising the w-weighted
// error (absolute with use_mad, else squared); tries nstep + 1 scales from
// (nmax + rmin) / (max - min) upwards by rdelta. Returns the scale; *mn gets -min.
static float fit_scale_min(int n, int nmax, const float * x, const float * w, uint8_t * L, float * mn,
                           float rmin, float rdelta, int nstep, int use_mad) {
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *mn = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l  += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min   = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            diff = use_mad ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *mn = -min;
    return scale;
}

// the value of largest magnitude (the first one; 0 when all are below GROUP_MAX_EPS)
static inline float signed_absmax(int n, const float * x, float * amax) {
    float max = 0, a = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > a) {
            a = ax;
            max = x[i];
        }
    }
    *amax = a;
    return max;
}

// The fit both searches below start from and step through: levels l = round(iscale * x)
// clamped to [-nmax, nmax), weighted by x^2; sumlx = sum w x l, suml2 = sum w l^2 (in
// ggml's order), and L[i] = l + shift
static void fit_sums(const float * x, float iscale, int nmax, int shift, int8_t * L,
                     float * sumlx, float * suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < 16; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + shift);
        float w = x[i] * x[i];
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

// The first fit of both, from iscale = -nmax / max (*max: the value of largest
// magnitude); 0 for a group below GROUP_MAX_EPS, whose L is zeroed (and scale is 0)
static int fit_start(const float * x, int nmax, int shift, int8_t * L, float * max,
                     float * sumlx, float * suml2) {
    float amax;
    *max = signed_absmax(16, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, 16);
        return 0;
    }
    fit_sums(x, (float)-nmax / *max, nmax, shift, L, sumlx, suml2);
    return 1;
}

// make_q3_quants with rmse (q3_K: 16 values, L in [0, 8)): x ~ scale * (L - 4), weights
// x^2, then up to 5 rounds of moving single values while the fit improves
static float fit_q3(const float * x, int8_t * L) {
    const int nmax = 4;
    float max, sumlx, suml2;
    if (!fit_start(x, nmax, 0, L, &max, &sumlx, &suml2)) return 0.0f;
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < 16; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            int l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (l == L[i]) continue;
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < 16; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// make_qx_quants as q6_K calls it (16 values, nmax 32, weights x^2): x ~ scale * (L - 32);
// the scale from the start nmax / max and 18 neighbours, refit by least squares
static float fit_q6(const float * x, int8_t * L) {
    const int nmax = 32;
    float max, sumlx, suml2;
    if (!fit_start(x, nmax, nmax, L, &max, &sumlx, &suml2)) return 0.0f;
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    int8_t trial[16];
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        fit_sums(x, -((float)nmax + 0.1f * (float)is) / max, nmax, nmax, trial, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            memcpy(L, trial, 16);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// The last pass of q3_K's and q6_K's quantisers: every group of 16 values again against
// its stored scale (d * sc[j]), L = round(x / (d sc)) in [-nmax, nmax) + nmax; a group
// whose scale is 0 keeps the L of its search
static void requantize_signed(const float * x, float d, const int8_t * sc, int nmax, int8_t * L) {
    for (int j = 0; j < 16; j++) {
        const float dj = d * (float)sc[j];
        if (dj == 0) continue;
        for (int i = 0; i < 16; i++) {
            L[16 * j + i] = (int8_t)(clampi(nearest_int(x[16 * j + i] / dj), -nmax, nmax - 1) + nmax);
        }
    }
}

// q2_K / q3_K low bits: byte l of each 32-byte group holds values l, l+32, l+64, l+96
static void pack_2bit(const uint8_t * L, uint8_t * qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

// ---------------------------------------------------------------------------
// q2_K: 16 groups of 16, value = d * scale * q - dmin * min, 4-bit scales and mins

void gp_quantize_row_q2_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    uint8_t L[QK_K];
    float w[16], scales[16], mins[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q2_K_BYTES) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        uint8_t * sc = y + Q2K_SCALES;
        memset(sc, 0, 16);
        if (max_scale > 0) {
            float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; j++) sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
        }
        gp_store_le16(y + Q2K_D, f2h_base(max_scale > 0 ? max_scale / 15.0f : 0.0f));
        if (max_min > 0) {
            float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; j++) sc[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
        }
        gp_store_le16(y + Q2K_DMIN, f2h_base(max_min > 0 ? max_min / 15.0f : 0.0f));

        // requantise against the rounded scales
        const float d = load_h(y + Q2K_D), dmin = load_h(y + Q2K_DMIN);
        for (int j = 0; j < 16; j++) {
            const float dj = d * (float)(sc[j] & 0x0F);
            if (dj == 0) continue;
            const float mj = dmin * (float)(sc[j] >> 4);
            for (int i = 0; i < 16; i++) {
                L[16 * j + i] = (uint8_t)clampi(nearest_int((x[16 * j + i] + mj) / dj), 0, 3);
            }
        }
        pack_2bit(L, y + Q2K_QS);
    }
}

void gp_dequantize_row_q2_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q2_K_BYTES) {
        const float d = load_h(x + Q2K_D), dmin = load_h(x + Q2K_DMIN);
        const uint8_t * sc = x + Q2K_SCALES;
        for (int k = 0; k < QK_K; k++) {
            // group of 16 and bit pair of byte k % 32 in the k / 128-th 32 bytes
            const int g = k / 16, shift = 2 * ((k / 32) % 4);
            const uint8_t q = (x[Q2K_QS + (k / 128) * 32 + k % 32] >> shift) & 3;
            const float dl = d * (float)(sc[g] & 0x0F), ml = dmin * (float)(sc[g] >> 4);
            *y++ = dl * (float)q - ml;
        }
    }
}

void gp_quantize_row_q2_K(const float * x, void * y, int64_t n) { gp_quantize_row_q2_K_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q3_K: 16 groups of 16, value = d * (scale - 32) * (q - 4), 6-bit scales, q in 3 bits

void gp_quantize_row_q3_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    int8_t L[QK_K];
    float scales[16];
    int8_t sc[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q3_K_BYTES) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(x + 16 * j, L + 16 * j);
            float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        uint8_t * s = y + Q3K_SCALES;
        memset(s, 0, 12);
        if (max_scale != 0) {
            float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                // ggml keeps the rounded value in an int8 before clamping
                int l = clampi((int8_t)nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) {
                    s[j] = (uint8_t)(l & 0x0F);
                } else {
                    s[j - 8] |= (uint8_t)((l & 0x0F) << 4);
                }
                s[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            gp_store_le16(y + Q3K_D, f2h_base(1 / iscale));
        } else {
            gp_store_le16(y + Q3K_D, 0);
        }

        kq_q3_scales(s, sc);
        requantize_signed(x, load_h(y + Q3K_D), sc, 4, L);

        // the third bit of value k goes to bit k / 32 of hmask byte k % 32
        uint8_t * hm = y + Q3K_HMASK;
        memset(hm, 0, 32);
        for (int k = 0; k < QK_K; k++) {
            if (L[k] > 3) {
                hm[k % 32] |= (uint8_t)(1 << (k / 32));
                L[k] -= 4;
            }
        }
        pack_2bit((const uint8_t *)L, y + Q3K_QS);
    }
}

void gp_dequantize_row_q3_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    int8_t sc[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += Q3_K_BYTES) {
        const float d = load_h(x + Q3K_D);
        kq_q3_scales(x + Q3K_SCALES, sc);
        for (int k = 0; k < QK_K; k++) {
            const int shift = 2 * ((k / 32) % 4);
            const int lo = (x[Q3K_QS + (k / 128) * 32 + k % 32] >> shift) & 3;
            const int hi = (x[Q3K_HMASK + k % 32] >> (k / 32)) & 1;
            const float dl = d * (float)sc[k / 16];
            *y++ = dl * (float)(lo - (hi ? 0 : 4));
        }
    }
}

void gp_quantize_row_q3_K(const float * x, void * y, int64_t n) { gp_quantize_row_q3_K_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q4_K / q5_K: 8 groups of 32, value = d * scale * q - dmin * min, 6-bit scales and mins
// (kq_k4_scales); q in 4 or 5 bits. The two quantisers differ in nmax and the search.

// the scales, mins, d and dmin of one block into blk (q4_K / q5_K share those offsets),
// and L[256] requantised against them
static void quantize_k4_scales(const float * x, uint8_t * blk, uint8_t * L, int nmax, float rmin, int nstep) {
    float w[32], scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float * xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xj[l]);
        scales[j] = fit_scale_min(32, nmax, xj, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min   = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t * s = blk + Q4K_SCALES;
    for (int j = 0; j < 8; j++) {
        const uint8_t ls = GP_MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        const uint8_t lm = GP_MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
        if (j < 4) {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0x0F) | ((lm & 0x0F) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    gp_store_le16(blk + Q4K_D, f2h_base(max_scale / 63.0f));
    gp_store_le16(blk + Q4K_DMIN, f2h_base(max_min / 63.0f));

    uint8_t sm[16];
    kq_k4_scales(s, sm);
    const float d = load_h(blk + Q4K_D), dmin = load_h(blk + Q4K_DMIN);
    for (int j = 0; j < 8; j++) {
        const float dj = d * (float)sm[j];
        if (dj == 0) continue;
        const float mj = dmin * (float)sm[8 + j];
        for (int i = 0; i < 32; i++) {
            L[32 * j + i] = (uint8_t)clampi(nearest_int((x[32 * j + i] + mj) / dj), 0, nmax);
        }
    }
}

_Static_assert(Q5K_D == Q4K_D && Q5K_DMIN == Q4K_DMIN && Q5K_SCALES == Q4K_SCALES, "q4_K/q5_K headers");

// value k of a q4_K / q5_K block: group k / 32; nibble (k / 32) % 2 of byte
// (k / 64) * 32 + k % 32
static inline void dequantize_k4_block(const uint8_t * blk, const uint8_t * qs, const uint8_t * qh, float * y) {
    uint8_t sm[16];
    kq_k4_scales(blk + Q4K_SCALES, sm);
    const float d = load_h(blk + Q4K_D), dmin = load_h(blk + Q4K_DMIN);
    for (int g = 0; g < 8; g++) {
        const float dl = d * (float)sm[g], ml = dmin * (float)sm[8 + g];
        const uint8_t * q = qs + (g / 2) * 32;
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> (4 * (g % 2))) & 0x0F;
            if (qh) v += ((qh[l] >> g) & 1) << 4;
            y[32 * g + l] = dl * (float)v - ml;
        }
    }
}

void gp_quantize_row_q4_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    uint8_t L[QK_K];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q4_K_BYTES) {
        quantize_k4_scales(x, y, L, 15, -1.0f, 20);
        uint8_t * q = y + Q4K_QS;
        for (int j = 0; j < QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

void gp_dequantize_row_q4_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q4_K_BYTES, y += QK_K) {
        dequantize_k4_block(x, x + Q4K_QS, NULL, y);
    }
}

void gp_quantize_row_q4_K(const float * x, void * y, int64_t n) { gp_quantize_row_q4_K_ref(x, y, n); }

void gp_quantize_row_q5_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    uint8_t L[QK_K];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q5_K_BYTES) {
        quantize_k4_scales(x, y, L, 31, -0.5f, 15);
        uint8_t * qh = y + Q5K_QH;
        uint8_t * q = y + Q5K_QS;
        memset(qh, 0, 32);
        for (int g = 0; g < 8; g += 2, q += 32) {
            for (int l = 0; l < 32; l++) {
                const int lo = L[32 * g + l], hi = L[32 * g + 32 + l];
                qh[l] |= (uint8_t)(((lo >> 4) << g) | ((hi >> 4) << (g + 1)));
                q[l] = (uint8_t)((lo & 0x0F) | ((hi & 0x0F) << 4));
            }
        }
    }
}

void gp_dequantize_row_q5_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q5_K_BYTES, y += QK_K) {
        dequantize_k4_block(x, x + Q5K_QS, x + Q5K_QH, y);
    }
}

void gp_quantize_row_q5_K(const float * x, void * y, int64_t n) { gp_quantize_row_q5_K_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q6_K: 16 groups of 16, value = d * scale * (q - 32), int8 scales, q in 6 bits:
// low nibbles in ql, top 2 bits in qh; per 128 values, ql byte l holds values l
// (low) and l + 64 (high), byte l + 32 values l + 32 and l + 96, qh byte l their
// top bits in the order l, l + 32, l + 64, l + 96

void gp_quantize_row_q6_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    int8_t L[QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q6_K_BYTES) {
        float max_scale = 0, max_abs = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q6(x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > max_abs) {
                max_abs = a;
                max_scale = scales[j];
            }
        }
        if (max_abs < GROUP_MAX_EPS) {
            memset(y, 0, Q6_K_BYTES);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        gp_store_le16(y + Q6K_D, f2h_base(1 / iscale));
        int8_t * sc = (int8_t *)(y + Q6K_SCALES);
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)GP_MIN(127, nearest_int(iscale * scales[j]));

        requantize_signed(x, load_h(y + Q6K_D), sc, 32, L);

        uint8_t * ql = y + Q6K_QL;
        uint8_t * qh = y + Q6K_QH;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            const uint8_t * Lj = (const uint8_t *)L + j;
            for (int l = 0; l < 32; l++) {
                ql[l]      = (uint8_t)((Lj[l] & 0x0F) | ((Lj[l + 64] & 0x0F) << 4));
                ql[l + 32] = (uint8_t)((Lj[l + 32] & 0x0F) | ((Lj[l + 96] & 0x0F) << 4));
                qh[l] = (uint8_t)((Lj[l] >> 4) | ((Lj[l + 32] >> 4) << 2) | ((Lj[l + 64] >> 4) << 4) |
                                  ((Lj[l + 96] >> 4) << 6));
            }
        }
    }
}

void gp_dequantize_row_q6_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q6_K_BYTES) {
        const float d = load_h(x + Q6K_D);
        const int8_t * sc = (const int8_t *)(x + Q6K_SCALES);
        for (int k = 0; k < QK_K; k++) {
            const int h = k / 128, r = k % 128, l = r % 32, part = r / 32;     // part 0..3
            const uint8_t lo = x[Q6K_QL + 64 * h + l + 32 * (part & 1)] >> (4 * (part >> 1));
            const uint8_t hi = x[Q6K_QH + 32 * h + l] >> (2 * part);
            const int q = (int)((lo & 0x0F) | ((hi & 3) << 4)) - 32;
            *y++ = d * (float)sc[k / 16] * (float)q;
        }
    }
}

void gp_quantize_row_q6_K(const float * x, void * y, int64_t n) { gp_quantize_row_q6_K_ref(x, y, n); }

// ---------------------------------------------------------------------------
// q8_K: float d, 256 int8, and the int16 sums of each 16 (for the mins of the dots)

void gp_quantize_row_q8_K_ref(const float * x, void * vy, int64_t n) {
    uint8_t * y = vy;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K, y += Q8_K_BYTES) {
        float amax;
        const float max = signed_absmax(QK_K, x, &amax);
        int8_t * q = (int8_t *)(y + Q8K_QS);
        // ggml leaves bsums untouched for an all-zero block; they are zeroed here
        if (amax == 0) {
            memset(y, 0, Q8_K_BYTES);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) q[j] = (int8_t)GP_MIN(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += q[16 * j + i];
            gp_store_le16(y + Q8K_BSUMS + 2 * j, (uint16_t)sum);
        }
        const uint32_t d = gp_f2u(1 / iscale);
        for (int i = 0; i < 4; i++) y[Q8K_D + i] = (uint8_t)(d >> (8 * i));
    }
}

void gp_dequantize_row_q8_K(const void * vx, float * y, int64_t n) {
    const uint8_t * x = vx;
    for (int64_t b = 0; b < n / QK_K; b++, x += Q8_K_BYTES) {
        const float d = kq_load_f32(x + Q8K_D);
        const int8_t * q = (const int8_t *)(x + Q8K_QS);
        for (int j = 0; j < QK_K; j++) *y++ = d * (float)q[j];
    }
}

// x86 ggml-cpu's quantize_row_q8_K is the reference one
void gp_quantize_row_q8_K(const float * x, void * y, int64_t n) { gp_quantize_row_q8_K_ref(x, y, n); }
