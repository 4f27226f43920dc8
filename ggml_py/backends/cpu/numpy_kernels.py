"""The CPU backend's kernels in numpy: the reference for the C kernels and the kernels
of the nodes they do not take (ops, types or layouts the C kernels lack, such as
TIMESTEP_EMBEDDING), with the numerics of ggml 0.10.1's CPU backend.

Every kernel reads its sources and writes its result in place through numpy views
built from the tensor's address and byte strides, so views share memory as in ggml.

Numerics follow ggml-cpu where they decide whether results match:
  * MUL_MAT / MUL_MAT_ID convert src1 to the weights' vec_dot type first
    (f16 weights: src1 rounded to f16; q8_0/q4_0 weights: src1 quantised to q8_0
    with the CPU quantiser), then multiply in float32 (np.matmul);
  * results stored as f16 are rounded to nearest-even; CPY/SET_ROWS into q8_0 use
    the CPU quantiser (127/max, halves to even);
  * GELU / GELU_QUICK (and GEGLU*) go through ggml's 65536-entry f16 table;
  * ROPE builds theta by repeated float32 multiplication, as the CPU does;
  * FLASH_ATTN_EXT with f16 V accumulates V*p in f16 with the online softmax, except on
    ggml's tiled path (64 queries or more, f32 / f16 K and V), which sums in float32
    a block of 64 positions at a time.
"""

import math

import numpy as np

from ggml_py.errors import BackendError
from ggml_py import quants
from ggml_py.numerics import alibi_bases, bits_f32, powf, rope_theta_scale, rope_yarn_corr_dims
from ggml_py._core import (GLU_OP_NAMES as GLU_OPS, ROPE_TYPES, UNARY_OP_NAMES as UNARY_OPS,
                           acc_region_end)
from ggml_py.backends.cpu._executor import isa
from ggml_py.backends.cpu.memory import tensor_array


F32 = np.float32


# ---------------------------------------------------------------------------
# tensor values

def values(t):
    """t's values as float32 in numpy order (dequantised / widened), a new array."""
    a = tensor_array(t)
    if t.type == "f32":
        return np.array(a, dtype=F32)
    return quants.to_f32(t.type, a)


def store(t, x, cpu=True):
    """Write float32 (or integer) values x, numpy order, into t, converting to t's type."""
    a = tensor_array(t)
    if t.type in ("i32", "i64", "i16", "i8"):
        a[...] = x
    elif t.type == "f32":
        a[...] = x
    elif a.flags.c_contiguous and a.flags.writeable and np.shape(x) == a.shape:
        quants.from_f32(t.type, x, cpu=cpu, out=a)       # converted straight into t
    else:
        a[...] = quants.from_f32(t.type, np.asarray(x, dtype=F32), cpu=cpu)


def _f(t, i):
    return bits_f32(t.op_params[i])


def _shape(t):
    ne = t.ne
    return (ne[3], ne[2], ne[1], ne[0])


# ---------------------------------------------------------------------------
# kernels

def _k_copy(t):
    """DUP / CONT / CPY: element k of the source (logical order) to element k of dst."""
    src = t.src[0]
    out = tensor_array(t)
    if src.type == t.type and (not quants.is_quantized(t.type) or src.ne[0] == t.ne[0]):
        out[...] = np.array(tensor_array(src)).reshape(out.shape)
        return
    ints = ("i32", "i64", "i16", "i8")
    if t.type in ints or src.type in ints:
        store(t, np.array(tensor_array(src)).reshape(_shape(t)))
        return
    store(t, values(src).reshape(_shape(t)))


