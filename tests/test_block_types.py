"""Every block type the CPU executor computes with, held to ggml 0.10.1 itself:

* against what ggml made of fixed rows (tests/data/quants/ggml_block_types.npz, written
  by bench/make_quant_goldens.py): both quantisers and dequantisation bit for bit, and
  the dot products (the AVX2 loops give ggml's bits, the baseline ones its values);
* against ggml's library live, on rows hypothesis draws (where ggml is installed: CI);
* inside graphs: MUL_MAT, MUL_MAT_ID, GET_ROWS, CPY and SET_ROWS in the C kernels
  against the numpy kernels (dequantised weights times rounded activations), threads and
  instruction sets alike.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO_ROOT, DATA_DIR, require_ggml_rpc
from ggml_py import ops, quants
from ggml_py._core import Context
from ggml_py.backends.cpu import CPUBackend, isa, isa_supported, set_isa, tensor_array
from ggml_py.errors import NotSupportedError, UnknownNameError
from ggml_py.tools import opscheck

GOLD = np.load(DATA_DIR / "quants" / "ggml_block_types.npz")
X = GOLD["x"]
TYPES = sorted({k.split("/")[0] for k in GOLD.files if "/" in k})
WEIGHT_TYPES = [t for t in TYPES if f"{t}/dot" in GOLD.files]
NEW_TYPES = [t for t in WEIGHT_TYPES if t not in ("q8_0", "q4_0")]
ISAS = [i for i in ("avx512", "avx2", "baseline") if isa_supported(i)]
HYP = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def on_isa(request):
    """Run under instruction set request.param, then restore the one before."""
    before = isa()
    set_isa(request.param)
    yield request.param
    set_isa(before)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_the_goldens_cover_every_block_type():
    assert set(TYPES) == set(quants.BLOCKS)
    assert set(WEIGHT_TYPES) == {t for t in quants.BLOCKS if t not in ("q8_1", "q8_K")}


# ---------------------------------------------------------------------------
# conversions and dots against ggml's own output

def _defined(t, raw):
    """The bytes of quantised rows that ggml defines. ggml's iq4_nl quantiser leaves the
    indices of an all-zero block (scale 0) as its scratch holds them: the previous block's,
    or for a row's first block whatever its stack held; they decode to 0 either way, so
    they are set to 0 here on both sides."""
    if t != "iq4_nl":
        return raw
    blocks = np.array(raw, np.uint8).reshape(-1, 18)
    blocks[(blocks[:, 0] == 0) & (blocks[:, 1] & 0x7F == 0), 2:] = 0
    return blocks.reshape(np.shape(raw))


@pytest.mark.parametrize("t", [t for t in TYPES if f"{t}/ref" in GOLD.files])
def test_reference_quantiser_is_ggmls(t):
    np.testing.assert_array_equal(_defined(t, quants.quantize(t, X, cpu=False)),
                                  _defined(t, GOLD[f"{t}/ref"]))


@pytest.mark.parametrize("t", TYPES)
def test_cpu_quantiser_is_ggmls(t):
    np.testing.assert_array_equal(_defined(t, quants.quantize(t, X, cpu=True)),
                                  _defined(t, GOLD[f"{t}/cpu"]))


@pytest.mark.parametrize("t", [t for t in TYPES if f"{t}/float" in GOLD.files])
def test_dequantisation_is_ggmls_bit_for_bit(t):
    got = quants.dequantize(t, GOLD[f"{t}/raw"])
    np.testing.assert_array_equal(_bits(got), _bits(GOLD[f"{t}/float"]))


def _dots(t):
    """The executor's dot of ggml's quantised row i with the vec_dot-type row i of x
    reversed, as the golden file pairs them."""
    v = quants.vec_dot_type(t)
    y = quants.quantize(v, X[::-1].copy(), cpu=True)
    w = GOLD[f"{t}/ref"]
    from ggml_py import _quants
    from ggml_py._core import type_id
    return np.array([_quants.vec_dot(type_id(t), w[i], y[i]) for i in range(len(X))], np.float32)


@pytest.mark.parametrize("on_isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", NEW_TYPES)
def test_vec_dot_is_ggmls(t, on_isa):
    got, want = _dots(t), GOLD[f"{t}/dot"]
    if on_isa != "baseline":        # ggml's own AVX2 loops, sum for sum
        np.testing.assert_array_equal(_bits(got), _bits(want))
    else:                           # ggml's generic order: same products, other sums
        scale = np.abs(X).sum(axis=1) * np.abs(X[::-1]).sum(axis=1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(scale.max()) * 1e-3)


# ---------------------------------------------------------------------------
# edges a user meets

@pytest.mark.parametrize("t", TYPES)
def test_a_row_must_be_whole_blocks(t):
    qk = quants.BLOCKS[t][0]
    with pytest.raises(ValueError, match="whole number of blocks"):
        quants.quantize(t, np.zeros((2, qk + 1), np.float32))
    size = quants.BLOCKS[t][1].itemsize
    with pytest.raises(ValueError, match="whole number of blocks"):
        quants.dequantize(t, np.zeros((2, size + 1), np.uint8))


def test_types_without_conversions_are_named():
    with pytest.raises(NotSupportedError, match="iq2_xxs"):
        quants.quantize("iq2_xxs", np.zeros(256, np.float32))
    with pytest.raises(UnknownNameError, match="q7_K"):
        quants.dequantize("q7_K", np.zeros(10, np.uint8))


@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_quantised_rows_come_back_close(t):
    """A sanity bound per type (the goldens pin the exact bits): the NMSE of uniform rows
    through the reference quantiser stays well under what the type's bits allow."""
    x = X[:4]
    y = quants.dequantize(t, quants.quantize(t, x, cpu=False))
    nmse = float(((y - x) ** 2).sum() / (x ** 2).sum())
    assert nmse < {"q2_K": 0.08, "q3_K": 0.03, "mxfp4": 0.03}.get(t, 0.01), nmse


