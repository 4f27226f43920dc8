"""Element types of ggml in numpy: f16/bf16 rounding and every block format the CPU
executor computes with (q4_0 ... q8_0, q2_K ... q6_K, q8_K, iq4_nl, iq4_xs, mxfp4).

Layouts follow ggml-common.h; a row of a block type is its blocks' bytes (rows are the
last axis of the arrays here). A q8_0 block is an f16 scale then 32 int8 values (34
bytes); a q4_0 block is an f16 scale then 16 bytes holding 32 4-bit values (low nibbles
are elements 0..15, high nibbles 16..31), value = (q - 8) * d.

Every block type has two quantisers in ggml and both are here (``quantize``):
  * the reference one (``quantize_row_*_ref``, what ``ggml_quantize_chunk`` runs without
    an importance matrix): ``cpu=False``;
  * the CPU backend's (its type traits' ``from_float``: CPY / SET_ROWS into the type and
    the activations of a MUL_MAT): ``cpu=True``. For q8_0 it uses 127/max and rounds
    halves to even where the reference one rounds x/d halves away from zero; for iq4_nl
    it is a one-pass quantiser, for most others the same as the reference.
Dequantisation is ggml's to_float, bit for bit.

The conversions themselves are the C kernels of ggml_py._quants (the CPU executor's
own, GIL released); this module names them and dispatches on ggml type names. f16
conversions follow ggml's x86 CPU path (F16C): exact widening, round to nearest
even, NaNs come out quiet.
"""

import numpy as np

from ggml_py import _quants
from ggml_py._core import TYPE_IDS, TYPE_NAMES, TYPE_LAYOUTS
from ggml_py._core import ggml_type
from ggml_py.errors import NotSupportedError, UnknownNameError
from ggml_py._quants import (f16_to_f32, f32_to_f16, round_f16, round_bf16, quantize_q8_0,
                             dequantize_q8_0, round_q8_0, quantize_q4_0, dequantize_q4_0)

QK8_0 = 32
QK4_0 = 32

BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK4_0 // 2,))])
assert BLOCK_Q8_0.itemsize == 34 and BLOCK_Q4_0.itemsize == 18

# numpy dtypes of the plain (non-block) types
PLAIN_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"), "bf16": np.dtype("<u2"),
}


def _block_types():
    """(elements, numpy dtype of one block) of each block type with conversions: the
    structured dtypes above for q8_0 / q4_0, raw bytes for the others."""
    named = {"q8_0": BLOCK_Q8_0, "q4_0": BLOCK_Q4_0}
    out = {}
    for i in _quants.block_types():
        name = TYPE_NAMES[i]
        assert name is not None
        qk, size = TYPE_LAYOUTS[name]
        out[name] = (qk, named.get(name, np.dtype((np.void, size))))
    return out


BLOCKS = _block_types()


def is_quantized(type_name):
    """Is `type_name` ('q8_0', 'q4_0', ...) stored in quantized blocks?"""
    type_name = _type(type_name)
    return type_name in BLOCKS


def row_bytes(type_name, ne0):
    """Bytes of a row of ne0 elements of `type_name` (whole blocks for quantized types)."""
    type_name = _type(type_name)
    if type_name in BLOCKS:
        qk, dt = BLOCKS[type_name]
        return ne0 // qk * dt.itemsize
    return ne0 * _plain_dtype(type_name).itemsize


def _type(spec):
    """A type as ggml names it: numpy dtypes and their names are accepted too
    (_core.ggml_type); anything else is left for the caller's own error."""
    if isinstance(spec, str) and spec in TYPE_IDS:
        return spec
    try:
        return ggml_type(spec)
    except UnknownNameError:
        return spec


def _plain_dtype(type_name):
    if not isinstance(type_name, str) or type_name not in PLAIN_DTYPES:
        raise UnknownNameError(f"no numpy form of ggml type {type_name!r}; known: "
                               f"{', '.join([*PLAIN_DTYPES, *BLOCKS])}")
    return PLAIN_DTYPES[type_name]


