// FLASH_ATTN_EXT (ggml-cpu's ggml_compute_forward_flash_attn_ext_f16):
// softmax(K . Q * scale [soft-capped] + slope * mask) . V for each query row, with the
// online softmax and ggml's numerics on its two paths:
//   * one query row at a time (fewer than 64 queries, or other K/V types): Q goes to K's
//     dot form first (rounded to f16 for f16 K, quantised to q8_0 for q8_0 / q4_0 K, ...)
//     and K . Q is MUL_MAT's dot product of that type (mul-mat.c); position by position, a
//     new maximum rescales the accumulator and the sum by expf(Mold - M); with f16 V the
//     accumulator is f16, every rescale and every V * p rounded to f16;
//   * tiled (64 queries or more, K and V both f32 or both f16): Q stays float32, and a
//     block of 64 positions at a time is one rescale, then weights summed in double and V
//     rows summed in float32;
//   * the sinks come in last, as one more logit without a V row.
// Up to ROW_GROUP query rows that read the same K and V heads (a head's tokens, or the
// heads of a GQA group) go together: their K . Q products are computed a block of KV
// positions at a time by MUL_MAT's dot tiles, and each V row, loaded once, feeds all of
// them; every row's sums are the ones it would have alone, in ggml's order. Positions the
// mask sets to -inf are skipped. Threads take whole query rows (flat over [n_q, n_head,
// n_seq]), so results do not depend on the thread count or on the grouping.
// ggml 0.10.1 also splits one query's long KV cache between threads (one query, 512
// positions or more, more than one thread): its partial sums round differently and that
// split is not ported (results would then depend on the thread count).

#include "cpu-impl.h"

#define KV_BLOCK  64    // KV positions whose K . Q products are computed in one call (and
                        // ggml's tile of KV positions in its tiled path)
#define TILED_MIN_Q 64  // queries from which ggml takes its tiled path (GGML_FA_TILE_Q)
#define ROW_GROUP 6     // query rows sharing K and V heads taken together

typedef struct {
    int64_t DK, DV, n_kv;
    float   scale, softcap, max_bias;
    float   m0, m1;
    uint32_t n_head_log2;
    int     tiled;          // ggml's tiled path: Q float32, V summed in float32, a block at once
    int     acc16;          // the accumulator is f16 (f16 V, one-row path)
    float   pad;            // the tiled path's logit for a short last block's padding
} fa_shape;

static fa_shape shape_of(const gp_tensor * dst) {
    const gp_tensor * q = dst->src[0];
    const gp_tensor * k = dst->src[1];
    const gp_tensor * v = dst->src[2];
    fa_shape f;
    f.DK = dst->src[1]->ne[0];
    f.DV = dst->src[2]->ne[0];
    f.n_kv = dst->src[1]->ne[1];
    f.scale = gp_param_f32(dst, 0);
    f.max_bias = gp_param_f32(dst, 1);
    f.softcap = gp_param_f32(dst, 2);
    if (f.softcap != 0.0f) f.scale /= f.softcap;
    const uint32_t n_head = (uint32_t)q->ne[2];
    f.n_head_log2 = 1u << (uint32_t)floor(log2(n_head));
    f.m0 = powf(2.0f, -(f.max_bias) / f.n_head_log2);
    f.m1 = powf(2.0f, -(f.max_bias / 2.0f) / f.n_head_log2);
    // (ggml built for this CPU asks DV to be a whole number of its float vectors)
    const int64_t epr = gp_isa_get() == GP_ISA_AVX512 ? 16 : gp_isa_get() == GP_ISA_AVX2 ? 8 : 1;
    f.tiled = q->ne[1] >= TILED_MIN_Q && k->type == v->type && (k->type == GP_TYPE_F32 || k->type == GP_TYPE_F16) &&
              f.DV % epr == 0;
    f.acc16 = v->type == GP_TYPE_F16 && !f.tiled;
    f.pad = f.softcap != 0.0f && !dst->src[3] ? -f.softcap : -INFINITY;
    return f;
}

