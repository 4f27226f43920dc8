"""numpy reference versions of the element conversions in ggml_py._quants.

These were the package's implementation before the Cython kernels; they stay
here only as the references that tests/test_quants.py and bench/bench_quants.py
compare the kernels with. Two deliberate differences from the kernels, both
where the kernels follow ggml's x86 CPU path (F16C) and numpy does not:

* signalling NaNs: numpy's f16 <-> f32 casts keep a NaN signalling, vcvtph2ps /
  vcvtps2ph make it quiet (tests compare those cases with explicit values);
* quantize_q4_0 of an all-zero block whose first element is -0.0: numpy's argmax
  picks the -0.0 (d = +0), ggml keeps its initial +0 (d = -0); fixed here;
* degenerate blocks, whose scale's inverse overflows (largest magnitude below
  about 3.7e-37, all finite): x * inf and 0 * inf meet x86's float -> int
  conversion, which gives INT32_MIN. ggml's CPU q8_0 quantiser saturates that to
  -128 and its reference one truncates it to int8 (0); the old numpy code clipped
  inf to +-127 instead. Fixed here as ggml does it (_x86_i32 below).
"""

import numpy as np

# (the references run with numpy's floating-point warnings off: overflow to inf
# and NaN scales are part of what the tests feed them)

QK = 32
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])


@np.errstate(all="ignore")
def f16_to_f32(h):
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32)


@np.errstate(all="ignore")
def f32_to_f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


@np.errstate(all="ignore")
def round_f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


@np.errstate(all="ignore")
def f32_to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)


@np.errstate(all="ignore")
def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


@np.errstate(all="ignore")
def round_bf16(x):
    return bf16_to_f32(f32_to_bf16(x))


def _blocks(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.shape[-1] % QK == 0
    return x.reshape(x.shape[:-1] + (x.shape[-1] // QK, QK))


def _x86_i32(r):
    """float64 integers -> int32 as x86's cvt: NaN, inf and what does not fit -> INT32_MIN."""
    ok = np.isfinite(r) & (r >= -2.0 ** 31) & (r < 2.0 ** 31)
    return np.where(ok, np.where(ok, r, 0).astype(np.int64), -2 ** 31)


@np.errstate(all="ignore")
def quantize_q8_0(x, cpu=False):
    b = _blocks(x)
    amax = np.max(np.abs(b), axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        if cpu:
            idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
            q = np.rint(b * idv[..., None])
        else:
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            v = b * idv[..., None]
            q = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)   # roundf
    out = np.empty(b.shape[:-1], dtype=BLOCK_Q8_0)
    out["d"] = d.astype(np.float16)
    qi = _x86_i32(q)
    out["qs"] = np.clip(qi, -128, 127).astype(np.int8) if cpu else qi.astype(np.int8)
    return out.view(np.uint8).reshape(b.shape[:-2] + (-1,))


@np.errstate(all="ignore")
def dequantize_q8_0(raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nblk = raw.shape[-1] // BLOCK_Q8_0.itemsize
    blk = raw.view(BLOCK_Q8_0)
    out = blk["qs"].astype(np.float32) * blk["d"].astype(np.float32)[..., None]
    return out.reshape(raw.shape[:-1] + (nblk * QK,))


@np.errstate(all="ignore")
def round_q8_0(x):
    return dequantize_q8_0(quantize_q8_0(x, cpu=True))


@np.errstate(all="ignore")
def quantize_q4_0(x):
    b = _blocks(x)
    idx = np.argmax(np.abs(b), axis=-1)            # first of the largest magnitudes
    mx = np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]
    mx = np.where(mx == 0, np.float32(0), mx)      # ggml keeps +0 for an all-zero block
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv[..., None] + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, _x86_i32(np.trunc(v).astype(np.float64)).astype(np.int8)).astype(np.uint8)
    out = np.empty(b.shape[:-1], dtype=BLOCK_Q4_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = (q[..., :QK // 2] & 0x0F) | ((q[..., QK // 2:] & 0x0F) << 4)
    return out.view(np.uint8).reshape(b.shape[:-2] + (-1,))


@np.errstate(all="ignore")
def dequantize_q4_0(raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nblk = raw.shape[-1] // BLOCK_Q4_0.itemsize
    blk = raw.view(BLOCK_Q4_0)
    d = blk["d"].astype(np.float32)[..., None]
    qs = blk["qs"]
    lo = (qs & 0x0F).astype(np.float32) - 8
    hi = (qs >> 4).astype(np.float32) - 8
    out = np.concatenate([lo * d, hi * d], axis=-1)
    return out.reshape(raw.shape[:-1] + (nblk * QK,))
