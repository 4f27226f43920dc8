// MUL_MAT and MUL_MAT_ID (ggml_compute_forward_mul_mat / _mul_mat_id).
//
// Weights (src0) are read in their own type. src1 is first put in the weights' dot form,
// as ggml's CPU does with its vec_dot_type:
//   f32 weights:        src1 as it is (float32)
//   f16 / bf16 weights: src1 rounded to f16 / bf16 (kept as float32 values)
//   block types:        src1 quantised to the type's vec_dot type (q8_0, q8_1 or q8_K)
//                       with ggml-cpu's quantiser
// Weights are read by the active instruction set's dot tile of their type (gp_simd.tile:
// simd.c for f32 / f16 / bf16 / q8_0 / q4_0, dot-k.c and dot-legacy.c for the other block
// types, whose tiles give every product its vec_dot's bits), or, where the instruction
// set has none (the baseline's other block types), by their vec_dot one product at a
// time, as ggml's CPU does. The converted rows go to the work buffer (each thread converts its
// share, then all wait); then the threads take chunks of (matrix, 16 weight rows) in
// turn, each chunk running over all of its matrix's src1 rows. Every output is one dot
// product summed in a fixed order, so the thread count does not change the result.
// q8_0 and q4_0 weights against GEMM_MIN_COLS src1 rows or more go to the instruction
// set's GEMM instead (gp_simd.gemm_q8_0: gemm-q8.c), where it has one: the converted rows
// are packed into its panels, then the threads take its chunks of weight rows in turn.

#include "cpu-impl.h"

#include <stdlib.h>

#define MM_ROWS  16     // weight rows per chunk
#define MM_COLS  48     // src1 rows per dot call (its pointers live on the stack)

typedef enum { FORM_F32, FORM_F16, FORM_BF16, FORM_BLOCKS } dot_form;

static dot_form form_of(int wtype) {
    switch (wtype) {
        case GP_TYPE_F16:  return FORM_F16;
        case GP_TYPE_BF16: return FORM_BF16;
        default:           return gp_is_quant(wtype) ? FORM_BLOCKS : FORM_F32;
    }
}

// the dot tile of the weights, or NULL for a type read by its vec_dot
static gp_dot_tile tile_of(int wtype) {
    return wtype >= 0 && wtype < GP_TYPE_COUNT ? gp_simd_active->tile[wtype] : NULL;
}

size_t gp_dot_form_size(int wtype, int64_t k) {
    return form_of(wtype) == FORM_BLOCKS ? gp_row_size(gp_vec_dot_type(wtype), k)
                                         : (size_t)k * sizeof(float);
}

// Does src1 need converting? (f32 weights read float32 src1 rows in place)
static int needs_form(const gp_tensor * w, const gp_tensor * x) {
    return !(form_of(w->type) == FORM_F32 && x->type == GP_TYPE_F32);
}

void gp_dot_form(int wtype, int xtype, const char * x, int64_t k, char * y) {
    if (xtype == GP_TYPE_F16) {                 // (f16 src1 only meets f16 weights)
        gp_f16_to_f32_row((const uint16_t *)x, (float *)y, k);
        return;
    }
    const float * xf = (const float *)x;
    switch (form_of(wtype)) {
        case FORM_F16:    gp_round_f16_row(xf, (float *)y, k); break;
        case FORM_BF16:   gp_round_bf16_row(xf, (float *)y, k); break;
        case FORM_BLOCKS: gp_get_type_traits(gp_vec_dot_type(wtype))->from_float(xf, y, k); break;
        default:          memcpy(y, x, (size_t)k * sizeof(float)); break;
    }
}

// the src1 rows [r0, r1) of this thread, flat over (i1, i2, i3), into the work buffer
static void convert_rows(const gp_params * p, const gp_tensor * w, const gp_tensor * x) {
    const size_t rb = gp_dot_form_size(w->type, x->ne[0]);
    int64_t r0, r1;
    gp_rows_of(p, gp_nrows(x), &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        gp_unravel_row(x, r, &i1, &i2, &i3);
        gp_dot_form(w->type, x->type, gp_row(x, i1, i2, i3), x->ne[0], p->wdata + r * rb);
    }
}