# ---------------------------------------------------------------------------
# live against ggml's library (installed in CI with the RPC server)

@pytest.fixture(scope="module")
def ggml():
    require_ggml_rpc()
    import sys
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from ggml_quants_ref import GgmlQuants
    from ggml_py.rpc_server import library_dir
    return GgmlQuants(library_dir())


def test_layouts_and_vec_dot_types_are_ggmls(ggml):
    """The one list of types (ggml-py-vocab.h) against ggml's own type traits."""
    from ggml_py._core import TYPE_LAYOUTS
    import ggml_quants_ref
    for name, layout in TYPE_LAYOUTS.items():
        if name in ggml_quants_ref.TYPE_IDS:
            assert ggml.block(name) == layout, name
    for t in WEIGHT_TYPES:
        assert quants.vec_dot_type(t) == ggml.vec_dot_type(t), t


_ROWS = st.tuples(st.integers(1, 3), st.integers(1, 3),
                  st.sampled_from(("uniform", "normal", "tiny", "sparse", "nonfinite")),
                  st.integers(0, 2**32 - 1))


def _draw_rows(qk, spec):
    n_rows, n_blocks, kind, seed = spec
    rng = np.random.default_rng(seed)
    shape = (n_rows, n_blocks * max(qk, 256))
    if kind == "nonfinite":                 # a few NaN / inf among normal values
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.01] = np.nan
        x[rng.random(shape) < 0.01] = np.inf * rng.choice([-1, 1])
        return x.astype(np.float32)
    x = {"uniform": lambda: rng.uniform(-2, 2, shape), "normal": lambda: rng.standard_normal(shape) * 10,
         "tiny": lambda: rng.uniform(-1, 1, shape) * 1e-20,
         "sparse": lambda: rng.standard_normal(shape) * (rng.random(shape) < 0.05)}[kind]()
    return x.astype(np.float32)


@settings(max_examples=15, **HYP)
@given(spec=_ROWS)
@pytest.mark.parametrize("t", TYPES)
def test_live_conversions_match_ggml(ggml, t, spec):
    x = _draw_rows(quants.BLOCKS[t][0], spec)
    np.testing.assert_array_equal(_defined(t, quants.quantize(t, x, cpu=True)),
                                  _defined(t, ggml.from_float(t, x)))
    if t == "q8_K":
        return                      # (ggml has no reference quantiser or to_float for it)
    ref = ggml.quantize_chunk(t, x) if t != "q8_1" else ggml.quantize_ref(t, x)
    np.testing.assert_array_equal(_defined(t, quants.quantize(t, x, cpu=False)), _defined(t, ref))
    if t != "q8_1":
        np.testing.assert_array_equal(_bits(quants.dequantize(t, ref)), _bits(ggml.to_float(t, ref)))


