"""MUL_MAT's q8_0 GEMM (src/ggml_py/backends/cpu/kernels/gemm-q8.c, the AVX-512 VNNI build):
from 8 src1 rows on, q8_0 weights (and q4_0 ones, widened to q8_0 a chunk at a time) are
multiplied 16 rows by 16 columns at a time, and every product is summed in ggml's generic
order, the baseline build's. So the GEMM must give the baseline's bits on any shape (ragged
rows and columns, broadcast and permuted src1), at any thread count, and the same as the
numpy kernels within MUL_MAT's bound."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from ggml_py import ops, quants
from ggml_py._core import Context, Graph
from ggml_py.backends.cpu import CPUBackend, isa, isa_supported, set_isa, tensor_array
from ggml_py.runtime import Status
from ggml_py.sched import Scheduler
from ggml_py.tools import opscheck

pytestmark = pytest.mark.skipif(not isa_supported("avx512"), reason="this CPU has no AVX-512 VNNI")

# no BLAS: the C kernels take every batch
FAST = {n: CPUBackend(n_threads=n, blas_min_batch={}) for n in (1, 2, 3, 4)}
REF = CPUBackend(n_threads=1, compiled=False)


def _arr(seed, shape):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def _q8_0(ctx, values, name, t="q8_0"):
    """A q8_0 (or t) tensor of numpy-order values [.., rows, k]; (tensor, raw feed)."""
    ne = list(reversed(values.shape)) + [1] * (4 - values.ndim)
    return ops.new_tensor(ctx, t, ne, name=name), quants.from_f32(t, values, cpu=False)


def _f32(ctx, values, name):
    ne = list(reversed(values.shape)) + [1] * (4 - values.ndim)
    return ops.new_tensor(ctx, "f32", ne, name=name), values


def _run(backend, g, out, level):
    before = isa()
    try:
        set_isa(level)
        assert backend.graph_compute(g)
    finally:
        set_isa(before)
    assert backend.executor.cplan_of(g).kinds()[-1] == "c"
    return np.array(tensor_array(out))


def _gemm_and_baseline(out, feeds, threads=1):
    """out under the AVX-512 build (the GEMM) and under the baseline, each in a cplan of
    its own (a cplan keeps the work buffer of the instruction set it was made under)."""
    fast = _run(FAST[threads], opscheck.prepare(FAST[threads], out, feeds)[0], out, "avx512")
    base = _run(FAST[1], opscheck.prepare(FAST[1], out, feeds)[0], out, "baseline")
    return fast, base


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), n=st.integers(8, 40), nb=st.integers(1, 5),
       bcast=st.sampled_from([(1, 1, 1, 1), (2, 1, 2, 1), (1, 2, 3, 2)]),
       seed=st.integers(0, 1000), t=st.sampled_from(["q8_0", "q4_0"]))
def test_gemm_is_the_baseline_bit_for_bit(m, n, nb, bcast, seed, t):
    """Ragged weight rows and columns (not multiples of 16), several matrices, weights
    broadcast over src1's matrices (ne12 / ne02, ne13 / ne03)."""
    w2, w3, r2, r3 = bcast
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(seed, (w3, w2, m, 32 * nb)), "w", t)
    x, fx = _f32(ctx, _arr(seed + 1, (w3 * r3, w2 * r2, n, 32 * nb)), "x")
    out = ops.mul_mat(ctx, w, x)
    fast, base = _gemm_and_baseline(out, [(w, fw), (x, fx)])
    np.testing.assert_array_equal(fast.view(np.uint32), base.view(np.uint32))


def test_gemm_takes_permuted_and_strided_src1():
    """src1 as a permuted view (rows strided in memory): the kernel converts src1's rows to
    q8_0 wherever they are before packing them, so it gives the bits of a packed src1."""
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(0, (3, 37, 96)), "w")
    xs, fx = _f32(ctx, _arr(1, (21, 3, 96)), "x")             # [96, 3, 21]
    xp = ops.permute(ctx, xs, 0, 2, 1, 3)                      # [96, 21, 3]: rows strided
    out = ops.mul_mat(ctx, w, xp)
    fast, base = _gemm_and_baseline(out, [(w, fw), (xs, fx)])
    np.testing.assert_array_equal(fast.view(np.uint32), base.view(np.uint32))
    ctx2 = Context()
    w2, _ = _q8_0(ctx2, _arr(0, (3, 37, 96)), "w")
    x2, _ = _f32(ctx2, np.ascontiguousarray(fx.transpose(1, 0, 2)), "x")
    packed, _ = _gemm_and_baseline(ops.mul_mat(ctx2, w2, x2),
                                   [(w2, fw), (x2, np.ascontiguousarray(fx.transpose(1, 0, 2)))])
    np.testing.assert_array_equal(fast.view(np.uint32), packed.view(np.uint32))


@pytest.mark.parametrize("t", ["q8_0", "q4_0"])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_gemm_threads_do_not_change_a_bit(threads, t):
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(3, (2, 70, 256)), "w", t)
    x, fx = _f32(ctx, _arr(4, (2, 45, 256)), "x")
    out = ops.mul_mat(ctx, w, x)
    feeds = [(w, fw), (x, fx)]
    many = _run(FAST[threads], opscheck.prepare(FAST[threads], out, feeds)[0], out, "avx512")
    one = _run(FAST[1], opscheck.prepare(FAST[1], out, feeds)[0], out, "avx512")
    np.testing.assert_array_equal(many.view(np.uint32), one.view(np.uint32))