def _tile_to(b, shape):
    reps = tuple(n // m for n, m in zip(shape, b.shape))
    return np.tile(b, reps) if any(r != 1 for r in reps) else b


def _k_binary(t):
    a, b = values(t.src[0]), values(t.src[1])
    b = _tile_to(b, a.shape)
    op = t.op
    with np.errstate(all="ignore"):
        if op == "ADD":
            r = a + b
        elif op == "SUB":
            r = a - b
        elif op == "MUL":
            r = a * b
        else:
            r = a / b
    store(t, r)


def _k_acc(t):
    a, b = t.src[0], t.src[1]
    p = t.op_params
    nb1, nb2, nb3, offset = (x & 0xFFFFFFFF for x in p[:4])
    end = acc_region_end(t)
    if end > a.nbytes:
        raise BackendError(
            f"ACC '{t.name}': '{b.name}' {list(b.ne)} added at byte offset {offset} with "
            f"strides {nb1}, {nb2}, {nb3} reaches byte {end} of '{a.name}', which has "
            f"{a.nbytes}")
    out = values(a).reshape(-1).copy()
    bv = values(b)
    region = np.ndarray(bv.shape, dtype=F32, buffer=out, offset=offset,
                        strides=(nb3, nb2, nb1, 4))
    region += bv
    store(t, out.reshape(_shape(t)))


def _k_sqr(t):
    x = values(t.src[0])
    store(t, x * x)


def _k_sqrt(t):
    with np.errstate(invalid="ignore"):
        store(t, np.sqrt(values(t.src[0])))


def _k_sum(t):
    store(t, np.array(values(t.src[0]).astype(np.float64).sum(), dtype=F32).reshape(1, 1, 1, 1))


def _k_sum_rows(t):
    store(t, values(t.src[0]).astype(np.float64).sum(axis=-1, keepdims=True).astype(F32))


def _k_mean(t):
    x = values(t.src[0])
    s = x.astype(np.float64).sum(axis=-1, keepdims=True).astype(F32)
    store(t, s / F32(x.shape[-1]))


def _k_repeat(t):
    a = np.array(tensor_array(t.src[0]))
    tensor_array(t)[...] = _tile_to(a, _shape(t))


def _k_concat(t):
    dim = t.op_params[0]
    a = np.array(tensor_array(t.src[0]))
    b = np.array(tensor_array(t.src[1]))
    tensor_array(t)[...] = np.concatenate([a, b], axis=3 - dim)


def _k_norm(t):
    eps = _f(t, 0)
    x = values(t.src[0]).astype(np.float64)
    n = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True) / n
    y = (x - mean).astype(F32)
    var = (y.astype(np.float64) ** 2).sum(axis=-1, keepdims=True) / n
    sc = (F32(1.0) / np.sqrt((var + eps).astype(F32))).astype(F32)
    store(t, y * sc)


def _k_rms_norm(t):
    eps = _f(t, 0)
    x = values(t.src[0])
    n = x.shape[-1]
    mean = (x.astype(np.float64) ** 2).sum(axis=-1, keepdims=True) / n
    sc = (F32(1.0) / np.sqrt((mean + eps).astype(F32))).astype(F32)
    store(t, x * sc)


def _bcast_weights(w, shape_b):
    """Repeat a's matrices over b's dims 2/3 by integer division (ggml's broadcast)."""
    r3 = shape_b[0] // w.shape[0]
    r2 = shape_b[1] // w.shape[1]
    if r3 != 1:
        w = np.repeat(w, r3, axis=0)
    if r2 != 1:
        w = np.repeat(w, r2, axis=1)
    return w


def _k_mul_mat(t):
    a, b = t.src[0], t.src[1]
    if a.nb[0] != quants.PLAIN_DTYPES.get(a.type, np.dtype("u1")).itemsize and \
            not quants.is_quantized(a.type):
        raise BackendError(f"MUL_MAT '{t.name}': src0 '{a.name}' dim 0 is not contiguous")
    if b.nb[0] != quants.PLAIN_DTYPES.get(b.type, np.dtype("u1")).itemsize:
        raise BackendError(f"MUL_MAT '{t.name}': src1 '{b.name}' dim 0 is not contiguous")
    # f32 operands are read in place and the product written straight into dst: copies
    # of the weights would cost as much memory traffic as the product itself
    w = tensor_array(a) if a.type == "f32" else values(a)
    x = quants.vec_dot_round(a.type, tensor_array(b) if b.type == "f32" else values(b))
    w = _bcast_weights(w, x.shape)
    np.matmul(x, np.swapaxes(w, -1, -2), out=tensor_array(t))


