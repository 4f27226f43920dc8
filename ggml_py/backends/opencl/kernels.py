"""OpenCL C 1.2 kernels of the OpenCL backend (one program, built once per device context).

Conventions:
  * a tensor travels as four arguments, TENSOR(x): the buffer, the byte offset of the
    tensor's data in it, ne (long4) and nb (ulong4, byte strides) -- so every kernel
    reads views and permuted tensors through their strides, as ggml's ops do;
  * element types are runtime ints (T_F32, T_F16, T_Q8_0, T_I32, T_I64: ggml type ids,
    passed as -D options by the backend); arithmetic is f32, f16 is read with
    vload_half and written with vstore_half_rte (round to nearest even, as ggml's
    CPU converts);
  * local sizes are fixed (WG for 1-D kernels and row reductions, TS x TS for the
    matmul tiles) because PoCL compiles a kernel again for every local size.
"""

from ggml_py import quants
from ggml_py._core import GLU_OP_NAMES as GLU_OPS, UNARY_OP_NAMES as UNARY_OPS, type_size
from ggml_py._supports import OPENCL_FA_D, OPENCL_SORT_MAX

BODY = r"""
#define TENSOR(x) global char * x##_d, ulong x##_o, long4 x##_ne, ulong4 x##_nb
#define AT(x, i0, i1, i2, i3) (x##_d + x##_o + (ulong)(i0) * x##_nb.s0 + (ulong)(i1) * x##_nb.s1 \
                               + (ulong)(i2) * x##_nb.s2 + (ulong)(i3) * x##_nb.s3)
#define ATV(x, i) AT(x, (i).s0, (i).s1, (i).s2, (i).s3)
#define PASS(x) x##_d, x##_o, x##_ne, x##_nb           /* a TENSOR(x) on to a helper */

/* ---- element access ---- */

float ld(const global char * p, int t) {
    return t == T_F16 ? vload_half(0, (const global half *)p) : *(const global float *)p;
}

void st(global char * p, int t, float v) {
    if (t == T_F16) {
        vstore_half_rte(v, 0, (global half *)p);
    } else {
        *(global float *)p = v;
    }
}

/* x rounded to the nearest f16 and widened back (ggml's f16 round trips) */
float round_f16(float x) {
    ushort h;
    vstore_half_rte(x, 0, (half *)&h);
    return vload_half(0, (const half *)&h);
}

/* element k of a weight row starting at p: f32, f16 or q8_0 blocks (d: f16, qs: 32 x int8) */
float ld_row(const global char * p, int t, long k) {
    if (t == T_Q8_0) {
        const global char * blk = p + (k / QK8_0) * Q8_0_BYTES;
        return vload_half(0, (const global half *)blk) * (float)blk[2 + k % QK8_0];
    }
    if (t == T_F16) {
        return vload_half(k, (const global half *)p);
    }
    return ((const global float *)p)[k];
}

/* logical index k -> (i0, i1, i2, i3) for shape ne (ggml order) */
long4 unravel(ulong k, long4 ne) {
    long4 i;
    i.s0 = k % ne.s0; k /= ne.s0;
    i.s1 = k % ne.s1; k /= ne.s1;
    i.s2 = k % ne.s2;
    i.s3 = k / ne.s2;
    return i;
}

/* group index -> (0, i1, i2, i3): the row a one-group-per-row kernel works on */
long4 unravel_row(ulong row, long4 ne) {
    return unravel(row, (long4)(1, ne.s1, ne.s2, ne.s3));
}

/* 32 floats -> one q8_0 block with the CPU backend's quantiser
   (d = amax/127, q = rint(x * 127/amax)) */
void quantize_q8_0(const float * v, global char * blk) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fmax(amax, fabs(v[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    vstore_half_rte(amax / 127.0f, 0, (global half *)blk);
    for (int j = 0; j < QK8_0; j++) {
        blk[2 + j] = (char)clamp(rint(v[j] * id), -128.0f, 127.0f);
    }
}

/* ALiBi slope of head h (slope 1 without max_bias), as ggml's soft_max and flash attention */
float alibi_slope(int h, float max_bias, float m0, float m1, int n_head_log2) {
    if (max_bias <= 0.0f) return 1.0f;
    return h < n_head_log2 ? pown(m0, h + 1) : pown(m1, 2 * (h - n_head_log2) + 1);
}

/* ---- work-group reductions (WG items, one row per group) ---- */

float wg_sum(local float * buf, float v) {
    const int l = get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] += buf[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);   /* buf is reused by the next reduction */
    return r;
}

float wg_max(local float * buf, float v) {
    const int l = get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] = fmax(buf[l], buf[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* ---- DUP / CONT / CPY: element k of src (logical order) -> element k of dst;
   REPEAT (repeat != 0): dst[i] = src[i mod src.ne] ---- */

kernel void k_cpy(TENSOR(s), int s_t, TENSOR(d), int d_t, int elt_size, int repeat, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 id = unravel(k, d_ne);
    const global char * ps = ATV(s, repeat ? id % s_ne : unravel(k, s_ne));
    global char * pd = ATV(d, id);
    if (s_t == d_t) {                               /* bit copy: exact for every type */
        if (elt_size == 4) *(global uint *)pd = *(const global uint *)ps;
        else if (elt_size == 2) *(global ushort *)pd = *(const global ushort *)ps;
        else for (int b = 0; b < elt_size; b++) pd[b] = ps[b];
    } else {
        st(pd, d_t, ld(ps, s_t));
    }
}

/* f32/f16 -> q8_0, one block per item */
kernel void k_cpy_q8_0(TENSOR(s), int s_t, TENSOR(d), ulong nblocks) {
    const ulong b = get_global_id(0);
    if (b >= nblocks) return;
    const long nb0 = d_ne.s0 / QK8_0;
    const long4 ib = unravel(b, (long4)(nb0, d_ne.s1, d_ne.s2, d_ne.s3));
    const ulong k0 = (((ulong)ib.s3 * d_ne.s2 + ib.s2) * d_ne.s1 + ib.s1) * d_ne.s0
                     + (ulong)ib.s0 * QK8_0;
    float v[QK8_0];
    for (int j = 0; j < QK8_0; j++) v[j] = ld(ATV(s, unravel(k0 + j, s_ne)), s_t);
    quantize_q8_0(v, AT(d, 0, ib.s1, ib.s2, ib.s3) + ib.s0 * Q8_0_BYTES);
}

/* ---- CONCAT along dim: dst[i] = a[i] where i[dim] < a.ne[dim], else b[i - a.ne[dim]] ---- */

kernel void k_concat(int dim, TENSOR(a), TENSOR(b), TENSOR(d), int elt_size, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    const long ia[4] = {i.s0, i.s1, i.s2, i.s3};
    long ib[4] = {i.s0, i.s1, i.s2, i.s3};
    const long na[4] = {a_ne.s0, a_ne.s1, a_ne.s2, a_ne.s3};
    const global char * ps;
    if (ia[dim] < na[dim]) {
        ps = AT(a, ia[0], ia[1], ia[2], ia[3]);
    } else {
        ib[dim] -= na[dim];
        ps = AT(b, ib[0], ib[1], ib[2], ib[3]);
    }
    global char * pd = ATV(d, i);
    for (int c = 0; c < elt_size; c++) pd[c] = ps[c];
}

/* ---- DIAG_MASK_INF: -inf above the diagonal shifted by n_past ---- */

kernel void k_diag_mask_inf(int n_past, TENSOR(a), TENSOR(d), ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    const float v = ld(ATV(a, i), T_F32);
    st(ATV(d, i), T_F32, i.s0 > n_past + i.s1 ? -INFINITY : v);
}

/* ---- SUM_ROWS / MEAN: one work-group per row ---- */

kernel void k_sum_rows(int mean, TENSOR(a), TENSOR(d)) {
    local float buf[WG];
    const long4 r = unravel_row(get_group_id(0), a_ne);
    const long i1 = r.s1, i2 = r.s2, i3 = r.s3;
    const int l = get_local_id(0);
    float s = 0.0f;
    for (long i0 = l; i0 < a_ne.s0; i0 += WG) s += ld(AT(a, i0, i1, i2, i3), T_F32);
    s = wg_sum(buf, s);
    if (l == 0) st(AT(d, 0, i1, i2, i3), T_F32, mean ? s / (float)a_ne.s0 : s);
}

/* ---- SET_ROWS: d[i0, ids[i1, i2 % c.ne1, i3 % c.ne2], i2, i3] = s[i0, i1, i2, i3] ---- */

/* the destination row of source row (i1, i2, i3), or -1 for a bad id (which writes nothing) */
long set_rows_target(TENSOR(c), int c_t, long4 i, long n_rows) {
    const global char * pc = AT(c, i.s1, i.s2 % c_ne.s1, i.s3 % c_ne.s2, 0);
    const long row = c_t == T_I64 ? *(const global long *)pc : *(const global int *)pc;
    return row >= 0 && row < n_rows ? row : -1;
}

kernel void k_set_rows(TENSOR(s), TENSOR(c), int c_t, TENSOR(d), int d_t, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, s_ne);
    const long row = set_rows_target(PASS(c), c_t, i, d_ne.s1);
    if (row >= 0) st(AT(d, i.s0, row, i.s2, i.s3), d_t, ld(ATV(s, i), T_F32));
}

/* into q8_0 rows: one block per item, quantised as CPY does */
kernel void k_set_rows_q8_0(TENSOR(s), TENSOR(c), int c_t, TENSOR(d), ulong nblocks) {
    const ulong b = get_global_id(0);
    if (b >= nblocks) return;
    const long4 ib = unravel(b, (long4)(s_ne.s0 / QK8_0, s_ne.s1, s_ne.s2, s_ne.s3));
    const long row = set_rows_target(PASS(c), c_t, ib, d_ne.s1);
    if (row < 0) return;
    float v[QK8_0];
    for (int j = 0; j < QK8_0; j++) {
        v[j] = ld(AT(s, ib.s0 * QK8_0 + j, ib.s1, ib.s2, ib.s3), T_F32);
    }
    quantize_q8_0(v, AT(d, 0, row, ib.s2, ib.s3) + ib.s0 * Q8_0_BYTES);
}

/* ---- ADD / SUB / MUL / DIV: src1 repeats over src0 (ggml_can_repeat) ---- */


kernel void k_binary(int op, TENSOR(a), int a_t, TENSOR(b), int b_t, TENSOR(d), int d_t,
                     ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    const float x = ld(ATV(a, i), a_t);
    const float y = ld(ATV(b, i % b_ne), b_t);
    float r;
    switch (op) {
        case BIN_ADD: r = x + y; break;
        case BIN_SUB: r = x - y; break;
        case BIN_MUL: r = x * y; break;
        default: r = x / y; break;
    }
    st(ATV(d, i), d_t, r);
}

/* ---- element-wise maps: UNARY (ggml_unary_op ids) and a few ops of one input ---- */

/* not ggml unary ops: the other one-input maps */

float gelu_f32(float x) {
    const float c = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanh(c * x * (1.0f + 0.044715f * x * x)));
}

/* ggml's CPU GELU: a table over f16 inputs holding f16 results; for f32 tensors the
   table is bypassed beyond +-10 */
float gelu_cpu(float x, int is_f16) {
    if (!is_f16) {
        if (x <= -10.0f) return 0.0f;
        if (x >= 10.0f) return x;
    }
    return round_f16(gelu_f32(round_f16(x)));
}

float gelu_quick_cpu(float x) {
    const float h = round_f16(x);
    return round_f16(h * (1.0f / (1.0f + exp(-1.702f * h))));
}

float gelu_erf(float x) {
    return 0.5f * x * (1.0f + erf(x * 0.70710678118654752440084436210484f));
}

float silu(float x) {
    return x / (1.0f + exp(-x));
}

float map1(int op, float x, float p0, float p1, int is_f16) {
    switch (op) {
        case U_ABS: return fabs(x);
        case U_SGN: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
        case U_NEG: return -x;
        case U_STEP: return x > 0.0f ? 1.0f : 0.0f;
        case U_TANH: return tanh(x);
        case U_ELU: return x > 0.0f ? x : expm1(x);
        case U_RELU: return x > 0.0f ? x : 0.0f;
        case U_SIGMOID: return 1.0f / (1.0f + exp(-x));
        case U_GELU: return gelu_cpu(x, is_f16);
        case U_GELU_QUICK: return gelu_quick_cpu(x);
        case U_SILU: return silu(x);
        case U_HARDSWISH: return x * fmin(1.0f, fmax(0.0f, (x + 3.0f) / 6.0f));
        case U_HARDSIGMOID: return fmin(1.0f, fmax(0.0f, (x + 3.0f) / 6.0f));
        case U_EXP: return exp(x);
        case U_EXPM1: return exp(x) - 1.0f;          /* as the CPU: not expm1 */
        case U_SOFTPLUS: return x > 20.0f ? x : log(1.0f + exp(x));
        case U_GELU_ERF: return gelu_erf(x);
        case U_FLOOR: return floor(x);
        case U_CEIL: return ceil(x);
        case U_ROUND: return round(x);               /* halves away from zero, as roundf */
        case U_TRUNC: return trunc(x);
        case M_SQR: return x * x;
        case M_SQRT: return sqrt(x);
        case M_CLAMP: return fmax(fmin(x, p1), p0);
        case M_SCALE: return p1 != 0.0f ? x * p0 + p1 : x * p0;
    }
    return NAN;
}

kernel void k_map1(int op, float p0, float p1, TENSOR(a), int a_t, TENSOR(d), int d_t, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    st(ATV(d, i), d_t, map1(op, ld(ATV(a, i), a_t), p0, p1, a_t == T_F16));
}

/* ---- GLU: x from the first half of a row (or src0), gate from the second (or src1) ---- */


kernel void k_glu(int op, int swapped, int split, float alpha, float limit,
                  TENSOR(a), int a_t, TENSOR(b), int b_t, TENSOR(d), int d_t, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    float x, g;
    if (split) {
        x = ld(ATV(a, i), a_t);
        g = ld(ATV(b, i), b_t);
    } else {
        const long nc = d_ne.s0;
        x = ld(AT(a, i.s0 + (swapped ? nc : 0), i.s1, i.s2, i.s3), a_t);
        g = ld(AT(a, i.s0 + (swapped ? 0 : nc), i.s1, i.s2, i.s3), a_t);
    }
    const int is_f16 = a_t == T_F16;
    float r;
    switch (op) {
        case G_REGLU: r = x > 0.0f ? x * g : 0.0f; break;
        case G_GEGLU:
            if (!is_f16 && x <= -10.0f) r = 0.0f;
            else if (!is_f16 && x >= 10.0f) r = x * g;
            else r = gelu_cpu(x, 1) * g;
            break;
        case G_SWIGLU: r = silu(x) * g; break;
        case G_GEGLU_ERF: r = gelu_erf(x) * g; break;
        case G_GEGLU_QUICK: r = gelu_quick_cpu(x) * g; break;
        default: {                                  /* SWIGLU_OAI */
            const float xx = fmin(x, limit);
            const float yy = clamp(g, -limit, limit);
            r = (xx / (1.0f + exp(alpha * (-xx)))) * (yy + 1.0f);
        }
    }
    st(ATV(d, i), d_t, r);
}

/* ---- NORM / RMS_NORM: one work-group per row ---- */

kernel void k_norm(int rms, float eps, TENSOR(a), TENSOR(d)) {
    local float buf[WG];
    const long4 r = unravel_row(get_group_id(0), a_ne);
    const long i1 = r.s1, i2 = r.s2, i3 = r.s3;
    const int l = get_local_id(0);
    const long n = a_ne.s0;
    float s = 0.0f;
    for (long i0 = l; i0 < n; i0 += WG) s += ld(AT(a, i0, i1, i2, i3), T_F32);
    const float mean = rms ? 0.0f : wg_sum(buf, s) / n;
    float s2 = 0.0f;
    for (long i0 = l; i0 < n; i0 += WG) {
        const float v = ld(AT(a, i0, i1, i2, i3), T_F32) - mean;
        s2 += v * v;
    }
    const float scale = 1.0f / sqrt(wg_sum(buf, s2) / n + eps);
    for (long i0 = l; i0 < n; i0 += WG) {
        st(AT(d, i0, i1, i2, i3), T_F32, (ld(AT(a, i0, i1, i2, i3), T_F32) - mean) * scale);
    }
}

/* ---- SOFT_MAX(a * scale + slope * mask) with optional sinks: one group per row ---- */

kernel void k_soft_max(TENSOR(a), TENSOR(m), int m_t, int has_mask, TENSOR(s), int has_sinks,
                       TENSOR(d), float scale, float max_bias, float m0, float m1,
                       int n_head_log2) {
    local float buf[WG];
    const long4 r = unravel_row(get_group_id(0), a_ne);
    const long i1 = r.s1, i2 = r.s2, i3 = r.s3;
    const int l = get_local_id(0);
    const long n = a_ne.s0;
    const float slope = alibi_slope((int)i2, max_bias, m0, m1, n_head_log2);
    float mx = -INFINITY;
    for (long i0 = l; i0 < n; i0 += WG) {
        float v = ld(AT(a, i0, i1, i2, i3), T_F32) * scale;
        if (has_mask) v += slope * ld(AT(m, i0, i1, i2 % m_ne.s2, i3 % m_ne.s3), m_t);
        st(AT(d, i0, i1, i2, i3), T_F32, v);        /* each item rereads only its own */
        mx = fmax(mx, v);
    }
    mx = wg_max(buf, mx);
    const float sink = has_sinks ? ld(AT(s, i2, 0, 0, 0), T_F32) : -INFINITY;
    mx = fmax(mx, sink);
    float sum = 0.0f;
    for (long i0 = l; i0 < n; i0 += WG) {
        global char * p = AT(d, i0, i1, i2, i3);
        const float e = exp(ld(p, T_F32) - mx);
        st(p, T_F32, e);
        sum += e;
    }
    sum = wg_sum(buf, sum);
    if (has_sinks) sum += exp(sink - mx);
    const float inv = 1.0f / sum;
    for (long i0 = l; i0 < n; i0 += WG) {
        global char * p = AT(d, i0, i1, i2, i3);
        st(p, T_F32, ld(p, T_F32) * inv);
    }
}

/* ---- ROPE (normal and NEOX, YaRN, freq factors): one item per pair of a row ---- */

kernel void k_rope(TENSOR(a), int a_t, TENSOR(p), TENSOR(f), int has_ff, TENSOR(d), int d_t,
                   int n_dims, int neox, float theta_scale, float freq_scale, float ext_factor,
                   float mscale, float corr0, float corr1, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long half_ne0 = a_ne.s0 / 2;
    const long j = k % half_ne0;
    const long r = k / half_ne0;
    const long i1 = r % a_ne.s1, i2 = (r / a_ne.s1) % a_ne.s2, i3 = r / (a_ne.s1 * a_ne.s2);
    if (j >= n_dims / 2) {                          /* past n_dims: copied unchanged */
        const long e = n_dims + 2 * (j - n_dims / 2);
        st(AT(d, e, i1, i2, i3), d_t, ld(AT(a, e, i1, i2, i3), a_t));
        st(AT(d, e + 1, i1, i2, i3), d_t, ld(AT(a, e + 1, i1, i2, i3), a_t));
        return;
    }
    /* theta as the CPU builds it: position times theta_scale, multiplied j times in f32 */
    float theta = (float)(*(const global int *)AT(p, i2, 0, 0, 0));
    for (long q = 0; q < j; q++) theta *= theta_scale;
    const float ff = has_ff ? ld(AT(f, j, 0, 0, 0), T_F32) : 1.0f;
    const float th_extrap = theta / ff;
    const float th_interp = freq_scale * th_extrap;
    float th = th_interp;
    if (ext_factor != 0.0f) {
        const float y = ((float)j - corr0) / fmax(0.001f, corr1 - corr0);
        const float mix = (1.0f - fmin(1.0f, fmax(0.0f, y))) * ext_factor;
        th = th_interp * (1.0f - mix) + th_extrap * mix;
    }
    const float c = cos(th) * mscale, s = sin(th) * mscale;
    const long e0 = neox ? j : 2 * j;
    const long e1 = neox ? j + n_dims / 2 : 2 * j + 1;
    const float x0 = ld(AT(a, e0, i1, i2, i3), a_t);
    const float x1 = ld(AT(a, e1, i1, i2, i3), a_t);
    st(AT(d, e0, i1, i2, i3), d_t, x0 * c - x1 * s);
    st(AT(d, e1, i1, i2, i3), d_t, x0 * s + x1 * c);
}

/* ---- GET_ROWS: dst[i0, i10, i11, i12] = a[i0, rows[i10, i11, i12], i11, i12] ---- */

kernel void k_get_rows(TENSOR(a), int a_t, TENSOR(r), TENSOR(d), int d_t, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    const int row = *(const global int *)AT(r, i.s1, i.s2, i.s3, 0);
    global char * pd = ATV(d, i);
    if (row < 0 || row >= a_ne.s1) {                /* a bad id: make it visible */
        if (d_t == T_I32) *(global int *)pd = 0;
        else st(pd, d_t, NAN);
        return;
    }
    const global char * prow = AT(a, 0, row, i.s2, i.s3);
    if (a_t == T_I32) {
        *(global int *)pd = *(const global int *)(prow + i.s0 * a_nb.s0);
    } else if (a_t == T_Q8_0) {
        st(pd, d_t, ld_row(prow, a_t, i.s0));
    } else {
        st(pd, d_t, ld(prow + i.s0 * a_nb.s0, a_t));
    }
}

/* ---- SUM: the whole tensor, one work-group ---- */

kernel void k_sum(TENSOR(a), TENSOR(d), ulong n) {
    local float buf[WG];
    float s = 0.0f;
    for (ulong k = get_local_id(0); k < n; k += WG) s += ld(ATV(a, unravel(k, a_ne)), T_F32);
    s = wg_sum(buf, s);
    if (get_local_id(0) == 0) st(AT(d, 0, 0, 0, 0), T_F32, s);
}

/* ---- ACC: d = a, plus b added over the region of a's flat (logical) elements that starts
   at element r.s0 with element strides r.s1..r.s3 (ggml's byte nb1..nb3 and offset / 4).
   The copy d = a is queued first (k_cpy); this adds, reading a as ggml does. ---- */

kernel void k_acc(long4 r, TENSOR(a), TENSOR(b), TENSOR(d), ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, b_ne);
    const ulong e = r.s0 + i.s0 + i.s1 * r.s1 + i.s2 * r.s2 + i.s3 * r.s3;
    const long4 id = unravel(e, d_ne);
    st(ATV(d, id), T_F32, ld(ATV(a, id), T_F32) + ld(ATV(b, i), T_F32));
}

/* ---- PAD: a shifted by the left pads lp; outside a zero, or wrapped round when circular ---- */

kernel void k_pad(int circular, long4 lp, TENSOR(a), int a_t, TENSOR(d), int d_t, ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);
    long4 j = i - lp;
    float v = 0.0f;
    if (circular) {
        j = (j % a_ne + a_ne) % a_ne;
        v = ld(ATV(a, j), a_t);
    } else if (!any(j < 0) && !any(j >= a_ne)) {
        v = ld(ATV(a, j), a_t);
    }
    st(ATV(d, i), d_t, v);
}

/* ---- ARANGE: start + step * i, the product and sum as two f32 roundings (as the CPU) ---- */

kernel void k_arange(float start, float step, TENSOR(d), ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const float off = step * (float)k;
    st(AT(d, k, 0, 0, 0), T_F32, start + off);
}

/* ---- TIMESTEP_EMBEDDING: row r = [cos(t f_j) | sin(t f_j) | 0 for an odd dim], with
   f_j = exp(-log(max_period) * j / half) and t = timesteps[r] ---- */

kernel void k_timestep_embedding(float neg_log_period, int half_dim, TENSOR(a), TENSOR(d),
                                 ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long i0 = k % d_ne.s0, r = k / d_ne.s0;
    float v = 0.0f;
    if (i0 < 2 * half_dim) {
        const long j = i0 < half_dim ? i0 : i0 - half_dim;
        const float freq = exp((neg_log_period * (float)j) / (float)half_dim);
        const float arg = ld(AT(a, r, 0, 0, 0), T_F32) * freq;
        v = i0 < half_dim ? cos(arg) : sin(arg);
    }
    st(AT(d, i0, r, 0, 0), T_F32, v);
}

/* ---- ARGSORT / TOP_K: one work-group per row (at most SORT_MAX values, kept in local
   memory). Each value's place is its rank in a stable ascending sort of the keys (x, or
   -x for descending; NaN last): the order of numpy's stable argsort, which the CPU
   backend uses -- ties keep index order. Places from d.ne0 on are dropped (TOP_K);
   swap01 swaps the first two, as ggml 0.10.1's CPU top_k does. ---- */


/* key x at index i sorts before key y at index j */
int sorts_before(float x, long i, float y, long j) {
    if (isnan(x) || isnan(y)) return isnan(y) && (!isnan(x) || i < j);
    return x < y || (x == y && i < j);
}

kernel void k_argsort(int desc, int swap01, TENSOR(a), TENSOR(d)) {
    local float key[SORT_MAX];
    const long4 r = unravel_row(get_group_id(0), a_ne);
    const int l = get_local_id(0);
    const long n = a_ne.s0;
    for (long j = l; j < n; j += WG) {
        const float x = ld(AT(a, j, r.s1, r.s2, r.s3), T_F32);
        key[j] = desc ? -x : x;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long j = l; j < n; j += WG) {
        long place = 0;
        for (long i = 0; i < n; i++) place += sorts_before(key[i], i, key[j], j);
        if (swap01 && place < 2) place = 1 - place;
        if (place < d_ne.s0) *(global int *)AT(d, place, r.s1, r.s2, r.s3) = (int)j;
    }
}

/* ---- FLASH_ATTN_EXT with f16 K and V, as ggml's CPU computes it: q rounded to f16 for
   the K dots, then an online softmax over the KV positions whose V*p sums are kept in
   f16 (rounded after every scale and add). One work-group per (query row, head, seq):
   each item scores one KV position of a block of WG, then every item walks the block's
   scores for its own FA_PER output elements (all items keep the same max and sum). ---- */

#define FA_PER (FA_D / WG)

kernel void k_flash_attn(TENSOR(q), TENSOR(k), TENSOR(v), TENSOR(m), int m_t, int has_mask,
                         TENSOR(s), int has_sinks, TENSOR(d), float scale, float softcap,
                         float max_bias, float m0, float m1, int n_head_log2) {
    local float qs[FA_D];
    local float score[WG];
    local float masked[WG];
    const long4 r = unravel_row(get_group_id(0), q_ne);    /* (0, query, head, seq) */
    const long iq1 = r.s1, h = r.s2, iq3 = r.s3;
    const int l = get_local_id(0);
    const long DK = q_ne.s0, DV = v_ne.s0, n_kv = k_ne.s1;
    const long hk = h / (q_ne.s2 / k_ne.s2), sk = iq3 / (q_ne.s3 / k_ne.s3);
    const long hv = h / (q_ne.s2 / v_ne.s2), sv = iq3 / (q_ne.s3 / v_ne.s3);
    const float slope = alibi_slope((int)h, max_bias, m0, m1, n_head_log2);
    for (long c = l; c < DK; c += WG) qs[c] = round_f16(ld(AT(q, c, iq1, h, iq3), T_F32));
    float acc[FA_PER];
    for (int p = 0; p < FA_PER; p++) acc[p] = 0.0f;
    float M = -INFINITY, S = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long c0 = 0; c0 < n_kv; c0 += WG) {
        const long ic = c0 + l;
        if (ic < n_kv) {
            float dot = 0.0f;
            for (long c = 0; c < DK; c++) dot += qs[c] * ld(AT(k, c, ic, hk, sk), T_F16);
            float x = dot * scale;
            if (softcap != 0.0f) x = softcap * tanh(x);
            const float mv = has_mask
                ? slope * ld(AT(m, ic, iq1, h % m_ne.s2, iq3 % m_ne.s3), m_t) : 0.0f;
            score[l] = x + mv;
            masked[l] = mv;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const long cnt = min((long)WG, n_kv - c0);
        for (long t = 0; t < cnt; t++) {
            if (masked[t] == -INFINITY) continue;
            const float x = score[t];
            const int is_new = x > M;
            const float ms = is_new ? exp(M - x) : 1.0f;
            const float vs = is_new ? 1.0f : exp(x - M);
            if (is_new) M = x;
            for (int p = 0; p < FA_PER; p++) {
                const long c = l + p * WG;
                if (c >= DV) break;
                const float a = is_new ? round_f16(acc[p] * ms) : acc[p];
                acc[p] = round_f16(a + ld(AT(v, c, c0 + t, hv, sv), T_F16) * vs);
            }
            S = S * ms + vs;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (has_sinks) {                    /* one more score, with no V row (and no f16 rounding) */
        const float x = ld(AT(s, h, 0, 0, 0), T_F32);
        const int is_new = x > M;
        const float ms = is_new ? exp(M - x) : 1.0f;
        const float vs = is_new ? 1.0f : exp(x - M);
        if (is_new) {
            for (int p = 0; p < FA_PER; p++) acc[p] *= ms;
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int p = 0; p < FA_PER; p++) {
        const long c = l + p * WG;
        if (c < DV) st(AT(d, c, h, iq1, iq3), T_F32, acc[p] * inv);
    }
}

/* ---- MUL_MAT: d[m, n, i2, i3] = sum_k a[k, m, i2/r2, i3/r3] * b[k, n, i2, i3] ----
   TS x TS tiles of a and b in local memory; dims 2/3 of a broadcast by integer
   division (ggml). b is f32 or f16; f32 b is rounded to f16 for f16 weights (the CPU
   dots in f16 there). Rows of a are contiguous (nb0 = element or block size). */

kernel void k_mul_mat(TENSOR(a), int a_t, TENSOR(b), int b_t, int round_b, TENSOR(d)) {
    local float As[TS][TS + 1];
    local float Bs[TS][TS + 1];
    const int lm = get_local_id(0), ln = get_local_id(1);
    const long m = get_global_id(0), nn = get_global_id(1);
    const long batch = get_global_id(2);
    const long i2 = batch % b_ne.s2, i3 = batch / b_ne.s2;
    const long M = a_ne.s1, N = b_ne.s1, K = a_ne.s0;
    const long m_tile = m - lm, n_tile = nn - ln;
    const global char * arow = AT(a, 0, m_tile + lm < M ? m_tile + lm : 0,
                                  i2 / (b_ne.s2 / a_ne.s2), i3 / (b_ne.s3 / a_ne.s3));
    float acc = 0.0f;
    for (long k0 = 0; k0 < K; k0 += TS) {
        /* item (lm, ln) loads a[k0 + ln, m] and b[k0 + lm, n_tile + ln] */
        const long ka = k0 + ln, kb = k0 + lm;
        As[lm][ln] = (m < M && ka < K) ? ld_row(arow, a_t, ka) : 0.0f;
        const long nb_ = n_tile + ln;
        float bv = 0.0f;
        if (nb_ < N && kb < K) {
            bv = ld(AT(b, kb, nb_, i2, i3), b_t);
            if (round_b) bv = round_f16(bv);
        }
        Bs[ln][lm] = bv;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TS; kk++) acc += As[lm][kk] * Bs[ln][kk];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (m < M && nn < N) st(AT(d, m, nn, i2, i3), T_F32, acc);
}

/* ---- MUL_MAT_ID: d[m, u, t] = sum_k as[k, m, ids[u, t]] * b[k, u % ne11, t] ---- */

kernel void k_mul_mat_id(TENSOR(a), int a_t, TENSOR(b), int b_t, int round_b, TENSOR(ids),
                         TENSOR(d),
                         ulong n) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const long4 i = unravel(k, d_ne);              /* (m, u, t, 0) */
    const int e = *(const global int *)AT(ids, i.s1, i.s2, 0, 0);
    if (e < 0 || e >= a_ne.s2) {
        st(ATV(d, i), T_F32, NAN);
        return;
    }
    const global char * arow = AT(a, 0, i.s0, e, 0);
    const long ib1 = i.s1 % b_ne.s1;
    float acc = 0.0f;
    for (long kk = 0; kk < a_ne.s0; kk++) {
        float bv = ld(AT(b, kk, ib1, i.s2, 0), b_t);
        if (round_b) bv = round_f16(bv);
        acc += ld_row(arow, a_t, kk) * bv;
    }
    st(ATV(d, i), T_F32, acc);
}
"""

