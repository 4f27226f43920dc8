"""The CPU backend's compiled executor (ggml_py.backends.cpu._executor, over
src/ggml_py/backends/cpu/kernels): its C kernels against the numpy kernels on random shapes,
the AVX2 and baseline loops, threads, plans that must never run stale, errors instead of
crashes, the BLAS path and the scheduler's fast path."""

import json
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from conftest import ops_dir
from ggml_py import ops, quants, _quants
from ggml_py.tools import opscheck
from ggml_py._backend import BufferType, fake_buffer, host_buffer, set_buffer
from ggml_py._core import Context, Graph
from ggml_py.backends.cpu import (CPUBackend, KERNELS, NUMPY_KERNELS, isa, isa_supported,
                                  set_isa, tensor_array)
from ggml_py.runtime import time_graph_compute
from ggml_py.backends.cpu import blas
from ggml_py.errors import AllocationError, ArgumentError, ArgumentTypeError
from ggml_py.errors import ComputeError
from ggml_py.runtime import Status
from ggml_py.sched import Scheduler

FAST = CPUBackend(n_threads=1)
REF = CPUBackend(n_threads=1, compiled=False)
FLOAT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
HYP = dict(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _arr(seed, shape, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


def _tensor(ctx, type_name, values, name):
    """A tensor of numpy-order `values` (float32) stored as `type_name`; (tensor, feed)."""
    ne = list(reversed(values.shape)) + [1] * (4 - values.ndim)
    t = ops.new_tensor(ctx, type_name, ne, name=name)
    if type_name in ("i32", "i64"):
        return t, values.astype(quants.PLAIN_DTYPES[type_name])
    return t, quants.from_f32(type_name, values, cpu=False) if type_name != "f32" else values


def _both(out, feeds, expect_c=True):
    """out computed by the C kernels and by the numpy kernels: (fast, reference)."""
    g, alloc = opscheck.prepare(FAST, out, feeds)
    FAST.graph_compute(g)
    if expect_c:
        assert FAST.executor.cplan_of(g).kinds()[-1] == "c", f"{out.op} did not run in C"
    fast = np.array(tensor_array(out))
    REF.graph_compute(g)
    ref = np.array(tensor_array(out))
    return _values(out.type, fast), _values(out.type, ref)


def _values(type_name, a):
    if type_name in ("i32", "i64"):
        return a
    return quants.to_f32(type_name, np.ascontiguousarray(a)).astype(np.float64)


# ops that look f16-rounded inputs up in a table of f16 values (ggml_table_gelu_f16 and
# friends): libm's expf and tanhf, which build the C kernels' tables as they build ggml's,
# and numpy's exp and tanh differ in the last bit of some float32 results, and that
# rounds a table entry now and then to the next f16 value: one f16 step apart at most
F16_TABLE_OPS = ("GELU", "GELU_QUICK", "GEGLU", "GEGLU_QUICK")
F16_STEP = 2.0 ** -10           # relative


def _close(fast, ref, type_name, rtol=2e-6, atol_floor=1e-30, f16_table=False):
    """fast against ref, to the tolerance of type_name's storage (rtol, atol_floor for
    float32); with f16_table (F16_TABLE_OPS), a float32 element may be one f16 step off
    instead, and atol_floor bounds the absolute error of a stored type too (the tables'
    float32 cancellation in their tails)."""
    if type_name in ("i32", "i64"):
        np.testing.assert_array_equal(fast, ref)
        return
    finite = np.abs(ref[np.isfinite(ref)])
    big = finite.max() if finite.size else 0.0
    if type_name in ("f16", "bf16", "q8_0", "q4_0"):
        # one step of the stored type apart at most (float32 work, then rounding)
        scale = {"f16": 2e-3, "bf16": 1.6e-2, "q8_0": 2e-2, "q4_0": 0.3}[type_name]
        atol = scale * big + 1e-6
        np.testing.assert_allclose(fast, ref, rtol=scale,
                                   atol=max(atol, atol_floor) if f16_table else atol)
    elif f16_table:
        atol = max(rtol * big, atol_floor)
        ok = (np.isclose(fast, ref, rtol=rtol, atol=atol, equal_nan=True)
              | np.isclose(fast, ref, rtol=F16_STEP * (1 + 2.0 ** -10), atol=2.0 ** -24))
        bad = np.flatnonzero(~ok)
        assert bad.size == 0, (f"{bad.size} elements more than one f16 step apart, first at "
                               f"{bad[0]}: {fast.flat[bad[0]]} against {ref.flat[bad[0]]}")
    else:
        np.testing.assert_allclose(fast, ref, rtol=rtol, atol=max(rtol * big, atol_floor))


# ---------------------------------------------------------------------------
# C kernels against the numpy kernels

shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.integers(1, 70))


@settings(**HYP)
@given(st.data(), shapes, st.sampled_from(["ADD", "SUB", "MUL", "DIV"]),
       st.sampled_from([("f32", "f32"), ("f16", "f32"), ("f16", "f16"), ("bf16", "f32")]))
def test_binary_broadcast(data, shape, op, types):
    # b repeats over a by modulo in every dim, dim 0 included
    bshape = tuple(data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
                   for n in shape)
    seed = data.draw(st.integers(0, 2**31))
    ctx = Context()
    a, fa = _tensor(ctx, types[0], _arr(seed, shape), "a")
    b, fb = _tensor(ctx, types[1], _arr(seed + 1, bshape, 0.5, 2.0), "b")
    out = {"ADD": ops.add, "SUB": ops.sub, "MUL": ops.mul, "DIV": ops.div}[op](ctx, a, b)
    fast, ref = _both(out, [(a, fa), (b, fb)])
    _close(fast, ref, out.type)


@settings(**HYP)
@given(st.integers(0, 2**31), shapes, st.sampled_from(["f32", "f16"]),
       st.sampled_from(ops.UNARY_OPS + ("SQR", "SQRT", "CLAMP", "SCALE")))    # every unary op
def test_unary(seed, shape, type_name, op):
    ctx = Context()
    lo = 0.0 if op == "SQRT" else -12.0
    a, fa = _tensor(ctx, type_name, _arr(seed, shape, lo, 12.0), "a")
    if op == "SQR":
        out = ops.sqr(ctx, a)
    elif op == "SQRT":
        out = ops.sqrt(ctx, a)
    elif op == "CLAMP":
        out = ops.clamp(ctx, a, -1.5, 2.5)
    elif op == "SCALE":
        out = ops.scale_bias(ctx, a, 0.75, -0.25)
    elif op == "XIELU":
        out = ops.xielu(ctx, a, 0.8, 0.8, 0.5, -1e-6)
    else:
        out = ops.unary(ctx, a, op)
    fast, ref = _both(out, [(a, fa)])
    # float32 formulas cancel in the tails (GELU's 1 + tanh(x) near x = -5 leaves a few
    # 1e-7 of a value near 1e-6): the error is absolute, at the scale of the inputs
    _close(fast, ref, out.type, rtol=2e-6, atol_floor=2e-6, f16_table=op in F16_TABLE_OPS)


@settings(**HYP)
@given(st.integers(0, 2**31), shapes, st.sampled_from(["RMS_NORM", "NORM"]), st.booleans())
def test_norms_on_views(seed, shape, op, view):
    ctx = Context()
    wide = shape[:-1] + (shape[-1] + 3,) if view else shape
    a, fa = _tensor(ctx, "f32", _arr(seed, wide, -10, 10), "a")
    x = ops.view_4d(ctx, a, shape[2], shape[1], shape[0], 1, a.nb[1], a.nb[2], a.nb[3], 4) \
        if view else a
    out = (ops.rms_norm if op == "RMS_NORM" else ops.norm)(ctx, x, 1e-5)
    fast, ref = _both(out, [(a, fa)])
    # NORM's mean is a float32 in ggml (and C), a float64 in numpy: x - mean cancels
    _close(fast, ref, "f32", rtol=1e-5 if op == "RMS_NORM" else 1e-4)


@settings(**HYP)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 5), st.integers(1, 6),
       st.sampled_from([None, "f32", "f16"]), st.sampled_from([0.0, 8.0]), st.booleans())