void gp_dot_rows(int wtype, int64_t k, const char * a, size_t lda, int rm,
                 const void * const * b, int rn, float * const * c) {
    const gp_dot_tile tile = tile_of(wtype);
    if (tile) {
        tile(k, a, lda, rm, b, rn, c);
        return;
    }
    const gp_vec_dot_fn dot = gp_vec_dot_of(wtype);
    for (int j = 0; j < rn; j++) {
        for (int i = 0; i < rm; i++) {
            dot(k, &c[j][i], a + i * lda, b[j]);
        }
    }
}

static int src1_type_ok(const gp_tensor * w, const gp_tensor * x) {
    return x->type == GP_TYPE_F32 || (x->type == GP_TYPE_F16 && w->type == GP_TYPE_F16);
}

int gp_dot_type_ok(int type) {
    return tile_of(type) != NULL || gp_vec_dot_of(type) != NULL;
}

// ---------------------------------------------------------------------------
// MUL_MAT

static const char * mul_mat_check(const gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    if (!w || !x) return "needs two sources";
    if (w->ne[0] != x->ne[0]) return "src0 and src1 rows differ in length";
    if (dst->ne[0] != w->ne[1] || dst->ne[1] != x->ne[1] || dst->ne[2] != x->ne[2] ||
        dst->ne[3] != x->ne[3]) return "the result's shape is not [src0.ne1, src1.ne1, src1.ne2, src1.ne3]";
    if (w->ne[2] == 0 || w->ne[3] == 0 || x->ne[2] % w->ne[2] || x->ne[3] % w->ne[3])
        return "src1's matrices do not repeat src0's a whole number of times";
    return NULL;
}

// Can the C kernel take it? (otherwise the numpy kernel does)
static int mul_mat_supported(const gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    return dst->type == GP_TYPE_F32 && dst->nb[0] == sizeof(float) && gp_dot_type_ok(w->type) &&
           src1_type_ok(w, x) && w->nb[0] == gp_type_size(w->type) &&
           x->nb[0] == gp_type_size(x->type) && w->ne[0] % gp_blck_size(w->type) == 0;
}

static size_t form_wsize(const gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    if (!needs_form(w, x)) return 0;
    return gp_pad(gp_dot_form_size(w->type, x->ne[0]) * (size_t)gp_nrows(x));
}

// ---------------------------------------------------------------------------
// the GEMM (gp_gemm: the active instruction set's, for q8_0 weights, and q4_0 ones
// widened to q8_0 a chunk at a time) from GEMM_MIN_COLS src1 rows per matrix on; its work
// buffer follows the converted rows: the panels of every src1 matrix, then each thread's
// scratch (and its chunk of q4_0 rows widened)

#define GEMM_MIN_COLS 8     // (below, the dot tiles' 4 x 2 register tiles waste less)
_Static_assert(MM_ROWS == GP_GEMM_ROWS, "MUL_MAT_ID's chunks are the GEMM's");

static const gp_gemm * gemm_of(const gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    if (dst->op != GP_OP_MUL_MAT || !(w->type == GP_TYPE_Q8_0 || w->type == GP_TYPE_Q4_0) ||
        dst->src[1]->ne[1] < GEMM_MIN_COLS)
        return NULL;
    return gp_simd_active->gemm_q8_0;
}

static size_t gemm_panels_size(const gp_gemm * gemm, const gp_tensor * x) {
    const int64_t groups = (x->ne[1] + GP_GEMM_COLS - 1) / GP_GEMM_COLS;
    return gp_pad(gemm->panel_size(x->ne[0]) * (size_t)(groups * x->ne[2] * x->ne[3]));
}

static size_t gemm_scratch_size(const gp_tensor * dst) {
    const size_t nb = (size_t)(dst->src[0]->ne[0] / 32);
    const size_t wide = dst->src[0]->type == GP_TYPE_Q4_0 ? gp_pad(GP_GEMM_ROWS * nb * Q8_0_BYTES) : 0;
    return gp_pad(GP_GEMM_ROWS * nb * 8) + wide;
}