def _k_mul_mat_id(t):
    as_, b, ids = t.src[0], t.src[1], t.src[2]
    w = values(as_)[0]                                   # (n_expert, rows, cols)
    x = quants.vec_dot_round(as_.type, values(b))[0]     # (n_tok, ne11, cols)
    idx = np.array(tensor_array(ids))[0, 0]              # (n_tok, n_used)
    n_tok, n_used = idx.shape
    ne11 = x.shape[1]
    out = np.zeros((n_tok, n_used, w.shape[1]), dtype=F32)
    for e in np.unique(idx):
        if not 0 <= e < w.shape[0]:
            raise BackendError(f"MUL_MAT_ID '{t.name}': expert id {e} out of range")
        tt, uu = np.nonzero(idx == e)
        out[tt, uu] = np.matmul(x[tt, uu % ne11], w[e].T)
    store(t, out[None])


def _k_scale(t):
    s, b = F32(_f(t, 0)), F32(_f(t, 1))
    x = values(t.src[0])
    store(t, x * s + b if b != 0 else x * s)


def _k_get_rows(t):
    a, b = t.src[0], t.src[1]
    raw = tensor_array(a)                       # (ne03, ne02, ne01, ne00 or bytes)
    rows = np.array(tensor_array(b))[0]         # (ne12, ne11, ne10)
    if rows.size and (rows.min() < 0 or rows.max() >= a.ne[1]):
        raise BackendError(f"GET_ROWS '{t.name}': row id out of range 0..{a.ne[1] - 1}")
    i3 = np.arange(rows.shape[0])[:, None, None]
    i2 = np.arange(rows.shape[1])[None, :, None]
    g = np.array(raw[i3, i2, rows])
    if t.type == "i32":
        tensor_array(t)[...] = g
    else:
        store(t, quants.to_f32(a.type, g) if a.type != "f32" else g)


def _k_set_rows(t):
    src, idx, dst = t.src[0], t.src[1], t.src[2]
    x = values(src)                             # (ne03, ne02, ne01, ne00)
    ids = np.array(tensor_array(idx))[0]        # (c2, c1, c0)
    if ids.size and (ids.min() < 0 or ids.max() >= dst.ne[1]):
        raise BackendError(f"SET_ROWS '{t.name}': row id out of range 0..{dst.ne[1] - 1}")
    conv = quants.from_f32(dst.type, x, cpu=True)
    i3 = np.arange(x.shape[0])[:, None, None]
    i2 = np.arange(x.shape[1])[None, :, None]
    i1 = np.arange(x.shape[2])[None, None, :]
    rows = ids[i3 % ids.shape[0], i2 % ids.shape[1], i1]
    out = tensor_array(t)
    out[i3, i2, rows] = conv


def _k_diag_mask_inf(t):
    n_past = t.op_params[0]
    x = values(t.src[0])
    i1 = np.arange(x.shape[2])[:, None]
    i0 = np.arange(x.shape[3])[None, :]
    x[..., i0 > n_past + i1] = -np.inf
    store(t, x)


def _alibi_slopes(n_head, max_bias):
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=F32)
    m0, m1, n_head_log2 = alibi_bases(n_head, max_bias)
    # powf per head, as ggml: numpy's float32 power ufunc is an ulp off for one in five
    return np.array([powf(m0, h + 1) if h < n_head_log2 else powf(m1, 2 * (h - n_head_log2) + 1)
                     for h in range(n_head)], dtype=F32)


def _mask_rows(mask, shape):
    """mask values for a tensor of numpy shape (ne3, ne2, ne1, ne0): row = a's row,
    dims 2/3 repeated by modulo."""
    m = values(mask)[:, :, : shape[2], :]
    return _tile_to(m, shape)


def _k_soft_max(t):
    scale, max_bias = F32(_f(t, 0)), _f(t, 1)
    x = values(t.src[0]) * scale
    srcs = t.src
    mask = srcs[1] if len(srcs) > 1 else None
    sinks = srcs[2] if len(srcs) > 2 else None
    if mask is not None:
        slopes = _alibi_slopes(x.shape[1], max_bias)[None, :, None, None]
        m = _mask_rows(mask, x.shape)
        with np.errstate(invalid="ignore"):
            x = x + (slopes * m if max_bias > 0 else m)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mx = np.max(x, axis=-1, keepdims=True)
        if sinks is not None:
            sk = values(sinks).reshape(-1)[: x.shape[1]][None, :, None, None]
            mx = np.maximum(mx, sk)
        e = np.exp(x - mx)
        s = e.astype(np.float64).sum(axis=-1, keepdims=True)
        if sinks is not None:
            s = s + np.exp(sk - mx).astype(np.float64)
        y = (e * (1.0 / s).astype(F32)).astype(F32)
    store(t, y)


