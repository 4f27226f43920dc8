"""Element conversions of ggml's CPU backend in C: f16, bf16, q8_0 and q4_0.

Row kernels over raw pointers (nogil) and Python wrappers that take numpy
arrays, release the GIL for the loops and return float32 (or the stored form).
The numerics are those of ggml 0.10.1's CPU backend on x86 with F16C:

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

Block layouts (ggml-common.h) are read and written byte by byte, little-endian:
q8_0 = f16 scale + 32 int8; q4_0 = f16 scale + 16 bytes of nibbles (low nibbles
are elements 0..15, high nibbles 16..31), value = (q - 8) * d.

Degenerate blocks (a scale whose inverse overflows, from a largest magnitude
below ~3.7e-37, or inf / NaN inside) follow ggml's x86 code too: its float -> int
conversions give INT32_MIN, saturated to -128 by the CPU q8_0 quantiser and
truncated to 0 by the reference one.

Float arithmetic is exactly that of float32 operations: no addition follows a
product directly (roundings use comparisons, or an addition in double on the
rounded float product), so no compiler can fuse the two into an FMA. The inner
loops are branch-free (sel) so that gcc -O3 vectorises them at the baseline ISA.
"""

from libc.stdint cimport uint8_t, int8_t, uint16_t, uint32_t, int32_t
from libc.string cimport memcpy

import sys

import numpy as np

if sys.byteorder != "little":      # the uint16/float32 bit views below assume it
    raise ImportError("ggml_py._quants needs a little-endian host")

QK8_0 = 32
QK4_0 = 32
Q8_0_BYTES = 34
Q4_0_BYTES = 18

cdef Py_ssize_t QK = 32
cdef Py_ssize_t B8 = 34
cdef Py_ssize_t B4 = 18

# ---------------------------------------------------------------------------
# scalar conversions

cdef inline float u2f(uint32_t u) noexcept nogil:
    cdef float f
    memcpy(&f, &u, 4)
    return f


cdef inline uint32_t f2u(float f) noexcept nogil:
    cdef uint32_t u
    memcpy(&u, &f, 4)
    return u


cdef inline uint32_t sel(bint c, uint32_t a, uint32_t b) noexcept nogil:
    """c ? a : b without a branch (Cython writes ?: as if/else, which gcc does not
    always if-convert, and then the loop is not vectorised)."""
    cdef uint32_t m = (<uint32_t>0) - <uint32_t>c
    return (a & m) | (b & ~m)


cdef inline float h2f(uint16_t h) noexcept nogil:
    """IEEE half bits -> float, exact; a NaN comes out quiet with its payload.

    Branch-free (all three cases computed, one selected) so loops vectorise."""
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef int32_t em = h & 0x7FFF
    # normal: rebias the exponent (15 -> 127)
    cdef uint32_t normal = ((<uint32_t>em) << 13) + ((127 - 15) << 23)
    # subnormal or zero: m * 2^-24, exact
    cdef uint32_t sub = f2u(<float>em * <float>5.9604644775390625e-08)
    # inf / NaN: all-ones exponent, payload kept, quiet bit set on NaN
    cdef uint32_t special = (0x7F800000 | ((<uint32_t>(em & 0x3FF)) << 13)
                             | ((<uint32_t>(em > 0x7C00)) << 22))
    cdef uint32_t bits = sel(em < 0x0400, sub, sel(em >= 0x7C00, special, normal))
    return u2f(bits | sign)


cdef inline uint16_t f2h(float f) noexcept nogil:
    """float -> IEEE half bits, round to nearest even (vcvtps2ph semantics). Branch-free."""
    cdef uint32_t u = f2u(f)
    cdef int32_t a = <int32_t>(u & 0x7FFFFFFF)
    # normal half (a carry out of the mantissa rounds up into the exponent, and
    # past 65504 into inf): rebias, add just under half an ulp plus the odd bit
    cdef uint32_t normal = ((<uint32_t>a) - ((127 - 15) << 23) + 0xFFF
                            + ((<uint32_t>a >> 13) & 1)) >> 13
    # below 2^-14: adding 0.5f puts the half's unit (2^-24) at the float's last
    # bit; the float addition rounds to nearest even
    cdef uint32_t sub = f2u(u2f(<uint32_t>a) + <float>0.5) - 0x3F000000
    cdef uint32_t nan = 0x7E00 | ((<uint32_t>a >> 13) & 0x3FF)
    cdef uint32_t o = sel(a < 0x38800000, sub, normal)
    o = sel(a >= 0x47800000, 0x7C00, o)
    o = sel(a > 0x7F800000, nan, o)
    return <uint16_t>(o | ((u >> 16) & 0x8000))


