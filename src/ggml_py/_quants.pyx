"""Element conversions of ggml's CPU backend: f16, bf16, q8_0 and q4_0, for numpy arrays.

The row kernels are the CPU executor's C conversions
(src/ggml_py/backends/cpu/kernels/quants.c, reached through ggml_py.backends.cpu._executor
so the process holds one copy and one instruction-set choice); these wrappers take numpy
arrays, release the GIL for the loops and return float32 (or the stored form). The numerics
are those of ggml 0.10.1's CPU backend on x86 with F16C:

* f16 -> f32 is exact (subnormals, infinities); a NaN keeps its payload and
  comes out quiet, as vcvtph2ps does;
* f32 -> f16 rounds to nearest, ties to even (vcvtps2ph with imm 0): overflow
  gives inf, a NaN keeps the top 10 bits of its payload and comes out quiet;
* bf16 -> f32 is a shift; f32 -> bf16 is ggml_compute_fp32_to_bf16 (nearest
  even on the upper half, a NaN forced quiet by setting bit 6);
* q8_0 has two quantisers: the reference one (scale 1/d, halves away from
  zero; ggml_quantize_chunk) and the CPU backend's (127/max, halves to even;
  CPY / SET_ROWS into q8_0 and src1 of a quantised MUL_MAT);
* q4_0 uses the reference quantiser (the CPU has no other).

Block layouts (ggml-common.h): q8_0 = f16 scale + 32 int8; q4_0 = f16 scale + 16
bytes of nibbles (low nibbles are elements 0..15, high nibbles 16..31), value =
(q - 8) * d. Degenerate blocks (a scale whose inverse overflows, or inf / NaN inside)
follow ggml's x86 code (see quants.c).
"""

from libc.stdint cimport uint8_t, uint16_t, int64_t

from ggml_py.backends.cpu._executor cimport (conversions, get_conversions, u16_to_f32_row,
                                             f32_to_u16_row, f32_to_f32_row, f32_to_blocks,
                                             blocks_to_f32, gp_type_traits, gp_from_float_fn,
                                             gp_vec_dot_fn)
from ggml_py._ggml cimport ggml_py_type_infos, GGML_PY_N_TYPE_INFOS, GGML_PY_TYPE_COUNT

import sys

import numpy as np

from ggml_py.errors import ArgumentTypeError, NotSupportedError, OutOfRangeError

if sys.byteorder != "little":      # the uint16/float32 bit views below assume it
    raise ImportError("ggml_py._quants needs a little-endian host")

QK8_0 = 32
QK4_0 = 32
Q8_0_BYTES = 34
Q4_0_BYTES = 18

cdef Py_ssize_t QK = 32
cdef Py_ssize_t B8 = 34
cdef Py_ssize_t B4 = 18

cdef const conversions * C = get_conversions()


# ---------------------------------------------------------------------------
# numpy wrappers

cdef object _F32 = np.dtype(np.float32)
cdef object _F16 = np.dtype("<f2")
cdef object _U16 = np.dtype("<u2")
cdef object _U8 = np.dtype(np.uint8)


cdef object _f32_in(x):
    # (np.asarray with order="C" keeps a 0-d input 0-d, ascontiguousarray would not)
    return np.asarray(x, dtype=np.float32, order="C")


cdef object _u16_in(x, str what):
    """An array of 16-bit elements (float16 / uint16 / int16 bits), contiguous, as uint16."""
    a = np.asarray(x)
    if a.dtype.itemsize != 2 or a.dtype.kind not in "uif":
        if a.dtype.kind in "ui" and a.dtype.itemsize != 2 and not isinstance(x, np.ndarray):
            a = a.astype(np.uint16)         # a list of bit patterns
        else:
            raise TypeError(f"{what}: expected 16-bit elements, got {a.dtype}")
    return np.asarray(a, order="C").view(np.uint16)