def rope_cache(pos, n_dims, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
               beta_slow, n_ctx_orig, freq_factors=None, n_pairs=None, mode=0, sections=None):
    """cos/sin per (position, pair) as the CPU builds them: (n_pos, n_pairs) each.

    pos is (n_pos,) for the plain modes and (4, n_pos) for the multi-section ones
    (MROPE / IMROPE / VISION: t, h, w, e positions)."""
    n_pairs = n_dims // 2 if n_pairs is None else n_pairs
    theta_scale = rope_theta_scale(freq_base, n_dims)
    lo, hi = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    multi = bool(mode & ROPE_TYPES["MROPE"])
    pos = np.asarray(pos)
    if multi:
        base = [pos[k].astype(F32) for k in range(4)]
        sec = [int(x) for x in (sections or [0, 0, 0, 0])]
        sect_dims = sum(sec)
        if sect_dims <= 0:
            raise BackendError("ROPE: multi-section rope needs sections")
        sec_w = sec[0] + sec[1]
        sec_e = sec_w + sec[2]
        is_imrope = mode == ROPE_TYPES["IMROPE"]
        indep = mode == ROPE_TYPES["VISION"]
    else:
        base = [pos.astype(F32)]
    thetas = list(base)
    n_pos = base[0].shape[0]
    cos = np.empty((n_pos, n_pairs), dtype=F32)
    sin = np.empty((n_pos, n_pairs), dtype=F32)
    fs, ef = F32(freq_scale), F32(ext_factor)
    mscale = F32(attn_factor)
    if ext_factor != 0.0:
        mscale = F32(mscale * (F32(1.0) + F32(0.1) * np.log(F32(1.0) / fs)))
    for i in range(n_pairs):
        if freq_factors is None or i >= len(freq_factors):
            ff = F32(1.0)
        else:
            ff = F32(freq_factors[i])
        if multi:
            sector = i % sect_dims
            if indep:
                for k, start in enumerate((0, sec[0], sec_w, sec_e)):
                    if sector == start:
                        thetas[k] = base[k]
                        break
            if is_imrope:
                if sector % 3 == 1 and sector < 3 * sec[1]:
                    theta = thetas[1]
                elif sector % 3 == 2 and sector < 3 * sec[2]:
                    theta = thetas[2]
                elif sector % 3 == 0 and sector < 3 * sec[0]:
                    theta = thetas[0]
                else:
                    theta = thetas[3]
            else:
                if sec[0] <= sector < sec_w:
                    theta = thetas[1]
                elif sec_w <= sector < sec_w + sec[2]:
                    theta = thetas[2]
                elif sector >= sec_w + sec[2]:
                    theta = thetas[3]
                else:
                    theta = thetas[0]
        else:
            theta = thetas[0]
        th_extrap = (theta / ff).astype(F32)
        th_interp = (fs * th_extrap).astype(F32)
        th = th_interp
        if ext_factor != 0.0:
            y = (F32(i) - lo) / max(F32(0.001), F32(hi - lo))
            ramp = F32(1) - min(F32(1), max(F32(0), F32(y)))
            mix = F32(ramp * ef)
            th = (th_interp * (F32(1) - mix) + th_extrap * mix).astype(F32)
        cos[:, i] = np.cos(th) * mscale
        sin[:, i] = np.sin(th) * mscale
        thetas = [(x * theta_scale).astype(F32) for x in thetas]
    return cos, sin


