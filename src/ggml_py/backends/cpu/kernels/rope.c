// ROPE (ggml_compute_forward_rope_flt): every mode of ggml 0.10.1, f32 and f16, with
// ggml's cos/sin rows (ggml_rope_cache_init / ggml_mrope_cache_init: theta by repeated
// float32 multiplication) kept per cplan in a small cache keyed by the positions' values
// and every parameter, so the rope nodes of a step (every layer's Q and K) share one.

#include "cpu-impl.h"

#include <stdlib.h>

#define GP_PI 3.14159265358979323846

enum { ROPE_NORMAL = 0, ROPE_NEOX = 2, ROPE_MROPE = 8, ROPE_IMROPE = 40, ROPE_VISION = 24 };

#define ROPE_SLOTS 8

typedef struct rope_slot {
    int       used;
    uint64_t  stamp;                        // last use, for replacing the oldest
    int32_t   params[GP_MAX_OP_PARAMS];     // the rope's op_params
    int64_t   ne0;                          // cache row length
    int64_t   n_rows;                       // positions (dim 2)
    int32_t * pos;                          // [n_rows, or 4 * n_rows for multi-section]
    int64_t   n_pos;
    float *   ff;                           // freq factors copied, or NULL
    int64_t   n_ff;
    float *   cache;                        // [n_rows][ne0]
    size_t    cap;                          // floats allocated in cache
    size_t    pos_cap, ff_cap;
} rope_slot;

struct gp_rope_cache {
    rope_slot   slots[ROPE_SLOTS];
    uint64_t    clock;
    rope_slot * current;                    // the slot of the node being computed
    int64_t     hits, misses;
};

gp_rope_cache * gp_rope_cache_new(void) { return calloc(1, sizeof(gp_rope_cache)); }

void gp_rope_cache_free(gp_rope_cache * c) {
    if (!c) return;
    for (int i = 0; i < ROPE_SLOTS; i++) {
        free(c->slots[i].pos);
        free(c->slots[i].ff);
        free(c->slots[i].cache);
    }
    free(c);
}

static float rope_yarn_ramp(const float low, const float high, const int i0) {
    const float y = (i0 / 2 - low) / GP_MAX(0.001f, high - low);
    return 1 - GP_MIN(1, GP_MAX(0, y));
}

static void rope_yarn(float theta_extrap, float freq_scale, const float corr_dims[2], int64_t i0,
                      float ext_factor, float mscale, float * cos_theta, float * sin_theta) {
    float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
        float ramp_mix = rope_yarn_ramp(corr_dims[0], corr_dims[1], (int)i0) * ext_factor;
        theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    }
    *cos_theta = cosf(theta) * mscale;
    *sin_theta = sinf(theta) * mscale;
}

static float rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)GP_PI)) / (2 * logf(base));
}

