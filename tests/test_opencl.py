"""The OpenCL backend (ggml_py.backends.opencl) on whatever OpenCL device is present (PoCL in CI).

Skipped as a whole when no OpenCL library/platform/device is found, unless
GGML_PY_REQUIRE_OPENCL=1, which turns the skip into a failure (CI sets it once PoCL
is installed). One backend serves the whole module: PoCL compiles every kernel on
its first launch (seconds cold; POCL_CACHE_DIR moves its cache).
"""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ggml_py import ops, quants
from ggml_py.tools import opscheck
from ggml_py._backend import get_buffer, set_buffer, view_init
from conftest import ops_dir, require_opencl
from ggml_py._core import Context
from ggml_py.errors import AllocationError, ArgumentError, BackendError
from ggml_py.backends import opencl
from ggml_py.backends.cpu import CPUBackend

require_opencl()

OPS_DIR = str(ops_dir())

# op families (case file names) whose every case the backend must run, not skip
CLAIMED = {"mul_mat", "mul_mat_id", "add", "sub", "mul", "div", "scale", "rms_norm", "norm",
           "soft_max", "rope", "get_rows", "cpy", "cont", "dup", "glu", "unary", "sqr", "sqrt",
           "clamp", "repeat", "concat", "diag_mask_inf", "sum_rows", "mean", "set_rows",
           "argsort", "top_k", "sum", "pad", "arange", "acc", "timestep_embedding",
           "flash_attn_ext"}


def _load():
    out = []
    for path in sorted(glob.glob(os.path.join(OPS_DIR, "*.json"))):
        family = os.path.basename(path)[:-5]
        for kind, case in opscheck.load_cases(path):
            out.append((family, case))
    return out


CASES = _load()


@pytest.fixture(scope="module")
def ocl():
    b = opencl.OpenCLBackend()
    b.build()
    return b


def _tensor(ctx, type_name, ne, name="t"):
    return ops.new_tensor(ctx, type_name, ne, name=name)


# ---------------------------------------------------------------------------
# devices and identity

def test_list_devices():
    devs = opencl.list_devices()
    assert devs, "available() said yes, so there is a device"
    d = devs[0]
    assert d["index"] == 0 and d["name"]
    assert d["global_mem"] > 0 and d["max_alloc"] > 0 and d["compute_units"] > 0
    for key in ("vendor", "version", "driver_version", "opencl_c_version", "platform"):
        assert isinstance(d[key], str)


def test_backend_identity(ocl):
    assert ocl.device_type == "gpu"
    buft = ocl.get_default_buffer_type()
    assert buft.name == "OpenCL" and not buft.is_host
    info = ocl.device
    want_align = info["base_addr_align_bits"] // 8 or 128
    assert buft.alignment == want_align
    assert buft.max_size == info["max_alloc"]
    assert ocl.supports_buft(buft)
    assert not ocl.supports_buft(CPUBackend().buffer_type)


def test_device_by_name(ocl):
    name = ocl.device["name"]
    assert opencl.OpenCLBackend(name[:6]).device["index"] == 0
    with pytest.raises(opencl.OpenCLUnavailable, match="no OpenCL device matches"):
        opencl.OpenCLBackend("no-such-device-xyz")


# ---------------------------------------------------------------------------
# buffers

def test_buffer_roundtrip(ocl):
    buft = ocl.get_default_buffer_type()
    buf = buft.alloc_buffer(4096)
    assert buf.base % buft.alignment == 0 and buf.memory is None and not buf.is_host
    ctx = Context()
    a = _tensor(ctx, "f32", [8, 4], "a")
    b = _tensor(ctx, "f16", [16], "b")
    buf.tensor_alloc(a, 0)
    buf.tensor_alloc(b, 1024)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    y = np.linspace(-1, 1, 16).astype(np.float16)
    ocl.set_tensor(a, x)
    ocl.set_tensor(b, y.tobytes())
    assert ocl.get_tensor(a) == x.tobytes()
    assert ocl.get_tensor(b) == y.tobytes()
    assert ocl.get_tensor(a, 8, 8) == x.reshape(-1)[2:4].tobytes()
    ocl.set_tensor(a, np.float32([-5.0]), offset=4)
    assert np.frombuffer(ocl.get_tensor(a, 0, 8), np.float32).tolist() == [0.0, -5.0]
    v = ops.view_1d(ctx, a, 4, 16)
    view_init(v)
    assert get_buffer(v) is buf
    assert np.frombuffer(ocl.get_tensor(v), np.float32).tolist() == [4, 5, 6, 7]
    with pytest.raises(ArgumentError, match="exceed"):
        ocl.get_tensor(a, 0, 4096)