def _k_rope(t):
    a, b = t.src[0], t.src[1]
    srcs = t.src
    c = srcs[2] if len(srcs) > 2 else None
    p = t.op_params
    n_dims, mode, n_ctx_orig = p[1], p[2], p[4]
    fb, fs, ef, af, bf, bs = (bits_f32(p[i]) for i in range(5, 11))
    sections = p[11:15]
    if mode not in ROPE_TYPES.values():
        raise BackendError(f"ROPE '{t.name}': mode {mode} is not supported")
    x = values(a)                                   # (ne3, ne2, ne1, ne0)
    ne0, ne2 = x.shape[3], x.shape[1]
    if n_dims > ne0 or n_dims % 2:
        raise BackendError(f"ROPE '{t.name}': n_dims {n_dims} must be even and <= ne0 {ne0}")
    posv = np.array(tensor_array(b)).reshape(-1)
    multi = bool(mode & ROPE_TYPES["MROPE"])
    vision = mode == ROPE_TYPES["VISION"]
    if vision and n_dims != ne0 // 2:
        raise BackendError(f"ROPE '{t.name}': vision rope needs n_dims == ne0/2")
    pos = posv[: 4 * ne2].reshape(4, ne2) if multi else posv[:ne2]
    ff = values(c).reshape(-1) if c is not None else None
    n_pairs = ne0 // 2 if vision else n_dims // 2
    cos, sin = rope_cache(pos, n_dims, fb, fs, ef, af, bf, bs, n_ctx_orig, ff, n_pairs, mode,
                          sections)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    out = x.copy()
    if mode == ROPE_TYPES["NORMAL"]:
        i0, i1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    elif vision:
        i0 = np.arange(n_pairs)
        i1 = i0 + n_dims
    else:
        i0 = np.arange(n_dims // 2)
        i1 = i0 + n_dims // 2
    x0, x1 = x[..., i0], x[..., i1]
    out[..., i0] = x0 * cos - x1 * sin
    out[..., i1] = x0 * sin + x1 * cos
    store(t, out)


def _k_clamp(t):
    mn, mx = F32(_f(t, 0)), F32(_f(t, 1))
    store(t, np.maximum(np.minimum(values(t.src[0]), mx), mn))


def _k_pad(t):
    p = t.op_params
    a = np.array(tensor_array(t.src[0]))
    out = tensor_array(t)
    lp = [p[0], p[2], p[4], p[6]]
    if p[8]:
        idx = [(np.arange(t.ne[i]) - lp[i]) % t.src[0].ne[i] for i in range(4)]
        out[...] = a[np.ix_(idx[3], idx[2], idx[1], idx[0])]
    else:
        out[...] = 0
        s = t.src[0].ne
        out[lp[3]:lp[3] + s[3], lp[2]:lp[2] + s[2], lp[1]:lp[1] + s[1], lp[0]:lp[0] + s[0]] = a


def _k_arange(t):
    start, step = F32(_f(t, 0)), F32(_f(t, 2))
    n = t.ne[0]
    store(t, (start + step * np.arange(n, dtype=F32)).reshape(1, 1, 1, n))


def _k_timestep_embedding(t):
    dim, max_period = t.op_params[0], t.op_params[1]
    ts = values(t.src[0]).reshape(-1)[: t.src[0].ne[0]]
    half = dim // 2
    j = np.arange(half, dtype=F32)
    freq = np.exp((-np.log(F32(max_period)) * j) / F32(half)).astype(F32)
    arg = (ts[:, None] * freq[None, :]).astype(F32)
    out = np.zeros((ts.shape[0], t.ne[0]), dtype=F32)
    out[:, :half] = np.cos(arg)
    out[:, half:2 * half] = np.sin(arg)
    store(t, out.reshape(_shape(t)))


def _k_argsort(t):
    x = values(t.src[0])
    order = t.op_params[0]
    idx = np.argsort(-x if order == 1 else x, axis=-1, kind="stable")
    tensor_array(t)[...] = idx.astype(np.int32)


def _k_top_k(t):
    x = values(t.src[0])
    k = t.ne[0]
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int32)
    if k > 1:     # the CPU swaps the first two on purpose ("order is not important")
        idx[..., [0, 1]] = idx[..., [1, 0]]
    tensor_array(t)[...] = idx


# --- unary / glu

_GELU_TABLE = None
_GELU_QUICK_TABLE = None


def _gelu_f32(x):
    x = x.astype(F32)
    c = F32(0.79788456080286535587989211986876)
    return (F32(0.5) * x * (F32(1.0) + np.tanh(c * x * (F32(1.0) + F32(0.044715) * x * x)))).astype(F32)


def _gelu_quick_f32(x):
    x = x.astype(F32)
    with np.errstate(over="ignore"):
        return (x * (F32(1.0) / (F32(1.0) + np.exp(F32(-1.702) * x)))).astype(F32)


