"""Element types of ggml in numpy: f16/bf16 rounding and the q8_0 / q4_0 block formats.

Layouts follow ggml-common.h: a q8_0 block is an f16 scale then 32 int8 values
(34 bytes); a q4_0 block is an f16 scale then 16 bytes holding 32 4-bit values
(low nibbles are elements 0..15, high nibbles 16..31), value = (q - 8) * d.

Two q8_0 quantisers exist in ggml and both are here:
  * the reference one (``quantize_row_q8_0_ref``, used by ``ggml_quantize_chunk``):
    scale factor 1/d, rounding halves away from zero;
  * the CPU backend's one (x86 AVX2 ``quantize_row_q8_0``, used by CPY / SET_ROWS
    into q8_0 and for the activations of a q8_0 MUL_MAT): 127/max, halves to even.
"""

import numpy as np

QK8_0 = 32
QK4_0 = 32

BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK4_0 // 2,))])
assert BLOCK_Q8_0.itemsize == 34 and BLOCK_Q4_0.itemsize == 18

# numpy dtypes of the plain (non-block) types
PLAIN_DTYPES = {
    "f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"), "bf16": np.dtype("<u2"),
}

BLOCKS = {"q8_0": (QK8_0, BLOCK_Q8_0), "q4_0": (QK4_0, BLOCK_Q4_0)}


def is_quantized(type_name):
    return type_name in BLOCKS


def row_bytes(type_name, ne0):
    if type_name in BLOCKS:
        qk, dt = BLOCKS[type_name]
        return ne0 // qk * dt.itemsize
    return ne0 * PLAIN_DTYPES[type_name].itemsize


# ---------------------------------------------------------------------------
# f16 / bf16

def round_f16(x):
    """float32 values rounded to the nearest f16 (ties to even), as float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def f32_to_bf16_bits(x):
    """ggml_compute_fp32_to_bf16: round to nearest even on the upper 16 bits, NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    r = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    return r


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


# ---------------------------------------------------------------------------
# q8_0

def _blocks(x, qk):
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % qk:
        raise ValueError(f"row of {x.shape[-1]} values is not a whole number of {qk}-blocks")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // qk, qk))


def quantize_q8_0(x, cpu=False):
    """Rows of float32 (last axis, a multiple of 32) -> uint8 bytes (last axis = row bytes).

    cpu=False: ggml's reference quantiser (ggml_quantize_chunk); cpu=True: the CPU
    backend's own (AVX2) quantiser."""
    b = _blocks(x, QK8_0)
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
    out["qs"] = np.clip(q, -128, 127).astype(np.int8)
    return out.view(np.uint8).reshape(b.shape[:-2] + (-1,))


def dequantize_q8_0(raw, ne0=None):
    """uint8 bytes (last axis = row bytes) -> float32 rows."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nblk = raw.shape[-1] // BLOCK_Q8_0.itemsize
    blk = raw.reshape(raw.shape[:-1] + (nblk * BLOCK_Q8_0.itemsize,)).view(BLOCK_Q8_0)
    d = blk["d"].astype(np.float32)
    q = blk["qs"].astype(np.float32)
    out = q * d[..., None]
    return out.reshape(raw.shape[:-1] + (nblk * QK8_0,))


# ---------------------------------------------------------------------------
# q4_0

def quantize_q4_0(x, cpu=False):
    """Rows of float32 -> q4_0 bytes (quantize_row_q4_0_ref; the CPU uses the same)."""
    b = _blocks(x, QK4_0)
    idx = np.argmax(np.abs(b), axis=-1)            # first of the largest magnitudes
    mx = np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv[..., None] + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v).astype(np.int32).astype(np.int8)).astype(np.uint8)
    lo = q[..., : QK4_0 // 2]
    hi = q[..., QK4_0 // 2:]
    out = np.empty(b.shape[:-1], dtype=BLOCK_Q4_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = (lo & 0x0F) | ((hi & 0x0F) << 4)
    return out.view(np.uint8).reshape(b.shape[:-2] + (-1,))


def dequantize_q4_0(raw, ne0=None):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nblk = raw.shape[-1] // BLOCK_Q4_0.itemsize
    blk = raw.view(BLOCK_Q4_0)
    d = blk["d"].astype(np.float32)[..., None]
    qs = blk["qs"]
    lo = (qs & 0x0F).astype(np.float32) - 8
    hi = (qs >> 4).astype(np.float32) - 8
    out = np.concatenate([lo * d, hi * d], axis=-1)
    return out.reshape(raw.shape[:-1] + (nblk * QK4_0,))


_QUANT = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
_DEQUANT = {"q8_0": dequantize_q8_0, "q4_0": dequantize_q4_0}


def quantize(type_name, x, cpu=True):
    """float32 rows -> bytes of `type_name` rows."""
    try:
        return _QUANT[type_name](x, cpu=cpu)
    except KeyError:
        raise NotImplementedError(f"quantisation to {type_name} is not implemented") from None


def dequantize(type_name, raw):
    """bytes of `type_name` rows (last axis) -> float32 rows."""
    try:
        return _DEQUANT[type_name](raw)
    except KeyError:
        raise NotImplementedError(f"dequantisation of {type_name} is not implemented") from None


def to_f32(type_name, arr):
    """Values of a tensor as stored (plain numpy array, or row bytes for block types) -> float32."""
    if type_name in BLOCKS:
        return dequantize(type_name, arr)
    if type_name == "bf16":
        return bf16_bits_to_f32(arr)
    return np.asarray(arr).astype(np.float32)


def from_f32(type_name, x, cpu=True):
    """float32 values -> stored form of `type_name` (numpy array of its dtype, or row bytes)."""
    if type_name in BLOCKS:
        return quantize(type_name, x, cpu=cpu)
    if type_name == "bf16":
        return f32_to_bf16_bits(x)
    return np.asarray(x, dtype=np.float32).astype(PLAIN_DTYPES[type_name])


def vec_dot_round(type_name, x):
    """What the CPU's MUL_MAT does to src1 for weights of `type_name`: convert to the
    weights' vec_dot type and back to float32."""
    if type_name in ("f16",):
        return round_f16(x)
    if type_name == "bf16":
        return round_bf16(x)
    if type_name in BLOCKS:          # q8_0 and q4_0 both dot with q8_0 activations
        return dequantize_q8_0(quantize_q8_0(x, cpu=True))
    return np.asarray(x, dtype=np.float32)