cdef inline float bf2f(uint16_t b) noexcept nogil:
    return u2f((<uint32_t>b) << 16)


cdef inline uint16_t f2bf(float f) noexcept nogil:
    """ggml_compute_fp32_to_bf16: nearest even on the upper half; NaN forced quiet."""
    cdef uint32_t u = f2u(f)
    cdef uint32_t r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    cdef uint32_t nan = (u >> 16) | 64
    return <uint16_t>sel((u & 0x7FFFFFFF) > 0x7F800000, nan, r)


cdef inline float f16_round(float f) noexcept nogil:
    return h2f(f2h(f))


# Rounding of a quantised value. Only exact operations and comparisons follow the
# product that made v, so the result cannot depend on FMA contraction. Both are
# exact for |v| < 2^22, which holds in every block with a finite, not too small
# scale (|v| <= 127 or so); the other blocks take the *_blocks' slow path.

cdef inline int32_t round_away(float v) noexcept nogil:
    """roundf(v): halves away from zero."""
    cdef uint32_t u = f2u(v)
    cdef float a = u2f(u & 0x7FFFFFFF)
    cdef int32_t i = <int32_t>a
    cdef int32_t r = i + (a >= <float>i + <float>0.5)
    cdef int32_t s = -<int32_t>(u >> 31)        # 0 or -1
    return (r ^ s) - s


cdef inline int32_t round_even(float v) noexcept nogil:
    """rintf(v) in the default mode: halves to even. Adding 1.5 * 2^52 in double
    leaves no fraction bits, so the addition itself rounds; the operand is a float
    widened to double, so no FMA can absorb it."""
    cdef double t = (<double>v + 6755399441055744.0) - 6755399441055744.0
    return <int32_t>t


cdef inline int32_t x86_i32(float r) noexcept nogil:
    """A float that is already an integer (or inf / NaN) converted to int32 as x86's
    cvt instructions do: what does not fit, inf and NaN give INT32_MIN. C leaves
    this undefined; ggml's x86 code meets it in the degenerate blocks."""
    if r != r or r >= <float>2147483648.0 or r < <float>-2147483648.0:
        return <int32_t>0x80000000
    return <int32_t>r


cdef inline float rint_any(float v, bint even) noexcept nogil:
    """round_even / round_away for any float (large ones are integers already)."""
    if not (v < <float>4194304 and v > <float>-4194304):
        return v
    return <float>(round_even(v) if even else round_away(v))


cdef inline bint finite(float f) noexcept nogil:
    return (f2u(f) & 0x7F800000) != 0x7F800000


cdef inline int32_t sat8(int32_t q) noexcept nogil:
    q = <int32_t>sel(q > 127, 127, <uint32_t>q)
    return <int32_t>sel(q < -128, <uint32_t>-128, <uint32_t>q)


# ---------------------------------------------------------------------------
# row kernels (n elements; block kernels take a count of blocks)