def test_alloc_failure_raises_and_recovers(ocl):
    buft = ocl.get_default_buffer_type()
    absurd = 1 << 50
    with pytest.raises(AllocationError) as e:
        buft.alloc_buffer(absurd)
    assert str(absurd) in str(e.value) and ocl.device["name"] in str(e.value)
    # the device and the interpreter are fine afterwards
    buf = buft.alloc_buffer(64)
    ctx = Context()
    t = _tensor(ctx, "i32", [16])
    buf.tensor_alloc(t, 0)
    ocl.set_tensor(t, np.arange(16, dtype=np.int32))
    assert np.frombuffer(ocl.get_tensor(t), np.int32).tolist() == list(range(16))


def test_host_tensor_is_refused(ocl):
    ctx = Context()
    a = _tensor(ctx, "f32", [4])
    CPUBackend().buffer_type.alloc_buffer(16).tensor_alloc(a, 0)
    with pytest.raises(BackendError, match="not in this device's memory"):
        ocl.get_tensor(a)


def test_bad_kernel_source_raises_with_build_log(ocl):
    with pytest.raises(opencl.BuildError) as e:
        ocl._dev.ctx.build("kernel void broken(global float * x) { x[0] = no_such_name; }")
    assert "no_such_name" in e.value.log
    assert "build log" in str(e.value) and "no_such_name" in str(e.value)


# ---------------------------------------------------------------------------
# copies and events

def test_copies_and_events(ocl):
    cpu = CPUBackend()
    ctx = Context()
    x = np.random.default_rng(0).uniform(-1, 1, 64).astype(np.float32)
    host = _tensor(ctx, "f32", [64], "host")
    d1 = _tensor(ctx, "f32", [64], "d1")
    d2 = _tensor(ctx, "f32", [64], "d2")
    back = _tensor(ctx, "f32", [64], "back")
    cpu.buffer_type.alloc_buffer(256).tensor_alloc(host, 0)
    cpu.buffer_type.alloc_buffer(256).tensor_alloc(back, 0)
    dev = ocl.get_default_buffer_type().alloc_buffer(512)
    dev.tensor_alloc(d1, 0)
    dev.tensor_alloc(d2, 256)
    cpu.set_tensor(host, x.tobytes())
    assert ocl.cpy_tensor_async(cpu, host, d1)          # host -> device
    assert ocl.cpy_tensor_async(ocl, d1, d2)            # device -> device
    ev = ocl.event_new()
    ocl.event_record(ev)
    ocl.event_wait(ev)
    ocl.event_synchronize(ev)
    assert ocl.cpy_tensor_async(ocl, d2, back)          # device -> host
    ocl.synchronize()
    np.testing.assert_array_equal(np.frombuffer(cpu.get_tensor(back), np.float32), x)
    # a layout it cannot copy: the caller must fall back
    odd = _tensor(ctx, "f32", [32], "odd")
    dev2 = ocl.get_default_buffer_type().alloc_buffer(128)
    dev2.tensor_alloc(odd, 0)
    assert not ocl.cpy_tensor_async(ocl, d1, odd)


# ---------------------------------------------------------------------------
# the reference cases

@pytest.mark.parametrize("family,case", CASES, ids=[c["name"] for _, c in CASES])
def test_op_case(family, case, ocl):
    r = opscheck.run_case(case, ocl)
    if r["skipped"]:
        assert family not in CLAIMED, f"{family} is claimed but skipped: {r['message']}"
        pytest.skip(r["message"])
    assert r["passed"], f"{r['name']}: error {r['error']} > {r['tolerance']}: {r['message']}"


MODELS = sorted(glob.glob(os.path.join(OPS_DIR, "models", "*.json")))


@pytest.mark.parametrize("path", MODELS, ids=[os.path.basename(p)[:-5] for p in MODELS])
def test_model(path, ocl):
    """A model whose weights OpenCL computes matches ggml's logits; one with weights in a
    block type it does not (the K-quant / IQ4_NL mixes) is refused by name, not computed."""
    with open(path) as f:
        model = json.load(f)
    r = opscheck.run_model(model, ocl)
    refused = {w["type"] for w in model["weights"]} - set(opencl.TYPE_CODES)
    if refused:
        assert r["skipped"] and "does not support" in r["message"], (sorted(refused), r)
        return
    assert not r["skipped"], r["message"]
    assert r["passed"], r["message"]


