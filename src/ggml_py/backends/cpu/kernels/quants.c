// Element conversions of ggml's CPU backend: f16, bf16, q8_0 and q4_0 rows.
//
// The numerics are those of ggml 0.10.1's CPU backend on x86 with F16C:
//  * f16 -> f32 is exact; a NaN keeps its payload and comes out quiet (vcvtph2ps);
//  * f32 -> f16 rounds to nearest even (vcvtps2ph imm 0); overflow gives inf;
//  * bf16 -> f32 is a shift; f32 -> bf16 is ggml_compute_fp32_to_bf16;
//  * q8_0 has two quantisers: the reference one (scale 1/d, halves away from zero;
//    ggml_quantize_chunk) and the CPU backend's (127/max, halves to even; CPY /
//    SET_ROWS into q8_0 and src1 of a quantised MUL_MAT);
//  * q4_0 uses the reference quantiser (the CPU has no other).
// Block layouts (ggml-common.h) are read and written byte by byte, little-endian:
// q8_0 = f16 scale + 32 int8; q4_0 = f16 scale + 16 bytes of nibbles (low nibbles are
// elements 0..15, high nibbles 16..31), value = (q - 8) * d.
//
// Degenerate blocks (a scale whose inverse overflows, or inf / NaN inside) follow
// ggml's x86 code too: its float -> int conversions give INT32_MIN, saturated to -128
// by the CPU q8_0 quantiser and truncated to 0 by the reference one.
//
// f16 rows go through the active instruction set's loops (F16C gives the same bits).

#include "cpu-impl.h"

void gp_f16_to_f32_row(const uint16_t * x, float * y, int64_t n) { gp_simd_active->f16_to_f32(x, y, n); }
void gp_f32_to_f16_row(const float * x, uint16_t * y, int64_t n) { gp_simd_active->f32_to_f16(x, y, n); }
void gp_round_f16_row(const float * x, float * y, int64_t n)     { gp_simd_active->round_f16(x, y, n); }

void gp_bf16_to_f32_row(const uint16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = gp_bf2f(x[i]);
    }
}

void gp_f32_to_bf16_row(const float * x, uint16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = gp_f2bf(x[i]);
    }
}

void gp_round_bf16_row(const float * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = gp_bf2f(gp_f2bf(x[i]));
    }
}

// Bits of max |x[j]| over a block: on sign-cleared floats the integer order is the
// float order (a NaN is above inf, so it wins, as numpy's max)
static inline uint32_t absmax_bits32(const float * x) {
    uint32_t m = 0;
    for (int j = 0; j < 32; j++) {
        uint32_t a = gp_f2u(x[j]) & 0x7FFFFFFF;
        m = a > m ? a : m;
    }
    return m;
}

// MAXPS: the second operand unless the first is greater (a NaN first loses, second wins)
static inline float maxps(float a, float b) { return a > b ? a : b; }

// max |x[j]| as ggml finds it: its reference quantisers with a running MAX over the
// block (cpu = 0), its x86 AVX2 ones in 8 lanes, then halves (cpu = 1). They differ only
// where a NaN is inside, which each order forgets or keeps in its own way.
static inline float absmax_ggml(const float * xb, int cpu) {
    if (!cpu) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = GP_MAX(amax, fabsf(xb[j]));
        return amax;
    }
    float m[8];
    for (int l = 0; l < 8; l++) {
        m[l] = fabsf(xb[l]);
        for (int k = 8; k < 32; k += 8) m[l] = maxps(m[l], fabsf(xb[k + l]));
    }
    for (int l = 0; l < 4; l++) m[l] = maxps(m[l + 4], m[l]);
    for (int l = 0; l < 2; l++) m[l] = maxps(m[l], m[l + 2]);
    return maxps(m[0], m[1]);
}

float gp_q8_block(const float * xb, int8_t * q, int cpu, int32_t * sum) {
    const float amax = absmax_ggml(xb, cpu);
    const float d = amax / 127.0f;
    const float idv = cpu ? (amax != 0 ? 127.0f / amax : 0.0f) : (d != 0 ? 1.0f / d : 0.0f);
    int32_t i[32];
    if (gp_finite(idv) && absmax_bits32(xb) < 0x7F800000) {    // then |x * idv| <= 127 or so
        if (cpu) {
            for (int j = 0; j < 32; j++) i[j] = gp_round_even(xb[j] * idv);
        } else {
            for (int j = 0; j < 32; j++) i[j] = gp_round_away(xb[j] * idv);
        }
    } else {
        // degenerate block (inf / NaN inside, or a scale whose inverse overflows): ggml's
        // x86 float -> int conversions give INT32_MIN here
        for (int j = 0; j < 32; j++) i[j] = gp_x86_i32(gp_rint_any(xb[j] * idv, cpu));
    }
    // the CPU quantiser saturates to int8, the reference one truncates; q8_1's sum is of
    // the int32 values (CPU, wrapping) or of the stored int8 ones (reference)
    uint32_t s = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = cpu ? (int8_t)gp_sat8(i[j]) : (int8_t)i[j];
        s += (uint32_t)(cpu ? i[j] : q[j]);
    }
    if (sum) *sum = (int32_t)s;
    return d;
}

