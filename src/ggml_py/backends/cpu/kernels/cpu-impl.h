// Internals of the CPU executor: scalar conversions with ggml's CPU numerics, the
// compute parameters every kernel receives, tensor helpers and the per-ISA tables.
//
// Float arithmetic in the conversions is that of single float32 operations: the
// library is compiled with -ffp-contract=off, so no compiler fuses a product and an
// addition into an FMA behind our back (the SIMD kernels write their FMAs explicitly).

#pragma once

#include "ggml-py-cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define GP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GP_MAX(a, b) ((a) > (b) ? (a) : (b))

#define QK8_0      32
#define QK4_0      32
#define Q8_0_BYTES 34           // f16 scale + 32 int8
#define Q4_0_BYTES 18           // f16 scale + 16 bytes of nibbles

// ---------------------------------------------------------------------------
// scalar conversions (branch-free where loops must vectorise)

static inline float gp_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t gp_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// c ? a : b without a branch
static inline uint32_t gp_sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)0 - (uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

// IEEE half bits -> float, exact; a NaN comes out quiet with its payload (vcvtph2ps)
static inline float gp_h2f(uint16_t h) {
    uint32_t sign   = (uint32_t)(h & 0x8000) << 16;
    int32_t  em     = h & 0x7FFF;
    uint32_t normal = ((uint32_t)em << 13) + ((127 - 15) << 23);
    uint32_t sub    = gp_f2u((float)em * 5.9604644775390625e-08f);        // m * 2^-24
    uint32_t special = 0x7F800000 | ((uint32_t)(em & 0x3FF) << 13) | ((uint32_t)(em > 0x7C00) << 22);
    uint32_t bits   = gp_sel(em < 0x0400, sub, gp_sel(em >= 0x7C00, special, normal));
    return gp_u2f(bits | sign);
}

// float -> IEEE half bits, round to nearest even (vcvtps2ph, imm 0): overflow gives inf,
// a NaN keeps the top 10 bits of its payload and comes out quiet
static inline uint16_t gp_f2h(float f) {
    uint32_t u = gp_f2u(f);
    int32_t  a = (int32_t)(u & 0x7FFFFFFF);
    // normal half; a carry out of the mantissa rounds into the exponent (and to inf)
    uint32_t normal = ((uint32_t)a - ((127 - 15) << 23) + 0xFFF + (((uint32_t)a >> 13) & 1)) >> 13;
    // below 2^-14: adding 0.5f puts the half's unit at the float's last bit, and the
    // float addition rounds to nearest even
    uint32_t sub = gp_f2u(gp_u2f((uint32_t)a) + 0.5f) - 0x3F000000;
    uint32_t nan = 0x7E00 | (((uint32_t)a >> 13) & 0x3FF);
    uint32_t o = gp_sel(a < 0x38800000, sub, normal);
    o = gp_sel(a >= 0x47800000, 0x7C00, o);
    o = gp_sel(a > 0x7F800000, nan, o);
    return (uint16_t)(o | ((u >> 16) & 0x8000));
}

// ggml's software float -> half (ggml_compute_fp32_to_fp16): gp_f2h, but a NaN becomes
// 0x7E00 with its sign
static inline uint16_t gp_f2h_sw(float f) {
    uint16_t h = gp_f2h(f);
    return (gp_f2u(f) & 0x7FFFFFFF) > 0x7F800000 ? (uint16_t)((h & 0x8000) | 0x7E00) : h;
}

static inline float gp_bf2f(uint16_t b) { return gp_u2f((uint32_t)b << 16); }

// ggml_compute_fp32_to_bf16: nearest even on the upper half; a NaN forced quiet
static inline uint16_t gp_f2bf(float f) {
    uint32_t u   = gp_f2u(f);
    uint32_t r   = (u + (0x7FFF + ((u >> 16) & 1))) >> 16;
    uint32_t nan = (u >> 16) | 64;
    return (uint16_t)gp_sel((u & 0x7FFFFFFF) > 0x7F800000, nan, r);
}

static inline float gp_round_f16(float f) { return gp_h2f(gp_f2h(f)); }

// Rounding of a quantised value. Both are exact for |v| < 2^22, which holds in every
// block with a finite, not too small scale; the other blocks take a slow path.

// roundf(v): halves away from zero
static inline int32_t gp_round_away(float v) {
    uint32_t u = gp_f2u(v);
    float    a = gp_u2f(u & 0x7FFFFFFF);
    int32_t  i = (int32_t)a;
    int32_t  r = i + (a >= (float)i + 0.5f);
    int32_t  s = -(int32_t)(u >> 31);
    return (r ^ s) - s;
}

// rintf(v) in the default mode: adding 1.5 * 2^52 in double leaves no fraction bits
static inline int32_t gp_round_even(float v) {
    double t = ((double)v + 6755399441055744.0) - 6755399441055744.0;
    return (int32_t)t;
}

// an integral float (or inf / NaN) to int32 as x86's cvt instructions do: what does not
// fit gives INT32_MIN (C leaves it undefined; ggml's x86 code meets it)
static inline int32_t gp_x86_i32(float r) {
    if (r != r || r >= 2147483648.0f || r < -2147483648.0f) {
        return INT32_MIN;
    }
    return (int32_t)r;
}

static inline float gp_rint_any(float v, int even) {
    if (!(v < 4194304.0f && v > -4194304.0f)) {
        return v;
    }
    return (float)(even ? gp_round_even(v) : gp_round_away(v));
}

static inline int gp_finite(float f) { return (gp_f2u(f) & 0x7F800000) != 0x7F800000; }

static inline int32_t gp_sat8(int32_t q) {
    q = (int32_t)gp_sel(q > 127, 127, (uint32_t)q);
    return (int32_t)gp_sel(q < -128, (uint32_t)-128, (uint32_t)q);
}

static inline uint16_t gp_load_le16(const uint8_t * p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline void gp_store_le16(uint8_t * p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

// ---------------------------------------------------------------------------
// compute parameters (ggml_compute_params)

struct gp_params {
    int             ith;        // this thread
    int             nth;        // threads sharing the node
    char *          wdata;      // the cplan's work buffer, shared by the threads
    size_t          wsize;
    gp_threadpool * tp;         // barriers inside a kernel; NULL when nth == 1
    gp_cplan *      cplan;      // failures and the rope cache
    int             node;       // the node's index in the cplan
};

// every thread of the node waits here (nothing when the node runs on one thread)
void gp_barrier(const gp_params * p);
void gp_threadpool_barrier(gp_threadpool * tp);

// what the pool's threads run: nodes [i0, i1) of a cplan, as thread ith
void gp_cplan_run_thread(gp_cplan * cplan, int i0, int i1, int ith, gp_threadpool * tp);
// run a job on every thread of the pool (the caller is thread 0); returns when all are done
void gp_threadpool_run(gp_threadpool * tp, gp_cplan * cplan, int i0, int i1);

// Record why a node failed (the first failure wins) and return -1. Kernels return it
// before their first barrier, from a check every thread makes alike, or after the last.
int gp_fail(const gp_params * p, const char * fmt, ...) __attribute__((format(printf, 2, 3)));

// work buffer bytes per thread are padded to a cache line
#define GP_CACHE_LINE 64
static inline size_t gp_pad(size_t n) { return (n + GP_CACHE_LINE - 1) / GP_CACHE_LINE * GP_CACHE_LINE; }

// rows [*r0, *r1) of nr for thread ith of nth
static inline void gp_rows_of(const gp_params * p, int64_t nr, int64_t * r0, int64_t * r1) {
    int64_t dr = (nr + p->nth - 1) / p->nth;
    *r0 = GP_MIN(dr * p->ith, nr);
    *r1 = GP_MIN(*r0 + dr, nr);
}

// ---------------------------------------------------------------------------
// tensors

static inline int64_t gp_nrows(const gp_tensor * t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
static inline int64_t gp_nelements(const gp_tensor * t) { return t->ne[0] * gp_nrows(t); }

static inline float gp_param_f32(const gp_tensor * t, int i) {
    float f;
    memcpy(&f, &t->op_params[i], 4);
    return f;
}

// row (i1, i2, i3) of t
static inline char * gp_row(const gp_tensor * t, int64_t i1, int64_t i2, int64_t i3) {
    return t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

// flat row index -> (i1, i2, i3)
static inline void gp_unravel_row(const gp_tensor * t, int64_t ir, int64_t * i1, int64_t * i2, int64_t * i3) {
    *i3 = ir / (t->ne[2] * t->ne[1]);
    ir -= *i3 * t->ne[2] * t->ne[1];
    *i2 = ir / t->ne[1];
    *i1 = ir - *i2 * t->ne[1];
}

// The rows of t one thread takes, in order:
//     for (gp_row_iter it = gp_rows(p, t); gp_next_row(&it);) { ... it.i1, it.i2, it.i3 ... }
typedef struct {
    const gp_tensor * t;
    int64_t r, r1;              // the row before the next one; the end
    int64_t i1, i2, i3;         // the current row's indices
} gp_row_iter;

static inline gp_row_iter gp_rows(const gp_params * p, const gp_tensor * t) {
    gp_row_iter it = {t, 0, 0, 0, 0, 0};
    gp_rows_of(p, gp_nrows(t), &it.r, &it.r1);
    it.r -= 1;
    return it;
}

static inline int gp_next_row(gp_row_iter * it) {
    if (++it->r >= it->r1) return 0;
    gp_unravel_row(it->t, it->r, &it->i1, &it->i2, &it->i3);
    return 1;
}

// per-thread float scratch rows in the work buffer: a kernel using scratch(p, n, slot)
// (slot < 4) asks for SCRATCH_WSIZE(nth, n) bytes
static inline size_t scratch_bytes(int64_t n) { return gp_pad((size_t)n * sizeof(float)); }
static inline float * scratch(const gp_params * p, int64_t n, int slot) {
    return (float *)(p->wdata + ((size_t)p->ith * 4 + (size_t)slot) * scratch_bytes(n));
}
#define SCRATCH_WSIZE(nth, n) ((size_t)(nth) * 4 * scratch_bytes(n))

// ---------------------------------------------------------------------------
// element types (types.c)

// One block of 32 values -> q[32] and the scale d (before its f16 rounding), for q8_0
// and q8_1 (quants.c). cpu = 0: ggml's reference quantisers (quantize_row_q8_0_ref /
// q8_1_ref: 1/d, halves away from zero, the int cast); cpu = 1: ggml-cpu's x86 AVX2 ones
// (127/max, halves to even, saturated). *sum, if not NULL: the sum q8_1 stores.
float gp_q8_block(const float * xb, int8_t * q, int cpu, int32_t * sum);

size_t  gp_type_size(int type);            // bytes per element (per block for q types)
int64_t gp_blck_size(int type);            // elements per block (1 for plain types)
int     gp_is_quant(int type);             // a block type
size_t  gp_row_size(int type, int64_t ne);
int     gp_same_shape(const gp_tensor * a, const gp_tensor * b);
int     gp_is_contiguous(const gp_tensor * t);

// A row of a float type as float32: x itself when it is packed f32, else tmp[n] filled
// (nb0 is the element stride of a plain type; block types are packed).
const float * gp_load_row(int type, const char * x, size_t nb0, int64_t n, float * tmp);
// float32 values into a row of a float type (block types: ggml-cpu's quantiser)
void gp_store_row(int type, char * y, size_t nb0, const float * x, int64_t n);

// ---------------------------------------------------------------------------
// the per-ISA hot loops (simd.c, compiled once per instruction set)

// A block of dot products, the heart of MUL_MAT: c[j][i] = a_i . b_j for i < rm weight
// rows (a + i * lda, k elements of the weight type) and j < rn activation rows b[j] in
// the weight type's dot form (float32 for f32/f16/bf16 weights, q8_0 blocks for
// q8_0/q4_0 weights). Every c[j][i] is summed in the same order whatever rm and rn
// are, so results do not depend on how the work is cut between tiles and threads.
typedef void (*gp_dot_tile)(int64_t k, const char * a, size_t lda, int rm,
                            const void * const * b, int rn, float * const * c);

// A GEMM of one weight type against many src1 rows (gemm-q8.c): src1's rows in the dot
// form are packed once per MUL_MAT into panels of GP_GEMM_COLS columns; then each chunk
// of at most GP_GEMM_ROWS weight rows (a, row stride lda) runs against all n columns,
// column j's results going to c + j * ldc. scratch: GP_GEMM_ROWS * (k / 32) * 8 bytes.
#define GP_GEMM_ROWS 16
#define GP_GEMM_COLS 16
typedef struct gp_gemm {
    size_t (*panel_size)(int64_t k);
    void (*pack)(int64_t k, const char * const * rows, int n, char * panel);   // n <= COLS
    void (*run)(int64_t k, const char * a, size_t lda, int rm, const char * panels, int64_t n,
                char * c, size_t ldc, void * scratch);
} gp_gemm;

typedef struct gp_simd {
    const char * name;
    // the dot tiles of the weight types, by type (NULL: MUL_MAT reads that type with its
    // vec_dot one product at a time, as the baseline build does for the block types
    // other than q8_0 / q4_0); src1 comes as float32 rows for f32 weights, f16 / bf16
    // values (as float32) for f16 / bf16 weights, and blocks of the weights' vec_dot
    // type for block types
    gp_dot_tile  tile[GP_TYPE_COUNT];
    void (*f16_to_f32)(const uint16_t * x, float * y, int64_t n);
    void (*f32_to_f16)(const float * x, uint16_t * y, int64_t n);
    void (*round_f16)(const float * x, float * y, int64_t n);
    double (*exp_sum)(const float * x, float * y, int64_t n, float max);   // y = exp(x - max)
    void (*silu_mul)(const float * x, const float * g, float * y, int64_t n);  // silu(x) * g
    // FLASH_ATTN_EXT's accumulator of n values through m steps: acc *= ms[t] where
    // ms[t] != 1, then acc += v[t] * vs[t] (rows of n f16 / float32 values); f16: each
    // step rounded to f16
    void (*acc_steps_f16)(uint16_t * acc, const void * const * v, const float * ms, const float * vs,
                          int m, int64_t n);
    void (*acc_steps_f32)(float * acc, const void * const * v, const float * ms, const float * vs,
                          int m, int64_t n);
    // its tiled path's: nr (<= 6) accumulators acc[r] += sum over t of v[t] * p[r][t], in order
    void (*acc_gemm_f32)(float * const * acc, const float * const * p, int nr, const void * const * v, int m,
                         int64_t n);
    gp_vec_dot_fn vec_dot[GP_TYPE_COUNT];   // weights read by a vec_dot (block-quants.h),
                                            // by type; NULL for the others
    const gp_gemm * gemm_q8_0;              // q8_0 rows (q4_0 ones widened: mul-mat.c) by
                                            // many columns (NULL: the dot tiles)
} gp_simd;

// the dot tiles of the types read by a vec_dot (dot-k.c, dot-legacy.c), in the AVX2 and
// AVX-512 builds: every product has its vec_dot's bits
#define GP_BLOCK_TILE(T)                                                                   \
    void gp_dot_tile_##T##_avx2(int64_t k, const char * a, size_t lda, int rm,             \
                                const void * const * b, int rn, float * const * c);        \
    void gp_dot_tile_##T##_avx512(int64_t k, const char * a, size_t lda, int rm,           \
                                  const void * const * b, int rn, float * const * c);
GP_BLOCK_TILE(q4_1)
GP_BLOCK_TILE(q5_0)
GP_BLOCK_TILE(q5_1)
GP_BLOCK_TILE(iq4_nl)
GP_BLOCK_TILE(iq4_xs)
GP_BLOCK_TILE(mxfp4)
GP_BLOCK_TILE(q2_K)
GP_BLOCK_TILE(q3_K)
GP_BLOCK_TILE(q4_K)
GP_BLOCK_TILE(q5_K)
GP_BLOCK_TILE(q6_K)

#if GP_HAVE_AVX2
void   gp_gemm_q8_0_pack_avx512(int64_t k, const char * const * rows, int n, char * panel);
size_t gp_gemm_q8_0_panel_size_avx512(int64_t k);
void   gp_gemm_q8_0_avx512(int64_t k, const char * a, size_t lda, int rm, const char * panels,
                           int64_t n, char * c, size_t ldc, void * scratch);
#endif

extern const gp_simd gp_simd_baseline;
#if GP_HAVE_AVX2
extern const gp_simd gp_simd_avx2;
extern const gp_simd gp_simd_avx512;
#endif

// The hot-loop files are compiled once per instruction set; GP_SIMD_FN(name) is name's
// definition in the one being compiled (name_baseline, name_avx2, name_avx512). The AVX-512
// build defines GP_SIMD_AVX2 too: its code is the AVX2 code.
#if defined(GP_SIMD_AVX512)
#define GP_SIMD_SUFFIX avx512
#elif defined(GP_SIMD_AVX2)
#define GP_SIMD_SUFFIX avx2
#else
#define GP_SIMD_SUFFIX baseline
#endif
#define GP_SIMD_CAT_(a, b) a##_##b
#define GP_SIMD_CAT(a, b)  GP_SIMD_CAT_(a, b)
#define GP_SIMD_FN(name)   GP_SIMD_CAT(name, GP_SIMD_SUFFIX)
extern const gp_simd * gp_simd_active;

// ---------------------------------------------------------------------------
// MUL_MAT's dot products (mul-mat.c), which FLASH_ATTN_EXT's K . Q shares: weights of type
// wtype (K) against rows in its dot form, as ggml's vec_dot_type

int    gp_dot_type_ok(int wtype);                       // a tile or a vec_dot reads it
size_t gp_dot_form_size(int wtype, int64_t k);          // bytes of a row in the dot form
// one row (k values of type xtype at x: f32, or f16 against f16) into the dot form at y
void   gp_dot_form(int wtype, int xtype, const char * x, int64_t k, char * y);
// rm x rn products c[j][i] of the weight rows at a (stride lda) with the dot-form rows b[j]:
// the weights' dot tile, or their vec_dot product by product
void   gp_dot_rows(int wtype, int64_t k, const char * a, size_t lda, int rm,
                   const void * const * b, int rn, float * const * c);

// ---------------------------------------------------------------------------
// kernel selection (ops.c, mul-mat.c, rope.c, flash-attn.c); kernels are int k(params, dst): 0, or -1
// through gp_fail


// The kernel of an op node, with its thread count and work buffer size, or NULL when
// there is none in C for this node (its types or layout): then *why says so, or is NULL
// when the node itself is invalid and *error says why.
gp_kernel gp_select_kernel(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize,
                           const char ** error);
gp_kernel gp_select_mul_mat(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize,
                            const char ** error);

gp_kernel gp_select_rope(const gp_tensor * t, int nth, size_t * wsize, const char ** error);
gp_kernel gp_select_flash_attn(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize,
                               const char ** error);

// rope cos/sin cache (rope.c), kept per cplan
typedef struct gp_rope_cache gp_rope_cache;
gp_rope_cache * gp_rope_cache_new(void);
void            gp_rope_cache_free(gp_rope_cache * c);
gp_rope_cache * gp_cplan_rope_cache(gp_cplan * cplan);