// ALiBi's slope of head h (1 without max_bias)
static float slope_of(const fa_shape * f, uint32_t h) {
    if (f->max_bias <= 0.0f) return 1.0f;
    return h < f->n_head_log2 ? powf(f->m0, h + 1) : powf(f->m1, 2 * (h - f->n_head_log2) + 1);
}

// the work buffer of one query row: Q in K's dot form, its float32 accumulator, its f16
// accumulator (f16 V), a block's logits and mask values
typedef struct {
    char *     qf;
    float *    acc;
    uint16_t * acc16;
    float *    kq;
    float *    mv;
} fa_row_work;

static size_t qf_bytes(const gp_tensor * dst) {
    return gp_pad(gp_dot_form_size(dst->src[1]->type, dst->src[1]->ne[0]));
}
static size_t acc_bytes(const gp_tensor * dst) { return gp_pad((size_t)dst->src[2]->ne[0] * sizeof(float)); }
static size_t row_work_bytes(const gp_tensor * dst) {
    return qf_bytes(dst) + 2 * acc_bytes(dst) + 2 * gp_pad(KV_BLOCK * sizeof(float));
}
// a block of V rows as float32 (V types other than f16 and f32)
static size_t vblock_bytes(const gp_tensor * dst) { return KV_BLOCK * acc_bytes(dst); }
static size_t thread_work_bytes(const gp_tensor * dst) {
    return ROW_GROUP * row_work_bytes(dst) + vblock_bytes(dst);
}

// this thread's ROW_GROUP rows' work buffers; returns its V block
static float * work_of(const gp_params * p, const gp_tensor * dst, fa_row_work * w) {
    char * base = p->wdata + (size_t)p->ith * thread_work_bytes(dst);
    for (int r = 0; r < ROW_GROUP; r++) {
        w[r].qf = base + (size_t)r * row_work_bytes(dst);
        w[r].acc = (float *)(w[r].qf + qf_bytes(dst));
        w[r].acc16 = (uint16_t *)((char *)w[r].acc + acc_bytes(dst));
        w[r].kq = (float *)((char *)w[r].acc16 + acc_bytes(dst));
        w[r].mv = w[r].kq + KV_BLOCK;
    }
    return (float *)(base + ROW_GROUP * row_work_bytes(dst));
}

// one query row's place and its online softmax: the maximum logit M and the sum S
typedef struct {
    int64_t  i1, i2, i3;
    float    slope;
    const uint16_t * mp;    // its mask row, or NULL
    float    M, S;
} fa_row;

// position j's logit in row w: K . Q scaled, soft-capped, masked
static inline float logit(const fa_shape * f, const fa_row_work * w, int j) {
    float s = w->kq[j] * f->scale;
    if (f->softcap != 0.0f) s = f->softcap * tanhf(s);
    return s + w->mv[j];
}

// The online softmax of one row over a block's positions [first, last] (V rows vrows[j])
// as ggml's one-row path runs it, position by position: a new maximum rescales what was
// summed by expf(Mold - M), any other logit weighs its V row by expf(s - M); masked
// positions are no step.
static void softmax_steps(const fa_shape * f, fa_row * row, const fa_row_work * w, int first, int last,
                          const void * const * vrows) {
    const void * v[KV_BLOCK];
    float ms[KV_BLOCK], vs[KV_BLOCK];
    int m = 0;
    for (int j = first; j <= last; j++) {
        if (w->mv[j] == -INFINITY) continue;
        const float s = logit(f, w, j);
        ms[m] = 1.0f;
        vs[m] = 1.0f;
        if (s > row->M) {
            ms[m] = expf(row->M - s);
            row->M = s;
        } else {
            vs[m] = expf(s - row->M);
        }
        row->S = row->S * ms[m] + vs[m];
        v[m++] = vrows[j];
    }
    if (f->acc16) gp_simd_active->acc_steps_f16(w->acc16, v, ms, vs, m, f->DV);
    else gp_simd_active->acc_steps_f32(w->acc, v, ms, vs, m, f->DV);
}