// one cache row for a position (or the four positions of a multi-section rope)
static void rope_cache_row(const int32_t * params, int64_t ne0, const int64_t pos[4],
                           const float * ff, float * cache) {
    const int n_dims = params[1], mode = params[2], n_ctx_orig = params[4];
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    memcpy(&freq_base,   params + 5,  4);
    memcpy(&freq_scale,  params + 6,  4);
    memcpy(&ext_factor,  params + 7,  4);
    memcpy(&attn_factor, params + 8,  4);
    memcpy(&beta_fast,   params + 9,  4);
    memcpy(&beta_slow,   params + 10, 4);
    const int * sections = params + 11;
    const float theta_scale = powf(freq_base, -2.0f / n_dims);
    float corr_dims[2];
    {
        float start = floorf(rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
        float end   = ceilf(rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
        corr_dims[0] = GP_MAX(0, start);
        corr_dims[1] = GP_MIN(n_dims - 1, end);
    }
    if (!(mode & ROPE_MROPE)) {
        float theta = (float)pos[0];
        for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
            // (factors past the rotated channels: ggml reads beyond the n_dims/2 it asks
            // for there, into cache entries no pair uses)
            const float f = ff && i0 < n_dims ? ff[i0 / 2] : 1.0f;
            rope_yarn(theta / f, freq_scale, corr_dims, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
            theta *= theta_scale;
        }
        return;
    }
    // ggml_mrope_cache_init
    const int is_imrope = mode == ROPE_IMROPE, indep = mode == ROPE_VISION;
    float theta_t = (float)pos[0], theta_h = (float)pos[1], theta_w = (float)pos[2], theta_e = (float)pos[3];
    const int sect_dims = sections[0] + sections[1] + sections[2] + sections[3];
    const int sec_w = sections[1] + sections[0];
    const int sec_e = sections[2] + sec_w;
    for (int64_t i0 = 0; i0 < ne0; i0 += 2) {
        const float f = ff ? ff[i0 / 2] : 1.0f;
        const int sector = (int)((i0 / 2) % sect_dims);
        if (indep) {
            if (sector == 0) theta_t = (float)pos[0];
            else if (sector == sections[0]) theta_h = (float)pos[1];
            else if (sector == sec_w) theta_w = (float)pos[2];
            else if (sector == sec_e) theta_e = (float)pos[3];
        }
        float theta = theta_t;
        if (is_imrope) {
            if (sector % 3 == 1 && sector < 3 * sections[1]) theta = theta_h;
            else if (sector % 3 == 2 && sector < 3 * sections[2]) theta = theta_w;
            else if (sector % 3 == 0 && sector < 3 * sections[0]) theta = theta_t;
            else theta = theta_e;
        } else {
            if (sector >= sections[0] && sector < sec_w) theta = theta_h;
            else if (sector >= sec_w && sector < sec_w + sections[2]) theta = theta_w;
            else if (sector >= sec_w + sections[2]) theta = theta_e;
        }
        rope_yarn(theta / f, freq_scale, corr_dims, i0, ext_factor, attn_factor, &cache[i0], &cache[i0 + 1]);
        theta_t *= theta_scale;
        theta_w *= theta_scale;
        theta_h *= theta_scale;
        theta_e *= theta_scale;
    }
}

static int grow(void ** ptr, size_t * cap, size_t n, size_t elem) {
    if (n <= *cap) return 0;
    void * q = realloc(*ptr, n * elem);
    if (!q) return -1;
    *ptr = q;
    *cap = n;
    return 0;
}

// the cache slot for this rope node's positions and parameters (filled on a miss)
static rope_slot * rope_lookup(const gp_params * p, const gp_tensor * dst) {
    gp_rope_cache * rc = gp_cplan_rope_cache(p->cplan);
    const gp_tensor * pos_t = dst->src[1];
    const gp_tensor * ff_t  = dst->src[2];
    const int multi = (dst->op_params[2] & ROPE_MROPE) != 0;
    const int64_t n_rows = dst->ne[2], ne0 = dst->ne[0];
    const int64_t n_pos = multi ? 4 * n_rows : n_rows;
    const int64_t n_ff = ff_t ? (multi ? ne0 / 2 : dst->op_params[1] / 2) : 0;
    const int32_t * pos = (const int32_t *)pos_t->data;
    const float * ff = ff_t ? (const float *)ff_t->data : NULL;
    rope_slot * oldest = &rc->slots[0];
    rc->clock++;
    for (int s = 0; s < ROPE_SLOTS; s++) {
        rope_slot * sl = &rc->slots[s];
        if (sl->used && sl->ne0 == ne0 && sl->n_rows == n_rows && sl->n_pos == n_pos && sl->n_ff == n_ff &&
            memcmp(sl->params, dst->op_params, sizeof(sl->params)) == 0 &&
            memcmp(sl->pos, pos, (size_t)n_pos * sizeof(int32_t)) == 0 &&
            (n_ff == 0 || memcmp(sl->ff, ff, (size_t)n_ff * sizeof(float)) == 0)) {
            sl->stamp = rc->clock;
            rc->hits++;
            return sl;
        }
        if (!sl->used || sl->stamp < oldest->stamp) oldest = sl;
    }
    rope_slot * sl = oldest;
    sl->used = 0;
    if (grow((void **)&sl->cache, &sl->cap, (size_t)(n_rows * ne0), sizeof(float)) ||
        grow((void **)&sl->pos, &sl->pos_cap, (size_t)GP_MAX(n_pos, 1), sizeof(int32_t)) ||
        grow((void **)&sl->ff, &sl->ff_cap, (size_t)GP_MAX(n_ff, 1), sizeof(float))) {
        return NULL;
    }
    memcpy(sl->params, dst->op_params, sizeof(sl->params));
    memcpy(sl->pos, pos, (size_t)n_pos * sizeof(int32_t));
    if (n_ff) memcpy(sl->ff, ff, (size_t)n_ff * sizeof(float));
    sl->ne0 = ne0;
    sl->n_rows = n_rows;
    sl->n_pos = n_pos;
    sl->n_ff = n_ff;
    for (int64_t i2 = 0; i2 < n_rows; i2++) {
        int64_t ps[4] = {pos[i2], 0, 0, 0};
        if (multi) {
            ps[1] = pos[i2 + n_rows];
            ps[2] = pos[i2 + 2 * n_rows];
            ps[3] = pos[i2 + 3 * n_rows];
        }
        rope_cache_row(dst->op_params, ne0, ps, n_ff ? sl->ff : NULL, sl->cache + i2 * ne0);
    }
    sl->used = 1;
    sl->stamp = rc->clock;
    rc->misses++;
    return sl;
}

// rotate the pairs of one row (float32): NORMAL pairs (2i, 2i+1); the others (i, i + off)
static void rope_row(const float * x, float * y, const float * cache, int64_t n_pairs, int normal,
                     int64_t off) {
    if (normal) {
        for (int64_t i = 0; i < n_pairs; i++) {
            const float c = cache[2 * i], s = cache[2 * i + 1];
            const float x0 = x[2 * i], x1 = x[2 * i + 1];
            y[2 * i]     = x0 * c - x1 * s;
            y[2 * i + 1] = x0 * s + x1 * c;
        }
        return;
    }
    for (int64_t i = 0; i < n_pairs; i++) {
        const float c = cache[2 * i], s = cache[2 * i + 1];
        const float x0 = x[i], x1 = x[i + off];
        y[i]       = x0 * c - x1 * s;
        y[i + off] = x0 * s + x1 * c;
    }
}

static int k_rope(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * src = dst->src[0];
    gp_rope_cache * rc = gp_cplan_rope_cache(p->cplan);
    if (p->ith == 0) {
        rc->current = rope_lookup(p, dst);
    }
    gp_barrier(p);
    if (!rc->current) {     // every thread sees it after the barrier
        return gp_fail(p, "out of memory for the rope cache");
    }
    const float * cache0 = rc->current->cache;
    const int n_dims = dst->op_params[1], mode = dst->op_params[2];
    const int64_t ne0 = dst->ne[0];
    const int is_vision = mode == ROPE_VISION;
    // rotated pairs: NORMAL (2i, 2i+1) for i < n_dims/2; NEOX and the multi-section modes
    // (i, i + n_dims/2); VISION (i, i + n_dims) for i < ne0/2
    const int64_t n_pairs = is_vision ? ne0 / 2 : n_dims / 2;
    const int64_t off = is_vision ? n_dims : n_dims / 2;
    const int f16 = src->type == GP_TYPE_F16;
    float * tx = scratch(p, ne0, 0);
    float * ty = scratch(p, ne0, 1);
    for (gp_row_iter it = gp_rows(p, dst); gp_next_row(&it);) {
        const float * cache = cache0 + it.i2 * ne0;
        const char * xrow = gp_row(src, it.i1, it.i2, it.i3);
        char * yrow = gp_row(dst, it.i1, it.i2, it.i3);
        const float * x = f16 ? gp_load_row(GP_TYPE_F16, xrow, 2, ne0, tx) : (const float *)xrow;
        float * y = f16 ? ty : (float *)yrow;
        rope_row(x, y, cache, n_pairs, mode == ROPE_NORMAL, off);
        if (!is_vision && n_dims < ne0) {       // the rest is copied
            memmove(y + n_dims, x + n_dims, (size_t)(ne0 - n_dims) * sizeof(float));
        }
        if (f16) gp_store_row(GP_TYPE_F16, yrow, 2, ty, ne0);
    }
    return 0;
}

// The rope kernel for a node, or NULL: *error says why when ggml would abort, else the
// numpy kernel takes it (other types or layouts).
gp_kernel gp_select_rope(const gp_tensor * t, int nth, size_t * wsize, const char ** error) {
    const gp_tensor * s0 = t->src[0];
    const gp_tensor * pos = t->src[1];
    const gp_tensor * ff = t->src[2];
    const int n_dims = t->op_params[1], mode = t->op_params[2];
    const int multi = (mode & ROPE_MROPE) != 0;
    if (!s0 || !pos || !gp_same_shape(s0, t)) { *error = "needs src and positions of its shape"; return NULL; }
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX && mode != ROPE_MROPE && mode != ROPE_IMROPE &&
        mode != ROPE_VISION) { *error = "unknown rope mode"; return NULL; }
    if (n_dims <= 0 || n_dims % 2 || n_dims > t->ne[0] || t->ne[0] % 2) {
        *error = "n_dims must be even, positive and at most ne0";
        return NULL;
    }
    if (mode == ROPE_VISION && n_dims != t->ne[0] / 2) { *error = "vision rope needs n_dims == ne0/2"; return NULL; }
    if (multi) {
        const int32_t * sec = t->op_params + 11;
        if (sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sec[3] < 0 ||
            sec[0] + sec[1] + sec[2] + sec[3] <= 0 || sec[0] + sec[1] + sec[2] + sec[3] > t->ne[0]) {
            *error = "multi-section rope needs sections that fit ne0";
            return NULL;
        }
    }
    if (pos->type != GP_TYPE_I32 || !gp_is_contiguous(pos) ||
        gp_nelements(pos) < (multi ? 4 : 1) * t->ne[2]) {
        *error = "positions must be contiguous i32, one per dim-2 index (four for multi-section)";
        return NULL;
    }
    if (ff) {
        if (ff->type != GP_TYPE_F32 || gp_nelements(ff) < n_dims / 2) {
            *error = "freq_factors must be f32 with n_dims/2 values";
            return NULL;
        }
        // the multi-section modes read a factor per pair of the whole row: shorter ones
        // (and factors not contiguous) take the numpy kernel
        if (!gp_is_contiguous(ff) || (multi && gp_nelements(ff) < t->ne[0] / 2)) return NULL;
    }
    if (t->type != s0->type || (t->type != GP_TYPE_F32 && t->type != GP_TYPE_F16) ||
        s0->nb[0] != gp_type_size(s0->type) || t->nb[0] != gp_type_size(t->type)) return NULL;
    *wsize = SCRATCH_WSIZE(nth, t->ne[0]);
    return k_rope;
}
