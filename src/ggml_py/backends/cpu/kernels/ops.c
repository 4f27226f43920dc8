// Row and element kernels of the CPU executor (ggml-cpu's ops.cpp, binary-ops.cpp,
// unary-ops.cpp), over ggml's strides, with ggml's numerics:
//   * element-wise ops compute in float32 and convert to the result's type (f16 rounded
//     to nearest even, q8_0 with the CPU quantiser);
//   * RMS_NORM / NORM / SUM / SOFT_MAX sum in double (ggml_float) where ggml does;
//   * GELU / GELU_QUICK / GEGLU* look f16-rounded inputs up in ggml's 65536-entry tables.
// (ROPE is in rope.c, MUL_MAT / MUL_MAT_ID in mul-mat.c, FLASH_ATTN_EXT in flash-attn.c.)
// Each kernel takes the rows of its thread (gp_rows); gp_select_kernel decides whether a
// node is one the C kernels take (types, layouts) and checks what ggml asserts.

#include "cpu-impl.h"

#include <pthread.h>
#include <stdlib.h>

// elements below which a node runs on one thread (a barrier costs about a microsecond)
#define PARALLEL_MIN_CHEAP  (1 << 16)
#define PARALLEL_MIN_COSTLY (1 << 14)

// ---------------------------------------------------------------------------
// GELU tables (ggml_table_gelu_f16 / ggml_table_gelu_quick_f16), built once

static const float GELU_COEF_A     = 0.044715f;
static const float GELU_QUICK_COEF = -1.702f;
static const float SQRT_2_OVER_PI  = 0.79788456080286535587989211986876f;
static const float SQRT_2_INV      = 0.70710678118654752440084436210484f;

static uint16_t gelu_table[1 << 16];
static uint16_t gelu_quick_table[1 << 16];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) {
        float x = gp_h2f((uint16_t)i);
        gelu_table[i] = gp_f2h(0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x))));
        gelu_quick_table[i] = gp_f2h(x * (1.0f / (1.0f + expf(GELU_QUICK_COEF * x))));
    }
}

static inline float gelu_lookup(float x) { return gp_h2f(gelu_table[gp_f2h(x)]); }
static inline float gelu_quick_lookup(float x) { return gp_h2f(gelu_quick_table[gp_f2h(x)]); }

// GELU of f32 values: the table between -10 and 10 (an f16 input always uses it)
static inline float gelu_f32(float x, int is_f16) {
    if (!is_f16) {
        if (x <= -10.0f) return 0.0f;
        if (x >= 10.0f) return x;
    }
    return gelu_lookup(x);
}

static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * SQRT_2_INV)); }

// ---------------------------------------------------------------------------
// UNARY, SQR, SQRT, CLAMP, SCALE: y = f(x) element-wise, same shape

// Every kind has its case in unary_row: a unary op listed in ggml-py-vocab.h without its
// kernel here does not compile (-Wswitch as an error over the enum, no default).
#define U_ENUM_(NAME) U_##NAME = GGML_PY_UNARY_OP_##NAME,
enum unary_kind {  // ggml_unary_op (ggml-py-vocab.h)
    GGML_PY_UNARY_OPS(U_ENUM_)
    // ops of their own that map element-wise too
    U_SQR = 100, U_SQRT, U_CLAMP, U_SCALE,
};
#undef U_ENUM_

static enum unary_kind unary_kind_of(const gp_tensor * t) {
    switch (t->op) {
        case GP_OP_SQR:   return U_SQR;
        case GP_OP_SQRT:  return U_SQRT;
        case GP_OP_CLAMP: return U_CLAMP;
        case GP_OP_SCALE: return U_SCALE;
        default:          return (enum unary_kind)t->op_params[0];   // checked by gp_select_kernel
    }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
static void unary_row(const gp_tensor * t, enum unary_kind kind, int is_f16, const float * x,
                      float * y, int64_t n) {
    switch (kind) {
        case U_ABS:   for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
        case U_SGN:   for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.f ? 1.f : (x[i] < 0.f ? -1.f : 0.f); break;
        case U_NEG:   for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
        case U_STEP:  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.f ? 1.f : 0.f; break;
        case U_TANH:  for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
        case U_ELU:   for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.f ? x[i] : expm1f(x[i]); break;
        case U_RELU:  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.f ? x[i] : 0.f; break;
        case U_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = 1.f / (1.f + expf(-x[i])); break;
        case U_GELU:  for (int64_t i = 0; i < n; i++) y[i] = gelu_f32(x[i], is_f16); break;
        case U_GELU_QUICK: for (int64_t i = 0; i < n; i++) y[i] = gelu_quick_lookup(x[i]); break;
        case U_SILU:  gp_simd_active->silu_mul(x, NULL, y, n); break;
        case U_HARDSWISH:
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * fminf(1.0f, fmaxf(0.0f, (x[i] + 3.0f) / 6.0f));
            break;
        case U_HARDSIGMOID:
            for (int64_t i = 0; i < n; i++) y[i] = fminf(1.0f, fmaxf(0.0f, (x[i] + 3.0f) / 6.0f));
            break;
        case U_EXP:   for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]); break;
        case U_EXPM1: for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]) - 1.0f; break;
        case U_SOFTPLUS:
            for (int64_t i = 0; i < n; i++) y[i] = x[i] > 20.0f ? x[i] : logf(1.0f + expf(x[i]));
            break;
        case U_GELU_ERF: for (int64_t i = 0; i < n; i++) y[i] = gelu_erf(x[i]); break;
        case U_XIELU: {
            const float an = gp_param_f32(t, 1), ap = gp_param_f32(t, 2);
            const float beta = gp_param_f32(t, 3), eps = gp_param_f32(t, 4);
            for (int64_t i = 0; i < n; i++) {
                y[i] = x[i] > 0.0f ? ap * x[i] * x[i] + beta * x[i]
                                   : (expm1f(fminf(x[i], eps)) - x[i]) * an + beta * x[i];
            }
            break;
        }
        case U_FLOOR: for (int64_t i = 0; i < n; i++) y[i] = floorf(x[i]); break;
        case U_CEIL:  for (int64_t i = 0; i < n; i++) y[i] = ceilf(x[i]); break;
        case U_ROUND: for (int64_t i = 0; i < n; i++) y[i] = roundf(x[i]); break;
        case U_TRUNC: for (int64_t i = 0; i < n; i++) y[i] = truncf(x[i]); break;
        case U_SQR:   for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
        case U_SQRT:  for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
        case U_CLAMP: {
            const float lo = gp_param_f32(t, 0), hi = gp_param_f32(t, 1);
            for (int64_t i = 0; i < n; i++) y[i] = fmaxf(fminf(x[i], hi), lo);
            break;
        }
        case U_SCALE: {                 // x * s (+ b)
            const float sc = gp_param_f32(t, 0), b = gp_param_f32(t, 1);
            if (b == 0.0f) for (int64_t i = 0; i < n; i++) y[i] = x[i] * sc;
            else for (int64_t i = 0; i < n; i++) y[i] = x[i] * sc + b;
            break;
        }
    }
}
#pragma GCC diagnostic pop

