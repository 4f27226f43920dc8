"""numpy in and out (issue 33): Scheduler.set_input / get_output and Tensor.write / numpy
check shapes (numpy order) and dtypes and convert with ggml's rounding wherever the tensor
lives; numpy dtypes are types; bytes given as a typed array are not reinterpreted; a graph
input never written is an error at compute, not zeros; op errors speak numpy order."""

import re

import numpy as np
import pytest

import ggml_py as gp
from conftest import REPO_ROOT
from ggml_py import Context, Graph, ops, quants
from ggml_py._backend import host_buffer, is_written, set_buffer, tensor_get, view_init
from ggml_py._core import ggml_type
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import (ArgumentError, ArgumentTypeError, GraphError, SchedulerError,
                            UnknownNameError)
from ggml_py.sched import Scheduler


@pytest.fixture
def cpu():
    with CPUBackend() as b:
        yield b


@pytest.fixture
def dev():
    with NumpyDeviceBackend() as b:
        yield b


def placed(backend, *tensors):
    """The tensors in a buffer of `backend`'s default type."""
    alloc_ctx_tensors_from_buft(list(tensors), backend.get_default_buffer_type())
    return tensors


# ---------------------------------------------------------------------------
# types: numpy dtypes and their names wherever a ggml type is taken

@pytest.mark.parametrize("spec, name", [
    (np.float32, "f32"), (np.dtype("float16"), "f16"), ("float32", "f32"), ("float16", "f16"),
    ("int32", "i32"), (np.int8, "i8"), (np.dtype("<i2"), "i16"), (np.int64, "i64"),
    (np.float64, "f64"), ("bfloat16", "bf16"), ("bf16", "bf16"), ("q8_0", "q8_0"),
    ("i8", "i8"),           # ggml's name first: int8, not numpy's int64 code
])
def test_type_specs(spec, name):
    assert ggml_type(spec) == name
    assert gp.type_id(spec) == gp.type_id(name)
    t = Context().new_tensor(spec, (2, 32))
    assert t.type == name


@pytest.mark.parametrize("spec", ["float", "uint8", np.uint16, np.complex64, None, 3, "f4",
                                  np.dtype(">f4"), "q9_9"])
def test_type_specs_refused_say_what_is_accepted(spec):
    with pytest.raises(UnknownNameError) as e:
        Context().new_tensor(spec, (4,))
    assert "float32" in str(e.value) and "q8_0" in str(e.value) or "little-endian" in str(e.value)


def test_quants_take_numpy_types():
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    assert np.array_equal(quants.from_f32(np.float16, x), quants.from_f32("f16", x))
    assert quants.row_bytes("float32", 8) == 32
    assert not quants.is_quantized(np.float32) and quants.is_quantized("q4_0")


# ---------------------------------------------------------------------------
# bytes given as a typed array: no silent reinterpretation

def test_set_tensor_refuses_a_typed_array_of_another_type(cpu):
    t, = placed(cpu, Context().new_tensor("f16", (4, 8), name="h"))
    x = np.ones((2, 8), np.float32)                 # the byte size of the f16 tensor
    with pytest.raises(ArgumentTypeError, match=r"'h' \(f16, shape \(4, 8\)\).*float32.*"
                                                r"reinterpreted.*set_input"):
        cpu.set_tensor(t, x)
    cpu.set_tensor(t, x.tobytes())                  # bytes as they are: still possible
    cpu.set_tensor(t, np.ones((4, 8), np.float16))  # the tensor's own type


def test_a_wrong_array_names_its_dtype(cpu):
    t, = placed(cpu, Context().new_tensor("f32", (16, 16), name="x"))
    with pytest.raises(ArgumentTypeError, match=r"'x' \(f32, shape \(16, 16\)\) was given a "
                                                r"float64 array of shape \(16, 16\)"):
        cpu.set_tensor(t, np.zeros((16, 16)))
    with pytest.raises(ArgumentError, match=r"float32 array of shape \(17, 16\): 1088 bytes "
                                            r"at offset 0 exceed its 1024 bytes"):
        cpu.set_tensor(t, np.zeros((17, 16), np.float32))