void gp_quantize_q8_0_blocks(const float * x, uint8_t * y, int64_t nb, int cpu) {
    int8_t q[32];
    for (int64_t b = 0; b < nb; b++) {
        float d = gp_q8_block(x + b * 32, q, cpu, NULL);
        gp_store_le16(y + b * Q8_0_BYTES, cpu ? gp_f2h(d) : gp_f2h_sw(d));
        memcpy(y + b * Q8_0_BYTES + 2, q, 32);
    }
}

void gp_dequantize_q8_0_blocks(const uint8_t * x, float * y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = gp_h2f(gp_load_le16(x + b * Q8_0_BYTES));
        const int8_t * qs = (const int8_t *)(x + b * Q8_0_BYTES + 2);
        float * yb = y + b * 32;
        for (int j = 0; j < 32; j++) {
            yb[j] = (float)qs[j] * d;
        }
    }
}

// the CPU q8_0 quantiser followed by dequantisation, without the bytes in between
void gp_round_q8_0_blocks(const float * x, float * y, int64_t nb) {
    int8_t q[32];
    float  r[32];
    for (int64_t b = 0; b < nb; b++) {
        float d = gp_round_f16(gp_q8_block(x + b * 32, q, 1, NULL));
        for (int j = 0; j < 32; j++) {
            r[j] = (float)q[j] * d;
        }
        memcpy(y + b * 32, r, sizeof(r));
    }
}

void gp_dequantize_q4_0_blocks(const uint8_t * x, float * y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = gp_h2f(gp_load_le16(x + b * Q4_0_BYTES));
        const uint8_t * qs = x + b * Q4_0_BYTES + 2;
        float * yb = y + b * 32;
        for (int j = 0; j < 16; j++) {
            yb[j]      = (float)((int32_t)(qs[j] & 0x0F) - 8) * d;
            yb[j + 16] = (float)((int32_t)(qs[j] >> 4) - 8) * d;
        }
    }
}

// (int8_t)(v*idv + 8.5f) capped at 15. The float sum is the double sum of the rounded
// float product (exact) rounded to float: no FMA possible.
static inline int32_t q4_value(float v, float idv) {
    float   s = (float)((double)(v * idv) + 8.5);
    int32_t q = (int8_t)(int32_t)s;
    return (int32_t)gp_sel(q > 15, 15, (uint32_t)q);
}

// quantize_row_q4_0_ref: d = (the first value of largest magnitude) / -8
void gp_quantize_q4_0_blocks(const float * x, uint8_t * y, int64_t nb) {
    uint8_t q[32];
    for (int64_t b = 0; b < nb; b++) {
        const float * xb = x + b * 32;
        // ggml's search: it keeps +0 for an all-zero block (even for -0) and passes over
        // a NaN, which no magnitude is below
        float amax = 0, mx = 0;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                mx = xb[j];
            }
        }
        float d   = mx / -8.0f;
        float idv = d != 0 ? 1.0f / d : 0.0f;
        gp_store_le16(y + b * Q4_0_BYTES, gp_f2h_sw(d));
        if (gp_finite(idv) && absmax_bits32(xb) < 0x7F800000) {   // then x * idv + 8.5 is in [0.5, 16.5]
            for (int j = 0; j < 32; j++) {
                q[j] = (uint8_t)(q4_value(xb[j], idv) & 0x0F);
            }
        } else {                                        // degenerate block: as on x86
            for (int j = 0; j < 32; j++) {
                int32_t v = (int8_t)gp_x86_i32((float)((double)(xb[j] * idv) + 8.5));
                q[j] = (uint8_t)(GP_MIN(15, v) & 0x0F);
            }
        }
        uint8_t * qs = y + b * Q4_0_BYTES + 2;
        for (int j = 0; j < 16; j++) {
            qs[j] = q[j] | (q[j + 16] << 4);
        }
    }
}