cdef void f16_to_f32_row(const uint16_t *x, float *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = h2f(x[i])


cdef void f32_to_f16_row(const float *x, uint16_t *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = f2h(x[i])


cdef void bf16_to_f32_row(const uint16_t *x, float *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = bf2f(x[i])


cdef void f32_to_bf16_row(const float *x, uint16_t *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = f2bf(x[i])


cdef void round_f16_row(const float *x, float *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = h2f(f2h(x[i]))


cdef void round_bf16_row(const float *x, float *y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = bf2f(f2bf(x[i]))


cdef inline uint16_t load_le16(const uint8_t *p) noexcept nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


cdef inline void store_le16(uint8_t *p, uint16_t v) noexcept nogil:
    p[0] = <uint8_t>(v & 0xFF)
    p[1] = <uint8_t>(v >> 8)


cdef inline uint32_t absmax_bits32(const float *x) noexcept nogil:
    """Bits of max |x[j]| over a block: on sign-cleared floats the integer order is
    the float order (a NaN is above inf, so it wins, as numpy's max)."""
    cdef uint32_t m = 0, a
    cdef Py_ssize_t j
    for j in range(32):
        a = f2u(x[j]) & 0x7FFFFFFF
        m = a if a > m else m
    return m


cdef void dequantize_q8_0_blocks(const uint8_t *x, float *y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t b, j
    cdef float d
    cdef const int8_t *qs
    cdef float *yb
    for b in range(nb):
        d = h2f(load_le16(x + b * B8))
        qs = <const int8_t *>(x + b * B8 + 2)
        yb = y + b * 32
        for j in range(32):
            yb[j] = <float>qs[j] * d


cdef inline float q8_0_block(const float *xb, int8_t *q, bint cpu) noexcept nogil:
    """One block of 32 values -> q[32] and the scale d (before its f16 rounding).

    cpu=0: quantize_row_q8_0_ref (1/d, halves away from zero); cpu=1: the x86
    CPU quantize_row_q8_0 (127/max, halves to even, saturating)."""
    cdef Py_ssize_t j
    cdef float amax = u2f(absmax_bits32(xb))
    cdef float d = amax / <float>127
    cdef float idv
    cdef int32_t i
    if cpu:
        idv = (<float>127 / amax) if amax != 0 else <float>0
    else:
        idv = (<float>1 / d) if d != 0 else <float>0
    if finite(idv) and finite(amax):            # then |x * idv| <= 127 or so
        if cpu:
            for j in range(32):
                q[j] = <int8_t>sat8(round_even(xb[j] * idv))
        else:
            for j in range(32):
                q[j] = <int8_t>sat8(round_away(xb[j] * idv))
    else:
        # degenerate block (a scale that overflows, or inf / NaN in it): follow
        # ggml's x86 code, whose float -> int conversions give INT32_MIN there;
        # the CPU quantiser saturates it to -128, the reference one truncates to 0
        for j in range(32):
            i = x86_i32(rint_any(xb[j] * idv, cpu))
            q[j] = <int8_t>sat8(i) if cpu else <int8_t>i
    return d


cdef void quantize_q8_0_blocks(const float *x, uint8_t *y, Py_ssize_t nb, bint cpu) noexcept nogil:
    cdef Py_ssize_t b
    cdef int8_t q[32]
    cdef float d
    for b in range(nb):
        d = q8_0_block(x + b * 32, q, cpu)
        store_le16(y + b * B8, f2h(d))
        memcpy(y + b * B8 + 2, q, 32)


cdef void round_q8_0_blocks(const float *x, float *y, Py_ssize_t nb) noexcept nogil:
    """The CPU q8_0 quantiser followed by dequantisation, without the bytes in between."""
    cdef Py_ssize_t b, j
    cdef int8_t q[32]
    cdef float r[32]
    cdef float d
    for b in range(nb):
        d = f16_round(q8_0_block(x + b * 32, q, 1))
        for j in range(32):
            r[j] = <float>q[j] * d
        memcpy(y + b * 32, r, 32 * sizeof(float))


cdef void dequantize_q4_0_blocks(const uint8_t *x, float *y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t b, j
    cdef float d
    cdef const uint8_t *qs
    cdef float *yb
    for b in range(nb):
        d = h2f(load_le16(x + b * B4))
        qs = x + b * B4 + 2
        yb = y + b * 32
        for j in range(16):
            yb[j] = <float>(<int32_t>(qs[j] & 0x0F) - 8) * d
        for j in range(16):
            yb[j + 16] = <float>(<int32_t>(qs[j] >> 4) - 8) * d


cdef inline int32_t q4_value(float v, float idv) noexcept nogil:
    # (int8_t)(v*idv + 8.5f) capped at 15. The float sum is formed as the double
    # sum of the rounded float product (exact) rounded to float: no FMA possible.
    cdef float s = <float>(<double>(v * idv) + 8.5)
    cdef int32_t q = <int8_t><int32_t>s
    return <int32_t>sel(q > 15, 15, <uint32_t>q)


cdef void quantize_q4_0_blocks(const float *x, uint8_t *y, Py_ssize_t nb) noexcept nogil:
    """quantize_row_q4_0_ref: d = (the first value of largest magnitude) / -8."""
    cdef Py_ssize_t b, j
    cdef uint32_t amax
    cdef float mx, d, idv
    cdef const float *xb
    cdef uint8_t q[32]
    cdef uint8_t qs[16]
    for b in range(nb):
        xb = x + b * 32
        amax = absmax_bits32(xb)
        mx = 0                      # ggml keeps +0 for an all-zero block, even for -0
        if amax != 0:
            for j in range(32):
                if (f2u(xb[j]) & 0x7FFFFFFF) == amax:
                    mx = xb[j]
                    break
        d = mx / <float>-8
        idv = (<float>1 / d) if d != 0 else <float>0
        store_le16(y + b * B4, f2h(d))
        if finite(idv) and finite(mx):             # then x * idv + 8.5 is in [0.5, 16.5]
            for j in range(32):
                q[j] = <uint8_t>(q4_value(xb[j], idv) & 0x0F)
        else:                                       # degenerate block: as on x86
            for j in range(32):
                q[j] = <uint8_t>(min(15, <int8_t>x86_i32(<float>(<double>(xb[j] * idv) + 8.5)))
                                 & 0x0F)
        for j in range(16):
            qs[j] = q[j] | (q[j + 16] << 4)
        memcpy(y + b * B4 + 2, qs, 16)


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


ctypedef void (*u16_to_f32_row)(const uint16_t *, float *, Py_ssize_t) noexcept nogil
ctypedef void (*f32_to_u16_row)(const float *, uint16_t *, Py_ssize_t) noexcept nogil
ctypedef void (*f32_to_f32_row)(const float *, float *, Py_ssize_t) noexcept nogil


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


cdef object _round_trip(x, out, str what, f32_to_f32_row row):
    """float32 -> float32 through a narrower type, the GIL released."""
    a = _f32_in(x)
    r = _out(out, a.shape, _F32, what)
    cdef const float[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t n = src.shape[0]
    if n:
        with nogil:
            row(&src[0], &dst[0], n)
    return r


def f16_to_f32(x, out=None):
    """f16 values (float16, or uint16 bits) -> float32, exact."""
    return _widen(x, out, "f16_to_f32", f16_to_f32_row)


def f32_to_f16(x, out=None):
    """float32 values -> float16 array, round to nearest even (out may be float16 or uint16)."""
    return _narrow(x, out, "f32_to_f16", f32_to_f16_row, _F16, _U16)


def bf16_to_f32(x, out=None):
    """bf16 bits (uint16) -> float32."""
    return _widen(x, out, "bf16_to_f32", bf16_to_f32_row)


def f32_to_bf16(x, out=None):
    """float32 -> bf16 bits (uint16), ggml_compute_fp32_to_bf16."""
    return _narrow(x, out, "f32_to_bf16", f32_to_bf16_row, _U16)


def round_f16(x, out=None):
    """float32 values rounded to the nearest f16 (ties to even), as float32."""
    return _round_trip(x, out, "round_f16", round_f16_row)


def round_bf16(x, out=None):
    """float32 values through bf16 and back."""
    return _round_trip(x, out, "round_bf16", round_bf16_row)


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


def quantize_q8_0(x, cpu=False, out=None):
    """Rows of float32 (last axis a multiple of 32) -> q8_0 bytes (last axis = row bytes).

    cpu=False: ggml's reference quantiser; cpu=True: the CPU backend's."""
    a = _f32_in(x)
    shape = _blocks_shape(a.shape, QK, B8, "quantize_q8_0", "values")
    r = _out(out, shape, _U8, "quantize_q8_0")
    cdef const float[::1] src = a.reshape(-1)
    cdef uint8_t[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // QK
    cdef bint c = bool(cpu)
    if nb:
        with nogil:
            quantize_q8_0_blocks(&src[0], &dst[0], nb, c)
    return r


def dequantize_q8_0(raw, out=None):
    """q8_0 bytes (last axis = row bytes, a multiple of 34) -> float32 rows."""
    a = _u8_in(raw, "dequantize_q8_0")
    shape = _blocks_shape(a.shape, B8, QK, "dequantize_q8_0", "bytes")
    r = _out(out, shape, _F32, "dequantize_q8_0")
    cdef const uint8_t[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // B8
    if nb:
        with nogil:
            dequantize_q8_0_blocks(&src[0], &dst[0], nb)
    return r


def round_q8_0(x, out=None):
    """float32 rows through the CPU q8_0 quantiser and back (src1 of a quantised MUL_MAT);
    equal to dequantize_q8_0(quantize_q8_0(x, cpu=True))."""
    a = _f32_in(x)
    _blocks_shape(a.shape, QK, QK, "round_q8_0", "values")
    r = _out(out, a.shape, _F32, "round_q8_0")
    cdef const float[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // QK
    if nb:
        with nogil:
            round_q8_0_blocks(&src[0], &dst[0], nb)
    return r


def quantize_q4_0(x, out=None):
    """Rows of float32 (last axis a multiple of 32) -> q4_0 bytes (quantize_row_q4_0_ref)."""
    a = _f32_in(x)
    shape = _blocks_shape(a.shape, QK, B4, "quantize_q4_0", "values")
    r = _out(out, shape, _U8, "quantize_q4_0")
    cdef const float[::1] src = a.reshape(-1)
    cdef uint8_t[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // QK
    if nb:
        with nogil:
            quantize_q4_0_blocks(&src[0], &dst[0], nb)
    return r


def dequantize_q4_0(raw, out=None):
    """q4_0 bytes (last axis = row bytes, a multiple of 18) -> float32 rows."""
    a = _u8_in(raw, "dequantize_q4_0")
    shape = _blocks_shape(a.shape, B4, QK, "dequantize_q4_0", "bytes")
    r = _out(out, shape, _F32, "dequantize_q4_0")
    cdef const uint8_t[::1] src = a.reshape(-1)
    cdef float[::1] dst = r.reshape(-1)
    cdef Py_ssize_t nb = src.shape[0] // B4
    if nb:
        with nogil:
            dequantize_q4_0_blocks(&src[0], &dst[0], nb)
    return r
