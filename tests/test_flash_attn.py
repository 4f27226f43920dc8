"""FLASH_ATTN_EXT's C kernel (src/ggml_py/backends/cpu/kernels/flash-attn.c): ggml's own op
cases through it, the numpy kernel on random shapes (masks, ALiBi, GQA, sinks, soft-capping,
K/V types), threads, and ggml 0.10.1's CPU backend live."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO_ROOT, ops_dir, require_ggml_rpc
from ggml_py import ops, quants
from ggml_py._core import Context, Graph
from ggml_py.backends.cpu._executor import C_KERNEL_OPS
from ggml_py.backends.cpu import CPUBackend, isa, isa_supported, set_isa, tensor_array
from ggml_py.backends.cpu.numpy_kernels import _fa_tiled
from ggml_py.errors import GgmlPyError
from ggml_py.tools import opscheck

FAST = CPUBackend(n_threads=1)
REF = CPUBackend(n_threads=1, compiled=False)
HYP = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0")
CASES = [c for kind, c in opscheck.load_cases(str(ops_dir() / "flash_attn_ext.json")) if kind == "op"]


def _compute(backend, out, feeds):
    g, alloc = opscheck.prepare(backend, out, feeds)
    backend.graph_compute(g)
    return g, alloc, np.array(tensor_array(out), dtype=np.float64)


def test_flash_attn_has_a_c_kernel():
    assert "FLASH_ATTN_EXT" in C_KERNEL_OPS


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ggml_cases_through_the_c_kernel(case):
    ctx = Context(case["name"])
    alloc = opscheck.HostAllocation(FAST)
    out, _ = opscheck.build_case(ctx, case, FAST, alloc)
    g = Graph(64).build_forward_expand(out)
    alloc.alloc_graph(g)
    FAST.graph_compute(g)
    assert FAST.executor.cplan_of(g).kinds()[-1] == "c"
    o = case["output"]
    ok, err, msg = opscheck.compare(case.get("compare", "nmse"), o["type"],
                                    opscheck.decode(o["type"], o["ne"], o["data"]),
                                    opscheck.read_tensor(FAST, out), float(case["tolerance"]))
    assert ok, f"{case['name']}: {err} > {case['tolerance']}: {msg}"


def _attention(ctx, rng, dk, dv, n_q, n_kv, heads_kv, gqa, n_seq, kv_type, v_type, mask_heads,
               max_bias, softcap, sinks):
    """A FLASH_ATTN_EXT node on random values and its feeds."""
    feeds = []

    def t(type_name, shape, name, values=None):
        x = rng.uniform(-1, 1, shape).astype(np.float32) if values is None else values
        ne = list(reversed(shape)) + [1] * (4 - len(shape))
        tt = ops.new_tensor(ctx, type_name, ne, name=name)
        feeds.append((tt, quants.from_f32(type_name, x, cpu=False) if type_name != "f32" else x))
        return tt
    heads = heads_kv * gqa
    q = t("f32", (n_seq, heads, n_q, dk), "q")
    k = t(kv_type, (n_seq, heads_kv, n_kv, dk), "k")
    v = t(v_type, (n_seq, heads_kv, n_kv, dv), "v")
    mask = None
    if mask_heads:
        m = rng.uniform(-2, 2, (1, mask_heads, n_q + 1, n_kv)).astype(np.float32)
        m[rng.random(m.shape) < 0.3] = -np.inf         # some rows wholly -inf, on small n_kv
        mask = t("f16", m.shape, "mask", m)
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 1.0 / np.sqrt(dk), max_bias if mask else 0.0, softcap)
    if sinks:
        ops.flash_attn_ext_add_sinks(out, t("f32", (heads,), "sinks", rng.uniform(-3, 3, heads).astype(np.float32)))
    return out, feeds


_SHAPES = st.fixed_dictionaries(dict(
    dk=st.sampled_from([32, 64, 128]), dv=st.sampled_from([32, 64, 40]),
    n_q=st.one_of(st.integers(1, 9), st.integers(64, 70)),          # (64+: ggml's tiled path)
    n_kv=st.integers(1, 150), heads_kv=st.integers(1, 3), gqa=st.sampled_from([1, 2, 4]),
    n_seq=st.integers(1, 2), mask_heads=st.sampled_from([0, 1, "all"]),
    max_bias=st.sampled_from([0.0, 8.0]), softcap=st.sampled_from([0.0, 10.0]), sinks=st.booleans()))


@settings(max_examples=40, **HYP)
@given(st.integers(0, 2**31), _SHAPES, st.sampled_from(KV_TYPES), st.booleans())
def test_c_kernel_matches_the_numpy_kernel(seed, s, kv_type, v_f16):
    """Same accumulation as the numpy kernel: only float32 sum order and exp differ (and,
    with an f16 accumulator, an f16 rounding they flip now and then)."""
    s = dict(s, mask_heads=s["heads_kv"] * s["gqa"] if s["mask_heads"] == "all" else s["mask_heads"])
    v_type = "f16" if v_f16 else kv_type
    if quants.is_quantized(v_type):
        s["dv"] = 32 * -(-s["dv"] // 32)           # (block types: whole blocks)
    ctx = Context()
    out, feeds = _attention(ctx, np.random.default_rng(seed), kv_type=kv_type, v_type=v_type, **s)
    g, alloc, fast = _compute(FAST, out, feeds)
    assert FAST.executor.cplan_of(g).kinds()[-1] == "c"
    REF.graph_compute(g)
    ref = np.array(tensor_array(out), dtype=np.float64)
    assert np.array_equal(np.isnan(fast), np.isnan(ref))
    tol = 2e-3 if v_type == "f16" and not _fa_tiled(*out.src[:3]) else 2e-5
    np.testing.assert_allclose(fast, ref, rtol=tol, atol=tol * max(np.abs(ref).max(), 1e-30))


def test_results_do_not_depend_on_threads():
    ctx = Context()
    shape = dict(dk=64, dv=64, n_q=7, n_kv=200, heads_kv=2, gqa=2, n_seq=1, mask_heads=1,
                 max_bias=0.0, softcap=0.0, sinks=True)
    out, feeds = _attention(ctx, np.random.default_rng(3), kv_type="f16", v_type="f16", **shape)
    g, alloc, one = _compute(FAST, out, feeds)
    many = CPUBackend(n_threads=3)
    many.graph_compute(g)
    assert many.executor.cplan_of(g).n_tasks()[-1] == 3
    np.testing.assert_array_equal(np.array(tensor_array(out), dtype=np.float64), one)


@pytest.mark.skipif(not isa_supported("avx2"), reason="this CPU has no AVX2")
def test_instruction_sets_agree():
    """The baseline loops multiply and add where AVX2 fuses; AVX-512's build is AVX2's code."""
    ctx = Context()
    shape = dict(dk=128, dv=40, n_q=3, n_kv=90, heads_kv=2, gqa=2, n_seq=1, mask_heads=1,
                 max_bias=8.0, softcap=10.0, sinks=True)
    out, feeds = _attention(ctx, np.random.default_rng(5), kv_type="f16", v_type="f16", **shape)
    g, alloc = opscheck.prepare(FAST, out, feeds)
    res = {}
    before = isa()
    try:
        for name in [i for i in ("baseline", "avx2", "avx512") if isa_supported(i)]:
            set_isa(name)
            FAST.graph_compute(g)
            res[name] = np.array(tensor_array(out), dtype=np.float64)
    finally:
        set_isa(before)
    np.testing.assert_allclose(res["avx2"], res["baseline"], rtol=2e-3, atol=2e-3 * np.abs(res["avx2"]).max())
    if "avx512" in res:
        np.testing.assert_array_equal(res["avx512"], res["avx2"])


def _small(ctx, q_view=None):
    q = ops.new_tensor(ctx, "f32", [32, 4, 2, 1], name="q")
    k = ops.new_tensor(ctx, "f16", [32, 16, 2, 1], name="k")
    rng = np.random.default_rng(0)
    feeds = [(q, rng.uniform(-1, 1, (1, 2, 4, 32)).astype(np.float32)),
             (k, quants.from_f32("f16", rng.uniform(-1, 1, (1, 2, 16, 32)).astype(np.float32)))]
    return q, k, feeds


def test_strided_q_falls_back_to_numpy():
    """q with strided elements (a transposed view) is not one the C kernel reads."""
    ctx = Context()
    q, k, feeds = _small(ctx)
    qt = ops.permute(ctx, ops.reshape_4d(ctx, q, 4, 32, 2, 1), 1, 0, 2, 3)     # ne [32, 4, 2]
    out = ops.flash_attn_ext(ctx, qt, k, k, None, 0.125)
    g, alloc, fast = _compute(FAST, out, feeds)
    assert FAST.executor.cplan_of(g).kinds()[-1] == "python"
    REF.graph_compute(g)
    np.testing.assert_array_equal(fast, np.array(tensor_array(out)))


def test_an_unknown_precision_is_a_clear_error():
    ctx = Context()
    q, k, feeds = _small(ctx)
    out = ops.flash_attn_ext(ctx, q, k, k, None, 0.125)
    _, _, want = _compute(FAST, out, feeds)
    for prec, value in ops.PRECS.items():       # the C kernel knows the same values
        ops.flash_attn_ext_set_prec(out, prec)
        g, _, got = _compute(FAST, out, feeds)
        assert out.op_params[3] == value and FAST.executor.cplan_of(g).kinds()[-1] == "c"
        np.testing.assert_array_equal(got, want)
    out.set_op_params(list(out.op_params[:3]) + [7] + list(out.op_params[4:]))
    with pytest.raises(GgmlPyError, match="FLASH_ATTN_EXT.*unknown precision|unknown precision.*FLASH_ATTN_EXT"):
        _compute(FAST, out, feeds)


# ---------------------------------------------------------------------------
# live against ggml 0.10.1's CPU backend

@pytest.fixture(scope="module")
def ggml():
    require_ggml_rpc()
    import sys
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from bench_vs_ggml import Ggml
    from ggml_py.rpc_server import library_dir
    return Ggml(library_dir())


def _ours_and_ggmls(ggml, out, feeds):
    """out computed by the C kernel and by ggml's CPU backend (1 thread), flat."""
    from bench_vs_ggml import Mirror
    g, alloc, fast = _compute(FAST, out, feeds)
    mirror = Mirror(ggml, g)
    try:
        mirror.compute()
        return fast.reshape(-1), mirror.values(out).astype(np.float64)
    finally:
        mirror.close()