def test_soft_max(seed, n, rows, heads, mask_type, max_bias, sinks):
    ctx = Context()
    a, fa = _tensor(ctx, "f32", _arr(seed, (heads, rows, n), -5, 5), "a")
    feeds = [(a, fa)]
    mask = None
    if mask_type:
        m = np.where(_arr(seed + 1, (1, rows + 2, n)) > 1.5, -np.inf, _arr(seed + 2, (1, rows + 2, n)))
        m[..., 0] = 0.0                                 # never a whole row of -inf
        mask, fm = _tensor(ctx, mask_type, m.astype(np.float32), "mask")
        feeds.append((mask, fm))
    out = ops.soft_max_ext(ctx, a, mask, 0.7, max_bias if mask is not None else 0.0)
    if sinks:
        s, fs = _tensor(ctx, "f32", _arr(seed + 3, (heads,)), "sinks")
        feeds.append((s, fs))
        ops.soft_max_add_sinks(out, s)
    fast, ref = _both(out, feeds)
    _close(fast, ref, "f32", rtol=2e-6)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from([16, 32, 64]), st.integers(1, 4), st.integers(1, 7),
       st.sampled_from(["NORMAL", "NEOX"]), st.sampled_from(["f32", "f16"]), st.booleans(),
       st.sampled_from([0.0, 0.5]))
