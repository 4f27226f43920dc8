// Byte layouts of the K-quant blocks (ggml-common.h) and the scale unpacking that the
// conversions (quants-k.c) and the dots (dot-k.c) share. Private to the CPU executor.
//
// Every block covers QK_K = 256 values; f16 fields are little-endian, q8_K's d is a
// little-endian float32 and its bsums int16.

#pragma once

#include "block-quants.h"

#include <stdint.h>
#include <string.h>

// byte offsets inside a block
enum {
    Q2K_SCALES = 0,     // 16 bytes: low nibble scale, high nibble min, per 16 values
    Q2K_QS     = 16,    // 64 bytes: 2-bit values
    Q2K_D      = 80,
    Q2K_DMIN   = 82,

    Q3K_HMASK  = 0,     // 32 bytes: third bits (bit b of byte l: value 32 * b + l)
    Q3K_QS     = 32,    // 64 bytes: low 2 bits
    Q3K_SCALES = 96,    // 12 bytes: 16 6-bit scales, stored + 32
    Q3K_D      = 108,

    Q4K_D      = 0,
    Q4K_DMIN   = 2,
    Q4K_SCALES = 4,     // 12 bytes: 8 6-bit scales and 8 6-bit mins
    Q4K_QS     = 16,    // 128 bytes of nibbles

    Q5K_D      = 0,
    Q5K_DMIN   = 2,
    Q5K_SCALES = 4,     // as q4_K
    Q5K_QH     = 16,    // 32 bytes: fifth bits (bit b of byte l: value 32 * b + l)
    Q5K_QS     = 48,    // 128 bytes of nibbles

    Q6K_QL     = 0,     // 128 bytes: low nibbles
    Q6K_QH     = 128,   // 64 bytes: high 2 bits
    Q6K_SCALES = 192,   // 16 int8 scales
    Q6K_D      = 208,

    Q8K_D      = 0,     // float32
    Q8K_QS     = 4,     // 256 int8
    Q8K_BSUMS  = 260,   // 16 int16: sums of 16 consecutive qs
};

_Static_assert(Q2K_DMIN + 2 == Q2_K_BYTES, "q2_K layout");
_Static_assert(Q3K_D + 2 == Q3_K_BYTES, "q3_K layout");
_Static_assert(Q4K_QS + QK_K / 2 == Q4_K_BYTES, "q4_K layout");
_Static_assert(Q5K_QS + QK_K / 2 == Q5_K_BYTES, "q5_K layout");
_Static_assert(Q6K_D + 2 == Q6_K_BYTES, "q6_K layout");
_Static_assert(Q8K_BSUMS + 2 * QK_K / 16 == Q8_K_BYTES, "q8_K layout");

static inline uint32_t kq_load_le32(const uint8_t * p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline float kq_load_f32(const uint8_t * p) {
    uint32_t u = kq_load_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline int16_t kq_load_i16(const uint8_t * p) {
    return (int16_t)(uint16_t)(p[0] | (p[1] << 8));
}

// q4_K / q5_K: the 8 scales (bytes 0..7) and 8 mins (bytes 8..15), 6 bits each, as 4
// little-endian words, from the 12 packed bytes: bytes 0..7 hold scales 0..3 and mins
// 0..3 in their low 6 bits, bytes 8..11 the low 4 bits of scales 4..7 (low nibbles) and
// mins 4..7 (high nibbles), whose top 2 bits are the top bits of bytes 0..3 / 4..7
static inline void kq_k4_words(const uint8_t * s, uint32_t * w) {
    const uint32_t a = kq_load_le32(s), b = kq_load_le32(s + 4), c = kq_load_le32(s + 8);
    w[0] = a & 0x3F3F3F3F;
    w[1] = (c & 0x0F0F0F0F) | (((a >> 6) & 0x03030303) << 4);
    w[2] = b & 0x3F3F3F3F;
    w[3] = ((c >> 4) & 0x0F0F0F0F) | (((b >> 6) & 0x03030303) << 4);
}

static inline void kq_k4_scales(const uint8_t * s, uint8_t * out) {
    uint32_t w[4];
    kq_k4_words(s, w);
    for (int i = 0; i < 16; i++) out[i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
}

// q3_K: the 16 6-bit scales (stored value, i.e. scale + 32) as 4 little-endian words,
// from the 12 packed bytes: low nibbles in bytes 0..7 (scale j < 8 in the low half of
// byte j, j >= 8 in the high half of byte j - 8), top 2 bits in bytes 8..11 (scale j
// at bits 2 * (j / 4) of byte 8 + j % 4)
static inline void kq_q3_words(const uint8_t * s, uint32_t * w) {
    const uint32_t a = kq_load_le32(s), b = kq_load_le32(s + 4), c = kq_load_le32(s + 8);
    w[0] = (a & 0x0F0F0F0F) | (((c >> 0) & 0x03030303) << 4);
    w[1] = (b & 0x0F0F0F0F) | (((c >> 2) & 0x03030303) << 4);
    w[2] = ((a >> 4) & 0x0F0F0F0F) | (((c >> 4) & 0x03030303) << 4);
    w[3] = ((b >> 4) & 0x0F0F0F0F) | (((c >> 6) & 0x03030303) << 4);
}

// q3_K: the 16 signed scales
static inline void kq_q3_scales(const uint8_t * s, int8_t * out) {
    uint32_t w[4];
    kq_q3_words(s, w);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)((int)((w[i / 4] >> (8 * (i % 4))) & 0xFF) - 32);
}