@settings(max_examples=25, **HYP)
@given(st.integers(0, 2**31), _SHAPES, st.sampled_from(KV_TYPES))
def test_live_against_ggml(ggml, seed, s, kv_type):
    """ggml's one-query-row path (and its tiled path from 64 queries on), the same K/V types:
    only float32 sum orders differ, and, with an f16 accumulator, an f16 rounding now and then."""
    from bench_vs_ggml import nmse
    s = dict(s, mask_heads=s["heads_kv"] * s["gqa"] if s["mask_heads"] == "all" else s["mask_heads"])
    if quants.is_quantized(kv_type):
        s["dv"] = 32 * -(-s["dv"] // 32)
    ctx = Context()
    out, feeds = _attention(ctx, np.random.default_rng(seed), kv_type=kv_type, v_type=kv_type, **s)
    fast, ref = _ours_and_ggmls(ggml, out, feeds)
    assert np.array_equal(np.isnan(fast), np.isnan(ref))
    ok = ~np.isnan(ref)
    f16_acc = kv_type == "f16" and not _fa_tiled(*out.src[:3])
    assert nmse(ref[ok], fast[ok]) < (1e-7 if f16_acc else 1e-11)


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("mask_heads, softcap", [(1, 0.0), (0, 10.0)])
def test_live_against_ggmls_tiled_path(ggml, kv_type, mask_heads, softcap):
    """64 queries or more: V summed in float32 a block of 64 positions at a time; without a
    mask, soft-capping makes ggml count the padding of a short last block (300 = 4 x 64 + 44)
    with its buffer's stale V rows, and so do we."""
    from bench_vs_ggml import nmse
    shape = dict(dk=128, dv=128, n_q=70, n_kv=300, heads_kv=2, gqa=2, n_seq=1, mask_heads=mask_heads,
                 max_bias=0.0, softcap=softcap, sinks=True)
    ctx = Context()
    out, feeds = _attention(ctx, np.random.default_rng(1), kv_type=kv_type, v_type=kv_type, **shape)
    assert _fa_tiled(*out.src[:3])
    fast, ref = _ours_and_ggmls(ggml, out, feeds)
    assert nmse(ref, fast) < 1e-11