def test_rope(seed, d, heads, tokens, mode, type_name, partial, ext_factor):
    ctx = Context()
    a, fa = _tensor(ctx, type_name, _arr(seed, (tokens, heads, d)), "a")
    pos, fp = _tensor(ctx, "i32", np.random.default_rng(seed).integers(0, 500, tokens), "pos")
    n_dims = d // 2 if partial else d
    ff, feeds = None, [(a, fa), (pos, fp)]
    if seed % 3 == 0:       # a factor per pair of the row, or per rotated pair (phi3's)
        n_ff = d // 2 if seed % 2 else n_dims // 2
        ff, fff = _tensor(ctx, "f32", _arr(seed, (n_ff,), 1.0, 4.0), "ff")
        feeds.append((ff, fff))
    out = ops.rope_ext(ctx, a, pos, ff, n_dims, mode, 4096, 10000.0, 0.5, ext_factor, 1.0,
                       32.0, 1.0)
    fast, ref = _both(out, feeds)
    _close(fast, ref, type_name, rtol=1e-5)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from([32, 64]), st.integers(1, 3), st.integers(1, 5),
       st.sampled_from(["MROPE", "IMROPE", "VISION"]),
       st.lists(st.integers(0, 6), min_size=4, max_size=4).filter(lambda s: sum(s) > 0))
def test_rope_multi_section(seed, d, heads, tokens, mode, sections):
    ctx = Context()
    a, fa = _tensor(ctx, "f32", _arr(seed, (tokens, heads, d)), "a")
    pos, fp = _tensor(ctx, "i32", np.random.default_rng(seed).integers(0, 300, 4 * tokens), "pos")
    n_dims = d // 2 if mode == "VISION" else d
    out = ops.rope_multi(ctx, a, pos, None, n_dims, sections, mode, 4096, 10000.0, 1.0, 0.0,
                         1.0, 32.0, 1.0)
    fast, ref = _both(out, [(a, fa), (pos, fp)])
    _close(fast, ref, "f32", rtol=1e-5)


@settings(**HYP)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 4),
       st.sampled_from(["REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK"]),
       st.sampled_from(["fused", "swapped", "split"]), st.sampled_from(["f32", "f16"]))
def test_glu(seed, nc, rows, op, form, type_name):
    if op == "SWIGLU_OAI" and (form != "split" or type_name != "f32"):
        return                      # ggml has it split and f32 only
    ctx = Context()
    a, fa = _tensor(ctx, type_name, _arr(seed, (rows, 2 * nc), -12, 12), "a")
    feeds = [(a, fa)]
    if form == "split":
        b, fb = _tensor(ctx, type_name, _arr(seed + 1, (rows, 2 * nc)), "b")
        feeds.append((b, fb))
        out = ops.swiglu_oai(ctx, a, b, 1.702, 7.0) if op == "SWIGLU_OAI" else \
            ops.glu_split(ctx, a, b, op)
    else:
        out = ops.glu(ctx, a, op, swapped=form == "swapped")
    fast, ref = _both(out, feeds)
    # (GELU's table: float32 cancellation in its tail leaves entries up to 1.8e-7 apart
    # between libm's tanhf and numpy's tanh, an absolute error, times gates up to 12)
    table = op in F16_TABLE_OPS
    _close(fast, ref, type_name, rtol=1e-5, atol_floor=2.5e-6 if table else 1e-30,
           f16_table=table)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from(FLOAT_TYPES + ("i32",)), st.integers(1, 6),
       st.integers(1, 3))
def test_get_rows(seed, type_name, n_ids, mats):
    ctx = Context()
    vals = _arr(seed, (mats, 9, 64), -100, 100).round() if type_name == "i32" else \
        _arr(seed, (mats, 9, 64))
    a, fa = _tensor(ctx, type_name, vals, "a")
    ids, fi = _tensor(ctx, "i32", np.random.default_rng(seed).integers(0, 9, (mats, n_ids)), "ids")
    out = ops.get_rows(ctx, a, ids)
    fast, ref = _both(out, [(a, fa), (ids, fi)])
    _close(fast, ref, out.type, rtol=0)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from(FLOAT_TYPES), st.sampled_from(["i32", "i64"]),
       st.integers(1, 5))
def test_set_rows(seed, type_name, idx_type, n):
    ctx = Context()
    dst, fd = _tensor(ctx, type_name, _arr(seed, (2, 8, 64)), "dst")
    src, fs = _tensor(ctx, "f32", _arr(seed + 1, (2, n, 64)), "src")
    rows = np.random.default_rng(seed).permutation(8)[:n]
    idx, fi = _tensor(ctx, idx_type, np.stack([rows, rows[::-1]]), "idx")
    out = ops.set_rows(ctx, dst, src, idx)
    fast, ref = _both(out, [(dst, fd), (src, fs), (idx, fi)])
    _close(fast, ref, type_name, rtol=0)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from(FLOAT_TYPES), st.sampled_from(FLOAT_TYPES),
       st.sampled_from(["same", "permuted", "reshaped"]))