@settings(max_examples=15, **HYP)
@given(spec=_ROWS)
@pytest.mark.parametrize("t", NEW_TYPES)
def test_live_vec_dot_matches_ggml(ggml, t, spec):
    from ggml_py import _quants
    from ggml_py._core import type_id
    if spec[2] == "nonfinite":
        return                              # (NaN dots: NaN on both sides, no bits to compare)
    x = _draw_rows(quants.BLOCKS[t][0], spec)
    w = ggml.quantize_chunk(t, x)
    v = quants.vec_dot_type(t)
    y = ggml.from_float(v, x[::-1].copy())
    before = isa()
    try:
        for level in ISAS[:-1]:                 # the AVX2 code, in each of its builds
            set_isa(level)
            for i in range(len(x)):
                got = np.float32(_quants.vec_dot(type_id(t), w[i], y[i]))
                want = np.float32(ggml.vec_dot(t, w[i], y[i], x.shape[1]))
                assert _bits(got) == _bits(want), (t, level, i)
    finally:
        set_isa(before)


# ---------------------------------------------------------------------------
# the ops, in graphs: C kernels against the numpy kernels

FAST = CPUBackend(n_threads=1)
FAST2 = CPUBackend(n_threads=2)
REF = CPUBackend(n_threads=1, compiled=False)
# The numpy kernels multiply dequantised weights by the activations rounded through the
# vec_dot type; ggml's q4_1 / q5_1 dots take q8_1's block sums as stored, rounded to f16,
# which they do not model: ggml's own bound for MUL_MAT (test-backend-ops) holds both.
NMSE_MUL_MAT = 5e-4


def _nmse(ref, x):
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    return float(((ref - x) ** 2).sum() / max((ref ** 2).sum(), 1e-300))


def _compute(backend, out, feeds):
    g, alloc = opscheck.prepare(backend, out, list(feeds.items()))
    backend.graph_compute(g)
    kinds = backend.executor.cplan_of(g).kinds() if backend is not REF else None
    return np.array(tensor_array(out)), kinds


def _weights(ctx, t, m, k, seed, n_mat=1):
    w = np.random.default_rng(seed).uniform(-1, 1, (n_mat, m, k)).astype(np.float32)
    wt = ops.new_tensor(ctx, t, [k, m, n_mat, 1], name="w")
    return wt, quants.quantize(t, w.reshape(n_mat * m, k), cpu=False).reshape(n_mat, m, -1)


@pytest.mark.parametrize("t", WEIGHT_TYPES)
@pytest.mark.parametrize("n", [1, 5])
def test_mul_mat_runs_in_c_and_matches_numpy(t, n):
    k = 2 * max(quants.BLOCKS[t][0], 256)
    ctx = Context()
    wt, w = _weights(ctx, t, 20, k, seed=n)
    xt = ops.new_tensor(ctx, "f32", [k, n, 2, 1], name="x")
    x = np.random.default_rng(7).uniform(-1, 1, (1, 2, n, k)).astype(np.float32)
    out = ops.mul_mat(ctx, wt, xt)
    feeds = {wt: w, xt: x}
    fast, kinds = _compute(FAST, out, feeds)
    assert kinds[-1] == "c"
    two, _ = _compute(FAST2, out, feeds)
    ref, _ = _compute(REF, out, feeds)
    np.testing.assert_array_equal(fast, two)            # threads do not change a sum
    assert _nmse(ref, fast) < NMSE_MUL_MAT