# ---------------------------------------------------------------------------
# Tensor.write / numpy: checked, converted, wherever the tensor lives

@pytest.mark.parametrize("where", ["cpu", "dev"])
def test_write_and_read_round_through_ggml(where, request):
    backend = request.getfixturevalue(where)
    ctx = Context()
    ts = placed(backend, *(ctx.new_tensor(ty, (3, 256), name=ty)
                           for ty in ("f32", "f16", "bf16", "q8_0", "q4_K", "i32")))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 256))                # float64
    for t in ts[:5]:
        t.write(x)
    x32 = x.astype(np.float32)
    assert np.array_equal(ts[0].numpy(), x32)
    assert ts[1].numpy().dtype == np.float16
    assert np.array_equal(ts[1].numpy(np.float32), quants.round_f16(x32))
    assert np.array_equal(ts[2].numpy(), quants.round_bf16(x32))
    for t in ts[3:5]:
        assert t.numpy().dtype == np.float32 and t.numpy().shape == (3, 256)
        want = quants.from_f32(t.type, x32, cpu=False)
        assert tensor_get(t) == np.ascontiguousarray(want).tobytes()
        assert np.array_equal(t.numpy(), quants.to_f32(t.type, want))
    ts[5].write(np.arange(768).reshape(3, 256))     # int64 values that fit
    assert ts[5].numpy().dtype == np.int32 and ts[5].numpy()[2, 255] == 767


def test_write_checks_shape_and_kind_in_numpy_terms(cpu):
    ctx = Context()
    f, i, q = placed(cpu, ctx.new_tensor("f32", (8, 64), name="x"),
                     ctx.new_tensor("i32", (5,), name="pos"), ctx.new_tensor("q8_0", (2, 64)))
    with pytest.raises(ArgumentError, match=r"'x' \(f32, shape \(8, 64\)\).*float32 array of "
                                            r"shape \(64, 8\).*shapes differ"):
        f.write(np.zeros((64, 8), np.float32))
    with pytest.raises(ArgumentError, match="shape"):
        f.write(np.zeros((4, 64), np.float32))      # too little data: no partial write
    f.write(np.zeros((1, 8, 64), np.float32))       # a leading 1 is the same shape
    with pytest.raises(ArgumentTypeError, match=r"'pos' \(i32.*float64.*integers"):
        i.write(np.arange(5.0))
    with pytest.raises(ArgumentError, match="do not fit i32"):
        i.write(np.array([0, 1, 2, 3, 2**40]))
    with pytest.raises(ArgumentTypeError, match="real numbers"):
        f.write(np.full((8, 64), "a"))
    raw = np.ascontiguousarray(quants.from_f32("q8_0", np.ones((2, 64), np.float32)))
    q.write(raw.view(np.uint8).reshape(2, -1))      # a block type's stored rows
    assert np.array_equal(q.numpy(), quants.to_f32("q8_0", raw))


def test_host_view_and_strided_tensors(cpu, dev):
    ctx = Context()
    a, = placed(cpu, ctx.new_tensor("f32", (4, 6), name="a"))
    a.write(np.arange(24).reshape(4, 6))
    view = a.numpy(copy=False)
    assert not view.flags.writeable and np.shares_memory(view, a.numpy(copy=False))
    assert not np.shares_memory(a.numpy(), view)
    at = ctx.transpose(a)                           # strided: (6, 4)
    view_init(at)
    assert np.array_equal(at.numpy(), np.arange(24).reshape(4, 6).T)
    at.write(np.zeros((6, 4)) - 1)
    assert (a.numpy() == -1).all()
    b, = placed(dev, ctx.new_tensor("f32", (4, 6), name="b"))
    b.write(np.arange(24).reshape(4, 6))
    bt = ctx.transpose(b)
    view_init(bt)
    bt.write(np.arange(24).reshape(6, 4))
    assert np.array_equal(b.numpy(), np.arange(24).reshape(6, 4).T)
    assert b.numpy(copy=False).flags.writeable      # device memory: always a copy