// The chunk's weight rows as the GEMM reads them: q8_0 rows where they are, q4_0 rows
// widened into the end of scratch as q8_0 blocks (nibble - 8, the same scale: the same
// integer sums and scales, so the sums of the q4_0 dots' generic order).
static const char * gemm_rows(const gp_tensor * dst, const char * a, int rm, char * scratch, size_t * lda) {
    const gp_tensor * w = dst->src[0];
    *lda = w->nb[1];
    if (w->type != GP_TYPE_Q4_0) return a;
    const int64_t nb = w->ne[0] / 32;
    char * wide = scratch + gp_pad((size_t)GP_GEMM_ROWS * (size_t)nb * 8);
    const uint64_t lo = 0x0F0F0F0F0F0F0F0Full, top = 0x8080808080808080ull, eight = 0x0808080808080808ull;
    for (int r = 0; r < rm; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const char * q4 = a + r * w->nb[1] + b * Q4_0_BYTES;
            char * q8 = wide + (r * nb + b) * Q8_0_BYTES;
            memcpy(q8, q4, 2);
            for (int h = 0; h < 2; h++) {       // bytes 8h .. 8h + 7: values 8h.. and 16 + 8h..
                uint64_t v, vl, vh;
                memcpy(&v, q4 + 2 + 8 * h, 8);
                vl = (((v & lo) | top) - eight) ^ top;          // nibble - 8, byte by byte
                vh = ((((v >> 4) & lo) | top) - eight) ^ top;
                memcpy(q8 + 2 + 8 * h, &vl, 8);
                memcpy(q8 + 18 + 8 * h, &vh, 8);
            }
        }
    }
    *lda = (size_t)nb * Q8_0_BYTES;
    return wide;
}

static size_t gemm_wsize(const gp_gemm * gemm, const gp_tensor * dst, int nth) {
    const gp_tensor * x = dst->src[1];
    return form_wsize(dst) + gemm_panels_size(gemm, x) + (size_t)nth * gemm_scratch_size(dst);
}

int gp_mul_mat_gemm_takes(const gp_tensor * dst) {
    return dst->op == GP_OP_MUL_MAT && !mul_mat_check(dst) && mul_mat_supported(dst) && gemm_of(dst);
}

// after convert_rows: the panels, then chunks of GP_GEMM_ROWS weight rows of a matrix
// against all its columns (the threads take them in turn, as the dot tiles' chunks)
static int gemm_mul_mat(const gp_params * p, gp_tensor * dst, const gp_gemm * gemm) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    const int64_t k = w->ne[0], m = w->ne[1];
    const int64_t n = x->ne[1], ne12 = x->ne[2], ne13 = x->ne[3];
    const int64_t r2 = ne12 / w->ne[2], r3 = ne13 / w->ne[3];
    const size_t rb = gp_dot_form_size(w->type, k);
    const int64_t groups = (n + GP_GEMM_COLS - 1) / GP_GEMM_COLS;
    const size_t psize = gemm->panel_size(k);
    char * panels = p->wdata + form_wsize(dst);
    char * scratch = panels + gemm_panels_size(gemm, x) + (size_t)p->ith * gemm_scratch_size(dst);

    for (int64_t pi = p->ith; pi < groups * ne12 * ne13; pi += p->nth) {
        const int64_t mat = pi / groups, j0 = (pi % groups) * GP_GEMM_COLS;
        const char * rows[GP_GEMM_COLS];
        const int cn = (int)GP_MIN(GP_GEMM_COLS, n - j0);
        for (int j = 0; j < cn; j++) rows[j] = p->wdata + (mat * n + j0 + j) * rb;
        gemm->pack(k, rows, cn, panels + pi * psize);
    }
    gp_barrier(p);

    const int64_t mchunks = (m + GP_GEMM_ROWS - 1) / GP_GEMM_ROWS;
    for (int64_t ch = p->ith; ch < mchunks * ne12 * ne13; ch += p->nth) {
        const int64_t mat = ch / mchunks;
        const int64_t i12 = mat % ne12, i13 = mat / ne12;
        const int64_t m0 = (ch % mchunks) * GP_GEMM_ROWS;
        const int rm = (int)GP_MIN(GP_GEMM_ROWS, m - m0);
        size_t lda;
        const char * a = gemm_rows(dst, w->data + (i12 / r2) * w->nb[2] + (i13 / r3) * w->nb[3] +
                                   m0 * w->nb[1], rm, scratch, &lda);
        gemm->run(k, a, lda, rm, panels + mat * groups * psize, n,
                  gp_row(dst, 0, i12, i13) + m0 * sizeof(float), dst->nb[1], scratch);
    }
    return 0;
}

static size_t mul_mat_wsize(const gp_tensor * dst, int nth) {
    const gp_gemm * gemm = gemm_of(dst);
    return gemm ? gemm_wsize(gemm, dst, nth) : form_wsize(dst);
}

// ---------------------------------------------------------------------------