// ggml's tiled path takes a block of KV_BLOCK logits at once: per row, one rescale of the
// accumulator and S to the block's maximum, the weights expf(s - M) summed in double
// (ggml_vec_soft_max_f32) into S; then the rows' V sums, in float32 (acc_gemm_f32). The
// weights go to w->kq, 0 for a row the block leaves wholly masked (as ggml zeroes it).
static void block_weights(const fa_shape * f, fa_row * row, const fa_row_work * w, int first, int last, int nb) {
    float s[KV_BLOCK];
    float mx = -INFINITY;
    for (int j = 0; j < KV_BLOCK; j++) {
        s[j] = j >= nb ? f->pad : j < first || j > last ? -INFINITY : logit(f, w, j);
        mx = fmaxf(mx, s[j]);
    }
    if (mx == -INFINITY) {
        memset(w->kq, 0, sizeof(float) * KV_BLOCK);
        return;
    }
    const float M = fmaxf(row->M, mx);
    if (M > row->M) {
        const float ms = expf(row->M - M);
        for (int64_t d = 0; d < f->DV; d++) w->acc[d] *= ms;
        row->S *= ms;
    }
    row->M = M;
    row->S = (float)((double)row->S + gp_simd_active->exp_sum(s, w->kq, KV_BLOCK, M));
}

// The online softmax over the KV positions of n query rows that share their K and V
// heads: each block's K rows and V rows, loaded (and converted) once, feed them all
// (every row's sums are those it would have alone). The accumulators end as float32 in
// w[r].acc.
static void attend_rows(const gp_tensor * dst, const fa_shape * f, const fa_row_work * w, float * vblock,
                        fa_row * rows, int n) {
    const gp_tensor * q = dst->src[0];
    const gp_tensor * k = dst->src[1];
    const gp_tensor * v = dst->src[2];
    const int64_t DK = f->DK, DV = f->DV;
    const int64_t i2 = rows[0].i2, i3 = rows[0].i3;
    const int64_t ik2 = i2 / (q->ne[2] / k->ne[2]), ik3 = i3 / (q->ne[3] / k->ne[3]);
    const int64_t iv2 = i2 / (q->ne[2] / v->ne[2]), iv3 = i3 / (q->ne[3] / v->ne[3]);
    const void * qf[ROW_GROUP];
    float * kq[ROW_GROUP];
    const void * vrows[KV_BLOCK];
    for (int r = 0; r < n; r++) {
        gp_dot_form(f->tiled ? GP_TYPE_F32 : k->type, GP_TYPE_F32, gp_row(q, rows[r].i1, rows[r].i2, rows[r].i3),
                    DK, w[r].qf);
        qf[r] = w[r].qf;
        if (f->acc16) memset(w[r].acc16, 0, (size_t)DV * sizeof(uint16_t));
        else memset(w[r].acc, 0, (size_t)DV * sizeof(float));
        rows[r].M = -INFINITY;
        rows[r].S = 0.0f;
    }

    for (int64_t ic0 = 0; ic0 < f->n_kv; ic0 += KV_BLOCK) {
        const int nb = (int)GP_MIN(KV_BLOCK, f->n_kv - ic0);
        int first = nb, last = -1;          // the positions some row does not mask
        for (int r = 0; r < n; r++) {
            if (rows[r].mp) gp_simd_active->f16_to_f32(rows[r].mp + ic0, w[r].mv, nb);
            else memset(w[r].mv, 0, (size_t)nb * sizeof(float));
            for (int j = 0; j < nb; j++) {
                w[r].mv[j] *= rows[r].slope;
                if (w[r].mv[j] != -INFINITY) {
                    first = GP_MIN(first, j);
                    last = GP_MAX(last, j);
                }
            }
        }
        if (last < first) continue;
        for (int r = 0; r < n; r++) kq[r] = w[r].kq + first;
        gp_dot_rows(k->type, DK, gp_row(k, ic0 + first, ik2, ik3), k->nb[1], last - first + 1, qf, n, kq);
        for (int j = first; j <= last; j++) {
            const char * vrow = gp_row(v, ic0 + j, iv2, iv3);
            float * vf = (float *)((char *)vblock + (size_t)j * acc_bytes(dst));
            vrows[j] = f->acc16 ? (const void *)vrow : (const void *)gp_load_row(v->type, vrow, v->nb[0], DV, vf);
        }
        if (!f->tiled) {
            for (int r = 0; r < n; r++) softmax_steps(f, &rows[r], &w[r], first, last, vrows);
            continue;
        }
        float * accs[ROW_GROUP];
        const float * ps[ROW_GROUP];
        for (int r = 0; r < n; r++) {
            block_weights(f, &rows[r], &w[r], first, last, nb);
            accs[r] = w[r].acc;
            ps[r] = w[r].kq + first;
        }
        // ggml pads a short last block with logits of -inf, which it soft-caps to -softcap
        // where no mask adds -inf back (f->pad): they count, with the V rows its buffer
        // still holds from the block before (none after the first block); there is no mask
        // then, so that [first, last] is the whole block
        const int end = f->pad != -INFINITY && ic0 > 0 ? KV_BLOCK : last + 1;
        gp_simd_active->acc_gemm_f32(accs, ps, n, vrows + first, end - first, DV);
    }
    if (f->acc16) {
        for (int r = 0; r < n; r++) gp_simd_active->f16_to_f32(w[r].acc16, w[r].acc, DV);
    }
}