# ---------------------------------------------------------------------------
# the scheduler: set_input / get_output, and inputs never written

def small_graph():
    ctx = Context()
    x = ctx.new_tensor(np.float32, (4, 64), name="x").set_input()
    s = ops.scale(ctx, x, 0.5)
    y = ops.soft_max(ctx, s).set_output()
    return ctx, x, s, y, Graph(64).build_forward_expand(y)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_output_of_a_split_graph_wherever_it_lives(cpu):
    with NumpyDeviceBackend(unsupported_ops=["SCALE"]) as dev:
        _, x, s, y, g = small_graph()
        sched = Scheduler([dev, cpu], graph_size=64)
        sched.set_tensor_backend(y, dev)
        sched.alloc_graph(g)
        a = np.random.default_rng(0).random((4, 64))
        sched.set_input(x, a)
        assert sched.graph_compute(g) == 0
        assert sched.get_tensor_backend(y) is dev
        with pytest.raises(gp.BackendError, match="not in this device's memory"):
            cpu.get_tensor(y)                       # the backend slot: its own memory only
        out = sched.get_output(y)
        assert out.shape == (4, 64) and out.dtype == np.float32
        np.testing.assert_allclose(out, softmax(a.astype(np.float32) * 0.5), rtol=1e-5)
        assert np.array_equal(y.numpy(), out)
        assert sched.get_output(y, np.float64).dtype == np.float64


def test_set_input_before_alloc_says_what_to_do(cpu):
    _, x, _, _, g = small_graph()
    sched = Scheduler([cpu])
    with pytest.raises(SchedulerError, match="alloc_graph"):
        sched.set_input(x, np.zeros((4, 64)))


def test_an_input_never_written_is_an_error_not_zeros(cpu):
    _, x, _, y, g = small_graph()
    sched = Scheduler([cpu], graph_size=64)
    sched.alloc_graph(g)
    with pytest.raises(SchedulerError, match=r"'x' \(f32, shape \(4, 64\)\).*set_input") as e:
        sched.graph_compute(g)
    assert e.value.kind == "input-not-written" and e.value.tensors == [x]
    assert sched.graph_compute(g, check_inputs=False) == 0      # opt out, per call
    sched.set_input(x, np.ones((4, 64)))
    assert sched.graph_compute(g) == 0
    assert sched.graph_compute(g) == 0              # still written: computing again
    np.testing.assert_allclose(sched.get_output(y), np.full((4, 64), 1 / 64), rtol=1e-6)
    # another graph's allocation takes x's memory: it must be written again
    _, x2, _, _, g2 = small_graph()
    sched.reset()
    sched.alloc_graph(g2)
    x2.write(np.zeros((4, 64)))
    sched.graph_compute(g2)
    sched.reset()
    sched.alloc_graph(g)
    assert not is_written(x)
    with pytest.raises(SchedulerError, match="'x'"):
        sched.graph_compute(g)
    lax = Scheduler([cpu], graph_size=64, check_inputs=False)   # opt out, per scheduler
    lax.alloc_graph(g)
    assert lax.graph_compute(g) == 0


def test_what_counts_as_a_graph_input(cpu):
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 8), name="x").set_input()
    w = ctx.new_tensor("f32", (4, 8), name="w")     # pre-allocated below: its owner's
    c = ctx.new_tensor("f32", (4, 8), name="cache")  # no flag, no memory: a graph input too
    cc = ctx.new_tensor("f32", (4, 8), name="cc")   # written by the graph itself (CPY)
    buf = host_buffer(cpu.get_default_buffer_type(), 4096)
    set_buffer(w, buf, 0)
    filled = ops.cpy(ctx, x, cc)
    y = ops.add(ctx, ops.add(ctx, ops.add(ctx, x, w), c), filled)
    g = Graph(64).build_forward_expand(y)
    sched = Scheduler([cpu], graph_size=64)
    sched.alloc_graph(g)
    with pytest.raises(SchedulerError) as e:
        sched.graph_compute(g)
    assert e.value.tensors == [x, c]
    assert "'cache' (f32, shape (4, 8)) (not flagged INPUT)" in str(e.value)
    sched.set_input(x, np.ones((4, 8)))
    c.write(np.ones((4, 8)))
    assert sched.graph_compute(g) == 0


