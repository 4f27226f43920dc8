"""Op builders, the numpy CPU backend and ops-check against ggml's reference cases."""

import ctypes
import ctypes.util
import functools
import glob
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from conftest import ops_dir
from ggml_py._core import Context
from ggml_py.errors import GgmlPyError, GraphError
from ggml_py import numerics, ops, quants
from ggml_py.tools import opscheck
from ggml_py.backends.cpu import CPUBackend, tensor_array, SUPPORTED_OPS, rope_cache

OPS_DIR = str(ops_dir())


def _load_cases():
    cases, models = [], []
    for path in sorted(glob.glob(os.path.join(OPS_DIR, "**", "*.json"), recursive=True)):
        for kind, c in opscheck.load_cases(path):
            (models if kind == "model" else cases).append(c)
    return cases, models


CASES, MODELS = _load_cases()
assert CASES, f"no op cases under {OPS_DIR}"


@pytest.fixture(scope="module")
def cpu():
    return CPUBackend()


# ---------------------------------------------------------------------------
# the reference cases

@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_op_case(case, cpu):
    r = opscheck.run_case(case, cpu)
    assert not r["skipped"], r["message"]
    assert r["passed"], f"{r['name']}: error {r['error']} > {r['tolerance']}: {r['message']}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_op_params(case, cpu):
    """The builder stores exactly ggml's op_params words (and result type/shape/op)."""
    ctx = Context(case["name"])
    alloc = opscheck.HostAllocation(cpu)
    inputs = [opscheck._make_input(ctx, cpu, alloc, s, {}) for s in case["inputs"]]
    out = ops.builder(case["call"])(ctx, *inputs, **case.get("args", {}))
    o = case["output"]
    assert out.op_params == o["op_params"]
    assert out.op == o["op"]
    assert out.type == o["type"]
    assert list(out.ne) == o["ne"]
    if o.get("is_view_of"):
        assert out.view_src is not None


@pytest.mark.parametrize("model", MODELS, ids=[m["name"] for m in MODELS])
def test_model_logits(model, cpu):
    r = opscheck.run_model(model, cpu)
    assert not r["skipped"], r["message"]
    assert r["passed"], r["message"]


def test_ops_check_cli(capsys):
    from ggml_py.__main__ import main
    files = sorted(glob.glob(os.path.join(OPS_DIR, "scale.json")))
    rc = main(["ops-check", *files, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert out[-1] == "6 passed, 0 failed, 0 skipped"
    recs = [json.loads(line) for line in out[:-1]]
    assert {r["name"] for r in recs} == {c["name"] for c in CASES if c["call"].startswith("ggml_scale")}
    assert all(set(r) >= {"name", "passed", "error", "tolerance", "skipped"} for r in recs)


def test_ops_check_missing_path(capsys):
    from ggml_py.__main__ import main
    rc = main(["ops-check", "/nonexistent/ops"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/nonexistent/ops: no such file" in err[0]


# ---------------------------------------------------------------------------
# helpers to run small graphs

def _run(cpu, ctx, out, feeds):
    g, alloc = opscheck.prepare(cpu, out, feeds)
    cpu.graph_compute(g)
    return np.array(tensor_array(out)), alloc


def _input(ctx, type_name, arr, name="x"):
    ne = list(reversed(arr.shape)) + [1] * (4 - arr.ndim)
    return ops.new_tensor(ctx, type_name, ne, name=name)


# ---------------------------------------------------------------------------
# kernels against numpy references

floats = st.floats(-4, 4, allow_nan=False, width=32)


def _arr(draw, shape, lo=-4.0, hi=4.0):
    seed = draw(st.integers(0, 2**31 - 1))
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.integers(1, 40), st.integers(1, 5), st.integers(1, 3))
def test_rms_norm_reference(cpu, data, n, rows, mats):
    x = _arr(data.draw, (mats, rows, n))
    eps = 1e-5
    ctx = Context()
    a = _input(ctx, "f32", x)
    got, _ = _run(cpu, ctx, ops.rms_norm(ctx, a, eps), [(a, x)])
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps)
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.integers(1, 33), st.integers(1, 6), st.floats(0.05, 2.0))
def test_soft_max_reference(cpu, data, n, rows, scale):
    x = _arr(data.draw, (2, rows, n))
    ctx = Context()
    a = _input(ctx, "f32", x)
    got, _ = _run(cpu, ctx, ops.soft_max_ext(ctx, a, None, scale, 0.0), [(a, x)])
    z = x.astype(np.float64) * np.float32(scale)
    ref = np.exp(z - z.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-7)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.integers(1, 3), st.integers(1, 2), st.integers(1, 5), st.integers(1, 4),
       st.sampled_from(["f32", "f16"]))
