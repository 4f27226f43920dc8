"""The C kernels of ggml_py._quants against the numpy references (tests/quants_ref.py),
bit for bit, on exhaustive sweeps, random data (hypothesis) and special values."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from ggml_py import _quants as C, quants
import quants_ref as R


def bits32(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def bits16(a):
    return np.ascontiguousarray(a).view(np.uint16)


def is_snan32(u):
    return ((u & 0x7FFFFFFF) > 0x7F800000) & ((u & 0x400000) == 0)


def is_snan16(h):
    return ((h & 0x7FFF) > 0x7C00) & ((h & 0x200) == 0)


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


SPECIAL_F32 = f32([
    0, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000,          # zeros, f32 subnormals
    0x33000000, 0x33000001, 0x337FFFFF, 0x33800000,              # around half of 2^-24
    0x387FC000, 0x387FE000, 0x387FF000, 0x38800000,              # top of f16 subnormals
    0x3F800000, 0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001,  # ties at 1.0
    0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0xC77FF000,  # 65504 .. overflow
    0x7F7FFFFF, 0x7F800000, 0xFF800000,                          # max, inf
    0x7FC00000, 0xFFC00000, 0x7FC02000, 0x7FFFFFFF, 0x7FE00001,  # quiet NaNs
    0x3F808000, 0x3F818000, 0x3F817FFF, 0x3F808001,              # bf16 ties
])

# F16C (vcvtps2ph / vcvtph2ps) on signalling NaNs, measured on an x86 CPU
SNAN_F32_TO_F16 = {0x7F800001: 0x7E00, 0x7FA00000: 0x7F00, 0x7F802000: 0x7E01,
                   0xFF800001: 0xFE00}
SNAN_F16_TO_F32 = {0x7C01: 0x7FC02000, 0x7D00: 0x7FE00000, 0xFC01: 0xFFC02000}


# ---------------------------------------------------------------------------
# f16

def test_f16_to_f32_all_halves():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got, ref = bits32(C.f16_to_f32(h)), bits32(R.f16_to_f32(h))
    snan = is_snan16(h)
    assert np.array_equal(got[~snan], ref[~snan])
    # a signalling NaN comes out quiet with its payload, as vcvtph2ps makes it
    assert np.array_equal(got[snan], ref[snan] | 0x400000)
    for hb, fb in SNAN_F16_TO_F32.items():
        assert bits32(C.f16_to_f32(np.array([hb], np.uint16)))[0] == fb
    # float16 input is the same as its bits
    assert np.array_equal(bits32(C.f16_to_f32(h.view(np.float16))), got)


@pytest.mark.parametrize("low", [0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800, 0x17FF, 0x1800])
def test_f32_to_f16_sweep(low):
    """Every exponent and top-10 mantissa pattern, with the rounding-relevant low bits."""
    u = (np.arange(1 << 19, dtype=np.uint32) << 13) | np.uint32(low)
    x = u.view(np.float32)
    with np.errstate(over="ignore"):
        ref = bits16(R.f32_to_f16(x))
    got = bits16(C.f32_to_f16(x))
    snan = is_snan32(u)
    assert np.array_equal(got[~snan], ref[~snan])
    assert np.all(got[snan] & 0x200)          # quiet
    with np.errstate(over="ignore"):
        rf = bits32(R.round_f16(x))
    rg = bits32(C.round_f16(x))
    assert np.array_equal(rg[~snan], rf[~snan])


def test_f16_special_values():
    with np.errstate(over="ignore"):
        assert np.array_equal(bits16(C.f32_to_f16(SPECIAL_F32)), bits16(R.f32_to_f16(SPECIAL_F32)))
        assert np.array_equal(bits32(C.round_f16(SPECIAL_F32)), bits32(R.round_f16(SPECIAL_F32)))
    for fb, hb in SNAN_F32_TO_F16.items():
        assert bits16(C.f32_to_f16(f32([fb])))[0] == hb
    # ties to even, subnormals, overflow
    assert C.f32_to_f16(np.float32(1 + 2.0 ** -11)) == 1.0
    assert C.f32_to_f16(np.float32(1 + 3 * 2.0 ** -11)) == 1 + 2.0 ** -9
    assert C.f32_to_f16(np.float32(2.0 ** -25)) == 0.0
    assert bits16(C.f32_to_f16(np.float32(3 * 2.0 ** -25)))[()] == 2
    assert C.f32_to_f16(np.float32(65519.99)) == 65504
    assert np.isinf(C.f32_to_f16(np.float32(65520)))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.uint32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))
def test_f16_random_bits(u):
    x = u.view(np.float32)
    snan = is_snan32(u)
    with np.errstate(over="ignore"):
        ref = bits16(R.f32_to_f16(x))
        rr = bits32(R.round_f16(x))
    got = C.f32_to_f16(x)
    assert got.shape == u.shape and got.dtype == np.float16
    assert np.array_equal(bits16(got)[~snan], ref[~snan])
    assert np.array_equal(bits32(C.round_f16(x))[~snan], rr[~snan])
    h = (u & 0xFFFF).astype(np.uint16)
    hs = is_snan16(h)
    assert np.array_equal(bits32(C.f16_to_f32(h))[~hs], bits32(R.f16_to_f32(h))[~hs])


# ---------------------------------------------------------------------------
# bf16

@pytest.mark.parametrize("low", [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
def test_bf16_sweep(low):
    u = (np.arange(1 << 16, dtype=np.uint32) << 16) | np.uint32(low)
    x = u.view(np.float32)
    assert np.array_equal(C.f32_to_bf16(x), R.f32_to_bf16(x))
    assert np.array_equal(bits32(C.round_bf16(x)), bits32(R.round_bf16(x)))
    b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(bits32(C.bf16_to_f32(b)), bits32(R.bf16_to_f32(b)))


def test_bf16_nan_forced_quiet():
    # ggml_compute_fp32_to_bf16: (u >> 16) | 64 for any NaN, no rounding
    assert C.f32_to_bf16(f32([0x7F800001]))[0] == (0x7F80 | 64)
    assert C.f32_to_bf16(f32([0xFFFFFFFF]))[0] == 0xFFFF
    assert C.f32_to_bf16(f32([0x7F7FFFFF]))[0] == 0x7F80          # rounds up to inf
    assert np.array_equal(C.f32_to_bf16(SPECIAL_F32), R.f32_to_bf16(SPECIAL_F32))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.uint32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))
def test_bf16_random_bits(u):
    x = u.view(np.float32)
    got = C.f32_to_bf16(x)
    assert got.shape == u.shape and got.dtype == np.uint16
    # (the reference turns a 0-d input into shape (1,); compare the values)
    assert np.array_equal(got.reshape(-1), R.f32_to_bf16(x).reshape(-1))
    assert np.array_equal(bits32(C.round_bf16(x)).reshape(-1), bits32(R.round_bf16(x)).reshape(-1))


# ---------------------------------------------------------------------------
# q8_0 / q4_0

def _rows(draw, rows, nblk, scale_exp):
    x = draw(hnp.arrays(np.float32, (rows, 32 * nblk),
                        elements=st.floats(-1, 1, width=32, allow_subnormal=True)))
    return x * np.float32(2.0 ** scale_exp)


def _with_ties(x, d):
    """Put values on exact quantisation half-steps of scale d into x (in place)."""
    k = np.arange(x.shape[-1]) % 7
    x[..., ::3] = ((k[::3] - 3) + 0.5).astype(np.float32) * np.float32(d)
    return x


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 4), st.integers(-30, 30))
def test_q8_0_random(data, rows, nblk, e):
    x = _rows(data.draw, rows, nblk, e)
    for cpu in (False, True):
        got = C.quantize_q8_0(x, cpu=cpu)
        ref = R.quantize_q8_0(x, cpu=cpu)
        assert got.dtype == np.uint8 and got.shape == (rows, 34 * nblk)
        assert np.array_equal(got, ref)
        assert np.array_equal(bits32(C.dequantize_q8_0(got)), bits32(R.dequantize_q8_0(ref)))
    assert np.array_equal(bits32(C.round_q8_0(x)), bits32(R.round_q8_0(x)))


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 4), st.integers(-30, 30))
def test_q4_0_random(data, rows, nblk, e):
    x = _rows(data.draw, rows, nblk, e)
    got = C.quantize_q4_0(x)
    ref = R.quantize_q4_0(x)
    assert got.dtype == np.uint8 and got.shape == (rows, 18 * nblk)
    assert np.array_equal(got, ref)
    assert np.array_equal(bits32(C.dequantize_q4_0(got)), bits32(R.dequantize_q4_0(ref)))


def test_quantisers_large_random_and_ties():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 1024)) * rng.exponential(1, (64, 1))).astype(np.float32)
    x[::4] = _with_ties(x[::4].copy(), 1.0)
    x[1::4, 0] = 127.0                                  # d = 1 exactly: integer + 0.5 ties
    x[1::4, 1:32] = np.round(rng.uniform(-127, 127, (16, 31))) + 0.5
    x[2::4, :32] = 0.0                                  # all-zero blocks
    x[2::4, 32:64] = -0.0
    x[3::4, 64:96] = rng.integers(-8, 8, (16, 32))      # q4_0 ties: x*id + 8.5 integral
    for cpu in (False, True):
        assert np.array_equal(C.quantize_q8_0(x, cpu=cpu), R.quantize_q8_0(x, cpu=cpu))
    assert np.array_equal(bits32(C.round_q8_0(x)), bits32(R.round_q8_0(x)))
    assert np.array_equal(C.quantize_q4_0(x), R.quantize_q4_0(x))
    raw8 = rng.integers(0, 256, (8, 34 * 16), dtype=np.uint8)    # any scale, inf/NaN too
    raw4 = rng.integers(0, 256, (8, 18 * 16), dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(bits32(C.dequantize_q8_0(raw8)), bits32(R.dequantize_q8_0(raw8)))
        assert np.array_equal(bits32(C.dequantize_q4_0(raw4)), bits32(R.dequantize_q4_0(raw4)))


def test_q8_0_rounding_rules():
    # d = 1: 2.5 -> 3 (reference, away from zero), 2 (CPU, to even)
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [127, 2.5, -2.5, 0.5, -0.5, 1.5]
    ref = C.quantize_q8_0(x, cpu=False)[0, 2:8].view(np.int8)
    cpu = C.quantize_q8_0(x, cpu=True)[0, 2:8].view(np.int8)
    assert list(ref) == [127, 3, -3, 1, -1, 2]
    assert list(cpu) == [127, 2, -2, 0, 0, 2]


def test_q4_0_zero_block_sign():
    # ggml starts from max = +0 and never replaces it in an all-zero block: d = 0/-8 = -0
    for z in (0.0, -0.0):
        raw = C.quantize_q4_0(np.full((1, 32), z, np.float32))
        assert (raw[0, 0], raw[0, 1]) == (0x00, 0x80)
        assert np.all(raw[0, 2:] == 0x88)


def test_q4_0_first_of_largest():
    x = np.zeros(32, np.float32)
    x[3], x[9] = -4.0, 4.0                   # same magnitude: the first (-4) sets d = 0.5
    raw = C.quantize_q4_0(x)
    assert C.f16_to_f32(raw[:2].view(np.uint16))[0] == 0.5


# ---------------------------------------------------------------------------
# the wrappers

def test_shapes_dtypes_and_inputs():
    x = np.arange(2 * 3 * 64, dtype=np.float32).reshape(2, 3, 64) / 7
    q = C.quantize_q8_0(x)
    assert q.shape == (2, 3, 68)
    assert C.dequantize_q8_0(q).shape == (2, 3, 64)
    assert C.quantize_q4_0(x).shape == (2, 3, 36)
    assert C.dequantize_q4_0(C.quantize_q4_0(x)).shape == (2, 3, 64)
    # bytes, read-only and strided inputs, float64 input
    assert np.array_equal(C.dequantize_q8_0(q[0, 0].tobytes()), C.dequantize_q8_0(q[0, 0]))
    ro = q.copy()
    ro.flags.writeable = False
    assert np.array_equal(C.dequantize_q8_0(ro), C.dequantize_q8_0(q))
    xt = np.asfortranarray(x[0])
    assert np.array_equal(C.quantize_q8_0(xt), C.quantize_q8_0(x[0]))
    assert np.array_equal(C.round_f16(x.astype(np.float64)), C.round_f16(x))
    # 0-d and empty
    assert C.round_f16(np.float32(1 / 3)).shape == ()
    assert C.f16_to_f32(np.float16(2)).shape == ()
    assert C.quantize_q8_0(np.zeros((0, 32), np.float32)).shape == (0, 34)
    assert C.dequantize_q4_0(np.zeros((3, 0), np.uint8)).shape == (3, 0)
    assert C.f32_to_f16(np.zeros((0,), np.float32)).shape == (0,)


def test_errors():
    with pytest.raises(ValueError, match="whole number"):
        C.quantize_q8_0(np.zeros(33, np.float32))
    with pytest.raises(ValueError, match="whole number"):
        C.dequantize_q4_0(np.zeros(19, np.uint8))
    with pytest.raises(ValueError, match="at least one"):
        C.quantize_q4_0(np.float32(0))
    with pytest.raises(TypeError):
        C.dequantize_q8_0(np.zeros(34, np.float32))
    with pytest.raises(TypeError):
        C.f16_to_f32(np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        C.round_f16(np.zeros(4, np.float32), out=np.zeros(4, np.float64))
    with pytest.raises(ValueError):
        C.round_f16(np.zeros(4, np.float32), out=np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        C.round_f16(np.zeros(4, np.float32), out=np.zeros(8, np.float32)[::2])


def test_out_arguments():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    o = np.empty((4, 64), np.float32)
    assert C.round_f16(x, out=o) is o and np.array_equal(o, C.round_f16(x))
    assert C.round_q8_0(x, out=o) is o and np.array_equal(o, C.round_q8_0(x))
    h = np.empty((4, 64), np.uint16)
    assert C.f32_to_f16(x, out=h) is h and np.array_equal(h, bits16(C.f32_to_f16(x)))
    assert C.f32_to_bf16(x, out=h) is h and np.array_equal(h, C.f32_to_bf16(x))
    q = np.empty((4, 68), np.uint8)
    assert C.quantize_q8_0(x, cpu=True, out=q) is q
    assert C.dequantize_q8_0(q, out=o) is o and np.array_equal(o, C.round_q8_0(x))
    q4 = np.empty((4, 36), np.uint8)
    assert C.quantize_q4_0(x, out=q4) is q4
    assert C.dequantize_q4_0(q4, out=o) is o
    # in place
    y = x.copy()
    C.round_f16(y, out=y)
    assert np.array_equal(y, C.round_f16(x))


def test_releases_the_gil():
    """Threads run the kernels concurrently and get the same results."""
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((256, 1024)).astype(np.float32) for _ in range(4)]
    want = [C.quantize_q8_0(x, cpu=True) for x in xs]
    got = [None] * 4

    def work(i):
        got[i] = C.quantize_q8_0(xs[i], cpu=True)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


# ---------------------------------------------------------------------------
# quants.py dispatch

def test_quants_dispatch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert quants.from_f32("f16", x).dtype == np.float16
    assert np.array_equal(quants.to_f32("f16", quants.from_f32("f16", x)), R.round_f16(x))
    assert np.array_equal(quants.to_f32("bf16", quants.from_f32("bf16", x)), R.round_bf16(x))
    assert np.array_equal(quants.from_f32("q8_0", x), R.quantize_q8_0(x, cpu=True))
    assert np.array_equal(quants.from_f32("q8_0", x, cpu=False), R.quantize_q8_0(x))
    assert np.array_equal(quants.from_f32("q4_0", x), R.quantize_q4_0(x))
    assert np.array_equal(quants.to_f32("q8_0", quants.from_f32("q8_0", x)),
                          quants.vec_dot_round("q4_0", x))
    assert np.array_equal(quants.vec_dot_round("f16", x), R.round_f16(x))
    assert np.array_equal(quants.vec_dot_round("bf16", x), R.round_bf16(x))
    assert np.array_equal(quants.vec_dot_round("f32", x), x)
    assert quants.to_f32("i32", np.arange(3, dtype=np.int32)).dtype == np.float32
    assert quants.from_f32("i32", np.float32([1, 2])).dtype == np.int32
    out = np.empty((3, 68), np.uint8)
    assert quants.from_f32("q8_0", x, out=out) is out
    with pytest.raises(NotImplementedError):
        quants.quantize("iq2_xxs", x)
    with pytest.raises(NotImplementedError):
        quants.dequantize("iq2_xxs", out)


def test_q8_0_degenerate_block():
    """Largest magnitude below ~3.7e-37: 127/max (or 1/d) overflows to inf. ggml's x86
    conversions give INT32_MIN for x*inf and 0*inf: -128 after the CPU quantiser's
    saturation, 0 after the reference one's truncation to int8; d rounds to 0."""
    x = np.zeros((1, 64), np.float32)
    x[0, :32:2] = np.float32(1e-40)
    x[0, 32:] = np.float32(1.0)                      # an ordinary block beside it
    cpu = C.quantize_q8_0(x, cpu=True)
    ref = C.quantize_q8_0(x, cpu=False)
    assert np.all(cpu[0, :2] == 0) and np.all(cpu[0, 2:34].view(np.int8) == -128)
    assert np.all(ref[0, :2] == 0) and np.all(ref[0, 2:34] == 0)
    assert np.all(cpu[0, 36:68].view(np.int8) == 127)
    assert np.array_equal(cpu, R.quantize_q8_0(x, cpu=True))
    assert np.array_equal(ref, R.quantize_q8_0(x, cpu=False))
    assert np.array_equal(bits32(C.round_q8_0(x)), bits32(R.round_q8_0(x)))
    q4 = C.quantize_q4_0(x)
    assert np.array_equal(q4, R.quantize_q4_0(x))