def test_copies_between_types(seed, src_type, dst_type, layout):
    if (layout != "same" and src_type in ("q8_0", "q4_0")):
        return                          # block sources are copied row by row only
    ctx = Context()
    a, fa = _tensor(ctx, src_type, _arr(seed, (3, 4, 64)), "a")
    x = ops.permute(ctx, a, 0, 2, 1, 3) if layout == "permuted" else a
    if dst_type in ("q8_0", "q4_0") or layout != "reshaped":
        out = ops.cpy(ctx, x, ops.new_tensor(ctx, dst_type, x.ne, name="dst"))
    else:
        out = ops.cpy(ctx, x, ops.new_tensor(ctx, dst_type, [32, 24, 1, 1], name="dst"))
    fast, ref = _both(out, [(a, fa)])
    _close(fast, ref, dst_type, rtol=0)


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from(FLOAT_TYPES), st.integers(1, 3),
       st.integers(1, 40), st.integers(1, 37), st.sampled_from([1, 2]), st.booleans())
def test_mul_mat(seed, wtype, k32, n, m, bcast, view_src1):
    k = 32 * k32
    ctx = Context()
    w, fw = _tensor(ctx, wtype, _arr(seed, (2, m, k), -1, 1), "w")
    x, fx = _tensor(ctx, "f32", _arr(seed + 1, (2 * bcast, n + 2, k), -1, 1), "x")
    xs = ops.view_3d(ctx, x, k, n, 2 * bcast, x.nb[1], x.nb[2], x.nb[1]) if view_src1 else x
    out = ops.mul_mat(ctx, w, xs)
    fast, ref = _both(out, [(w, fw), (x, fx)])
    np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@settings(**HYP)
@given(st.integers(0, 2**31), st.sampled_from(FLOAT_TYPES), st.integers(1, 9),
       st.sampled_from([1, 2]))
def test_mul_mat_id(seed, wtype, n_tok, n_used):
    ctx = Context()
    w, fw = _tensor(ctx, wtype, _arr(seed, (5, 24, 64), -1, 1), "w")
    x, fx = _tensor(ctx, "f32", _arr(seed + 1, (n_tok, seed % 2 + (n_used if seed % 2 == 0 else 0) or 1, 64)),
                    "x")
    rng = np.random.default_rng(seed)
    ids, fi = _tensor(ctx, "i32", np.stack([rng.permutation(5)[:n_used] for _ in range(n_tok)]), "ids")
    out = ops.mul_mat_id(ctx, w, x, ids)
    fast, ref = _both(out, [(w, fw), (x, fx), (ids, fi)])
    np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@settings(**HYP)
@given(st.integers(0, 2**31), st.integers(2, 50), st.integers(1, 4),
       st.sampled_from(["TOP_K", "ASC", "DESC", "SUM_ROWS", "MEAN", "SUM"]))
def test_rows_reductions_and_sorts(seed, n, rows, op):
    ctx = Context()
    vals = np.random.default_rng(seed).permutation(n * rows).reshape(rows, n).astype(np.float32)
    a, fa = _tensor(ctx, "f32", vals / 7, "a")
    if op == "TOP_K":
        out = ops.top_k(ctx, a, max(1, n // 3))
    elif op in ("ASC", "DESC"):
        out = ops.argsort(ctx, a, op)
    else:
        out = {"SUM_ROWS": ops.sum_rows, "MEAN": ops.mean, "SUM": ops.sum}[op](ctx, a)
    fast, ref = _both(out, [(a, fa)])
    _close(fast, ref, out.type, rtol=1e-6)


@settings(**HYP)
@given(st.integers(0, 2**31), shapes, st.sampled_from(["REPEAT", "CONCAT", "PAD", "DIAG_MASK_INF"]),
       st.integers(0, 3))
def test_shape_ops(seed, shape, op, dim):
    ctx = Context()
    a, fa = _tensor(ctx, "f32", _arr(seed, shape), "a")
    feeds = [(a, fa)]
    if op == "REPEAT":
        out = ops.repeat(ctx, a, ops.new_tensor(ctx, "f32", [a.ne[0] * 2, a.ne[1], a.ne[2] * 3,
                                                             a.ne[3] * 2]))
    elif op == "CONCAT":
        ne = list(a.ne)
        ne[dim] += 2
        b = ops.new_tensor(ctx, "f32", ne[:dim] + [2] + ne[dim + 1:], name="b")
        feeds.append((b, _arr(seed + 1, tuple(reversed(b.ne)))))
        out = ops.concat(ctx, a, b, dim)
    elif op == "PAD":
        out = ops.pad_ext(ctx, a, 1, 2, 0, 1, 2, 0, 0, 1, circular=bool(seed % 2))
    else:
        out = ops.diag_mask_inf(ctx, a, seed % 4)
    fast, ref = _both(out, feeds)
    _close(fast, ref, "f32", rtol=0)


def test_every_op_case_with_the_baseline_loops():
    """The op cases pass with the plain C loops too (as on a CPU without AVX2)."""
    cases = []
    for path in sorted(ops_dir().glob("**/*.json")):
        cases += [c for kind, c in opscheck.load_cases(str(path)) if kind == "op"]
    before = isa()
    try:
        set_isa("baseline")
        failed = [r["name"] for r in (opscheck.run_case(c, FAST) for c in cases) if not r["passed"]]
    finally:
        set_isa(before)
    assert not failed


# ---------------------------------------------------------------------------
# instruction sets

needs_avx2 = pytest.mark.skipif(not isa_supported("avx2"), reason="this CPU has no AVX2")
ISAS = ("baseline", "avx2", "avx512")


@needs_avx2
def test_conversions_are_bit_identical_across_instruction_sets():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(0)
    floats = np.concatenate([rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
                             .view(np.float32),
                             np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 6e-8,
                                       -3e-5, 1e-40], np.float32)])
    out = {}
    before = isa()
    try:
        for name in [i for i in ISAS if isa_supported(i)]:
            set_isa(name)
            out[name] = (_quants.f16_to_f32(halves).view(np.uint32),
                         _quants.f32_to_f16(floats).view(np.uint16),
                         _quants.round_f16(floats).view(np.uint32))
    finally:
        set_isa(before)
    for name in out:
        for a, b in zip(out["baseline"], out[name]):
            np.testing.assert_array_equal(a, b)