def test_mul_mat_reference(cpu, data, k32, bh, n, m, wtype):
    k = 32 * k32
    w = _arr(data.draw, (bh, m, k), -1, 1)
    x = _arr(data.draw, (2 * bh, n, k), -1, 1)
    ctx = Context()
    wt = _input(ctx, wtype, w, "w")
    xt = _input(ctx, "f32", x, "x")
    wdata = w.astype(np.float16) if wtype == "f16" else w
    got, _ = _run(cpu, ctx, ops.mul_mat(ctx, wt, xt), [(wt, wdata), (xt, x)])
    wf = wdata.astype(np.float64)
    xf = x.astype(np.float16).astype(np.float64) if wtype == "f16" else x.astype(np.float64)
    wb = np.repeat(wf, 2, axis=0)          # integer-division broadcast over dim 2
    ref = xf @ np.swapaxes(wb, -1, -2)
    assert got.shape == (1, 2 * bh, n, m)
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(st.data(), st.integers(1, 4), st.integers(1, 3))
def test_q8_0_roundtrip(data, nblocks, rows):
    x = _arr(data.draw, (rows, 32 * nblocks), -3, 3)
    for cpu_q in (False, True):
        raw = quants.quantize_q8_0(x, cpu=cpu_q)
        assert raw.shape == (rows, 34 * nblocks)
        y = quants.dequantize_q8_0(raw)
        amax = np.abs(x.reshape(rows, nblocks, 32)).max(-1)
        err = np.abs(y - x).reshape(rows, nblocks, 32).max(-1)
        # half a quantisation step plus the f16 rounding of the scale
        assert np.all(err <= amax / 127 * 0.5 + amax * 2e-3 + 1e-7)


def test_q8_0_rounding_rules():
    # one block whose max is 127 so that d = 1: 2.5 -> ref 3 (away from zero), cpu 2 (even)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 127.0
    x[0, 1] = 2.5
    x[0, 2] = -2.5
    ref = quants.quantize_q8_0(x, cpu=False).view(quants.BLOCK_Q8_0)[0, 0]["qs"]
    cpu = quants.quantize_q8_0(x, cpu=True).view(quants.BLOCK_Q8_0)[0, 0]["qs"]
    assert (ref[1], ref[2]) == (3, -3)
    assert (cpu[1], cpu[2]) == (2, -2)


@settings(max_examples=30, deadline=None)
@given(st.data(), st.integers(1, 4))
def test_q4_0_roundtrip(data, nblocks):
    x = _arr(data.draw, (2, 32 * nblocks), -2, 2)
    y = quants.dequantize_q4_0(quants.quantize_q4_0(x))
    amax = np.abs(x.reshape(2, nblocks, 32)).max(-1, keepdims=True)
    # half a step, except -max which clamps to 7d: a full step (d = max/8), plus f16 rounding of d
    assert np.all(np.abs(y - x).reshape(2, nblocks, 32) <= amax / 8 * (1 + 2e-3) + 1e-6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.sampled_from([0, 2]), st.integers(1, 4), st.integers(1, 3))