cdef object _u8_in(raw, str what):
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    a = np.asarray(raw)
    if a.dtype.itemsize != 1 or a.dtype.kind not in "uiV":
        if not isinstance(raw, np.ndarray) and a.dtype.kind in "ui":
            a = a.astype(np.uint8)
        else:
            raise TypeError(f"{what}: expected bytes (uint8), got {a.dtype}")
    a = np.asarray(a, order="C")
    return a.view(np.uint8) if a.dtype != _U8 else a


cdef object _out(out, tuple shape, dt, str what, alt=None):
    """A new array, or `out` checked: shape, dtype (or `alt`), C-contiguous, writeable."""
    if out is None:
        return np.empty(shape, dtype=dt)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a numpy array")
    if out.dtype != dt and (alt is None or out.dtype != alt):
        raise TypeError(f"{what}: out has dtype {out.dtype}, expected {np.dtype(dt)}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{what}: out has shape {out.shape}, expected {shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what}: out must be C-contiguous and writeable")
    return out


cdef object _widen(x, out, str what, u16_to_f32_row row):
    """16-bit values (bits) -> float32 through `row`, the GIL released."""
    a = _u16_in(x, what)
    r = _out(out, a.shape, _F32, what)
    cdef const uint16_t[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t n = src.shape[0]
    if n:
        with nogil:
            row(&src[0], &dst[0], n)
    return r


cdef object _narrow(x, out, str what, f32_to_u16_row row, dtype, alt_dtype=None):
    """float32 -> 16-bit values (bits) through `row`, the GIL released."""
    a = _f32_in(x)
    r = _out(out, a.shape, dtype, what, alt_dtype)
    cdef const float[::1] src = a.reshape(-1)
    cdef uint16_t[::1] dst = r.reshape(-1).view(np.uint16)
    cdef Py_ssize_t n = src.shape[0]
    if n:
        with nogil:
            row(&src[0], &dst[0], n)
    return r


cdef object _round_trip(x, out, str what, f32_to_f32_row row, Py_ssize_t unit=1):
    """float32 -> float32 through a narrower type, the GIL released; row counts in
    units of `unit` values (a block of a quantised type: the rows must hold whole ones)."""
    a = _f32_in(x)
    if unit > 1:
        _blocks_shape(a.shape, unit, unit, what, "values")
    r = _out(out, a.shape, _F32, what)
    cdef const float[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t n = src.shape[0] // unit
    if n:
        with nogil:
            row(&src[0], &dst[0], n)
    return r


def f16_to_f32(x, out=None):
    """f16 values (float16, or uint16 bits) -> float32, exact."""
    return _widen(x, out, "f16_to_f32", C.f16_to_f32)


def f32_to_f16(x, out=None):
    """float32 values -> float16 array, round to nearest even (out may be float16 or uint16)."""
    return _narrow(x, out, "f32_to_f16", C.f32_to_f16, _F16, _U16)


def bf16_to_f32(x, out=None):
    """bf16 bits (uint16) -> float32."""
    return _widen(x, out, "bf16_to_f32", C.bf16_to_f32)


def f32_to_bf16(x, out=None):
    """float32 -> bf16 bits (uint16), ggml_compute_fp32_to_bf16."""
    return _narrow(x, out, "f32_to_bf16", C.f32_to_bf16, _U16)


def round_f16(x, out=None):
    """float32 values rounded to the nearest f16 (ties to even), as float32."""
    return _round_trip(x, out, "round_f16", C.round_f16)


def round_bf16(x, out=None):
    """float32 values through bf16 and back."""
    return _round_trip(x, out, "round_bf16", C.round_bf16)


cdef tuple _blocks_shape(tuple shape, Py_ssize_t unit, Py_ssize_t per, str what, str of):
    # (the module is built with wraparound=False: no negative indices here)
    cdef Py_ssize_t nd = len(shape)
    if nd == 0:
        raise ValueError(f"{what}: expected at least one dimension")
    cdef Py_ssize_t last = shape[nd - 1]
    if last % unit:
        raise ValueError(f"{what}: a row of {last} {of} is not a whole number of "
                         f"blocks of {unit} {of}")
    return shape[:nd - 1] + (last // unit * per,)


cdef object _quantize_blocks(x, out, str what, f32_to_blocks fn, Py_ssize_t block_bytes,
                             int cpu):
    """Rows of float32 (last axis a multiple of 32) -> blocks of block_bytes through fn,
    the GIL released."""
    a = _f32_in(x)
    shape = _blocks_shape(a.shape, QK, block_bytes, what, "values")
    r = _out(out, shape, _U8, what)
    cdef const float[::1] src = a.reshape(-1)
    cdef uint8_t[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // QK
    if nb:
        with nogil:
            fn(&src[0], &dst[0], nb, cpu)
    return r


cdef object _dequantize_blocks(raw, out, str what, blocks_to_f32 fn, Py_ssize_t block_bytes):
    """Blocks of block_bytes (last axis = row bytes) -> float32 rows through fn, the GIL
    released."""
    a = _u8_in(raw, what)
    shape = _blocks_shape(a.shape, block_bytes, QK, what, "bytes")
    r = _out(out, shape, _F32, what)
    cdef const uint8_t[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // block_bytes
    if nb:
        with nogil:
            fn(&src[0], &dst[0], nb)
    return r


def quantize_q8_0(x, cpu=False, out=None):
    """Rows of float32 (last axis a multiple of 32) -> q8_0 bytes (last axis = row bytes).

    cpu=False: ggml's reference quantiser; cpu=True: the CPU backend's."""
    return _quantize_blocks(x, out, "quantize_q8_0", C.quantize_q8_0, B8, bool(cpu))


def dequantize_q8_0(raw, out=None):
    """q8_0 bytes (last axis = row bytes, a multiple of 34) -> float32 rows."""
    return _dequantize_blocks(raw, out, "dequantize_q8_0", C.dequantize_q8_0, B8)


def round_q8_0(x, out=None):
    """float32 rows through the CPU q8_0 quantiser and back (src1 of a quantised MUL_MAT);
    equal to dequantize_q8_0(quantize_q8_0(x, cpu=True))."""
    return _round_trip(x, out, "round_q8_0", C.round_q8_0, QK)


def quantize_q4_0(x, out=None):
    """Rows of float32 (last axis a multiple of 32) -> q4_0 bytes (quantize_row_q4_0_ref)."""
    return _quantize_blocks(x, out, "quantize_q4_0", C.quantize_q4_0, B4, 0)


def dequantize_q4_0(raw, out=None):
    """q4_0 bytes (last axis = row bytes, a multiple of 18) -> float32 rows."""
    return _dequantize_blocks(raw, out, "dequantize_q4_0", C.dequantize_q4_0, B4)


# ---------------------------------------------------------------------------
# every block type, by ggml type id (the executor's own traits: ggml_py.quants names them)

cdef tuple _layout(int type):
    """(elements, bytes) of one block of `type`, from the one list of types."""
    cdef int i
    for i in range(GGML_PY_N_TYPE_INFOS):
        if ggml_py_type_infos[i].id == type and ggml_py_type_infos[i].blck_size > 1:
            return ggml_py_type_infos[i].blck_size, ggml_py_type_infos[i].type_size
    raise ValueError(f"type id {type} is not a block type")


cdef const gp_type_traits * _traits(object type, str what) except NULL:
    """The conversions of ggml type id `type`, checked."""
    if isinstance(type, bool) or not isinstance(type, int):
        raise ArgumentTypeError(f"{what}: a type is given by its ggml id, got {type!r}")
    if not 0 <= type < GGML_PY_TYPE_COUNT:
        raise OutOfRangeError(f"{what}: type id {type} is not one of ggml's (0..{GGML_PY_TYPE_COUNT - 1})")
    cdef const gp_type_traits * t = C.type_traits(type)
    if t == NULL:
        raise NotSupportedError(f"{what}: type id {type} has no conversions in ggml_py")
    return t


def block_types():
    """ids of the block types with conversions here."""
    return tuple(i for i in range(GGML_PY_TYPE_COUNT) if C.type_traits(i) != NULL)


def quantize_blocks(type, x, bint cpu=False, out=None):
    """float32 rows (last axis a whole number of blocks) -> rows of `type`'s blocks, as
    bytes. cpu=False: ggml's reference quantiser (ggml_quantize_chunk without an
    importance matrix); cpu=True: ggml-cpu's (CPY / SET_ROWS, src1 of a MUL_MAT)."""
    cdef const gp_type_traits * t = _traits(type, "quantize_blocks")
    cdef gp_from_float_fn fn = t.from_float if cpu else t.from_float_ref
    qk, size = _layout(type)
    a = _f32_in(x)
    shape = _blocks_shape(a.shape, qk, size, "quantize_blocks", "values")
    r = _out(out, shape, _U8, "quantize_blocks")
    # (no negative indices: the module is built with wraparound=False)
    cdef const float[:, ::1] src = a.reshape(-1, a.shape[a.ndim - 1]) if a.size else np.zeros((0, 1), _F32)
    cdef uint8_t[:, ::1] dst = r.reshape(-1, r.shape[r.ndim - 1]) if a.size else np.zeros((0, 1), _U8)
    cdef Py_ssize_t i, n = src.shape[1]
    with nogil:
        for i in range(src.shape[0]):
            fn(&src[i, 0], &dst[i, 0], n)
    return r


def dequantize_blocks(type, raw, out=None):
    """rows of `type`'s blocks (bytes, last axis = row bytes) -> float32 rows (ggml's
    to_float, bit for bit)."""
    cdef const gp_type_traits * t = _traits(type, "dequantize_blocks")
    qk, size = _layout(type)
    a = _u8_in(raw, "dequantize_blocks")
    shape = _blocks_shape(a.shape, size, qk, "dequantize_blocks", "bytes")
    r = _out(out, shape, _F32, "dequantize_blocks")
    cdef const uint8_t[:, ::1] src = a.reshape(-1, a.shape[a.ndim - 1]) if r.size else np.zeros((0, 1), _U8)
    cdef float[:, ::1] dst = r.reshape(-1, r.shape[r.ndim - 1]) if r.size else np.zeros((0, 1), _F32)
    cdef Py_ssize_t i, n = dst.shape[1]
    with nogil:
        for i in range(src.shape[0]):
            t.to_float(&src[i, 0], &dst[i, 0], n)
    return r


def vec_dot_type(type):
    """The type id ggml-cpu converts src1 of a MUL_MAT to for weights of `type`."""
    _traits(type, "vec_dot_type")
    return C.vec_dot_type(type)


def vec_dot(type, x, y):
    """The executor's dot product of one row of `type` (bytes) with one row of its
    vec_dot type (bytes), on the active instruction set: a float."""
    _traits(type, "vec_dot")
    cdef gp_vec_dot_fn fn = C.vec_dot_of(type)
    if fn == NULL:
        raise NotSupportedError(f"vec_dot: type id {type} is read by a dot tile, not a vec_dot")
    qk, size = _layout(type)
    vqk, vsize = _layout(C.vec_dot_type(type))
    a = _u8_in(x, "vec_dot").reshape(-1)
    b = _u8_in(y, "vec_dot").reshape(-1)
    cdef Py_ssize_t n = a.shape[0] // size * qk
    if a.shape[0] % size or n == 0 or b.shape[0] != n // vqk * vsize:
        raise ValueError(f"vec_dot: {a.shape[0]} and {b.shape[0]} bytes are not one row "
                         f"each of the same length")
    cdef const uint8_t[::1] xa = a
    cdef const uint8_t[::1] yb = b
    cdef float s = 0
    with nogil:
        fn(n, &s, &xa[0], &yb[0])
    return s