def _tables():
    global _GELU_TABLE, _GELU_QUICK_TABLE
    if _GELU_TABLE is None:
        allh = quants.f16_to_f32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
        with np.errstate(all="ignore"):
            _GELU_TABLE = quants.round_f16(_gelu_f32(allh))
            _GELU_QUICK_TABLE = quants.round_f16(_gelu_quick_f32(allh))
    return _GELU_TABLE, _GELU_QUICK_TABLE


def _f16_index(x):
    return quants.f32_to_f16(x).view(np.uint16)


def gelu(x, is_f16=False):
    """ggml's GELU on float32 values (table on the f16-rounded input)."""
    table, _ = _tables()
    y = table[_f16_index(x)]
    if not is_f16:
        y = np.where(x <= -10.0, F32(0), np.where(x >= 10.0, x, y))
    return y.astype(F32)


def gelu_quick(x):
    """ggml's GELU_QUICK on float32 values (table on the f16-rounded input)."""
    _, table = _tables()
    return table[_f16_index(x)]


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu_erf(x):
    """ggml's GELU_ERF on float32 values: 0.5 x (1 + erf(x / sqrt(2))), in float32."""
    x = x.astype(F32)
    e = _erf(x.astype(np.float64) * float(F32(0.70710678118654752440084436210484)))
    e = np.asarray(e, dtype=np.float64).astype(F32)
    return (F32(0.5) * x * (F32(1.0) + e)).astype(F32)


def _silu(x):
    with np.errstate(over="ignore"):
        return (x / (F32(1.0) + np.exp(-x))).astype(F32)


def _unary(op, x, is_f16):
    with np.errstate(all="ignore"):
        if op == "ABS":
            return np.abs(x)
        if op == "SGN":
            return np.sign(x)
        if op == "NEG":
            return -x
        if op == "STEP":
            return (x > 0).astype(F32)
        if op == "TANH":
            return np.tanh(x)
        if op == "ELU":
            return np.where(x > 0, x, np.expm1(x))
        if op == "RELU":
            return np.where(x > 0, x, F32(0))
        if op == "SIGMOID":
            return F32(1.0) / (F32(1.0) + np.exp(-x))
        if op == "GELU":
            return gelu(x, is_f16)
        if op == "GELU_QUICK":
            return gelu_quick(x)
        if op == "SILU":
            return _silu(x)
        if op == "HARDSWISH":
            return x * np.minimum(F32(1.0), np.maximum(F32(0.0), (x + F32(3.0)) / F32(6.0)))
        if op == "HARDSIGMOID":
            return np.minimum(F32(1.0), np.maximum(F32(0.0), (x + F32(3.0)) / F32(6.0)))
        if op == "EXP":
            return np.exp(x)
        if op == "EXPM1":
            return np.exp(x) - F32(1.0)
        if op == "SOFTPLUS":
            return np.where(x > 20.0, x, np.log(F32(1.0) + np.exp(x)))
        if op == "GELU_ERF":
            return gelu_erf(x)
        if op == "FLOOR":
            return np.floor(x)
        if op == "CEIL":
            return np.ceil(x)
        if op == "ROUND":
            return (np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)).astype(F32)
        if op == "TRUNC":
            return np.trunc(x)
    raise BackendError(f"unary op {op} is not supported by the numpy CPU backend")


def _xielu(t, x):
    an, ap, beta, eps = (F32(_f(t, i)) for i in range(1, 5))
    with np.errstate(all="ignore"):
        pos = ap * x * x + beta * x
        neg = (np.expm1(np.minimum(x, eps)) - x) * an + beta * x
    return np.where(x > 0, pos, neg).astype(F32)


def _k_unary(t):
    opi = t.op_params[0]
    op = UNARY_OPS[opi] if 0 <= opi < len(UNARY_OPS) else str(opi)
    x = values(t.src[0])
    if op == "XIELU":
        store(t, _xielu(t, x))
        return
    store(t, np.asarray(_unary(op, x, t.src[0].type == "f16"), dtype=F32))