def test_rope_reference(cpu, data, mode, n_head, n_tok):
    d = 16
    x = _arr(data.draw, (n_tok, n_head, d), -1, 1)
    pos = np.arange(n_tok, dtype=np.int32) * 3
    ctx = Context()
    a = _input(ctx, "f32", x)
    p = _input(ctx, "i32", pos, "pos")
    out = ops.rope_ext(ctx, a, p, None, d, mode, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    got, _ = _run(cpu, ctx, out, [(a, x), (p, pos)])
    got = got.reshape(x.shape)
    ref = x.astype(np.float64).copy()
    for t in range(n_tok):
        for i in range(d // 2):
            th = pos[t] * 10000.0 ** (-2 * i / d)
            c, s = math.cos(th), math.sin(th)
            j0, j1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + d // 2)
            x0, x1 = x[t, :, j0].astype(np.float64), x[t, :, j1].astype(np.float64)
            ref[t, :, j0] = x0 * c - x1 * s
            ref[t, :, j1] = x0 * s + x1 * c
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.integers(1, 6), st.integers(1, 5))
def test_binary_broadcast_and_get_rows(cpu, data, n, rows):
    a = _arr(data.draw, (3, rows, 2 * n))
    b = _arr(data.draw, (1, rows, n))
    ctx = Context()
    at, bt = _input(ctx, "f32", a, "a"), _input(ctx, "f32", b, "b")
    got, _ = _run(cpu, ctx, ops.add(ctx, at, bt), [(at, a), (bt, b)])
    np.testing.assert_array_equal(got.reshape(a.shape), a + np.tile(b, (3, 1, 2)))

    ids = np.array([rows - 1, 0], dtype=np.int32)
    w = a[0]
    ctx = Context()
    wt, it = _input(ctx, "f32", w, "w"), _input(ctx, "i32", ids, "ids")
    got, _ = _run(cpu, ctx, ops.get_rows(ctx, wt, it), [(wt, w), (it, ids)])
    np.testing.assert_array_equal(got.reshape(2, -1), w[ids])


@functools.cache
def _libm():
    # (find_library runs ldconfig: once, not per call of a hypothesis test)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype, libm.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return libm


def _libm_powf(x, y):
    return np.float32(_libm().powf(x, y))


@pytest.mark.parametrize("n_dims", [8, 64, 128])
def test_rope_cache_theta_is_float32_product(n_dims):
    # theta_scale is C's powf (numpy 2.4's float32 power ufunc is one ulp off at n_dims 64)
    cos, sin = rope_cache(np.array([5], np.int32), n_dims, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 0)
    theta = np.float32(5)
    scale = _libm_powf(10000.0, np.float32(-2.0) / np.float32(n_dims))
    assert numerics.rope_theta_scale(10000.0, n_dims) == scale
    for i in range(n_dims // 2):
        assert cos[0, i] == np.cos(theta) and sin[0, i] == np.sin(theta)
        theta = np.float32(theta * scale)


@given(st.floats(2.0 ** -10, 2.0 ** 20, width=32), st.floats(-8, 8, width=32))
def test_powf_is_libm_powf(x, y):
    assert numerics.powf(x, y) == _libm_powf(x, y)


def test_ops_keeps_the_shared_numerics_under_its_names():
    # numerics.py is where they live; `ops.powf` and friends still name them
    for name in ("f32_bits", "bits_f32", "powf", "rope_theta_scale", "rope_yarn_corr_dims",
                 "alibi_bases"):
        assert getattr(ops, name) is getattr(numerics, name)


@given(st.integers(1, 64), st.floats(0.125, 16, width=32))
def test_alibi_slopes_are_ggmls(n_head, max_bias):
    # ggml_compute_forward_soft_max_f32's slopes, powf by powf
    from ggml_py.backends.cpu.numpy_kernels import _alibi_slopes
    m0, m1, n_head_log2 = numerics.alibi_bases(n_head, max_bias)
    assert m0 == _libm_powf(2.0, np.float32(-max_bias) / np.float32(n_head_log2))
    want = [_libm_powf(m0, h + 1) if h < n_head_log2 else _libm_powf(m1, 2 * (h - n_head_log2) + 1)
            for h in range(n_head)]
    np.testing.assert_array_equal(_alibi_slopes(n_head, max_bias), np.array(want, np.float32))


def test_cpy_into_view_writes_destination(cpu):
    ctx = Context()
    cache = ops.new_tensor(ctx, "f16", [8, 4], name="cache")
    src = ops.new_tensor(ctx, "f32", [8, 2], name="src")
    view = ops.view_2d(ctx, cache, 8, 2, cache.nb[1], cache.nb[1])
    out = ops.cpy(ctx, src, view)
    x = np.arange(16, dtype=np.float32).reshape(2, 8) + 0.1
    alloc = opscheck.HostAllocation(cpu)
    alloc.alloc(cache)
    cpu.set_tensor(cache, np.zeros((4, 8), np.float16).tobytes())
    _run(cpu, ctx, out, [(src, x)])
    back = np.frombuffer(cpu.get_tensor(cache), np.float16).reshape(4, 8)
    np.testing.assert_array_equal(back[1:3], x.astype(np.float16))
    assert not back[0].any() and not back[3].any()


# ---------------------------------------------------------------------------
# builder validation and backend facts

def test_builders_raise_graph_error():
    ctx = Context()
    a = ops.new_tensor(ctx, "f32", [32, 4], name="a")
    b = ops.new_tensor(ctx, "f32", [16, 4], name="b")
    with pytest.raises(GraphError, match="MUL_MAT.*'b'"):
        ops.mul_mat(ctx, a, b)
    with pytest.raises(GraphError, match="ADD"):
        ops.add(ctx, b, a)
    with pytest.raises(GraphError, match="CONCAT"):
        ops.concat(ctx, a, ops.new_tensor(ctx, "f16", [32, 4]), 0)
    with pytest.raises(GraphError, match="ROPE"):
        ops.rope_ext(ctx, ops.new_tensor(ctx, "f32", [16, 2, 3]), ops.new_tensor(ctx, "i32", [4]),
                     None, 16, "NEOX")
    with pytest.raises(GraphError, match="CPY"):
        ops.cpy(ctx, a, b)
    with pytest.raises(GraphError, match="RESHAPE"):
        ops.reshape_2d(ctx, ops.transpose(ctx, a), 4, 32)
    with pytest.raises(GraphError, match="GET_ROWS"):
        ops.get_rows(ctx, a, ops.new_tensor(ctx, "f32", [3]))
    with pytest.raises(GraphError, match="SOFT_MAX"):
        ops.soft_max_ext(ctx, a, None, 1.0, 8.0)


def test_shapes_and_params():
    ctx = Context()
    a = ops.new_tensor(ctx, "f32", [64, 6, 4], name="a")
    t = ops.soft_max_ext(ctx, a, None, 0.125, 0.0)
    assert t.op_params[:2] == [ops.f32_bits(0.125), 0]
    g = ops.swiglu(ctx, a)
    assert g.ne == (32, 6, 4, 1) and g.op_params[:2] == [2, 0]
    assert ops.top_k(ctx, a, 3).ne == (3, 6, 4, 1)
    v = ops.argsort_top_k(ctx, a, 2)
    assert v.op == "VIEW" and v.ne == (2, 6, 4, 1) and v.view_src.op == "ARGSORT"
    fa = ops.flash_attn_ext(ctx, ops.new_tensor(ctx, "f32", [64, 5, 4]),
                            ops.new_tensor(ctx, "f16", [64, 16, 2]),
                            ops.new_tensor(ctx, "f16", [32, 16, 2]), None, 0.125)
    assert fa.ne == (32, 4, 5, 1)
    assert ops.arange(ctx, 0.0, 1.0, 0.1).ne == (10, 1, 1, 1)
    for start, stop, step in [(0, 10, 0.0), (0, 10, -1.0), (0, 10, float("nan")),
                              (-3e38, 3e38, 1.0), (0, 10, 1e-45)]:     # ggml: a cast of inf
        with pytest.raises(GraphError, match="not a finite, positive number of values"):
            ops.arange(ctx, start, stop, step)


def test_supports_op_table():
    cpu = CPUBackend()
    assert cpu.device_type == "cpu"
    assert cpu.buffer_type.name == "CPU" and cpu.buffer_type.alignment == 32
    assert cpu.buffer_type.is_host
    ctx = Context()
    a = ops.new_tensor(ctx, "f32", [32, 4])
    assert cpu.supports_op(ops.mul_mat(ctx, a, a))
    assert cpu.supports_op(ops.rms_norm(ctx, a, 1e-5))
    assert not cpu.supports_op(ctx.new_op("CONV_2D", [a], "f32", (4, 32)))
    assert "VIEW" in SUPPORTED_OPS and "GLU" in SUPPORTED_OPS
    from ggml_py._backend import BufferType
    assert cpu.supports_buft(cpu.buffer_type)
    assert cpu.supports_buft(BufferType("OtherHost", is_host=True))
    assert not cpu.supports_buft(BufferType("Device", is_host=False))


def test_set_get_tensor_roundtrip():
    cpu = CPUBackend()
    ctx = Context()
    t = ops.new_tensor(ctx, "f32", [4, 2])
    alloc = opscheck.HostAllocation(cpu)
    alloc.alloc(t)
    x = np.arange(8, dtype=np.float32)
    cpu.set_tensor(t, x.tobytes())
    assert cpu.get_tensor(t) == x.tobytes()
    assert cpu.get_tensor(t, 4, 8) == x[1:3].tobytes()
    assert t.data_address % 32 == 0


def test_mrope_with_equal_positions_is_neox(cpu):
    d, n_head, n_tok = 16, 2, 3
    x = np.random.default_rng(1).uniform(-1, 1, (n_tok, n_head, d)).astype(np.float32)
    pos = np.array([0, 4, 9], np.int32)
    ctx = Context()
    a = _input(ctx, "f32", x)
    p1 = _input(ctx, "i32", pos, "pos")
    neox = ops.rope_ext(ctx, a, p1, None, d, "NEOX", 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    r1, keep = _run(cpu, ctx, neox, [(a, x), (p1, pos)])
    for mode, secs in (("MROPE", [2, 3, 3, 0]), ("IMROPE", [3, 3, 2, 0])):
        ctx2 = Context()
        a2 = _input(ctx2, "f32", x)
        q4 = _input(ctx2, "i32", np.tile(pos, 4), "pos4")
        mr = ops.rope_multi(ctx2, a2, q4, None, d, secs, mode, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        assert mr.op_params[11:15] == secs
        r2, _ = _run(cpu, ctx2, mr, [(a2, x), (q4, np.tile(pos, 4))])
        np.testing.assert_array_equal(r1, r2)


def test_soft_max_sinks_and_swiglu_oai(cpu):
    x = np.random.default_rng(2).uniform(-2, 2, (1, 2, 3, 8)).astype(np.float32)
    sk = np.array([0.5, -1.0], np.float32)
    ctx = Context()
    a = _input(ctx, "f32", x)
    s = _input(ctx, "f32", sk, "sinks")
    t = ops.soft_max_ext(ctx, a, None, 1.0, 0.0)
    ops.soft_max_add_sinks(t, s)
    got, _ = _run(cpu, ctx, t, [(a, x), (s, sk)])
    z = x.astype(np.float64)
    m = np.maximum(z.max(-1, keepdims=True), sk[None, :, None, None])
    e = np.exp(z - m)
    ref = e / (e.sum(-1, keepdims=True) + np.exp(sk[None, :, None, None] - m))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)

    ctx = Context()
    a = _input(ctx, "f32", x)
    b = _input(ctx, "f32", -x, "b")
    t = ops.swiglu_oai(ctx, a, b, 1.702, 1.5)
    assert t.op_params[:4] == [3, 0, ops.f32_bits(1.702), ops.f32_bits(1.5)]
    got, _ = _run(cpu, ctx, t, [(a, x), (b, -x)])
    xx = np.minimum(x, 1.5)
    ref = xx / (1 + np.exp(-1.702 * xx)) * (np.clip(-x, -1.5, 1.5) + 1)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["cpu", "numpy_device"])
def test_acc_past_its_tensor_is_a_clear_error(name):
    """ggml's CPU kernel asserts that b's region fits in a (and aborts); here the compute
    raises, naming the op, both tensors and the bytes (found by test_op_variants.py: a
    variant that ggml's RPC server aborted on)."""
    backend = opscheck.make_backend(name)
    ctx = Context()
    a, b = ops.new_tensor(ctx, "f32", (18, 5, 8, 9), name="a"), ops.new_tensor(ctx, "f32", (6, 8, 8, 9), name="b")
    out = ops.acc(ctx, a, b, 72, 360, 2880, 80)
    g, _alloc = opscheck.prepare(backend, out, [(a, np.zeros((9, 8, 5, 18), np.float32)),
                                                 (b, np.ones((9, 8, 8, 6), np.float32))])
    with pytest.raises(GgmlPyError, match=r"ACC .*'b' \[6, 8, 8, 9\] added at byte offset 80 .*"
                                          r"reaches byte 26168 of 'a', which has 25920"):
        backend.graph_compute(g)
        backend.synchronize()
    # within a, the same strides add b where ggml does
    small = ops.new_tensor(ctx, "f32", (6, 4, 8, 9), name="small")
    out = ops.acc(ctx, a, small, 72, 360, 2880, 80)
    g, _alloc = opscheck.prepare(backend, out, [(a, np.zeros((9, 8, 5, 18), np.float32)),
                                                 (small, np.ones((9, 8, 4, 6), np.float32))])
    backend.graph_compute(g)
    backend.synchronize()
    got = opscheck.read_tensor(backend, out).reshape(-1)
    assert got.sum() == small.nelements and got[20:26].tolist() == [1.0] * 6 and got[19] == 0