@needs_avx2
@pytest.mark.parametrize("wtype", FLOAT_TYPES)
def test_matmul_loops_agree_across_instruction_sets(wtype):
    ctx = Context()
    w, fw = _tensor(ctx, wtype, _arr(1, (70, 96), -1, 1), "w")
    x, fx = _tensor(ctx, "f32", _arr(2, (13, 96), -1, 1), "x")
    out = ops.mul_mat(ctx, w, x)
    g, alloc = opscheck.prepare(FAST, out, [(w, fw), (x, fx)])
    res = {}
    before = isa()
    try:
        for name in [i for i in ISAS if isa_supported(i)]:
            set_isa(name)
            FAST.graph_compute(g)
            res[name] = np.array(tensor_array(out))
    finally:
        set_isa(before)
    # the same lanes and sums; only FMA's single rounding differs, and AVX-512's build is
    # the AVX2 code with other encodings
    np.testing.assert_allclose(res["avx2"], res["baseline"], rtol=1e-5, atol=1e-5)
    if "avx512" in res:
        np.testing.assert_array_equal(res["avx512"], res["avx2"])


def test_unknown_instruction_set():
    with pytest.raises(ValueError, match="instruction sets"):
        set_isa("avx9000")


# ---------------------------------------------------------------------------
# threads: the same bits whatever the thread count