def test_graph_compute_node_list_matches_cpu(ocl):
    """A small chain (mul_mat -> add -> rms_norm -> silu) given as a node list."""
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (24, 40)).astype(np.float16)
    x = rng.uniform(-1, 1, (5, 40)).astype(np.float32)
    bias = rng.uniform(-1, 1, (24,)).astype(np.float32)
    results = []
    for backend in (ocl, CPUBackend()):
        ctx = Context()
        wt = _tensor(ctx, "f16", [40, 24], "w")
        xt = _tensor(ctx, "f32", [40, 5], "x")
        bt = _tensor(ctx, "f32", [24], "bias")
        out = ops.unary(ctx, ops.rms_norm(ctx, ops.add(ctx, ops.mul_mat(ctx, wt, xt), bt), 1e-5),
                        "SILU")
        g, alloc = opscheck.prepare(backend, out, ((wt, w), (xt, x), (bt, bias)))
        backend.graph_compute(list(g.nodes) if backend is ocl else g)
        backend.synchronize()
        results.append(np.frombuffer(backend.get_tensor(out), np.float32))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-5)


def _both(ocl, build, feeds_fn):
    """Build the same graph for OpenCL and the CPU backend; both results as float32."""
    out = []
    for backend in (ocl, CPUBackend()):
        ctx = Context()
        t, feeds = build(ctx)
        assert backend is not ocl or ocl.supports_op(t), t
        g, alloc = opscheck.prepare(backend, t, zip(feeds, feeds_fn()))
        backend.graph_compute(g)
        out.append(opscheck.read_tensor(backend, t).astype(np.float32))
    return out