@pytest.mark.parametrize("on_isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", NEW_TYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_mul_mat_is_the_vec_dot_product_by_product(t, n, on_isa):
    """Every output of MUL_MAT is the type's vec_dot of its weight row and src1 row (in
    the vec_dot type, through the CPU quantiser), bit for bit, whatever dot tile of rows
    and columns computed it (odd row counts and, for the 32-value types, an odd block
    count, which the two-accumulator dots finish on their own)."""
    from ggml_py import _quants
    from ggml_py._core import type_id
    qk = quants.BLOCKS[t][0]
    k = 9 * qk if qk == 32 else 2 * qk
    m = 21
    ctx = Context()
    wt, w = _weights(ctx, t, m, k, seed=11 + n)
    xt = ops.new_tensor(ctx, "f32", [k, n, 1, 1], name="x")
    x = np.random.default_rng(12 + n).uniform(-1, 1, (1, 1, n, k)).astype(np.float32)
    out = ops.mul_mat(ctx, wt, xt)
    fast, kinds = _compute(FAST, out, {wt: w, xt: x})
    assert kinds[-1] == "c"
    y = quants.quantize(quants.vec_dot_type(t), x.reshape(n, k), cpu=True)
    want = np.array([[_quants.vec_dot(type_id(t), w[0, i], y[j]) for i in range(m)] for j in range(n)],
                    np.float32)
    np.testing.assert_array_equal(_bits(fast.reshape(n, m)), _bits(want))


@pytest.mark.parametrize("t", NEW_TYPES)
def test_mul_mat_id_runs_in_c_and_matches_numpy(t):
    k = max(quants.BLOCKS[t][0], 256)
    ctx = Context()
    wt, w = _weights(ctx, t, 8, k, seed=3, n_mat=4)
    xt = ops.new_tensor(ctx, "f32", [k, 2, 3, 1], name="x")
    x = np.random.default_rng(8).uniform(-1, 1, (1, 3, 2, k)).astype(np.float32)
    ids = ops.new_tensor(ctx, "i32", [2, 3, 1, 1], name="ids")
    out = ops.mul_mat_id(ctx, wt, xt, ids)
    feeds = {wt: w, xt: x, ids: np.array([[0, 3], [2, 1], [3, 3]], np.int32)}
    fast, kinds = _compute(FAST, out, feeds)
    assert kinds[-1] == "c"
    ref, _ = _compute(REF, out, feeds)
    assert _nmse(ref, fast) < NMSE_MUL_MAT


@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_get_rows_dequantises_exactly(t):
    k = max(quants.BLOCKS[t][0], 256)
    ctx = Context()
    wt, w = _weights(ctx, t, 6, k, seed=5)
    rows = ops.new_tensor(ctx, "i32", [3, 1, 1, 1], name="rows")
    out = ops.get_rows(ctx, wt, rows)
    fast, kinds = _compute(FAST, out, {wt: w, rows: np.array([4, 0, 4], np.int32)})
    assert kinds[-1] == "c"
    want = quants.dequantize(t, w[0])[[4, 0, 4]]
    np.testing.assert_array_equal(_bits(fast.reshape(want.shape)), _bits(want))


KV_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl")


@pytest.mark.parametrize("t", KV_TYPES)
def test_cpy_and_set_rows_write_with_the_cpu_quantiser(t):
    ctx = Context()
    x = np.random.default_rng(9).uniform(-3, 3, (3, 64)).astype(np.float32)
    src = ops.new_tensor(ctx, "f32", [64, 3, 1, 1], name="src")
    dst = ops.new_tensor(ctx, t, [64, 3, 1, 1], name="dst")
    out = ops.cpy(ctx, src, dst)
    fast, kinds = _compute(FAST, out, {src: x, dst: np.zeros((3, quants.row_bytes(t, 64)), np.uint8)})
    assert kinds[-1] == "c"
    np.testing.assert_array_equal(fast.reshape(3, -1), quants.quantize(t, x, cpu=True))

    ctx = Context()
    cache = ops.new_tensor(ctx, t, [64, 5, 1, 1], name="cache")
    src = ops.new_tensor(ctx, "f32", [64, 2, 1, 1], name="src")
    idx = ops.new_tensor(ctx, "i64", [2, 1, 1, 1], name="idx")
    out = ops.set_rows(ctx, cache, src, idx)
    before = np.zeros((5, quants.row_bytes(t, 64)), np.uint8)
    fast, kinds = _compute(FAST, out, {cache: before, src: x[:2], idx: np.array([3, 1], np.int64)})
    assert kinds[-1] == "c"
    got = fast.reshape(5, -1)
    np.testing.assert_array_equal(got[[3, 1]], quants.quantize(t, x[:2], cpu=True))
    np.testing.assert_array_equal(got[[0, 2, 4]], before[[0, 2, 4]])