def _mixed_graph(ctx, n_tok=24, n_embd=256):
    """Big enough that matmuls, rope, softmax, glu and norms are shared between threads."""
    rng = np.random.default_rng(7)
    feeds = []

    def t(type_name, shape, name, lo=-1, hi=1):
        tt, f = _tensor(ctx, type_name, rng.uniform(lo, hi, shape).astype(np.float32), name)
        feeds.append((tt, f))
        return tt
    x = t("f32", (n_tok, n_embd), "x")
    h = ops.rms_norm(ctx, x, 1e-5)
    outs = []
    for wt in FLOAT_TYPES:
        w = t(wt, (2 * n_embd, n_embd), f"w_{wt}")
        outs.append(ops.mul_mat(ctx, w, h))
    g = ops.glu_split(ctx, outs[1], outs[2], "SWIGLU")
    q = ops.reshape_3d(ctx, outs[0], 64, 2 * n_embd // 64, n_tok)
    pos_t, fp = _tensor(ctx, "i32", np.arange(n_tok), "pos")
    feeds.append((pos_t, fp))
    q = ops.rope_ext(ctx, q, pos_t, None, 64, "NEOX", 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    kq = ops.mul_mat(ctx, ops.permute(ctx, q, 0, 2, 1, 3), ops.permute(ctx, q, 0, 2, 1, 3))
    sm = ops.soft_max_ext(ctx, kq, None, 0.125, 0.0)
    experts = t("q8_0", (4, 64, n_embd), "experts")
    ids_t, fi = _tensor(ctx, "i32", np.stack([[i % 4, (i + 1) % 4] for i in range(n_tok)]), "ids")
    feeds.append((ids_t, fi))
    moe = ops.mul_mat_id(ctx, experts, ops.reshape_3d(ctx, h, n_embd, 1, n_tok), ids_t)
    return [sm, g, outs[3], outs[4], moe], feeds


@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_results_do_not_depend_on_threads(n_threads):
    ctx = Context()
    outs, feeds = _mixed_graph(ctx)
    one, many = CPUBackend(n_threads=1), CPUBackend(n_threads=n_threads)
    g, alloc = opscheck.prepare(one, outs[0], feeds, graph_size=256)
    for o in outs[1:]:
        g.build_forward_expand(o)
    alloc.alloc_graph(g)
    one.graph_compute(g)
    first = [np.array(tensor_array(o)) for o in outs]
    many.graph_compute(g)
    assert max(many.executor.cplan_of(g).n_tasks()) == n_threads     # really shared
    for o, a in zip(outs, first):
        np.testing.assert_array_equal(np.array(tensor_array(o)), a)


def test_default_threads_and_setter():
    cpu = CPUBackend()
    assert cpu.n_threads >= 1
    cpu.n_threads = 3
    assert cpu.n_threads == 3
    for bad in (0, 513, 2**31, 2**63):     # ggml's GGML_MAX_N_THREADS is 512
        with pytest.raises(ArgumentError, match=rf"n_threads must be in \[1, 512\], got {bad}"):
            cpu.n_threads = bad
        with pytest.raises(ArgumentError, match="n_threads"):
            CPUBackend(n_threads=bad)
    with pytest.raises(ArgumentTypeError, match="n_threads"):
        cpu.n_threads = 1.5                 # (it was truncated to 1)
    assert cpu.n_threads == 3


def _small_mixed(cpu, which):
    """A small _mixed_graph computed once on cpu: (graph, output, its bytes, allocation)."""
    ctx = Context()
    outs, feeds = _mixed_graph(ctx, n_tok=8, n_embd=128)
    g, alloc = opscheck.prepare(cpu, outs[which], feeds, graph_size=256)
    cpu.graph_compute(g)
    return g, outs[which], np.array(tensor_array(outs[which])).tobytes(), alloc


def test_concurrent_computes_on_one_backend():
    cpu = CPUBackend(n_threads=2)
    g, out, want, alloc = _small_mixed(cpu, 1)
    errors = []

    def work():
        try:
            for _ in range(20):
                cpu.graph_compute(g)
                assert np.array(tensor_array(out)).tobytes() == want
        except Exception as e:          # reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
# (Python 3.12 and newer warn of fork() in a process with threads: the point of the test)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_computes_without_the_parents_threads():
    cpu = CPUBackend(n_threads=2)
    g, out, want, alloc = _small_mixed(cpu, 2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                    # the child: its pool's workers stayed in the parent
        try:
            cpu.graph_compute(g)
            os.write(w, b"ok" if np.array(tensor_array(out)).tobytes() == want else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"ok"
    cpu.graph_compute(g)            # the parent's pool still works


# ---------------------------------------------------------------------------
# plans: made once, never stale

def _scale_graph(cpu, vals):
    ctx = Context()
    a, fa = _tensor(ctx, "f32", vals, "a")
    out = ops.scale(ctx, ops.add(ctx, a, a), 0.5)
    g, alloc = opscheck.prepare(cpu, out, [(a, fa)])
    return ctx, a, out, g, alloc


def test_plan_is_reused_while_the_graph_is_unchanged():
    cpu = CPUBackend(n_threads=1)
    _, a, out, g, alloc = _scale_graph(cpu, _arr(0, (4, 8)))
    for _ in range(5):
        cpu.graph_compute(g)
    assert cpu.executor.n_builds == 1 and cpu.executor.n_reuses == 4


def test_stale_plans_are_impossible():
    cpu = CPUBackend(n_threads=1)
    vals = _arr(0, (4, 8))
    ctx, a, out, g, alloc = _scale_graph(cpu, vals)
    cpu.graph_compute(g)
    np.testing.assert_allclose(np.array(tensor_array(out))[0, 0], vals)
    # the input moves to a new buffer with other data: the plan sees the new pointer
    other = host_buffer(cpu.buffer_type, a.nbytes)
    set_buffer(a, other)
    cpu.set_tensor(a, (vals * 3).tobytes())
    cpu.graph_compute(g)
    np.testing.assert_allclose(np.array(tensor_array(out))[0, 0], vals * 3)
    # an op parameter changes
    out.set_op_params([ops.f32_bits(0.25), 0])
    cpu.graph_compute(g)
    np.testing.assert_allclose(np.array(tensor_array(out))[0, 0], vals * 1.5)
    # an op changes
    add = out.src[0]
    add.op = "MUL"
    cpu.graph_compute(g)
    np.testing.assert_allclose(np.array(tensor_array(out))[0, 0], (vals * 3) ** 2 * 0.25, rtol=1e-6)
    # a kernel of the user's replaces the C one, and stops when removed again
    calls = []
    old = KERNELS["SCALE"]
    KERNELS["SCALE"] = lambda t: calls.append(t.name)
    try:
        cpu.graph_compute(g)
        assert calls == [out.name]
    finally:
        KERNELS["SCALE"] = old
    cpu.graph_compute(g)
    assert calls == [out.name]
    assert cpu.executor.n_builds == 6


def test_shapes_changed_to_invalid_raise():
    cpu = CPUBackend(n_threads=1)
    ctx, a, out, g, alloc = _scale_graph(cpu, _arr(0, (4, 8)))
    cpu.graph_compute(g)
    out.ne = [8, 40, 1, 1]          # more rows than its buffer holds
    with pytest.raises(ComputeError, match="reaches past the end of its buffer"):
        cpu.graph_compute(g)
    out.ne = [8, 4, 1, 1]
    add = out.src[0]
    add.ne = [8, 2, 1, 1]           # no longer the shape of its source
    with pytest.raises(ComputeError, match="shape"):
        cpu.graph_compute(g)
    add.ne = [8, 4, 1, 1]
    cpu.graph_compute(g)            # and back: fine again


def test_scheduler_reallocation_recompiles():
    cpu = CPUBackend(n_threads=1)
    ctx = Context()
    x = ops.new_tensor(ctx, "f32", [16, 3], name="x").set_input()
    y = ops.scale(ctx, ops.sqr(ctx, x), 2.0).set_output()
    g = Graph(32).build_forward_expand(y)
    sched = Scheduler([cpu], graph_size=32)
    results = []
    for k in range(4):
        sched.reset()
        sched.alloc_graph(g)
        cpu.set_tensor(x, np.full((3, 16), k, np.float32).tobytes())
        assert sched.graph_compute(g) == Status.SUCCESS
        results.append(float(np.array(tensor_array(y))[0, 0, 0, 0]))
    assert results == [2.0 * k * k for k in range(4)]


def test_rope_cache_follows_the_positions():
    """The cos/sin cache is keyed by the positions' values: a decode step with new
    positions in the same plan must not reuse the old rows."""
    cpu = CPUBackend(n_threads=1)
    ctx = Context()
    a, fa = _tensor(ctx, "f32", _arr(3, (2, 4, 32)), "a")
    pos, fp = _tensor(ctx, "i32", np.array([3, 9]), "pos")
    out = ops.rope_ext(ctx, a, pos, None, 32, "NORMAL", 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    g, alloc = opscheck.prepare(cpu, out, [(a, fa), (pos, fp)])
    for p in ([3, 9], [4, 10], [3, 9], [100, 7]):
        cpu.set_tensor(pos, np.array(p, np.int32).tobytes())
        cpu.graph_compute(g)
        got = np.array(tensor_array(out))
        REF.graph_compute(g)
        np.testing.assert_allclose(got, np.array(tensor_array(out)), rtol=1e-6, atol=1e-6)
    assert cpu.executor.n_builds == 1


# ---------------------------------------------------------------------------
# errors instead of crashes; the backend stays usable

def test_bad_row_ids_raise_and_the_backend_recovers():
    cpu = CPUBackend(n_threads=2)
    ctx = Context()
    a, fa = _tensor(ctx, "f16", _arr(0, (5, 64)), "table")
    ids, fi = _tensor(ctx, "i32", np.array([1, 4]), "ids")
    out = ops.get_rows(ctx, a, ids)
    out.name = "rows"
    g, alloc = opscheck.prepare(cpu, out, [(a, fa), (ids, fi)])
    cpu.graph_compute(g)
    cpu.set_tensor(ids, np.array([1, 5], np.int32).tobytes())
    with pytest.raises(ComputeError, match=r"node 'rows' \(GET_ROWS\).*row id 5 out of range") as e:
        cpu.graph_compute(g)
    assert e.value.node == "rows" and e.value.backend == "CPU"
    cpu.set_tensor(ids, np.array([2, 0], np.int32).tobytes())
    cpu.graph_compute(g)


def test_bad_expert_ids_raise():
    cpu = CPUBackend(n_threads=2)
    ctx = Context()
    w, fw = _tensor(ctx, "q8_0", _arr(0, (4, 256, 256)), "experts")
    x, fx = _tensor(ctx, "f32", _arr(1, (8, 1, 256)), "x")
    ids, fi = _tensor(ctx, "i32", np.full((8, 2), 7), "ids")
    out = ops.mul_mat_id(ctx, w, x, ids)
    g, alloc = opscheck.prepare(cpu, out, [(w, fw), (x, fx), (ids, fi)])
    with pytest.raises(ComputeError, match="expert id 7 out of range"):
        cpu.graph_compute(g)


def test_tensors_outside_host_memory_raise():
    """A simulated buffer: an error, never a read; bytes past a buffer's end are refused
    when the tensor is placed there."""
    cpu = CPUBackend(n_threads=1)
    ctx = Context()
    a = ops.new_tensor(ctx, "f32", [64], name="a")
    out = ops.sqr(ctx, a)
    with pytest.raises(AllocationError, match="does not fit"):
        set_buffer(a, host_buffer(cpu.buffer_type, 64), 32)
    set_buffer(a, fake_buffer(cpu.buffer_type, 256), 0)
    g, alloc = opscheck.prepare(cpu, out, [])
    with pytest.raises(ComputeError, match="no host memory"):
        cpu.graph_compute(g)


# ---------------------------------------------------------------------------
# BLAS for large batches

def test_large_batches_go_to_blas_and_agree():
    cpu = CPUBackend(n_threads=1)
    no_blas = CPUBackend(n_threads=1, blas_min_batch={})
    ctx = Context()
    w, fw = _tensor(ctx, "f16", _arr(0, (96, 128), -1, 1), "w")
    x, fx = _tensor(ctx, "f32", _arr(1, (blas.BLAS_MIN_BATCH["f16"], 128), -1, 1), "x")
    out = ops.mul_mat(ctx, w, x)
    g, alloc = opscheck.prepare(cpu, out, [(w, fw), (x, fx)])
    cpu.graph_compute(g)
    assert cpu.executor.cplan_of(g).kinds()[-1] == "python"
    got = np.array(tensor_array(out))
    no_blas.graph_compute(g)
    assert no_blas.executor.cplan_of(g).kinds()[-1] == "c"
    np.testing.assert_allclose(got, np.array(tensor_array(out)), rtol=1e-5, atol=1e-5)


def test_blas_tiles_bound_their_memory(monkeypatch):
    monkeypatch.setattr(blas, "TILE_BYTES", 4 * 128 * 7)        # 7 rows a tile
    cpu = CPUBackend(n_threads=1, blas_min_batch={"q8_0": 1})
    ctx = Context()
    w, fw = _tensor(ctx, "q8_0", _arr(0, (2, 50, 128), -1, 1), "w")
    x, fx = _tensor(ctx, "f32", _arr(1, (4, 3, 128), -1, 1), "x")
    out = ops.mul_mat(ctx, w, x)
    fast, ref = None, None
    g, alloc = opscheck.prepare(cpu, out, [(w, fw), (x, fx)])
    cpu.graph_compute(g)
    fast = np.array(tensor_array(out))
    REF.graph_compute(g)
    np.testing.assert_allclose(fast, np.array(tensor_array(out)), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# the scheduler's fast path and whole models

class _NoNodeLists(CPUBackend):
    """A CPU backend that refuses node lists: the scheduler must use the range path."""

    def graph_compute(self, graph):
        raise AssertionError("graph_compute called with a node list")


@pytest.mark.parametrize("name", ["llama_2L", "moe_2L"])
def test_models_through_the_scheduler_fast_path(name):
    spec = json.loads((ops_dir() / "models" / f"{name}.json").read_text())
    cpu = _NoNodeLists(n_threads=2)
    ctx = Context(name)
    env = {}
    for s in spec["weights"] + spec["inputs"]:
        env[s["name"]] = t = ops.new_tensor(ctx, s["type"], s["ne"], name=s["name"][:63])
        set_buffer(t, host_buffer(cpu.buffer_type, t.nbytes))
        cpu.set_tensor(t, opscheck.decode(s["type"], s["ne"], s["data"]).tobytes())
    for c in spec["calls"]:
        ins = [None if n is None else env[n] for n in c["inputs"]]
        env[c["result"]] = opscheck._call(ctx, c["call"], ins, c.get("args", {}))
    out = env[spec["output"]["name"]].set_output()
    g = Graph(512).build_forward_expand(out)
    sched = Scheduler([cpu], graph_size=512)
    sched.alloc_graph(g)
    ref = opscheck.decode("f32", spec["output"]["ne"], spec["output"]["data"])
    for _ in range(3):
        assert sched.graph_compute(g) == Status.SUCCESS
        err, msg = opscheck.nmse(ref, np.array(tensor_array(out)))
        assert err < spec["tolerance"], msg
    plan = cpu.executor.cplan_of(g, 0, g.n_nodes)
    assert "python" not in plan.kinds()             # a decode step enters no Python kernel
    assert cpu.executor.n_builds == 1 and cpu.executor.n_reuses >= 2


def test_profiling_and_timing():
    cpu = CPUBackend(n_threads=1)
    _, a, out, g, alloc = _scale_graph(cpu, _arr(0, (4, 8)))
    cpu.executor.set_profiling(True)
    for _ in range(3):
        cpu.graph_compute(g)
    times = cpu.executor.cplan_of(g).node_times()
    assert len(times) == g.n_nodes and all(t > 0 for t in times)
    cpu.executor.set_profiling(False)
    r = time_graph_compute(cpu, g, reps=3, warmup=1)
    assert r["n_nodes"] == g.n_nodes and r["compute_us_median"] > 0


def test_numpy_kernels_are_the_defaults():
    assert KERNELS.replaced() == set()
    assert set(KERNELS) == set(NUMPY_KERNELS)