def test_soft_max_sinks_swiglu_oai_match_cpu(ocl):
    """Ops of ggml 0.10.1 the reference cases do not cover: sinks and SWIGLU_OAI."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (1, 2, 3, 8)).astype(np.float32)
    sk = np.array([0.5, -1.0], np.float32)

    def sm(ctx):
        a = _tensor(ctx, "f32", [8, 3, 2], "a")
        s = _tensor(ctx, "f32", [2], "sinks")
        t = ops.soft_max_ext(ctx, a, None, 0.7, 0.0)
        ops.soft_max_add_sinks(t, s)
        return t, [a, s]
    got, ref = _both(ocl, sm, lambda: [x, sk])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)

    def oai(ctx):
        a = _tensor(ctx, "f32", [8, 3, 2], "a")
        b = _tensor(ctx, "f32", [8, 3, 2], "b")
        return ops.swiglu_oai(ctx, a, b, 1.702, 1.5), [a, b]
    got, ref = _both(ocl, oai, lambda: [x, -x])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [7, 200])
def test_argsort_top_k_order_matches_cpu(ocl, n):
    """Ties (index order, both directions), NaN (last) and -0.0 == 0.0 as the CPU backend
    orders them, in rows shorter and longer than a work-group; TOP_K with ggml's swapped
    first pair, exactly."""
    rng = np.random.default_rng(n)
    x = rng.integers(-3, 4, (2, 3, n)).astype(np.float32)     # many ties
    x[0, 0, :3] = [np.nan, -0.0, 0.0]
    x[1, 2, -1] = np.nan
    for order in ("ASC", "DESC"):
        got, ref = _both(ocl, lambda ctx: (lambda a: (ops.argsort(ctx, a, order), [a]))(
            _tensor(ctx, "f32", [n, 3, 2], "a")), lambda: [x])
        np.testing.assert_array_equal(got, ref)
    for k in (1, 2, 5):
        got, ref = _both(ocl, lambda ctx: (lambda a: (ops.top_k(ctx, a, k), [a]))(
            _tensor(ctx, "f32", [n, 3, 2], "a")), lambda: [x])
        np.testing.assert_array_equal(got, ref)


def test_acc_inplace_and_flash_attn_sinks_match_cpu(ocl):
    """ACC into its own source, and FLASH_ATTN_EXT sinks (with and without a mask): not in
    the reference cases."""
    rng = np.random.default_rng(9)
    a = rng.uniform(-1, 1, (3, 16)).astype(np.float32)
    b = rng.uniform(-1, 1, (2, 4)).astype(np.float32)

    def acc(ctx):
        ta, tb = _tensor(ctx, "f32", [16, 3], "a"), _tensor(ctx, "f32", [4, 2], "b")
        return ops.acc_inplace(ctx, ta, tb, 64, 128, 128, 20), [ta, tb]
    got, ref = _both(ocl, acc, lambda: [a, b])
    np.testing.assert_array_equal(got, ref)

    q = rng.uniform(-1, 1, (1, 2, 3, 32)).astype(np.float32)
    kv = rng.uniform(-1, 1, (1, 2, 8, 32)).astype(np.float16)
    mask = np.zeros((3, 8), np.float16)
    mask[:, 5:] = -np.inf
    sinks = np.array([0.3, 2.0], np.float32)
    for with_mask in (False, True):
        def fa(ctx):
            tq = _tensor(ctx, "f32", [32, 3, 2], "q")
            tk, tv = _tensor(ctx, "f16", [32, 8, 2], "k"), _tensor(ctx, "f16", [32, 8, 2], "v")
            tm = _tensor(ctx, "f16", [8, 3], "m") if with_mask else None
            ts = _tensor(ctx, "f32", [2], "sinks")
            t = ops.flash_attn_ext(ctx, tq, tk, tv, tm, 0.2)
            ops.flash_attn_ext_add_sinks(t, ts)
            return t, [tq, tk, tv, ts] + ([tm] if with_mask else [])
        got, ref = _both(ocl, fa, lambda: [q, kv, -kv, sinks] + ([mask] if with_mask else []))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_tensor_past_its_buffer_is_refused(ocl):
    ctx = Context()
    a = _tensor(ctx, "f32", [16], "a")
    buf = ocl.get_default_buffer_type().alloc_buffer(64)
    with pytest.raises(AllocationError, match="does not fit"):
        set_buffer(a, buf, 32)                       # 64 bytes at 32: past the end
    set_buffer(a, buf, 0)
    a.ne = (32, 1, 1, 1)                             # grown in place: 128 bytes at 0
    out = ops.scale(ctx, a, 2.0)
    ocl.get_default_buffer_type().alloc_buffer(128).tensor_alloc(out, 0)
    with pytest.raises(BackendError, match="reaches past"):
        ocl.graph_compute([out])


# ---------------------------------------------------------------------------
# what it refuses

def test_supports_op_refuses_what_it_cannot_run(ocl):
    ctx = Context()
    f32 = _tensor(ctx, "f32", [64, 4], "f32")
    q4 = _tensor(ctx, "q4_0", [64, 4], "q4")
    q8 = _tensor(ctx, "q8_0", [64, 4], "q8")
    i32 = _tensor(ctx, "i32", [64, 4], "i32")
    assert ocl.supports_op(ops.mul_mat(ctx, q8, f32))
    assert not ocl.supports_op(ops.mul_mat(ctx, q4, f32))          # q4_0 weights
    for t in quants.BLOCKS:                                         # the other block types
        if t not in ("q8_0", "q4_0", "q8_1", "q8_K"):
            w = _tensor(ctx, t, [256, 4], t)
            assert not ocl.supports_op(ops.mul_mat(ctx, w, _tensor(ctx, "f32", [256, 2]))), t
            assert not ocl.supports_op(ops.get_rows(ctx, w, _tensor(ctx, "i32", [2]))), t
    assert not ocl.supports_op(ops.mul_mat(ctx, f32, q8))          # quantised src1
    assert not ocl.supports_op(ops.cpy(ctx, i32, f32))             # i32 -> f32 conversion
    assert not ocl.supports_op(ops.cpy(ctx, q8, _tensor(ctx, "q8_0", [64, 4])))
    assert ocl.supports_op(ops.argsort(ctx, f32, "ASC"))
    long_row = _tensor(ctx, "f32", [opencl.K.SORT_MAX + 1, 2], "long_row")
    assert not ocl.supports_op(ops.argsort(ctx, long_row, "ASC"))   # past the local buffer
    assert not ocl.supports_op(ops.top_k(ctx, long_row, 4))
    assert not ocl.supports_op(ops.argsort(ctx, _tensor(ctx, "f16", [64, 4]), "ASC"))
    rows = _tensor(ctx, "f32", [64, 2], "rows")
    ids = _tensor(ctx, "i32", [2], "ids")
    assert ocl.supports_op(ops.set_rows(ctx, _tensor(ctx, "f16", [64, 8]), rows, ids))
    assert ocl.supports_op(ops.set_rows(ctx, _tensor(ctx, "q8_0", [64, 8]), rows, ids))
    assert not ocl.supports_op(ops.set_rows(ctx, _tensor(ctx, "q4_0", [64, 8]), rows, ids))
    small = _tensor(ctx, "f32", [8, 2], "small")
    assert ocl.supports_op(ops.acc(ctx, f32, small, 256, 1024, 1024, 8))
    assert not ocl.supports_op(ops.acc(ctx, f32, small, 256, 1024, 1024, 2))     # mid-element
    assert not ocl.supports_op(ops.acc(ctx, f32, small, 256, 1024, 1024, 768))   # past dst
    q = _tensor(ctx, "f32", [64, 3, 2], "q")
    kv16 = _tensor(ctx, "f16", [64, 8, 2], "kv16")
    assert ocl.supports_op(ops.flash_attn_ext(ctx, q, kv16, kv16, None, 0.125))
    kv32 = _tensor(ctx, "f32", [64, 8, 2], "kv32")
    assert not ocl.supports_op(ops.flash_attn_ext(ctx, q, kv32, kv32, None, 0.125))
    big = opencl.K.FA_D * 2
    qb, kb = _tensor(ctx, "f32", [big, 3, 2], "qb"), _tensor(ctx, "f16", [big, 8, 2], "kb")
    assert not ocl.supports_op(ops.flash_attn_ext(ctx, qb, kb, kb, None, 0.125))
    assert not ocl.supports_op(ops.xielu(ctx, f32, 0.8, 0.8, 0.5, 1e-6))
    assert not ocl.supports_op(ops.add(ctx, i32, i32))
    assert not ocl.supports_op(ops.rms_norm(ctx, _tensor(ctx, "f16", [64, 4]), 1e-5))
    pos4 = _tensor(ctx, "i32", [4 * 3], "pos4")
    x = _tensor(ctx, "f32", [16, 2, 3], "x")
    mr = ops.rope_multi(ctx, x, pos4, None, 16, [2, 3, 3, 0], "MROPE", 0, 10000.0, 1.0, 0.0,
                        1.0, 32.0, 1.0)
    assert not ocl.supports_op(mr)
    assert ocl.supports_op(ops.rope_ext(ctx, x, _tensor(ctx, "i32", [3], "pos"), None, 16,
                                        "NEOX", 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0))


def test_graph_compute_rejects_unsupported_node(ocl):
    """Run directly (not through a scheduler), a node the rule refuses is a clear error
    naming the node, its sources' types, shapes and layouts, and for ACC the region."""
    ctx = Context()
    a = _tensor(ctx, "f32", [opencl.K.SORT_MAX + 1, 2], "long")
    s = ops.argsort(ctx, a, "ASC")
    with pytest.raises(BackendError, match=rf"ARGSORT .*src0 'long' f32 \[{opencl.K.SORT_MAX + 1}, 2"):
        ocl.graph_compute([s])
    t = ops.sqr(ctx, ops.transpose(ctx, _tensor(ctx, "i32", [8, 4], "ids")))
    with pytest.raises(BackendError, match=r"SQR .*i32 \[4, 8, 1, 1\] \(not contiguous\)"):
        ocl.graph_compute([t])
    f32, small = _tensor(ctx, "f32", [64, 4], "f32"), _tensor(ctx, "f32", [8, 2], "small")
    with pytest.raises(BackendError, match="bytes up to 1056, past the 1024 of src0"):
        ocl.graph_compute([ops.acc(ctx, f32, small, 256, 1024, 1024, 768)])
    with pytest.raises(BackendError, match="not whole f32 elements"):
        ocl.graph_compute([ops.acc(ctx, f32, small, 256, 1024, 1024, 2)])


def test_missing_library_override_is_unavailable():
    """GGML_PY_OPENCL_LIBRARY naming a missing file: unavailable, with the reason (in a
    fresh interpreter, since this one has the library loaded already)."""
    code = ("from ggml_py.backends import opencl\n"
            "ok, why = opencl.available()\n"
            "print(ok); print(why)\n"
            "try:\n"
            "    opencl.OpenCLBackend()\n"
            "except opencl.OpenCLUnavailable as e:\n"
            "    print('raised', e)\n")
    env = dict(os.environ, GGML_PY_OPENCL_LIBRARY="/nonexistent/libOpenCL-missing.so")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "False"
    assert "cannot open the OpenCL library" in lines[1] and "libOpenCL-missing.so" in lines[1]
    assert lines[2].startswith("raised")