# kernel names the backend looks up after the build
KERNELS = ("k_cpy", "k_cpy_q8_0", "k_concat", "k_diag_mask_inf", "k_sum_rows", "k_set_rows",
           "k_binary", "k_map1", "k_glu", "k_norm", "k_soft_max",
           "k_rope", "k_get_rows", "k_mul_mat", "k_mul_mat_id", "k_set_rows_q8_0", "k_sum",
           "k_acc", "k_pad", "k_arange", "k_timestep_embedding", "k_argsort", "k_flash_attn")

# The constants the kernels and the backend share: the program's #defines are made
# from these, so the two sides cannot disagree.
WG = 64          # local size of 1-D kernels and row reductions
TS = 16          # matmul tile
# the kernels' limits, which the OpenCL supports_op rule checks (ggml_py._supports)
SORT_MAX = OPENCL_SORT_MAX      # longest row ARGSORT / TOP_K sort in local memory
FA_D = OPENCL_FA_D              # largest flash-attention head size (DK and DV)

# op codes of the shared kernels: k_binary, k_map1 (M_*), k_map1's unary ops (U_*: ggml's
# ggml_unary_op ids) and k_glu (G_*: ggml's ggml_glu_op ids)
BINARY_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3}
MAP_CODES = {"SQR": 100, "SQRT": 101, "CLAMP": 102, "SCALE": 103}
# the unary ops map1 has a case for (XIELU, with its parameters, has none): the OpenCL
# rule answers for these alone, so a unary op without its kernel stays on the CPU
UNARY_SUPPORTED = tuple(op for op in UNARY_OPS if f"case U_{op}:" in BODY)


def _defines():
    lines = [f"#define WG {WG}", f"#define TS {TS}", f"#define QK8_0 {quants.QK8_0}",
             f"#define Q8_0_BYTES {type_size('q8_0')}", f"#define SORT_MAX {SORT_MAX}",
             f"#define FA_D {FA_D}"]
    lines += [f"#define BIN_{op} {code}" for op, code in BINARY_CODES.items()]
    lines += [f"#define U_{op} {UNARY_OPS.index(op)}" for op in UNARY_SUPPORTED]
    lines += [f"#define M_{op} {code}" for op, code in MAP_CODES.items()]
    lines += [f"#define G_{op} {i}" for i, op in enumerate(GLU_OPS)]
    return "\n".join(lines) + "\n"


SOURCE = _defines() + BODY