def _k_glu(t):
    opi, swapped = t.op_params[0], t.op_params[1]
    op = GLU_OPS[opi] if 0 <= opi < len(GLU_OPS) else str(opi)
    srcs = t.src
    a = values(srcs[0])
    if len(srcs) > 1 and srcs[1] is not None:
        x, g = a, values(srcs[1])
    else:
        nc = t.ne[0]
        x, g = a[..., :nc], a[..., nc:2 * nc]
        if swapped:
            x, g = g, x
    is_f16 = srcs[0].type == "f16"
    with np.errstate(all="ignore"):
        if op == "REGLU":
            y = np.where(x > 0, x * g, F32(0))
        elif op == "GEGLU":
            if is_f16:
                y = gelu(x, True) * g
            else:
                y = np.where(x <= -10.0, F32(0), np.where(x >= 10.0, x * g, gelu(x, True) * g))
        elif op == "SWIGLU":
            y = _silu(x) * g
        elif op == "GEGLU_ERF":
            y = gelu_erf(x) * g
        elif op == "GEGLU_QUICK":
            y = gelu_quick(x) * g
        elif op == "SWIGLU_OAI":
            alpha, limit = F32(_f(t, 2)), F32(_f(t, 3))
            xx = np.minimum(x, limit)
            yy = np.clip(g, -limit, limit)
            y = (xx / (F32(1.0) + np.exp(alpha * (-xx)))) * (yy + F32(1.0))
        else:
            raise BackendError(f"GLU op {op} is not supported by the numpy CPU backend")
    store(t, np.asarray(y, dtype=F32))


# --- flash attention

FA_TILE = 64        # ggml's tiled path: from this many queries on, in blocks of this many positions


def _fa_tiled(q, k, v):
    """Does ggml's CPU (built for this CPU) take its tiled path? 64 queries or more, K and V
    both f32 or both f16, DV a whole number of its float vectors."""
    epr = {"avx512": 16, "avx2": 8}.get(isa(), 1)
    return (q.ne[1] >= FA_TILE and k.type == v.type and k.type in ("f32", "f16")
            and v.ne[0] % epr == 0)


def _fa_rows(S, V, mv, f16_acc):
    """ggml's one-row path: the online softmax position by position; (acc, M, sum)."""
    s3, H, N, n_kv = S.shape
    M = np.full((s3, H, N), -np.inf, dtype=F32)
    Ssum = np.zeros((s3, H, N), dtype=F32)
    acc = np.zeros((s3, H, N, V.shape[-1]), dtype=F32)
    for ic in range(n_kv):
        valid = mv[..., ic] != -np.inf
        s = S[..., ic]
        new = valid & (s > M)
        ms = np.where(new, np.exp(M - s), F32(1)).astype(F32)
        vs = np.where(new, F32(1), np.exp(s - M)).astype(F32)
        M = np.where(new, s, M)
        scaled = acc * ms[..., None]
        if f16_acc:
            scaled = quants.round_f16(scaled)
        acc = np.where(new[..., None], scaled, acc)
        upd = acc + V[:, :, ic, :][:, :, None, :] * vs[..., None]
        if f16_acc:
            upd = quants.round_f16(upd)
        acc = np.where(valid[..., None], upd, acc)
        Ssum = np.where(valid, Ssum * ms + vs, Ssum).astype(F32)
    return acc, M, Ssum


def _fa_tiled_blocks(S, V, pad):
    """ggml's tiled path: the online softmax FA_TILE positions at a time, V summed in
    float32, each block's weights summed in double. A short last block is padded with
    logits `pad` (-softcap without a mask, else -inf) and the V rows ggml's buffer still
    holds from the block before (zeros in the first)."""
    s3, H, N, n_kv = S.shape
    DV = V.shape[-1]
    M = np.full((s3, H, N), -np.inf, dtype=F32)
    Ssum = np.zeros((s3, H, N), dtype=F32)
    acc = np.zeros((s3, H, N, DV), dtype=F32)
    vbuf = np.zeros((s3, H, FA_TILE, DV), dtype=F32)
    for c0 in range(0, n_kv, FA_TILE):
        nb = min(FA_TILE, n_kv - c0)
        s = np.concatenate([S[..., c0:c0 + nb], np.full((s3, H, N, FA_TILE - nb), pad, F32)], axis=-1)
        vbuf[:, :, :nb] = V[:, :, c0:c0 + nb]
        mx = s.max(axis=-1)
        valid = mx != -np.inf
        Mnew = np.maximum(M, mx)
        grow = valid & (Mnew > M)
        ms = np.where(grow, np.exp(M - Mnew), F32(1)).astype(F32)
        acc = np.where(grow[..., None], acc * ms[..., None], acc)
        Ssum = np.where(grow, Ssum * ms, Ssum)
        M = np.where(valid, Mnew, M)
        p = np.where(valid[..., None], np.exp(s - M[..., None]), F32(0)).astype(F32)
        Ssum = np.where(valid, (Ssum.astype(np.float64) + p.sum(axis=-1, dtype=np.float64)).astype(F32), Ssum)
        acc = (acc + np.matmul(p, vbuf)).astype(F32)
    return acc, M, Ssum