static int k_mul_mat(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    const int64_t k = w->ne[0], m = w->ne[1];
    const int64_t n = x->ne[1], ne12 = x->ne[2], ne13 = x->ne[3];
    const int64_t r2 = ne12 / w->ne[2], r3 = ne13 / w->ne[3];
    const int converted = needs_form(w, x);
    const size_t rb = gp_dot_form_size(w->type, k);

    if (converted) {
        convert_rows(p, w, x);
        gp_barrier(p);
    }
    // (a cplan made under another instruction set may have no room for the GEMM's buffers)
    const gp_gemm * gemm = gemm_of(dst);
    if (gemm && p->wsize >= gemm_wsize(gemm, dst, p->nth)) return gemm_mul_mat(p, dst, gemm);

    const int64_t mchunks = (m + MM_ROWS - 1) / MM_ROWS;
    const int64_t nchunks = mchunks * ne12 * ne13;
    const void * b[MM_COLS];
    float * c[MM_COLS];
    for (int64_t ch = p->ith; ch < nchunks; ch += p->nth) {
        const int64_t mat = ch / mchunks;
        const int64_t i12 = mat % ne12, i13 = mat / ne12;
        const int64_t m0 = (ch % mchunks) * MM_ROWS;
        const int rm = (int)GP_MIN(MM_ROWS, m - m0);
        const char * a = w->data + (i12 / r2) * w->nb[2] + (i13 / r3) * w->nb[3] + m0 * w->nb[1];
        for (int64_t j0 = 0; j0 < n; j0 += MM_COLS) {
            const int rn = (int)GP_MIN(MM_COLS, n - j0);
            for (int j = 0; j < rn; j++) {
                const int64_t i11 = j0 + j;
                b[j] = converted ? p->wdata + ((i13 * ne12 + i12) * n + i11) * rb
                                 : gp_row(x, i11, i12, i13);
                c[j] = (float *)gp_row(dst, i11, i12, i13) + m0;
            }
            gp_dot_rows(w->type, k, a, w->nb[1], rm, b, rn, c);
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// MUL_MAT_ID: as [k, m, n_expert], b [k, ne11, n_tok], ids i32 [n_used, n_tok]
//             -> dst [m, n_used, n_tok]: column (e, t) = as[ids[e, t]] . b[e % ne11, t]

static const char * mul_mat_id_check(const gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    const gp_tensor * ids = dst->src[2];
    if (!w || !x || !ids) return "needs three sources";
    if (ids->type != GP_TYPE_I32) return "ids must be i32";
    if (w->ne[0] != x->ne[0]) return "expert rows and src1 rows differ in length";
    if (w->ne[3] != 1 || x->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1)
        return "only 3-d experts, 3-d src1 and 2-d ids";
    if (dst->ne[0] != w->ne[1] || dst->ne[1] != ids->ne[0] || dst->ne[2] != ids->ne[1] ||
        dst->ne[3] != 1) return "the result's shape is not [as.ne1, ids.ne0, ids.ne1]";
    if (x->ne[2] != ids->ne[1]) return "src1 and ids have different token counts";
    if (x->ne[1] == 0) return "src1 has no rows";
    return NULL;
}

static int mul_mat_id_supported(const gp_tensor * dst) {
    return mul_mat_supported(dst) && dst->src[2]->nb[0] == sizeof(int32_t);
}

// Each thread lists the columns by expert (a counting sort of the ids, in its own part of
// the work buffer: cols[start[ex] .. start[ex + 1]) are the columns e + t * n_used that
// ask for expert ex, in order); an expert with GEMM_MIN_COLS columns or more goes
// through the GEMM (its columns packed into panels of its own, gstart[ex] panels in; the
// results land in the thread's out rows and are scattered from there), the others
// through the dot tiles.

typedef struct {
    int32_t * start;        // [n_expert + 1]
    int32_t * gstart;       // [n_expert + 1]: first panel of each expert (GEMM experts only)
    int32_t * cols;         // [n_used * n_tok]
    void *    scratch;      // the GEMM's (gemm_scratch_size)
    float *   out;          // [n_used * n_tok][GP_GEMM_ROWS]: a chunk's GEMM results
} id_lists;

static int64_t id_cols(const gp_tensor * dst) { return dst->src[2]->ne[0] * dst->src[2]->ne[1]; }

// panels of all GEMM experts together, at most
static int64_t id_max_panels(const gp_tensor * dst) {
    const int64_t n = id_cols(dst);
    return n / GP_GEMM_COLS + GP_MIN(dst->src[0]->ne[2], n / GEMM_MIN_COLS);
}

static const gp_gemm * gemm_id_of(const gp_tensor * dst) {
    const int wtype = dst->src[0]->type;
    return (wtype == GP_TYPE_Q8_0 || wtype == GP_TYPE_Q4_0) && id_cols(dst) >= GEMM_MIN_COLS
               ? gp_simd_active->gemm_q8_0 : NULL;
}

static size_t id_lists_size(const gp_tensor * dst, const gp_gemm * gemm) {
    const size_t ints = gp_pad((size_t)(2 * (dst->src[0]->ne[2] + 1) + id_cols(dst)) * sizeof(int32_t));
    if (!gemm) return ints;
    return ints + gemm_scratch_size(dst) + gp_pad((size_t)id_cols(dst) * GP_GEMM_ROWS * sizeof(float));
}

static size_t id_panels_size(const gp_tensor * dst, const gp_gemm * gemm) {
    return gemm ? gp_pad(gemm->panel_size(dst->src[0]->ne[0]) * (size_t)id_max_panels(dst)) : 0;
}

static size_t mul_mat_id_wsize(const gp_tensor * dst, const gp_gemm * gemm, int nth) {
    return form_wsize(dst) + id_panels_size(dst, gemm) + (size_t)nth * id_lists_size(dst, gemm);
}

static id_lists id_lists_of(const gp_params * p, const gp_tensor * dst, const gp_gemm * gemm) {
    const int64_t n_expert = dst->src[0]->ne[2];
    char * at = p->wdata + form_wsize(dst) + id_panels_size(dst, gemm) + (size_t)p->ith * id_lists_size(dst, gemm);
    id_lists l = {(int32_t *)at, (int32_t *)at + n_expert + 1, (int32_t *)at + 2 * (n_expert + 1), NULL, NULL};
    if (gemm) {
        l.scratch = at + gp_pad((size_t)(2 * (n_expert + 1) + id_cols(dst)) * sizeof(int32_t));
        l.out = (float *)((char *)l.scratch + gemm_scratch_size(dst));
    }
    const gp_tensor * ids = dst->src[2];
    const int64_t n_used = ids->ne[0], n_tok = ids->ne[1];
    int32_t * next = l.gstart;                  // (the counting sort's cursors, first)
    memset(l.start, 0, (size_t)(n_expert + 1) * sizeof(int32_t));
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t e = 0; e < n_used; e++)
            l.start[*(const int32_t *)(ids->data + e * ids->nb[0] + t * ids->nb[1]) + 1]++;
    for (int64_t ex = 0; ex < n_expert; ex++) {
        l.start[ex + 1] += l.start[ex];
        next[ex] = l.start[ex];
    }
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t e = 0; e < n_used; e++)
            l.cols[next[*(const int32_t *)(ids->data + e * ids->nb[0] + t * ids->nb[1])]++] = (int32_t)(e + t * n_used);
    l.gstart[0] = 0;
    for (int64_t ex = 0; ex < n_expert; ex++) {
        const int32_t cnt = l.start[ex + 1] - l.start[ex];
        l.gstart[ex + 1] = l.gstart[ex] + (gemm && cnt >= GEMM_MIN_COLS ? (cnt + GP_GEMM_COLS - 1) / GP_GEMM_COLS : 0);
    }
    return l;
}

static int k_mul_mat_id(const gp_params * p, gp_tensor * dst) {
    const gp_tensor * w = dst->src[0];
    const gp_tensor * x = dst->src[1];
    const gp_tensor * ids = dst->src[2];
    const int64_t k = w->ne[0], m = w->ne[1], n_expert = w->ne[2];
    const int64_t ne11 = x->ne[1];
    const int64_t n_used = ids->ne[0], n_tok = ids->ne[1];
    const int converted = needs_form(w, x);
    const size_t rb = gp_dot_form_size(w->type, k);

    // every thread checks the ids alike, so all return before the barrier or none
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t e = 0; e < n_used; e++) {
            int32_t id = *(const int32_t *)(ids->data + e * ids->nb[0] + t * ids->nb[1]);
            if (id < 0 || id >= n_expert) {
                return gp_fail(p, "expert id %d out of range [0, %lld) in '%s'", id,
                               (long long)n_expert, ids->name);
            }
        }
    }
    if (converted) {
        convert_rows(p, w, x);
        gp_barrier(p);
    }
    // (a cplan made under another instruction set may have no room for the GEMM's buffers)
    const gp_gemm * gemm = gemm_id_of(dst);
    if (gemm && p->wsize < mul_mat_id_wsize(dst, gemm, p->nth)) gemm = NULL;
    const id_lists l = id_lists_of(p, dst, gemm);
    // the src1 row of column q = e + t * n_used