// do flat query rows a and b read the same K and V heads?
static int same_kv(const gp_tensor * dst, const fa_row * a, const fa_row * b) {
    const int64_t nh = dst->src[0]->ne[2];
    const int64_t rk = nh / dst->src[1]->ne[2], rv = nh / dst->src[2]->ne[2];
    return a->i3 == b->i3 && a->i2 / rk == b->i2 / rk && a->i2 / rv == b->i2 / rv;
}

static int k_flash_attn(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * q = dst->src[0];
    const gp_tensor * mask = dst->src[3];
    const gp_tensor * sinks = dst->src[4];
    const fa_shape f = shape_of(dst);
    fa_row_work w[ROW_GROUP];
    fa_row rows[ROW_GROUP];
    float * vblock = work_of(p, dst, w);
    int64_t r0, r1;
    gp_rows_of(p, gp_nrows(q), &r0, &r1);
    for (int64_t ir = r0; ir < r1;) {
        int n = 0;                          // the next rows (up to ROW_GROUP) sharing K and V
        for (; n < ROW_GROUP && ir + n < r1; n++) {
            fa_row * row = &rows[n];
            gp_unravel_row(q, ir + n, &row->i1, &row->i2, &row->i3);
            if (n > 0 && !same_kv(dst, &rows[0], row)) break;
            row->slope = slope_of(&f, (uint32_t)row->i2);
            row->mp = mask ? (const uint16_t *)gp_row(mask, row->i1, row->i2 % mask->ne[2], row->i3 % mask->ne[3])
                           : NULL;
        }
        attend_rows(dst, &f, w, vblock, rows, n);
        for (int r = 0; r < n; r++) {
            float S = rows[r].S;
            float * acc = w[r].acc;
            if (sinks) {            // one more logit, with no V row
                const float s = ((const float *)sinks->data)[rows[r].i2];
                float ms = 1.0f, vs = 1.0f;
                if (s > rows[r].M) {
                    ms = expf(rows[r].M - s);
                    for (int64_t d = 0; d < f.DV; d++) acc[d] *= ms;
                } else {
                    vs = expf(s - rows[r].M);
                }
                S = S * ms + vs;
            }
            const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
            float * y = (float *)gp_row(dst, rows[r].i2, rows[r].i1, rows[r].i3);  // [DV, n_head, n_q, n_seq]
            for (int64_t d = 0; d < f.DV; d++) y[d] = acc[d] * S_inv;
        }
        ir += n;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// selection

// what ggml asserts (NULL: fine)
static const char * flash_attn_check(const gp_tensor * t) {
    const gp_tensor * q = t->src[0];
    const gp_tensor * k = t->src[1];
    const gp_tensor * v = t->src[2];
    const gp_tensor * mask = t->src[3];
    const gp_tensor * sinks = t->src[4];
    if (!q || !k || !v) return "needs q, k and v";
    if (q->ne[0] != k->ne[0]) return "q's and k's rows differ in length";
    if (k->ne[1] != v->ne[1]) return "k and v hold different numbers of positions";
    if (t->ne[0] != v->ne[0] || t->ne[1] != q->ne[2] || t->ne[2] != q->ne[1] || t->ne[3] != q->ne[3])
        return "the result is not [v.ne0, q.ne2, q.ne1, q.ne3]";
    if (k->ne[2] == 0 || k->ne[3] == 0 || v->ne[2] == 0 || v->ne[3] == 0 || q->ne[2] % k->ne[2] ||
        q->ne[3] % k->ne[3] || q->ne[2] % v->ne[2] || q->ne[3] % v->ne[3])
        return "k's or v's heads do not divide q's";
    if (mask && (mask->ne[0] < k->ne[1] || mask->ne[1] < q->ne[1] || mask->ne[2] == 0 ||
                 mask->ne[3] == 0 || q->ne[2] % mask->ne[2] || q->ne[3] % mask->ne[3]))
        return "the mask is smaller than [n_kv, n_q] or does not broadcast over q's heads";
    if (sinks && gp_nelements(sinks) < q->ne[2]) return "fewer sinks than heads";
    if (t->op_params[3] != GGML_PY_PREC_DEFAULT && t->op_params[3] != GGML_PY_PREC_F32)
        return "unknown precision";
    return NULL;
}

// a float or block type whose packed rows of n values the kernel reads
static int packed_rows(const gp_tensor * t, int64_t n) {
    const int float_type = t->type == GP_TYPE_F32 || t->type == GP_TYPE_F16 || t->type == GP_TYPE_BF16 ||
                           (gp_is_quant(t->type) && gp_get_type_traits(t->type) != NULL);
    return float_type && t->nb[0] == gp_type_size(t->type) && n % gp_blck_size(t->type) == 0;
}

// Can the C kernel take it? (otherwise the numpy kernel does)
static int flash_attn_supported(const gp_tensor * t) {
    const gp_tensor * q = t->src[0];
    const gp_tensor * k = t->src[1];
    const gp_tensor * v = t->src[2];
    const gp_tensor * mask = t->src[3];
    const gp_tensor * sinks = t->src[4];
    const int vdt = gp_vec_dot_type(k->type);
    return t->type == GP_TYPE_F32 && gp_is_contiguous(t) && q->type == GP_TYPE_F32 && q->nb[0] == sizeof(float) &&
           gp_dot_type_ok(k->type) && packed_rows(k, k->ne[0]) && k->ne[0] % gp_blck_size(vdt) == 0 &&
           packed_rows(v, v->ne[0]) && (!mask || (mask->type == GP_TYPE_F16 && mask->nb[0] == 2)) &&
           (!sinks || (sinks->type == GP_TYPE_F32 && gp_is_contiguous(sinks)));
}

// below this many multiply-adds a node runs on one thread
#define PARALLEL_MIN_WORK (1 << 16)

gp_kernel gp_select_flash_attn(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize, const char ** error) {
    if ((*error = flash_attn_check(t))) return NULL;
    if (!flash_attn_supported(t)) return NULL;
    const gp_tensor * q = t->src[0];
    const int64_t work = gp_nrows(q) * t->src[1]->ne[1] * (t->src[1]->ne[0] + t->src[2]->ne[0]);
    *n_tasks = work >= PARALLEL_MIN_WORK ? nth : 1;
    *wsize = (size_t)*n_tasks * thread_work_bytes(t);
    return k_flash_attn;
}