def test_recomputing_after_reset_keeps_written_inputs(cpu):
    # graph_compute allocates a reset graph again itself; inputs that kept their memory
    # keep what was written there (graph reuse off: a fresh allocation)
    _, x, _, y, g = small_graph()
    sched = Scheduler([cpu], graph_size=64, graph_reuse=False)
    sched.alloc_graph(g)
    sched.set_input(x, np.zeros((4, 64)))
    sched.graph_compute(g)
    sched.reset()
    assert sched.graph_compute(g) == 0


def test_a_session_writes_every_input(cpu):
    from ggml_py.models.transformer import Model, Session, llama_config
    model = Model.random(llama_config(n_layer=1), seed=0).place(cpu)
    sess = Session(model, [cpu])
    assert len(sess.generate([1, 2, 3], 3)) == 3


# ---------------------------------------------------------------------------
# op errors: numpy order, and what to do about a transposed operand

def test_op_errors_speak_numpy_order_and_suggest_cont():
    ctx = Context()
    x = ctx.new_tensor("f32", (8, 32), name="x")
    w = ctx.new_tensor("f32", (64, 64), name="w")
    with pytest.raises(GraphError, match=r"'x' \(f32, shape \(8, 32\).*'w' \(shape "
                                         r"\(64, 64\)\): mul_mat\(a, b\) is b @ a.T"):
        ops.mul_mat(ctx, w, x)
    v = ctx.new_tensor("f32", (32, 16), name="v")
    with pytest.raises(GraphError, match=r"transposed.*ops.cont\(ctx, a\)"):
        ops.mul_mat(ctx, ops.transpose(ctx, v), x)
    with pytest.raises(GraphError, match=r"cannot be broadcast to 'x' \(shape \(8, 32\)\)"):
        ops.add(ctx, x, w)


# ---------------------------------------------------------------------------
# the README's own graph, on the three backend mixes

def readme_own_graph():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Your own graph", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 20 and "bytes" not in code and "frombuffer" not in code
    return code


def run_own_graph(backends_src, extra_globals, capsys):
    code = readme_own_graph()
    line = re.search(r"^backends = .*$", code, re.M).group(0)
    env = {"__name__": "__readme__", **extra_globals}
    exec(compile(code.replace(line, f"backends = {backends_src}"), "README own graph",
                 "exec"), env)
    capsys.readouterr()
    w, x, out = env["w"], env["x"], env["out"]
    f = {n: t.numpy(np.float32) for n, t in w.items()}
    xv = env["inputs"].astype(np.float32)        # (x's memory went to later nodes)
    q, k, v = (xv @ f[n].T for n in ("wq", "wk", "wv"))
    h = xv + softmax(q @ k.T / 8) @ v
    z = h @ f["w1"].T
    gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    ref = h + gelu @ f["w2"].T
    assert out.shape == (10, 64) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)
    return env


def test_readme_own_graph_on_the_cpu(capsys):
    env = run_own_graph("[CPUBackend()]", {}, capsys)
    assert {s.backend.name for s in env["sched"].splits} == {"CPU"}


def test_readme_own_graph_on_the_numpy_device(capsys):
    env = run_own_graph("[NumpyDeviceBackend(), CPUBackend()]", {}, capsys)
    assert env["sched"].get_tensor_backend(env["y"]) is env["backends"][0]