static int k_unary(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    const enum unary_kind kind = unary_kind_of(dst);
    const int64_t n = dst->ne[0];
    const int direct = dst->type == GP_TYPE_F32 && dst->nb[0] == sizeof(float);
    float * tx = scratch(p, n, 0);
    float * ty = scratch(p, n, 1);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        char * yrow = gp_row(dst, it.i1, it.i2, it.i3);
        const float * x = gp_load_row(src->type, gp_row(src, it.i1, it.i2, it.i3), src->nb[0], n, tx);
        float * y = direct ? (float *)yrow : ty;
        unary_row(dst, kind, src->type == GP_TYPE_F16, x, y, n);
        if (!direct) gp_store_row(dst->type, yrow, dst->nb[0], ty, n);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// ADD / SUB / MUL / DIV: b repeats over a by modulo in every dim (dim 0 included)

static inline float binary(int op, float a, float b) {
    switch (op) {
        case GP_OP_ADD: return a + b;
        case GP_OP_SUB: return a - b;
        case GP_OP_MUL: return a * b;
        default:        return a / b;
    }
}

static int k_binary(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * a = dst->src[0];
    const gp_tensor * b = dst->src[1];
    const int op = dst->op;
    const int64_t n = dst->ne[0], nb0 = b->ne[0];
    const int all_f32 = a->type == GP_TYPE_F32 && b->type == GP_TYPE_F32 && dst->type == GP_TYPE_F32 &&
                        a->nb[0] == 4 && b->nb[0] == 4 && dst->nb[0] == 4;
    float * ta = scratch(p, n, 0);
    float * tb = scratch(p, n, 1);
    float * ty = scratch(p, n, 2);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * arow = gp_row(a, i1, i2, i3);
        const char * brow = gp_row(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        char * yrow = gp_row(dst, i1, i2, i3);
        if (all_f32) {
            // in place on a or b is fine: each element is read before it is written
            const float * x = (const float *)arow;
            const float * y = (const float *)brow;
            float * z = (float *)yrow;
            if (nb0 == n) {
                switch (op) {
                    case GP_OP_ADD: for (int64_t i = 0; i < n; i++) z[i] = x[i] + y[i]; break;
                    case GP_OP_SUB: for (int64_t i = 0; i < n; i++) z[i] = x[i] - y[i]; break;
                    case GP_OP_MUL: for (int64_t i = 0; i < n; i++) z[i] = x[i] * y[i]; break;
                    default:        for (int64_t i = 0; i < n; i++) z[i] = x[i] / y[i]; break;
                }
            } else {
                for (int64_t i = 0; i < n; i++) z[i] = binary(op, x[i], y[i % nb0]);
            }
            continue;
        }
        const float * x = gp_load_row(a->type, arow, a->nb[0], n, ta);
        const float * y = gp_load_row(b->type, brow, b->nb[0], nb0, tb);
        for (int64_t i = 0; i < n; i++) ty[i] = binary(op, x[i], y[i % nb0]);
        gp_store_row(dst->type, yrow, dst->nb[0], ty, n);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// RMS_NORM / NORM over dim 0 (ggml_compute_forward_rms_norm_f32 / norm_f32)

static int k_norm(const gp_params * p, gp_tensor * dst) {   // NORM and RMS_NORM
    const gp_tensor * src = dst->src[0];
    const float eps = gp_param_f32(dst, 0);
    const int64_t n = dst->ne[0];
    const int rms = dst->op == GP_OP_RMS_NORM;
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const float * x = (const float *)gp_row(src, it.i1, it.i2, it.i3);
        float * y = (float *)gp_row(dst, it.i1, it.i2, it.i3);
        float scale;
        if (rms) {                          // x / sqrt(mean(x^2) + eps)
            double sum = 0.0;
            for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
            const float mean = (float)(sum / (double)n);
            scale = 1.0f / sqrtf(mean + eps);
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
            continue;
        }
        double sum = 0.0;                   // (x - mean) / sqrt(var + eps)
        for (int64_t i = 0; i < n; i++) sum += (double)x[i];
        const float mean = (float)sum / (float)n;
        double var = 0.0;
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i] - mean;
            var += (double)(y[i] * y[i]);
        }
        scale = 1.0f / sqrtf((float)(var / (double)n) + eps);
        for (int64_t i = 0; i < n; i++) y[i] *= scale;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// SOFT_MAX (mask, scale, ALiBi, sinks)

static int k_soft_max(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src  = dst->src[0];
    const gp_tensor * mask = dst->src[1];
    const gp_tensor * sink = dst->src[2];
    const float scale = gp_param_f32(dst, 0), max_bias = gp_param_f32(dst, 1);
    const int64_t n = dst->ne[0];
    const uint32_t n_head = (uint32_t)src->ne[2];
    const uint32_t n_head_log2 = n_head ? 1u << (uint32_t)floor(log2(n_head)) : 1;
    const float m0 = powf(2.0f, -(max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    float * wp = scratch(p, n, 0);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const uint32_t h = (uint32_t)i2;
        const float slope = max_bias > 0.0f ? (h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1))
                                            : 1.0f;
        const float * x = (const float *)gp_row(src, i1, i2, i3);
        float * y = (float *)gp_row(dst, i1, i2, i3);
        for (int64_t i = 0; i < n; i++) wp[i] = x[i] * scale;
        if (mask) {
            const char * mrow = gp_row(mask, i1, i2 % mask->ne[2], i3 % mask->ne[3]);
            if (mask->type == GP_TYPE_F16) {
                for (int64_t i = 0; i < n; i++) wp[i] += slope * gp_h2f(((const uint16_t *)mrow)[i]);
            } else {
                for (int64_t i = 0; i < n; i++) wp[i] += slope * ((const float *)mrow)[i];
            }
        }
        float max = -INFINITY;
        for (int64_t i = 0; i < n; i++) max = fmaxf(max, wp[i]);
        float sk = 0.0f;
        if (sink) {
            sk = ((const float *)sink->data)[i2];
            max = fmaxf(max, sk);
        }
        double sum = gp_simd_active->exp_sum(wp, y, n, max);
        if (sink) sum += (double)expf(sk - max);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) y[i] *= inv;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// GLU: act(x) * g, x and g the two halves of a row (swapped on request) or two tensors

// (each GLU op has its case in k_glu's switch, or the file does not compile)
#define GLU_ENUM_(NAME) GLU_##NAME = GGML_PY_GLU_OP_##NAME,
enum glu_kind { GGML_PY_GLU_OPS(GLU_ENUM_) };   // ggml_glu_op
#undef GLU_ENUM_

#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
static int k_glu(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * a = dst->src[0];
    const gp_tensor * b = dst->src[1];
    const enum glu_kind op = (enum glu_kind)dst->op_params[0];  // checked by gp_select_kernel
    const int swapped = dst->op_params[1];
    const int64_t nc = dst->ne[0];
    const int is_f16 = a->type == GP_TYPE_F16;
    const size_t es = gp_type_size(a->type);
    float * tx = scratch(p, nc, 0);
    float * tg = scratch(p, nc, 1);
    float * ty = scratch(p, nc, 2);
    const float alpha = gp_param_f32(dst, 2), limit = gp_param_f32(dst, 3);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * xrow = gp_row(a, i1, i2, i3);
        const char * grow_ = b ? gp_row(b, i1, i2, i3) : xrow + nc * es;
        if (!b && swapped) {
            const char * t = xrow;
            xrow = grow_;
            grow_ = t;
        }
        const float * x = gp_load_row(a->type, xrow, es, nc, tx);
        const float * g = gp_load_row(b ? b->type : a->type, grow_, b ? b->nb[0] : es, nc, tg);
        float * y = dst->type == GP_TYPE_F32 ? (float *)gp_row(dst, i1, i2, i3) : ty;
        switch (op) {
            case GLU_REGLU:
                for (int64_t i = 0; i < nc; i++) y[i] = x[i] > 0.f ? x[i] * g[i] : 0.f;
                break;
            case GLU_GEGLU:
                for (int64_t i = 0; i < nc; i++) {
                    if (!is_f16 && x[i] <= -10.0f) y[i] = 0.0f;
                    else if (!is_f16 && x[i] >= 10.0f) y[i] = x[i] * g[i];
                    else y[i] = gelu_lookup(x[i]) * g[i];
                }
                break;
            case GLU_SWIGLU:
                gp_simd_active->silu_mul(x, g, y, nc);
                break;
            case GLU_SWIGLU_OAI:
                for (int64_t i = 0; i < nc; i++) {
                    const float xi = fminf(x[i], limit);
                    const float gi = fmaxf(fminf(g[i], limit), -limit);
                    y[i] = (xi / (1.0f + expf(alpha * (-xi)))) * (gi + 1.0f);
                }
                break;
            case GLU_GEGLU_ERF:
                for (int64_t i = 0; i < nc; i++) y[i] = gelu_erf(x[i]) * g[i];
                break;
            case GLU_GEGLU_QUICK:
                for (int64_t i = 0; i < nc; i++) y[i] = gelu_quick_lookup(x[i]) * g[i];
                break;
        }
        if (y == ty) gp_store_row(dst->type, gp_row(dst, i1, i2, i3), dst->nb[0], ty, nc);
    }
    return 0;
}
#pragma GCC diagnostic pop

// n elements of es bytes from stride sx to stride sy (fixed-size memcpy: one move each)
static void copy_strided(char * y, size_t sy, const char * x, size_t sx, int64_t n, size_t es) {
    switch (es) {
        case 4: for (int64_t i = 0; i < n; i++) memcpy(y + i * sy, x + i * sx, 4); break;
        case 2: for (int64_t i = 0; i < n; i++) memcpy(y + i * sy, x + i * sx, 2); break;
        case 8: for (int64_t i = 0; i < n; i++) memcpy(y + i * sy, x + i * sx, 8); break;
        default: for (int64_t i = 0; i < n; i++) memcpy(y + i * sy, x + i * sx, es); break;
    }
}

// ---------------------------------------------------------------------------
// GET_ROWS: dst row (i10, i11, i12) = src0 row (ids[i10, i11, i12], i11, i12) as float32
// (i32 rows are copied)

static int read_index(const gp_tensor * idx, int64_t i0, int64_t i1, int64_t i2, int64_t * v) {
    const char * e = idx->data + i0 * idx->nb[0] + i1 * idx->nb[1] + i2 * idx->nb[2];
    *v = idx->type == GP_TYPE_I64 ? *(const int64_t *)e : *(const int32_t *)e;
    return 0;
}

static int k_get_rows(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * a = dst->src[0];
    const gp_tensor * ids = dst->src[1];
    const int64_t nc = a->ne[0];
    int64_t r0, r1;
    gp_rows_of(p, gp_nelements(ids), &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i12 = r / (ids->ne[1] * ids->ne[0]);
        const int64_t i11 = (r - i12 * ids->ne[1] * ids->ne[0]) / ids->ne[0];
        const int64_t i10 = r - i12 * ids->ne[1] * ids->ne[0] - i11 * ids->ne[0];
        int64_t row;
        read_index(ids, i10, i11, i12, &row);
        if (row < 0 || row >= a->ne[1]) {
            return gp_fail(p, "row id %lld out of range 0..%lld", (long long)row, (long long)a->ne[1] - 1);
        }
        const char * x = gp_row(a, row, i11, i12);
        char * y = gp_row(dst, i10, i11, i12);
        if (a->type == dst->type) {         // f32 -> f32, i32 -> i32
            const size_t es = gp_type_size(a->type);
            if (a->nb[0] == es && dst->nb[0] == es) {
                memcpy(y, x, (size_t)nc * es);
            } else {
                copy_strided(y, dst->nb[0], x, a->nb[0], nc, es);
            }
        } else if (dst->nb[0] == sizeof(float)) {
            const float * v = gp_load_row(a->type, x, a->nb[0], nc, (float *)y);
            if ((const char *)v != y) memcpy(y, v, (size_t)nc * sizeof(float));
        } else {
            float * t = scratch(p, nc, 0);
            gp_store_row(GP_TYPE_F32, y, dst->nb[0], gp_load_row(a->type, x, a->nb[0], nc, t), nc);
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// SET_ROWS: dst row (idx[i, i02 % ne11, i03 % ne12], i02, i03) = src row (i, i02, i03),
// converted to dst's type; the node is a view of dst

static int k_set_rows(const gp_params * p, gp_tensor * node) {
    const gp_tensor * src = node->src[0];
    const gp_tensor * idx = node->src[1];
    gp_tensor * dst = node;             // a view of src[2]: same data, shape and strides
    const int64_t nc = src->ne[0], nr = src->ne[1];
    float * t = scratch(p, nc, 0);
    int64_t r0, r1;
    gp_rows_of(p, nr, &r0, &r1);
    for (int64_t i03 = 0; i03 < src->ne[3]; i03++) {
        for (int64_t i02 = 0; i02 < src->ne[2]; i02++) {
            for (int64_t i = r0; i < r1; i++) {
                int64_t row;
                read_index(idx, i, i02 % idx->ne[1], i03 % idx->ne[2], &row);
                if (row < 0 || row >= dst->ne[1]) {
                    return gp_fail(p, "row id %lld out of range 0..%lld", (long long)row,
                                   (long long)dst->ne[1] - 1);
                }
                const float * x = gp_load_row(src->type, gp_row(src, i, i02, i03), src->nb[0], nc, t);
                gp_store_row(dst->type, gp_row(dst, row, i02, i03), dst->nb[0], x, nc);
            }
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// DUP / CONT / CPY: element k of the source (logical order) to element k of dst

// one element of a plain float type
static inline float load1(int type, const char * x) {
    switch (type) {
        case GP_TYPE_F16:  return gp_h2f(*(const uint16_t *)x);
        case GP_TYPE_BF16: return gp_bf2f(*(const uint16_t *)x);
        default:           return *(const float *)x;
    }
}

static int k_copy(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    const int64_t n = dst->ne[0];
    const int same = gp_same_shape(src, dst);
    const int same_type = src->type == dst->type;
    const size_t es = gp_type_size(src->type);
    float * tx = scratch(p, n, 0);
    int64_t r0, r1;
    gp_rows_of(p, gp_nrows(dst), &r0, &r1);
    // the source position of dst row r0 (shapes may differ; only counts must agree)
    int64_t s[4];
    {
        int64_t k = r0 * n;
        for (int d = 0; d < GP_MAX_DIMS; d++) {
            s[d] = k % src->ne[d];
            k /= src->ne[d];
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        gp_unravel_row(dst, r, &i1, &i2, &i3);
        char * y = gp_row(dst, i1, i2, i3);
        if (same) {
            const char * x = gp_row(src, i1, i2, i3);
            if (same_type && (gp_is_quant(src->type) || (src->nb[0] == es && dst->nb[0] == es))) {
                memcpy(y, x, gp_row_size(src->type, n));
            } else if (same_type) {
                copy_strided(y, dst->nb[0], x, src->nb[0], n, es);
            } else {
                gp_store_row(dst->type, y, dst->nb[0], gp_load_row(src->type, x, src->nb[0], n, tx), n);
            }
            continue;
        }
        // walk the source element by element (plain types only)
        for (int64_t i = 0; i < n; i++) {
            const char * x = src->data + s[0] * src->nb[0] + s[1] * src->nb[1] + s[2] * src->nb[2] + s[3] * src->nb[3];
            if (same_type) {
                memcpy(y + i * dst->nb[0], x, es);
            } else {
                tx[i] = load1(src->type, x);
            }
            for (int d = 0; d < GP_MAX_DIMS; d++) {
                if (++s[d] < src->ne[d]) break;
                s[d] = 0;
            }
        }
        if (!same_type) {
            gp_store_row(dst->type, y, dst->nb[0], tx, n);
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// small reductions and shape ops

static int k_sum_rows(const gp_params * p, gp_tensor * dst) {     // SUM_ROWS and MEAN
    const gp_tensor * src = dst->src[0];
    const int64_t n = src->ne[0];
    for (gp_row_iter it = gp_rows(p, src); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * x = gp_row(src, i1, i2, i3);
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)*(const float *)(x + i * src->nb[0]);
        float v = (float)sum;
        if (dst->op == GP_OP_MEAN) v /= (float)n;
        *(float *)gp_row(dst, i1, i2, i3) = v;
    }
    return 0;
}

static int k_sum(const gp_params * p, gp_tensor * dst) {     // (on one thread)
    const gp_tensor * src = dst->src[0];
    double sum = 0.0;
    for (gp_row_iter it = gp_rows(p, src); gp_next_row(&it);) {
        const char * x = gp_row(src, it.i1, it.i2, it.i3);
        double row = 0.0;
        for (int64_t i = 0; i < src->ne[0]; i++) row += (double)*(const float *)(x + i * src->nb[0]);
        sum += row;
    }
    *(float *)dst->data = (float)sum;
    return 0;
}

static int k_repeat(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    const size_t es = gp_type_size(src->type);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * x = gp_row(src, i1 % src->ne[1], i2 % src->ne[2], i3 % src->ne[3]);
        char * y = gp_row(dst, i1, i2, i3);
        for (int64_t i = 0; i < dst->ne[0]; i++) memcpy(y + i * dst->nb[0], x + (i % src->ne[0]) * src->nb[0], es);
    }
    return 0;
}

static int k_concat(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * a = dst->src[0];
    const gp_tensor * b = dst->src[1];
    const int dim = dst->op_params[0];
    const size_t es = gp_type_size(a->type);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        int64_t i[4] = {0, it.i1, it.i2, it.i3};
        char * y = gp_row(dst, i[1], i[2], i[3]);
        for (i[0] = 0; i[0] < dst->ne[0]; i[0]++) {
            const gp_tensor * s = a;
            int64_t j[4] = {i[0], i[1], i[2], i[3]};
            if (i[dim] >= a->ne[dim]) {
                s = b;
                j[dim] -= a->ne[dim];
            }
            memcpy(y + i[0] * dst->nb[0], s->data + j[0] * s->nb[0] + j[1] * s->nb[1] + j[2] * s->nb[2] + j[3] * s->nb[3], es);
        }
    }
    return 0;
}

static int k_diag_mask_inf(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    const int n_past = dst->op_params[0];
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * x = gp_row(src, i1, i2, i3);
        char * y = gp_row(dst, i1, i2, i3);
        for (int64_t i = 0; i < dst->ne[0]; i++) {
            const float v = *(const float *)(x + i * src->nb[0]);
            *(float *)(y + i * dst->nb[0]) = i > n_past + i1 ? -INFINITY : v;
        }
    }
    return 0;
}

static int k_pad(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    const int32_t * pp = dst->op_params;
    const int64_t lp[4] = {pp[0], pp[2], pp[4], pp[6]};
    const int circular = pp[8];
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        int64_t i[4] = {0, it.i1, it.i2, it.i3};
        char * y = gp_row(dst, i[1], i[2], i[3]);
        for (i[0] = 0; i[0] < dst->ne[0]; i[0]++) {
            int64_t j[4];
            int inside = 1;
            for (int d = 0; d < 4; d++) {
                j[d] = i[d] - lp[d];
                if (circular) {
                    j[d] = ((j[d] % src->ne[d]) + src->ne[d]) % src->ne[d];
                } else if (j[d] < 0 || j[d] >= src->ne[d]) {
                    inside = 0;
                }
            }
            *(float *)(y + i[0] * dst->nb[0]) = inside
                ? *(const float *)(src->data + j[0] * src->nb[0] + j[1] * src->nb[1] + j[2] * src->nb[2] + j[3] * src->nb[3])
                : 0.0f;
        }
    }
    return 0;
}

static int k_arange(const gp_params * p, gp_tensor * dst) {
    const float start = gp_param_f32(dst, 0), step = gp_param_f32(dst, 2);
    int64_t r0, r1;
    gp_rows_of(p, dst->ne[0], &r0, &r1);
    for (int64_t i = r0; i < r1; i++) ((float *)dst->data)[i] = start + step * (float)i;
    return 0;
}

// ---------------------------------------------------------------------------
// ARGSORT / TOP_K: indices of each row's values

// Rows are ordered like numpy's stable argsort (of -x for descending): equal values keep
// their index order and NaNs go last either way (std::sort leaves both unspecified).
typedef struct { float v; int32_t i; } keyed;

static inline int cmp_keyed(const keyed * a, const keyed * b, int desc) {
    const int na = isnan(a->v), nb = isnan(b->v);
    if (na != nb) return na ? 1 : -1;
    if (!na) {
        if (a->v < b->v) return desc ? 1 : -1;
        if (a->v > b->v) return desc ? -1 : 1;
    }
    return (a->i > b->i) - (a->i < b->i);
}

static int cmp_asc(const void * x, const void * y) { return cmp_keyed(x, y, 0); }
static int cmp_desc(const void * x, const void * y) { return cmp_keyed(x, y, 1); }

static int k_sort(const gp_params * p, gp_tensor * dst) {   // ARGSORT and TOP_K
    const gp_tensor * src = dst->src[0];
    const int64_t n = src->ne[0], k = dst->ne[0];
    const int desc = dst->op == GP_OP_TOP_K || dst->op_params[0] == 1;
    keyed * tmp = (keyed *)scratch(p, 2 * n, 0);
    for (gp_row_iter it = gp_rows(p, src); gp_next_row(&it);) {
        const int64_t i1 = it.i1, i2 = it.i2, i3 = it.i3;
        const char * x = gp_row(src, i1, i2, i3);
        for (int64_t j = 0; j < n; j++) {
            tmp[j].v = *(const float *)(x + j * src->nb[0]);
            tmp[j].i = (int32_t)j;
        }
        qsort(tmp, (size_t)n, sizeof(keyed), desc ? cmp_desc : cmp_asc);
        char * y = gp_row(dst, i1, i2, i3);
        for (int64_t j = 0; j < k; j++) *(int32_t *)(y + j * dst->nb[0]) = tmp[j].i;
        if (dst->op == GP_OP_TOP_K && k > 1) {      // ggml swaps the first two on purpose
            int32_t * d0 = (int32_t *)y;
            int32_t * d1 = (int32_t *)(y + dst->nb[0]);
            int32_t t = *d0;
            *d0 = *d1;
            *d1 = t;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// selection: the C kernel of a node, or NULL (the numpy kernel runs it; *error set when
// the node is one ggml would abort on)

static int float_rows(const gp_tensor * t) {
    // a float type the row loaders read: plain types with any dim-0 stride, block types packed
    return (t->type == GP_TYPE_F32 || t->type == GP_TYPE_F16 || t->type == GP_TYPE_BF16) ||
           (gp_is_quant(t->type) && gp_type_known(t->type) && t->nb[0] == gp_type_size(t->type) &&
            t->ne[0] % gp_blck_size(t->type) == 0);
}

static int is_f32_rows(const gp_tensor * t) { return t->type == GP_TYPE_F32 && t->nb[0] == sizeof(float); }
static int can_repeat(const gp_tensor * b, const gp_tensor * a) {
    for (int d = 0; d < GP_MAX_DIMS; d++) {
        if (b->ne[d] == 0 || a->ne[d] % b->ne[d]) return 0;
    }
    return 1;
}

int gp_op_has_kernel(int op) {
#define KERNEL_OP_(NAME) case GP_OP_##NAME:
    switch (op) {
        GP_KERNEL_OPS(KERNEL_OP_) return 1;
        default: return 0;
    }
#undef KERNEL_OP_
}

gp_kernel gp_select_kernel(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize, const char ** error) {
    const gp_tensor * s0 = t->src[0];
    const gp_tensor * s1 = t->src[1];
    const int64_t n = gp_nelements(t);
    int costly = 0;
    gp_kernel k = NULL;
    *error = NULL;
    *wsize = 0;
    *n_tasks = 1;

    switch (t->op) {
        case GP_OP_MUL_MAT:
        case GP_OP_MUL_MAT_ID:
            return gp_select_mul_mat(t, nth, n_tasks, wsize, error);

        case GP_OP_FLASH_ATTN_EXT:
            return gp_select_flash_attn(t, nth, n_tasks, wsize, error);

        case GP_OP_ADD: case GP_OP_SUB: case GP_OP_MUL: case GP_OP_DIV:
            if (!s0 || !s1 || !gp_same_shape(s0, t) || !can_repeat(s1, s0)) {
                *error = "src1 does not repeat into src0, or the result's shape is not src0's";
                return NULL;
            }
            if (t->type != s0->type || gp_is_quant(t->type) || gp_is_quant(s1->type) || !float_rows(s0) ||
                !float_rows(s1) || !float_rows(t)) return NULL;
            k = k_binary;
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;

        case GP_OP_SQR: case GP_OP_SQRT: case GP_OP_CLAMP: case GP_OP_UNARY: case GP_OP_SCALE:
            if (!s0 || !gp_same_shape(s0, t)) { *error = "shape differs from the source's"; return NULL; }
            if (t->op == GP_OP_UNARY && (t->op_params[0] < 0 || t->op_params[0] >= GGML_PY_UNARY_OP_COUNT)) {
                *error = "unknown unary op";
                return NULL;
            }
            if (gp_is_quant(t->type) || gp_is_quant(s0->type) || !float_rows(s0) || !float_rows(t)) return NULL;
            k = k_unary;
            costly = t->op == GP_OP_UNARY;
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;

        case GP_OP_RMS_NORM: case GP_OP_NORM:
            if (!s0 || !gp_same_shape(s0, t)) { *error = "shape differs from the source's"; return NULL; }
            if (!is_f32_rows(s0) || !is_f32_rows(t)) return NULL;
            k = k_norm;
            break;

        case GP_OP_SOFT_MAX: {
            const gp_tensor * mask = t->src[1];
            const gp_tensor * sink = t->src[2];
            if (!s0 || !gp_same_shape(s0, t)) { *error = "shape differs from the source's"; return NULL; }
            if (mask && (mask->ne[0] != s0->ne[0] || mask->ne[1] < s0->ne[1] || mask->ne[2] == 0 ||
                         mask->ne[3] == 0)) {
                *error = "the mask's rows are shorter or fewer than the input's";
                return NULL;
            }
            if (sink && gp_nelements(sink) < s0->ne[2]) { *error = "fewer sinks than heads"; return NULL; }
            if (!is_f32_rows(s0) || !is_f32_rows(t)) return NULL;
            if (mask && !((mask->type == GP_TYPE_F32 && mask->nb[0] == 4) ||
                          (mask->type == GP_TYPE_F16 && mask->nb[0] == 2))) return NULL;
            if (sink && !(sink->type == GP_TYPE_F32 && gp_is_contiguous(sink))) return NULL;
            k = k_soft_max;
            costly = 1;
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;
        }

        case GP_OP_ROPE:
            if (!(k = gp_select_rope(t, nth, wsize, error))) return NULL;
            costly = 1;
            break;

        case GP_OP_GLU: {
            const int64_t nc = t->ne[0];
            if (!s0 || t->op_params[0] < 0 || t->op_params[0] >= GGML_PY_GLU_OP_COUNT) { *error = "unknown glu op"; return NULL; }
            if (s1 ? !gp_same_shape(s0, s1) || s0->ne[0] != nc : s0->ne[0] / 2 != nc) {
                *error = "the halves (or the two sources) do not match the result";
                return NULL;
            }
            if (t->ne[1] != s0->ne[1] || t->ne[2] != s0->ne[2] || t->ne[3] != s0->ne[3]) {
                *error = "the result's rows are not the source's";
                return NULL;
            }
            if ((s0->type != GP_TYPE_F32 && s0->type != GP_TYPE_F16) || t->type != s0->type ||
                s0->nb[0] != gp_type_size(s0->type) || t->nb[0] != gp_type_size(t->type) ||
                (s1 && (s1->type != s0->type || s1->nb[0] != gp_type_size(s1->type)))) return NULL;
            k = k_glu;
            costly = 1;
            *wsize = SCRATCH_WSIZE(nth, nc);
            break;
        }

        case GP_OP_GET_ROWS:
            if (!s0 || !s1 || (s1->type != GP_TYPE_I32) || s1->ne[3] != 1 ||
                t->ne[0] != s0->ne[0] || t->ne[1] != s1->ne[0] || t->ne[2] != s1->ne[1] ||
                t->ne[3] != s1->ne[2] || s0->ne[2] != s1->ne[1] || s0->ne[3] != s1->ne[2]) {
                *error = "rows [n, m, d2, d3] and i32 ids [r, d2, d3] give [n, r, d2, d3]";
                return NULL;
            }
            if (!(float_rows(s0) || s0->type == GP_TYPE_I32) ||
                !((t->type == GP_TYPE_F32 && s0->type != GP_TYPE_I32) || (t->type == GP_TYPE_I32 && s0->type == GP_TYPE_I32)))
                return NULL;
            k = k_get_rows;
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;

        case GP_OP_SET_ROWS: {
            const gp_tensor * idx = t->src[1];
            const gp_tensor * dst = t->src[2];
            if (!s0 || !idx || !dst || !gp_same_shape(t, dst) || s0->ne[0] != t->ne[0] ||
                s0->ne[2] != t->ne[2] || s0->ne[3] != t->ne[3] || idx->ne[0] != s0->ne[1] ||
                idx->ne[1] == 0 || idx->ne[2] == 0 || s0->ne[2] % idx->ne[1] || s0->ne[3] % idx->ne[2] ||
                (idx->type != GP_TYPE_I32 && idx->type != GP_TYPE_I64)) {
                *error = "rows, i32/i64 ids and destination do not fit together";
                return NULL;
            }
            if (t->data != dst->data || memcmp(t->nb, dst->nb, sizeof(t->nb)) != 0 || t->type != dst->type) {
                return NULL;        // not the view of dst ggml returns
            }
            if (s0->type != GP_TYPE_F32 || !float_rows(t) || (gp_is_quant(t->type) && t->ne[0] % gp_blck_size(t->type))) return NULL;
            k = k_set_rows;
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;
        }

        case GP_OP_DUP: case GP_OP_CONT: case GP_OP_CPY:
            if (!s0 || gp_nelements(s0) != n) { *error = "source and result hold different element counts"; return NULL; }
            if (s0->type == t->type && !gp_is_quant(t->type) && gp_type_known(t->type)) {
                k = k_copy;
            } else if (s0->type == t->type && gp_is_quant(t->type) && gp_same_shape(s0, t) &&
                       float_rows(s0) && float_rows(t)) {
                k = k_copy;
            } else if (float_rows(s0) && float_rows(t) &&
                       (gp_same_shape(s0, t) || (!gp_is_quant(s0->type) && !gp_is_quant(t->type)))) {
                k = k_copy;
            } else {
                return NULL;
            }
            *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
            break;

        case GP_OP_SUM_ROWS: case GP_OP_MEAN:
            if (!s0 || t->ne[0] != 1 || t->ne[1] != s0->ne[1] || t->ne[2] != s0->ne[2] || t->ne[3] != s0->ne[3]) {
                *error = "the result is not [1, ne1, ne2, ne3] of the source";
                return NULL;
            }
            if (s0->type != GP_TYPE_F32 || t->type != GP_TYPE_F32) return NULL;
            k = k_sum_rows;
            break;

        case GP_OP_SUM:
            if (!s0 || n != 1) { *error = "the result is not one element"; return NULL; }
            if (s0->type != GP_TYPE_F32 || t->type != GP_TYPE_F32) return NULL;
            k = k_sum;
            break;

        case GP_OP_REPEAT:
            if (!s0 || !can_repeat(s0, t)) { *error = "the source does not repeat into the result"; return NULL; }
            if (s0->type != t->type || gp_is_quant(t->type) || !gp_type_known(t->type)) return NULL;
            k = k_repeat;
            break;

        case GP_OP_CONCAT: {
            const int dim = t->op_params[0];
            if (!s0 || !s1 || dim < 0 || dim > 3) { *error = "needs two sources and a dim in 0..3"; return NULL; }
            for (int d = 0; d < 4; d++) {
                if ((d == dim ? s0->ne[d] + s1->ne[d] : s0->ne[d]) != t->ne[d] || (d != dim && s1->ne[d] != t->ne[d])) {
                    *error = "the sources do not concatenate to the result's shape";
                    return NULL;
                }
            }
            if (s0->type != t->type || s1->type != t->type || gp_is_quant(t->type) || !gp_type_known(t->type)) return NULL;
            k = k_concat;
            break;
        }

        case GP_OP_DIAG_MASK_INF:
            if (!s0 || !gp_same_shape(s0, t)) { *error = "shape differs from the source's"; return NULL; }
            if (s0->type != GP_TYPE_F32 || t->type != GP_TYPE_F32) return NULL;
            k = k_diag_mask_inf;
            break;

        case GP_OP_PAD:
            if (!s0) { *error = "needs a source"; return NULL; }
            for (int d = 0; d < 4; d++) {
                if (t->ne[d] != s0->ne[d] + t->op_params[2 * d] + t->op_params[2 * d + 1] ||
                    t->op_params[2 * d] < 0 || t->op_params[2 * d + 1] < 0 || s0->ne[d] == 0) {
                    *error = "the result is not the source with its padding";
                    return NULL;
                }
            }
            if (s0->type != GP_TYPE_F32 || t->type != GP_TYPE_F32) return NULL;
            k = k_pad;
            break;

        case GP_OP_ARANGE:
            if (t->type != GP_TYPE_F32 || !is_f32_rows(t) || gp_nrows(t) != 1) return NULL;
            k = k_arange;
            break;

        case GP_OP_ARGSORT: case GP_OP_TOP_K:
            if (!s0 || t->ne[1] != s0->ne[1] || t->ne[2] != s0->ne[2] || t->ne[3] != s0->ne[3] ||
                t->ne[0] > s0->ne[0] || (t->op == GP_OP_ARGSORT && t->ne[0] != s0->ne[0])) {
                *error = "the result's rows do not fit the source's";
                return NULL;
            }
            if (s0->type != GP_TYPE_F32 || t->type != GP_TYPE_I32) return NULL;
            k = k_sort;
            costly = 1;
            *wsize = SCRATCH_WSIZE(nth, 2 * s0->ne[0]);
            break;

        default:
            return NULL;
    }
    if (t->op == GP_OP_UNARY || t->op == GP_OP_GLU) {
        pthread_once(&tables_once, build_tables);
    }
    *n_tasks = n >= (costly ? PARALLEL_MIN_COSTLY : PARALLEL_MIN_CHEAP) ? nth : 1;
    if (t->op == GP_OP_SUM) *n_tasks = 1;
    return k;
}