# ---------------------------------------------------------------------------
# f16 / bf16 (round_f16, round_bf16, f16_to_f32, f32_to_f16 come from _quants)

def f32_to_bf16_bits(x, out=None):
    """ggml_compute_fp32_to_bf16: round to nearest even on the upper 16 bits, NaN kept quiet."""
    return _quants.f32_to_bf16(x, out=out)


def bf16_bits_to_f32(b, out=None):
    """bfloat16 values given as their uint16 bits, widened to float32."""
    return _quants.bf16_to_f32(b, out=out)


# ---------------------------------------------------------------------------
# block types: quantize_q8_0(x, cpu=False), dequantize_q8_0(raw), round_q8_0(x),
# quantize_q4_0(x), dequantize_q4_0(raw) come from _quants; rows are the last axis

def quantize(type_name, x, cpu=True, out=None):
    """float32 rows -> bytes of `type_name` rows: ggml-cpu's quantiser (cpu=True) or
    ggml's reference one (cpu=False, as ggml_quantize_chunk)."""
    type_name = _type(type_name)
    return _quants.quantize_blocks(_block_type(type_name, "quantiser"), x, cpu=cpu, out=out)


def dequantize(type_name, raw, out=None):
    """bytes of `type_name` rows (last axis) -> float32 rows."""
    type_name = _type(type_name)
    return _quants.dequantize_blocks(_block_type(type_name, "dequantiser"), raw, out=out)


def vec_dot_type(type_name):
    """The type ggml-cpu converts src1 of a MUL_MAT to for weights of `type_name`."""
    type_name = _type(type_name)
    if type_name in ("f32", "f16", "bf16"):
        return type_name
    return TYPE_NAMES[_quants.vec_dot_type(_block_type(type_name, "vec_dot type"))]


def _block_type(type_name, what):
    if isinstance(type_name, str) and type_name in BLOCKS:
        return TYPE_IDS[type_name]
    cls = NotSupportedError if isinstance(type_name, str) and type_name in TYPE_NAMES \
        else UnknownNameError
    raise cls(f"no {what} for type {type_name!r}; ggml_py has them for {', '.join(BLOCKS)}")


def to_f32(type_name, arr, out=None):
    """Values of a tensor as stored (plain numpy array, or row bytes for block types) -> float32:
    a new array, or `out` (C-contiguous float32 of the result's shape)."""
    type_name = _type(type_name)
    if type_name in BLOCKS:
        return dequantize(type_name, arr, out=out)
    if type_name == "f16":
        return f16_to_f32(arr, out=out)
    if type_name == "bf16":
        return _quants.bf16_to_f32(arr, out=out)
    if out is not None:
        np.copyto(out, arr, casting="unsafe")
        return out
    return np.asarray(arr).astype(np.float32)


def from_f32(type_name, x, cpu=True, out=None):
    """float32 values -> stored form of `type_name` (numpy array of its dtype, or row bytes);
    `out`, if given, must be C-contiguous of that dtype and shape."""
    type_name = _type(type_name)
    if type_name in BLOCKS:
        return quantize(type_name, x, cpu=cpu, out=out)
    if type_name == "f16":
        return f32_to_f16(x, out=out)
    if type_name == "bf16":
        return _quants.f32_to_bf16(x, out=out)
    y = np.asarray(x, dtype=np.float32).astype(_plain_dtype(type_name))
    if out is not None:
        out[...] = y
        return out
    return y


def vec_dot_round(type_name, x, out=None):
    """What the CPU's MUL_MAT does to src1 for weights of `type_name`: convert to the
    weights' vec_dot type and back to float32."""
    type_name = _type(type_name)
    if type_name == "f16":
        return round_f16(x, out=out)
    if type_name == "bf16":
        return round_bf16(x, out=out)
    if type_name in BLOCKS:
        v = vec_dot_type(type_name)
        if v == "q8_0":
            return round_q8_0(x, out=out)
        return dequantize(v, quantize(v, x, cpu=True), out=out)
    if out is not None:
        out[...] = x
        return out
    return np.asarray(x, dtype=np.float32)