def test_readme_own_graph_over_rpc(rpc_servers, capsys):
    from ggml_py.backends.rpc import RPCBackend
    env = run_own_graph("[RPCBackend(ENDPOINT), CPUBackend()]",
                        {"RPCBackend": RPCBackend, "ENDPOINT": rpc_servers[0].endpoint}, capsys)
    assert env["sched"].get_tensor_backend(env["y"]) is env["backends"][0]


def test_model_config_takes_numpy_types():
    from ggml_py.models.config import ModelConfig
    cfg = ModelConfig(wtype=np.float32, cache_type="float16")
    assert (cfg.wtype, cfg.cache_type) == ("f32", "f16")
    with pytest.raises(gp.errors.ModelError, match="wtype"):
        ModelConfig(wtype="uint8")


# ---------------------------------------------------------------------------
# weights from arrays in one call, and one step of a graph in one call

def test_tensors_from_arrays_makes_places_and_fills_them(dev):
    rng = np.random.default_rng(1)
    arrays = {"a": rng.standard_normal((3, 40)), "b": np.arange(6, dtype=np.int32).reshape(2, 3)}
    w = gp.tensors_from_arrays(arrays, dev, np.float16)
    assert list(w) == ["a", "b"] and [t.name for t in w.values()] == ["a", "b"]
    assert w["a"].shape == (3, 40) and w["a"].type == "f16"
    buf = gp.get_buffer(w["a"])
    assert buf is gp.get_buffer(w["b"]) and buf.usage == "weights"
    assert buf.buffer_type is dev.get_default_buffer_type()
    np.testing.assert_array_equal(w["a"].numpy(), arrays["a"].astype(np.float16))
    own = gp.tensors_from_arrays({"i": arrays["b"]}, CPUBackend().buffer_type, usage="any")
    assert own["i"].type == "i32" and gp.get_buffer(own["i"]).usage == "any"
    np.testing.assert_array_equal(own["i"].numpy(), arrays["b"])
    with pytest.raises(ArgumentTypeError, match="mapping of names to arrays, got list"):
        gp.tensors_from_arrays([arrays["a"]], dev)           # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="a Backend or a BufferType"):
        gp.tensors_from_arrays(arrays, "NUMPY_DEV")          # type: ignore[arg-type]


def _step_graph(w):
    ctx = Context()
    x = ctx.new_tensor(np.float32, (2, 4), name="x").set_input()
    y = ops.mul_mat(ctx, w, x).set_output()
    z = ops.scale(ctx, y, 2.0).set_output()
    return Graph(16).build_forward_expand(z), x, y, z


def test_run_is_alloc_set_compute_get(dev, cpu):
    wv = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    w = gp.tensors_from_arrays({"w": wv}, dev)["w"]
    sched = gp.Scheduler([dev, cpu])
    graph, x, y, z = _step_graph(w)
    for step in range(3):                   # the same graph again: no new allocation
        xv = np.full((2, 4), step, np.float32)
        yv, zv = sched.run(graph, {x: xv}, [y, z])
        np.testing.assert_allclose(yv, xv @ wv.T, rtol=1e-6)
        np.testing.assert_allclose(zv, 2 * xv @ wv.T, rtol=1e-6)
    assert sched.n_reallocs == 1
    other, x2, _, z2 = _step_graph(w)       # a second graph over the same weights
    with pytest.raises(SchedulerError, match="call reset"):
        sched.run(other, {x2: np.ones((2, 4))}, z2)
    sched.reset()
    np.testing.assert_allclose(sched.run(other, {x2: np.ones((2, 4))}, z2),
                               2 * np.ones((2, 4)) @ wv.T, rtol=1e-6)
    sched.set_eval_callback(lambda t, ask: ask or t.name != z2.name)     # cancels at z2
    with pytest.raises(SchedulerError, match="ABORTED") as e:
        sched.run(other, {x2: np.ones((2, 4))}, z2)
    assert e.value.kind == "not-computed"
    with pytest.raises(ArgumentTypeError, match="mapping of tensors to arrays"):
        sched.run(other, [np.ones((2, 4))], z2)              # type: ignore[arg-type]