#define ID_ROW(q) (converted ? p->wdata + (((q) / n_used) * ne11 + ((q) % n_used) % ne11) * rb \
                             : gp_row(x, ((q) % n_used) % ne11, (q) / n_used, 0))
#define ID_DST(q) ((float *)gp_row(dst, (q) % n_used, (q) / n_used, 0))

    const size_t psize = gemm ? gemm->panel_size(k) : 0;
    char * panels = p->wdata + form_wsize(dst);
    if (gemm) {
        for (int64_t pi = p->ith, ex = 0; pi < l.gstart[n_expert]; pi += p->nth) {
            while (pi >= l.gstart[ex + 1]) ex++;
            const int64_t j0 = l.start[ex] + (pi - l.gstart[ex]) * GP_GEMM_COLS;
            const int cn = (int)GP_MIN(GP_GEMM_COLS, l.start[ex + 1] - j0);
            const char * rows[GP_GEMM_COLS];
            for (int j = 0; j < cn; j++) rows[j] = ID_ROW(l.cols[j0 + j]);
            gemm->pack(k, rows, cn, panels + pi * psize);
        }
        gp_barrier(p);
    }

    const int64_t mchunks = (m + MM_ROWS - 1) / MM_ROWS;
    const void * b[MM_COLS];
    float * c[MM_COLS];
    for (int64_t ch = p->ith; ch < mchunks * n_expert; ch += p->nth) {
        const int64_t ex = ch / mchunks;
        const int64_t m0 = (ch % mchunks) * MM_ROWS;
        const int rm = (int)GP_MIN(MM_ROWS, m - m0);
        const char * a = w->data + ex * w->nb[2] + m0 * w->nb[1];
        const int32_t * cols = l.cols + l.start[ex];
        const int64_t cnt = l.start[ex + 1] - l.start[ex];
        if (l.gstart[ex + 1] > l.gstart[ex]) {
            size_t lda;
            const char * wa = gemm_rows(dst, a, rm, l.scratch, &lda);
            gemm->run(k, wa, lda, rm, panels + l.gstart[ex] * psize, cnt, (char *)l.out,
                      GP_GEMM_ROWS * sizeof(float), l.scratch);
            for (int64_t j = 0; j < cnt; j++)
                memcpy(ID_DST(cols[j]) + m0, l.out + j * GP_GEMM_ROWS, (size_t)rm * sizeof(float));
            continue;
        }
        for (int64_t j0 = 0; j0 < cnt; j0 += MM_COLS) {
            const int rn = (int)GP_MIN(MM_COLS, cnt - j0);
            for (int j = 0; j < rn; j++) {
                b[j] = ID_ROW(cols[j0 + j]);
                c[j] = ID_DST(cols[j0 + j]) + m0;
            }
            gp_dot_rows(w->type, k, a, w->nb[1], rm, b, rn, c);
        }
    }
#undef ID_ROW
#undef ID_DST
    return 0;
}

// ---------------------------------------------------------------------------
// selection (called by gp_select_kernel)

#define MM_PARALLEL_MIN (1 << 19)   // multiply-adds below which one thread does it all

gp_kernel gp_select_mul_mat(const gp_tensor * t, int nth, int * n_tasks, size_t * wsize, const char ** error) {
    const int is_id = t->op == GP_OP_MUL_MAT_ID;
    *error = is_id ? mul_mat_id_check(t) : mul_mat_check(t);
    if (*error) return NULL;
    if (!(is_id ? mul_mat_id_supported(t) : mul_mat_supported(t))) return NULL;
    const int64_t work = t->ne[0] * gp_nrows(t) * t->src[0]->ne[0];
    *n_tasks = work >= MM_PARALLEL_MIN ? nth : 1;
    *wsize = is_id ? mul_mat_id_wsize(t, gemm_id_of(t), *n_tasks) : mul_mat_wsize(t, *n_tasks);
    return is_id ? k_mul_mat_id : k_mul_mat;
}
