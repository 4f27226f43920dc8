// MUL_MAT's GEMM for q8_0 weights against many src1 rows (the prompt's products), in the
// AVX-512 VNNI build only (the other builds leave gp_simd.gemm_q8_0 NULL and MUL_MAT reads
// q8_0 with its dot tiles).
//
// The dot tiles put one product in a register (8 lanes of one weight row times one
// column), so every block of every product pays for a sign trick, a conversion and a
// scale. Here a register holds 16 columns instead: lane c of
//     s = corr + sum over g < 8 of vpdpbusd(Y[g], broadcast(w[4g .. 4g + 3]))
// is a whole block's integer dot product of one weight row with column c, and the
// weight bytes come straight from the row as broadcast memory operands. Per block
// and per 16 products: 8 VNNI instructions, one conversion, two multiplies and an add.
//
// vpdpbusd multiplies unsigned by signed bytes: the columns are stored as y + 128 (the
// panel, packed once per MUL_MAT), so each lane sums (y + 128) * w, and corr, the weight
// block's -128 * sum(w) (computed once per chunk of weight rows, exactly, in int32),
// takes the offset out again. The integer sums are exact, so every product is summed in
// the order of ggml's generic vec_dot_q8_0_q8_0 (and our baseline build):
//     acc += (float)sumi * (d_w * d_y), block after block, without FMA
// whatever the tile, the column group or the thread: the bits do not depend on either.

#include "cpu-impl.h"

#ifdef GP_SIMD_AVX512
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

// bytes of one column group's block in a panel: 8 groups of 4 values x 16 columns
// (y + 128), then the 16 columns' scales as float32
#define PANEL_BLOCK (8 * 64 + 16 * sizeof(float))

// A panel: the q8_0 rows (GP_GEMM_COLS of them; fewer are padded with zero columns) in
// the form the kernel reads, block after block.
void GP_SIMD_FN(gp_gemm_q8_0_pack)(int64_t k, const char * const * rows, int n, char * panel) {
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < nb; b++, panel += PANEL_BLOCK) {
        uint32_t * q = (uint32_t *)panel;
        float * d = (float *)(panel + 8 * 64);
        for (int c = 0; c < GP_GEMM_COLS; c++) {
            const uint8_t * blk = c < n ? (const uint8_t *)rows[c] + b * Q8_0_BYTES : NULL;
            d[c] = blk ? gp_h2f(gp_load_le16(blk)) : 0.0f;
            for (int g = 0; g < 8; g++) {
                uint32_t v = 0;             // (a zero column: 0 + 128 in every byte)
                if (blk) memcpy(&v, blk + 2 + 4 * g, 4);
                q[g * GP_GEMM_COLS + c] = v ^ 0x80808080u;
            }
        }
    }
}

size_t GP_SIMD_FN(gp_gemm_q8_0_panel_size)(int64_t k) { return (size_t)(k / 32) * PANEL_BLOCK; }

// the sum of a q8_0 block's 32 weights
INLINE int32_t block_sum(const uint8_t * blk) {
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                       _mm256_set1_epi8((char)0x80));       // w + 128
    const __m256i s4 = _mm256_sad_epu8(u, _mm256_setzero_si256());         // 4 x 8 bytes
    __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    s2 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
    return _mm_cvtsi128_si32(s2) - 32 * 128;
}

// Rows [0, rm) (rm <= GP_GEMM_ROWS) of the weights at a (row stride lda) against the n
// columns packed in panels: column j's results go to c + j * ldc. scratch holds
// GP_GEMM_ROWS * (k / 32) * 8 bytes (the rows' offset corrections and scales).
void GP_SIMD_FN(gp_gemm_q8_0)(int64_t k, const char * a, size_t lda, int rm, const char * panels,
                              int64_t n, char * c, size_t ldc, void * scratch) {
    enum { R = GP_GEMM_ROWS, C = GP_GEMM_COLS };
    const int64_t nb = k / 32;
    int32_t * corr = scratch;                   // [nb][R]: -128 * the block's sum of weights
    float * dw = (float *)(corr + nb * R);      // [nb][R]: the block's scale
    const uint8_t * row[R];
    for (int r = 0; r < R; r++) {               // (missing rows repeat row 0, unstored)
        row[r] = (const uint8_t *)a + (r < rm ? r : 0) * lda;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t * blk = row[r] + b * Q8_0_BYTES;
            corr[b * R + r] = -128 * block_sum(blk);
            dw[b * R + r] = _cvtsh_ss(gp_load_le16(blk));
        }
    }
    const size_t panel_bytes = (size_t)nb * PANEL_BLOCK;
    for (int64_t j0 = 0; j0 < n; j0 += C, panels += panel_bytes) {
        __m512 acc[R];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        const char * pb = panels;
        for (int64_t b = 0; b < nb; b++, pb += PANEL_BLOCK) {
            __m512i y[8];
            for (int g = 0; g < 8; g++) y[g] = _mm512_load_si512((const void *)(pb + 64 * g));
            const __m512 dy = _mm512_load_ps((const float *)(pb + 8 * 64));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                const uint8_t * w = row[r] + b * Q8_0_BYTES + 2;
                __m512i s = _mm512_set1_epi32(corr[b * R + r]);
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) {
                    int32_t w4;
                    memcpy(&w4, w + 4 * g, 4);
                    s = _mm512_dpbusd_epi32(s, y[g], _mm512_set1_epi32(w4));
                }
                const __m512 d = _mm512_mul_ps(_mm512_set1_ps(dw[b * R + r]), dy);
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(s), d));
            }
        }
        float out[R][C];
        for (int r = 0; r < R; r++) _mm512_storeu_ps(out[r], acc[r]);
        const int cn = (int)GP_MIN(C, n - j0);
        for (int j = 0; j < cn; j++) {
            float * cj = (float *)(c + (j0 + j) * ldc);
            for (int r = 0; r < rm; r++) cj[r] = out[r][j];
        }
    }
}

#endif