def test_a_cplan_without_room_for_the_gemm_keeps_the_dot_tiles():
    """A cplan made under AVX2 has no work buffer for the panels: computed under AVX-512,
    it reads q8_0 with the dot tiles (the AVX2 loops' bits) instead of overrunning it."""
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(10, (24, 128)), "w")
    x, fx = _f32(ctx, _arr(11, (30, 128)), "x")
    out = ops.mul_mat(ctx, w, x)
    g, _ = opscheck.prepare(FAST[1], out, [(w, fw), (x, fx)])
    avx2 = _run(FAST[1], g, out, "avx2")
    again = _run(FAST[1], g, out, "avx512")
    np.testing.assert_array_equal(again.view(np.uint32), avx2.view(np.uint32))
    gemm, base = _gemm_and_baseline(out, [(w, fw), (x, fx)])
    assert not np.array_equal(gemm.view(np.uint32), avx2.view(np.uint32))


@pytest.mark.parametrize("t", ["q8_0", "q4_0"])
def test_gemm_matches_the_numpy_kernels(t):
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(5, (50, 1024)), "w", t)
    x, fx = _f32(ctx, _arr(6, (128, 1024)), "x")
    out = ops.mul_mat(ctx, w, x)
    g, _ = opscheck.prepare(FAST[1], out, [(w, fw), (x, fx)])
    fast = _run(FAST[1], g, out, "avx512")
    REF.graph_compute(g)
    ref = np.array(tensor_array(out))
    assert float(np.mean((fast - ref) ** 2) / np.mean(ref ** 2)) < 1e-6


def test_gemm_reads_rewritten_weights():
    """The GEMM reads the weights' bytes at every compute (nothing of them is kept between
    computes): new weights through tensor_set, then a scheduler's second run, give the
    new products."""
    cpu = FAST[2]
    ctx = Context()
    w = ops.new_tensor(ctx, "q8_0", [64, 33, 1, 1], name="w").set_input()
    x = ops.new_tensor(ctx, "f32", [64, 20, 1, 1], name="x").set_input()
    out = ops.mul_mat(ctx, w, x).set_output()
    g = Graph(16).build_forward_expand(out)
    sched = Scheduler([cpu], graph_size=16)
    fx = _arr(7, (20, 64))
    got = []
    for seed in (8, 9):
        fw = quants.from_f32("q8_0", _arr(seed, (33, 64)), cpu=False)
        sched.reset()
        sched.alloc_graph(g)
        cpu.set_tensor(w, fw.tobytes())
        cpu.set_tensor(x, fx.tobytes())
        assert sched.graph_compute(g) == Status.SUCCESS
        got.append(np.array(tensor_array(out)))
        c2 = Context()
        w2, _ = _q8_0(c2, _arr(seed, (33, 64)), "w")
        x2, _ = _f32(c2, fx, "x")
        want, _ = _gemm_and_baseline(ops.mul_mat(c2, w2, x2), [(w2, fw), (x2, fx)])
        np.testing.assert_array_equal(got[-1].reshape(want.shape).view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(got[0], got[1])


@pytest.mark.parametrize("t", ["q8_0", "q4_0"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("ne11", [1, 2])
def test_mul_mat_id_gemm_is_the_baseline_bit_for_bit(threads, ne11, t):
    """MUL_MAT_ID: experts asked for by 8 columns or more go through the GEMM (their
    columns gathered into panels), the others through the dot tiles; both the
    baseline's bits (as the dot tiles are the AVX2 loops, the sparse experts are
    checked against the AVX-512 dot tiles below 8 columns: an expert's own MUL_MAT)."""
    n_expert, n_used, n_tok, k, m = 8, 2, 29, 96, 35
    tok = np.arange(n_tok)
    ids_np = np.stack([tok % 3, 3 + tok % 5], axis=1).astype(np.int32)  # 9-10 and 5-6 columns
    ctx = Context()
    w, fw = _q8_0(ctx, _arr(12, (n_expert, m, k)), "w", t)
    x, fx = _f32(ctx, _arr(13 + ne11, (n_tok, ne11, k)), "x")
    ids = ops.new_tensor(ctx, "i32", [n_used, n_tok, 1, 1], name="ids")
    out = ops.mul_mat_id(ctx, w, x, ids)
    feeds = [(w, fw), (x, fx), (ids, ids_np)]
    fast = _run(FAST[threads], opscheck.prepare(FAST[threads], out, feeds)[0], out, "avx512")
    base = _run(FAST[1], opscheck.prepare(FAST[1], out, feeds)[0], out, "baseline")
    avx2 = _run(FAST[1], opscheck.prepare(FAST[1], out, feeds)[0], out, "avx2")
    counts = np.bincount(ids_np.ravel(), minlength=n_expert)
    assert counts.max() >= 8 and counts.min() < 8
    fast, base, avx2 = (a.reshape(n_tok, n_used, m) for a in (fast, base, avx2))
    for i in range(n_tok):
        for e in range(n_used):
            want = base if counts[ids_np[i, e]] >= 8 else avx2
            np.testing.assert_array_equal(fast[i, e].view(np.uint32), want[i, e].view(np.uint32))