def _k_flash_attn_ext(t):
    srcs = t.src
    q, k, v = srcs[0], srcs[1], srcs[2]
    mask = srcs[3] if len(srcs) > 3 else None
    sinks = srcs[4] if len(srcs) > 4 else None
    scale, max_bias, softcap = (F32(_f(t, i)) for i in range(3))
    if softcap != 0:
        scale = F32(scale / softcap)
    tiled = _fa_tiled(q, k, v)
    Q = values(q) if tiled else quants.vec_dot_round(k.type, values(q))    # (s, H, N, DK)
    K = values(k)                                        # (s_k, Hk, n_kv, DK)
    V = values(v)                                        # (s_v, Hv, n_kv, DV)
    s3, H, N, _ = Q.shape
    K = _bcast_weights(K, Q.shape)
    V = _bcast_weights(V, Q.shape)
    n_kv = K.shape[2]
    S = np.matmul(Q, np.swapaxes(K, -1, -2)) * scale    # (s, H, N, n_kv)
    if softcap != 0:
        S = (softcap * np.tanh(S)).astype(F32)
    if mask is not None:
        slopes = _alibi_slopes(H, float(max_bias))[None, :, None, None]
        m = values(mask)[:, :, :N, :n_kv]
        m = _tile_to(m, (s3, H, N, n_kv))
        with np.errstate(invalid="ignore"):
            mv = (slopes * m).astype(F32) if max_bias > 0 else m
    else:
        mv = np.zeros_like(S)
    S = (S + mv).astype(F32)
    with np.errstate(all="ignore"):
        if tiled:
            acc, M, Ssum = _fa_tiled_blocks(S, V, -softcap if softcap != 0 and mask is None else -np.inf)
        else:
            acc, M, Ssum = _fa_rows(S, V, mv, v.type == "f16")
        if sinks is not None:
            sk = values(sinks).reshape(-1)[:H][None, :, None]
            new = sk > M
            ms = np.where(new, np.exp(M - sk), F32(1)).astype(F32)
            vs = np.where(new, F32(1), np.exp(sk - M)).astype(F32)
            acc = np.where(new[..., None], acc * ms[..., None], acc)
            M = np.where(new, sk, M)
            Ssum = (Ssum * ms + vs).astype(F32)
        inv = np.where(Ssum == 0, F32(0), F32(1) / Ssum).astype(F32)
    out = (acc * inv[..., None]).astype(F32)            # (s, H, N, DV)
    store(t, np.swapaxes(out, 1, 2))                    # dst (s, N, H, DV)


NUMPY_KERNELS = {
    "DUP": _k_copy, "CONT": _k_copy, "CPY": _k_copy,
    "ADD": _k_binary, "SUB": _k_binary, "MUL": _k_binary, "DIV": _k_binary,
    "ACC": _k_acc, "SQR": _k_sqr, "SQRT": _k_sqrt, "SUM": _k_sum, "SUM_ROWS": _k_sum_rows,
    "MEAN": _k_mean, "REPEAT": _k_repeat, "CONCAT": _k_concat, "NORM": _k_norm,
    "RMS_NORM": _k_rms_norm, "MUL_MAT": _k_mul_mat, "MUL_MAT_ID": _k_mul_mat_id,
    "SCALE": _k_scale, "GET_ROWS": _k_get_rows, "SET_ROWS": _k_set_rows,
    "DIAG_MASK_INF": _k_diag_mask_inf, "SOFT_MAX": _k_soft_max, "ROPE": _k_rope,
    "CLAMP": _k_clamp, "PAD": _k_pad, "ARANGE": _k_arange,
    "TIMESTEP_EMBEDDING": _k_timestep_embedding, "ARGSORT": _k_argsort, "TOP_K": _k_top_k,
    "UNARY": _k_unary, "GLU": _k_glu, "FLASH_ATTN_EXT": _k_flash_attn_ext,
}
