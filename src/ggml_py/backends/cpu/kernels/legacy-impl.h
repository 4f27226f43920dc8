// Pieces of the legacy / non-linear block types that their conversions
// (quants-legacy.c) and dots (dot-legacy.c) share.

#pragma once

#include "block-quants.h"
#include "cpu-impl.h"

static inline uint32_t gp_load_le32(const uint8_t * p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// ggml_e8m0_to_fp32_half (mxfp4's scale): 2^(e - 128), subnormal for e < 2
static inline float gp_e8m0_half(uint8_t e) {
    return gp_u2f(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

// 32 values from 16 bytes of nibbles (low nibbles are values 0..15) and, when qh is not
// NULL, 4 bytes of fifth bits (bit j is value j's)
static inline void gp_unpack_nibbles(const uint8_t * qs, const uint8_t * qh, uint8_t * q) {
    uint32_t h = qh ? gp_load_le32(qh) : 0;
    for (int j = 0; j < 16; j++, h >>= 1) {
        q[j]      = (uint8_t)((qs[j] & 0x0F) | ((h << 4) & 0x10));
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> 12) & 0x10));
    }
}

// iq4_xs sub-block ib's 6-bit scale (offset by 32): 4 bits from scales_l (sl, its 4
// bytes little-endian), 2 from scales_h (sh)
static inline int gp_iq4_xs_scale(uint32_t sl, uint16_t sh, int ib) {
    return (int)((sl >> 4 * ib) & 0x0F) | (((sh >> 2 * ib) & 3) << 4);
}
