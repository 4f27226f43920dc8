"""The RPC backend against real ggml RPC servers (ggml_py.backends.rpc): ggml 0.10.1's
(protocol 4) and llama.cpp's of llama-cpp-python 0.3.36 (protocol 7).

Two servers of each version run for the session (conftest.rpc_servers), and every test
that uses them runs against both versions. ggml computes with its own CPU kernels
there, so every op case and model file is also a cross-check of the graphs ggml_py
serialises. Skipped without the servers' libraries, unless GGML_PY_REQUIRE_RPC=1.
"""

import ctypes
import json
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ops_dir, require_ggml_rpc
from ggml_py import ops
from ggml_py.backends.rpc import _protocol
from ggml_py.tools import opscheck
from ggml_py._backend import Backend
from ggml_py._core import Context, Graph, OP_NAMES_LIST, TYPE_NAMES
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.rpc import RPCBackend
from ggml_py.models.placement import place_model
from ggml_py.errors import (AllocationError, ArgumentError, BackendError, GgmlPyError, ModelError,
                            RPCError)
from ggml_py.models.transformer import Model as LlamaModel, Session, llama_config, moe_config
from ggml_py.rpc_server import GgmlLibraryError, library_dir, load_libraries
from ggml_py.sched import Scheduler
from test_runtime import Model, cpu_results, load_model, run

require_ggml_rpc()


@pytest.fixture(scope="module")
def rpc(rpc_servers):
    """Device 0 of each session server."""
    return [RPCBackend(s.endpoint) for s in rpc_servers]


def f32(ctx, ne, name):
    return ops.new_tensor(ctx, "f32", ne, name=name)


def put(backend, t, arr):
    """Allocate t alone in a buffer of `backend` and write `arr`; returns the buffer."""
    buf = backend.buffer_type.alloc_buffer(max(t.nbytes, 1))
    buf.tensor_alloc(t, 0)
    if arr is not None:
        backend.set_tensor(t, np.ascontiguousarray(arr))
    return buf


def values(backend, t, dtype=np.float32):
    return np.frombuffer(backend.get_tensor(t), dtype=dtype)


# ---------------------------------------------------------------------------
# ggml's numbers are ggml_py's

def test_op_and_type_numbers_are_ggmls(rpc_protocol):
    """ggml_py's numbers are ggml 0.10.1's (protocol 4's); protocol 7's op numbers are
    what the protocol table makes of them, its types and unary / GLU ops the same."""
    libs = load_libraries(protocol=rpc_protocol)
    base = libs["libggml-base.so"]
    op_names = _protocol.PROTOCOLS[rpc_protocol].op_names
    assert [base.ggml_op_name(i).decode() for i in range(len(op_names))] == list(op_names)
    if rpc_protocol == 4:
        assert op_names == OP_NAMES_LIST
    assert [op_names[i] for i in _protocol.PROTOCOLS[rpc_protocol].op_ids] == list(OP_NAMES_LIST)
    for i, name in enumerate(TYPE_NAMES):
        if name:
            assert base.ggml_type_name(i).decode() == name
    base.ggml_unary_op_name.restype = base.ggml_glu_op_name.restype = ctypes.c_char_p
    assert [base.ggml_unary_op_name(i).decode() for i in range(len(ops.UNARY_OPS))] == list(ops.UNARY_OPS)
    assert [base.ggml_glu_op_name(i).decode() for i in range(len(ops.GLU_OPS))] == list(ops.GLU_OPS)


def test_library_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("GGML_PY_GGML_LIB", str(tmp_path))
    with pytest.raises(GgmlLibraryError, match="libggml-base.so.*GGML_PY_GGML_LIB"):
        library_dir()
    (tmp_path / "libggml-base.so").touch()
    (tmp_path / "libggml.so").touch()
    with pytest.raises(GgmlLibraryError, match="libggml-rpc.so not found.*GGML_RPC=ON"):
        library_dir()


def test_server_process_starts_and_stops(rpc_server_factory, rpc_protocol):
    s = rpc_server_factory()
    assert s.protocol == rpc_protocol
    conn = _protocol.Connection(s.endpoint)
    assert conn.version == (rpc_protocol, 0, 0) and conn.n_devices == 1
    assert conn.protocol is _protocol.PROTOCOLS[rpc_protocol]
    conn.close()
    pid = s.pid
    s.stop()
    assert not s.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert f"Starting RPC server v{rpc_protocol}.0.0" in s.output() or not os.path.exists(s.log_path)
    helptext = subprocess.run([sys.executable, "-m", "ggml_py.rpc_server", "--help"],
                              capture_output=True, text=True, check=True).stdout
    assert "--port" in helptext and "--threads" in helptext and "--protocol" in helptext
    from ggml_py.rpc_server import start_server
    for kw, match in [({"threads": 0}, "threads must be in"), ({"threads": 10**6}, "threads"),
                      ({"port": 70000}, "port must be in")]:       # before ggml sees them
        with pytest.raises(ArgumentError, match=match):
            start_server(**kw)
    bad = subprocess.run([sys.executable, "-m", "ggml_py.rpc_server", "--threads", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("rpc_server: threads must be in")


# ---------------------------------------------------------------------------
# the commands

def test_handshake_and_device_queries(rpc, rpc_protocol):
    r = rpc[0]
    assert r.conn.version == (rpc_protocol, 0, 0)
    assert f"protocol {rpc_protocol}.0.0" in repr(r.conn)
    assert r.conn.device_count() == 1
    free, total = r.device_memory()
    assert 0 < free <= total
    bt = r.buffer_type
    assert isinstance(bt, _protocol.RPCBufferType) and not bt.is_host
    assert bt.alignment == r.conn.get_alignment(0) == 32        # ggml's TENSOR_ALIGNMENT
    assert bt.max_size is None                                  # SIZE_MAX: unbounded
    assert type(bt) is _protocol.RPCBufferType       # a CPU server sizes tensors as ggml_nbytes
    assert r.name == f"RPC0[{r.endpoint}]" and r.device_type == "gpu"
    with pytest.raises(RPCError, match="no device 1: the server has 1"):
        RPCBackend(r.endpoint, 1)


def test_buffers_tensors_and_copies(rpc):
    r = rpc[0]
    ctx = Context()
    a, b = f32(ctx, (6, 3), "a"), f32(ctx, (6, 3), "b")
    buf = r.buffer_type.alloc_buffer(4096)
    assert buf.size >= 4096 and buf.base % r.buffer_type.alignment == 0
    buf.tensor_alloc(a, 0)
    buf.tensor_alloc(b, 1024)
    x = np.arange(18, dtype=np.float32)
    r.set_tensor(a, x)
    assert np.array_equal(values(r, a), x)
    r.set_tensor(a, np.float32([-1, -2]), 8)                     # at an offset
    assert np.array_equal(values(r, a)[:4], [0, 1, -1, -2])
    assert bytes(r.get_tensor(a, 4, 8)) == np.float32([1, -1]).tobytes()
    assert buf.cpy_tensor(a, b)                                 # COPY_TENSOR on the server
    assert np.array_equal(values(r, b), values(r, a))
    buf.clear(0)
    assert not values(r, a).any() and not values(r, b).any()
    with pytest.raises(ArgumentError, match="exceed its 72 bytes"):
        r.set_tensor(a, np.zeros(19, np.float32))
    host = CPUBackend()
    h = f32(ctx, (6, 3), "h")
    hbuf = put(host, h, x)
    assert r.cpy_tensor_async(host, h, a)                       # host -> server: SET_TENSOR
    assert np.array_equal(values(r, a), x)
    assert not host.cpy_tensor_async(r, a, h)
    assert hbuf
    n = r.conn.stats.get("FREE_BUFFER", [0])[0]
    spare = r.buffer_type.alloc_buffer(64)
    del spare                                                   # collected: freed on the server
    gc.collect()
    r.conn.device_count()                                       # ... before the next command
    assert r.conn.stats["FREE_BUFFER"][0] == n + 1
    other = r.buffer_type.alloc_buffer(64)
    other.free()
    assert r.conn.stats["FREE_BUFFER"][0] == n + 2


def test_buffer_arguments_past_their_ranges(rpc, rpc_protocol):
    """An RPC buffer's offsets, sizes and byte values are checked as every buffer's are:
    ArgumentErrors (a negative offset was the typed C argument's OverflowError), the
    connection still usable after."""
    r = rpc[0]
    ctx = Context()
    a = f32(ctx, (8,), "a")
    buf = put(r, a, np.arange(8, dtype=np.float32))
    for call in (lambda: buf.set_tensor(a, b"\0\0\0\0", -1),
                 lambda: buf.get_tensor(a, 2**64),
                 lambda: buf.get_tensor(a, 0, -1),
                 lambda: buf.memset_tensor(a, 256),
                 lambda: buf.memset_tensor(a, 0, 1.5),
                 lambda: buf.clear(-1)):
        with pytest.raises(GgmlPyError):
            call()
    before = dict((k, v[0]) for k, v in r.conn.stats.items())
    buf.memset_tensor(a, 0, 4, 8)
    assert np.array_equal(values(r, a), [0, 0, 0, 3, 4, 5, 6, 7])
    sent = "MEMSET_TENSOR" if rpc_protocol == 7 else "SET_TENSOR"  # (4 has none: the bytes)
    assert r.conn.stats[sent][0] == before.get(sent, 0) + 1
    conn = r.conn                   # the protocol's own: devices, handles, timeouts
    for call in (lambda: conn.get_device_memory(-1), lambda: conn.alloc_buffer(0, -1),
                 lambda: conn.free_buffer(2**64), lambda: conn.buffer_type(2**32),
                 lambda: r.buffer_type.alloc_buffer(-1), lambda: conn.buffer_clear(1, 256),
                 lambda: setattr(conn, "timeout", float("nan")),
                 lambda: setattr(conn, "timeout", 2**64)):
        with pytest.raises(GgmlPyError):
            call()
    assert conn.broken is None and conn.device_count() >= 1


def test_copy_between_servers(rpc):
    ctx = Context()
    a, b = f32(ctx, (8,), "a"), f32(ctx, (8,), "b")
    bufs = [put(rpc[0], a, np.arange(8, dtype=np.float32)), put(rpc[1], b, None)]
    assert rpc[1].cpy_tensor_async(rpc[0], a, b)                 # GET_TENSOR there, SET_TENSOR here
    assert np.array_equal(values(rpc[1], b), np.arange(8))
    assert bufs


def test_set_tensor_hash_uses_the_servers_cache(rpc_server_factory, tmp_path):
    s = rpc_server_factory(cache_dir=str(tmp_path))
    r = RPCBackend(s.endpoint)
    ctx = Context()
    t = f32(ctx, (3 * 1024 * 1024,), "big")                     # 12 MiB > HASH_THRESHOLD
    buf = put(r, t, None)
    x = np.random.default_rng(0).random(t.ne[0], dtype=np.float32)
    r.set_tensor(t, x)                                          # unknown: sent, and cached there
    r.conn.device_count()                                       # a reply: SET_TENSOR is done
    assert r.conn.stats["SET_TENSOR_HASH"][0] == 1 and r.conn.stats["SET_TENSOR"][0] == 1
    assert os.listdir(tmp_path) == [f"{_protocol.fnv_hash(x):016x}"]
    buf.clear(0)
    r.set_tensor(t, x)                                          # known: only the hash travels
    assert r.conn.stats["SET_TENSOR_HASH"][0] == 2 and r.conn.stats["SET_TENSOR"][0] == 1
    assert np.array_equal(values(r, t), x)


def test_allocation_failure_is_clear(rpc):
    r = rpc[0]
    with pytest.raises(AllocationError, match=r"cannot allocate \d+ bytes"):
        r.buffer_type.alloc_buffer(1 << 60)
    r.conn.device_count()                                       # the connection is fine


# ---------------------------------------------------------------------------
# graphs on the wire

def small_graph(r):
    ctx = Context()
    a = f32(ctx, (4, 3), "a").set_input()
    w = f32(ctx, (4, 2), "w")
    y = ops.mul_mat(ctx, w, a)
    z = ops.transpose(ctx, y)
    out = ops.scale(ctx, ops.cont(ctx, z), 2.0)
    g = Graph(16).build_forward_expand(out)
    bufs = [put(r, t, np.arange(t.nelements, dtype=np.float32)) for t in (a, w)]
    bufs.append(opscheck.HostAllocation(r).alloc_graph(g))
    return g, (a, w, y, z, out), bufs


def test_graph_serialisation_is_ggmls_format(rpc):
    r = rpc[0]
    g, (a, w, y, z, out), keep = small_graph(r)
    payload = _protocol.serialize_graph(r, 0, g, r.conn)
    device, ids, rec = _protocol.decode_graph(payload)
    # an independent reading of ggml-rpc.cpp's packed struct
    assert (_protocol.RPC_TENSOR_DTYPE.itemsize
            == 8 + 4 + 8 + 16 + 16 + 4 + 64 + 4 + 80 + 8 + 8 + 8 + 64 + 4)
    assert len(payload) == 12 + 8 * g.n_nodes + 296 * len(rec)
    addr = {t.name: _ptr(t) for t in (a, w, y, z, out)}
    assert device == 0 and list(ids) == [_ptr(n) for n in g.nodes]
    # every tensor once, sources (then view_src) before the tensor that reads them
    c = out.src[0]
    addr[c.name] = _ptr(c)
    assert [x.decode() for x in rec["name"]] == ["w", "a", y.name, z.name, c.name, out.name]
    byname = {x["name"].decode(): x for x in rec}
    assert byname[y.name]["src"][:2].tolist() == [addr["w"], addr["a"]]
    assert byname[z.name]["view_src"] == byname[z.name]["src"][0] == addr[y.name]
    assert byname[c.name]["src"][0] == addr[z.name]
    for t in (a, w, y, z, c, out):
        x = byname[t.name]
        assert x["id"] == addr[t.name] and x["type"] == 0
        assert x["ne"].tolist() == list(t.ne) and x["nb"].tolist() == list(t.nb)
        assert r.conn.protocol.op_names[x["op"]] == t.op and x["op_params"].tolist() == t.op_params
        assert x["use_count"] == 0                              # unknown: the server fuses nothing
        assert x["data"] == t.data_address and x["buffer"] != 0
    assert byname[out.name]["flags"] & 16                       # GGML_TENSOR_FLAG_COMPUTE


def _ptr(t):
    """A tensor's C address, its id on the wire (a Tensor hashes as its struct address)."""
    return hash(t)


def test_recompute_when_the_same_graph_runs_again(rpc):
    r = rpc[0]
    g, (a, _, _, _, out), keep = small_graph(r)
    stats = r.conn.stats
    before = stats.get("GRAPH_RECOMPUTE", [0])[0]
    r.graph_compute(g)
    first = values(r, out).copy()
    r.set_tensor(a, np.ones(12, np.float32))
    r.graph_compute(g)                                          # the same graph: stored one runs
    assert stats["GRAPH_RECOMPUTE"][0] == before + 1
    wa = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(values(r, out), 2 * (wa @ np.ones((4, 3), np.float32)).reshape(-1))
    assert np.allclose(first, 2 * (wa @ np.arange(12, dtype=np.float32).reshape(3, 4).T).reshape(-1))


def test_graph_checks_before_sending(rpc):
    r = rpc[0]
    ctx = Context()
    x = f32(ctx, (8,), "host_x")
    keep = put(CPUBackend(), x, np.ones(8, np.float32))
    y = ops.scale(ctx, x, 2.0)
    g = Graph(8).build_forward_expand(y)
    ybuf = put(r, y, None)
    n = r.conn.stats.get("GRAPH_COMPUTE", [0])[0]
    with pytest.raises(BackendError, match="'host_x' .*input of node.* is in buffer type 'CPU'"):
        r.graph_compute(g)
    bad = ops.mul_mat(ctx, ops.new_tensor(ctx, "f32", (8, 2)), ops.new_tensor(ctx, "f16", (8, 1)))
    assert not r.supports_op(bad)                               # f32 x f16: ggml-cpu would abort
    with pytest.raises(BackendError, match="op MUL_MAT .* is not one a ggml CPU server runs"):
        r.graph_compute([bad])
    u = f32(ctx, (8,), "u")
    ubuf = put(r, u, np.ones(8, np.float32))
    v = ops.scale(ctx, u, 2.0)
    vbuf = put(r, v, None)
    ubuf.free()
    with pytest.raises(BackendError, match="'u' .* is in a freed buffer"):
        r.graph_compute([v])
    with pytest.raises(BackendError, match="'u' is not in its memory"):
        r.get_tensor(u)
    assert r.conn.stats.get("GRAPH_COMPUTE", [0])[0] == n and r.conn.broken is None
    assert keep and ybuf and vbuf


@pytest.mark.parametrize("case", [
    # (op builder, expected) -- the CPU server's kernels, not ggml's "yes" to everything
    (lambda c: ops.mul_mat(c, ops.new_tensor(c, "q8_0", (32, 2)), ops.new_tensor(c, "f32", (32, 1))), True),
    (lambda c: ops.mul_mat(c, ops.new_tensor(c, "q4_0", (32, 2)), ops.new_tensor(c, "q8_0", (32, 1))), True),
    (lambda c: ops.mul_mat(c, ops.new_tensor(c, "q4_0", (32, 2)), ops.new_tensor(c, "f16", (32, 1))), False),
    (lambda c: ops.mul_mat_id(c, ops.new_tensor(c, "q8_0", (32, 4, 2)), ops.new_tensor(c, "f16", (32, 1, 1)),
                              ops.new_tensor(c, "i32", (1, 1))), False),
    (lambda c: ops.soft_max_ext(c, ops.new_tensor(c, "f32", (4, 2)), ops.new_tensor(c, "f16", (4, 2)),
                                1.0, 0.0), True),
    (lambda c: ops.unary(c, ops.new_tensor(c, "bf16", (4,)), "GELU"), False),
    (lambda c: ops.unary(c, ops.new_tensor(c, "bf16", (4,)), "TANH"), True),
    (lambda c: ops.add(c, ops.new_tensor(c, "f16", (4,)), ops.new_tensor(c, "f32", (4,))), True),
    (lambda c: ops.add(c, ops.new_tensor(c, "f32", (4,)), ops.new_tensor(c, "f16", (4,))), False),
    (lambda c: ops.cpy(c, ops.new_tensor(c, "i32", (4,)), ops.new_tensor(c, "f16", (4,))), False),
    (lambda c: ops.cpy(c, ops.new_tensor(c, "f32", (32,)), ops.new_tensor(c, "q4_0", (32,))), True),
    (lambda c: ops.rms_norm(c, ops.new_tensor(c, "f16", (4,)), 1e-5), False),
    (lambda c: ops.get_rows(c, ops.new_tensor(c, "q4_0", (32, 4)), ops.new_tensor(c, "i32", (2,))), True),
    (lambda c: ops.reshape_2d(c, ops.new_tensor(c, "f16", (4,)), 2, 2), True),
    # ACC: the kernel asserts b's region inside a (the server would abort), and packed rows
    (lambda c: ops.acc(c, ops.new_tensor(c, "f32", (18, 5, 8, 9)), ops.new_tensor(c, "f32", (6, 4, 8, 9)),
                       72, 360, 2880, 80), True),
    (lambda c: ops.acc(c, ops.new_tensor(c, "f32", (18, 5, 8, 9)), ops.new_tensor(c, "f32", (6, 8, 8, 9)),
                       72, 360, 2880, 80), False),
    (lambda c: ops.acc(c, ops.new_tensor(c, "f32", (8, 8)), ops.transpose(c, ops.new_tensor(c, "f32", (4, 4))),
                       32, 256, 256, 0), False),
    # layouts: most kernels assert packed rows (the server aborts), some assume more
    (lambda c: ops.add(c, ops.transpose(c, ops.new_tensor(c, "f32", (4, 6))), ops.new_tensor(c, "f32", (6, 4))), False),
    (lambda c: ops.add(c, ops.permute(c, ops.new_tensor(c, "f32", (4, 6, 2)), 0, 2, 1, 3),
                       ops.new_tensor(c, "f32", (4, 2, 6))), True),
    (lambda c: ops.scale(c, ops.view_2d(c, ops.new_tensor(c, "f32", (8, 4)), 6, 4, 32, 0), 2.0), False),
    (lambda c: ops.unary(c, ops.permute(c, ops.new_tensor(c, "f32", (4, 6, 2)), 0, 2, 1, 3), "GELU"), True),
    (lambda c: ops.unary(c, ops.view_2d(c, ops.new_tensor(c, "f32", (8, 4)), 6, 4, 32, 0), "GELU"), True),
    (lambda c: ops.sqr(c, ops.transpose(c, ops.new_tensor(c, "f32", (4, 6)))), False),
    (lambda c: ops.rms_norm(c, ops.transpose(c, ops.new_tensor(c, "f32", (4, 6))), 1e-5), False),
    (lambda c: ops.cpy(c, ops.transpose(c, ops.new_tensor(c, "f32", (32, 32))), ops.new_tensor(c, "q8_0", (32, 32))), False),
    (lambda c: ops.cpy(c, ops.transpose(c, ops.new_tensor(c, "f32", (32, 32))), ops.new_tensor(c, "f16", (32, 32))), True),
], ids=lambda c: "" if callable(c) else str(c))
def test_supports_op_follows_the_cpu_kernels(rpc, case):
    build, expected = case
    assert rpc[0].supports_op(build(Context())) is expected


def test_supports_op_is_answered_in_c(rpc):
    r = rpc[0]
    assert type(r).supports_op is Backend.supports_op           # no Python override to ask
    limited = RPCBackend(r.endpoint, unsupported_ops=["ROPE"])
    ctx = Context()
    x = ops.new_tensor(ctx, "f32", (8, 2, 3))
    rope = ops.rope_ext(ctx, x, ops.new_tensor(ctx, "i32", (3,)), None, 8, "NORMAL", 32,
                        10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert r.supports_op(rope) and not limited.supports_op(rope)
    assert not r.supports_op(ctx.new_op("CONV_2D", [x, x], "f32", (1,)))    # never checked: no


# ---------------------------------------------------------------------------
# every op case and model file on ggml's own kernels

OP_FILES = sorted(p.name for p in ops_dir().glob("*.json"))
MODEL_FILES = sorted(p.name for p in (ops_dir() / "models").glob("*.json"))


@pytest.mark.parametrize("fname", OP_FILES + [f"models/{m}" for m in MODEL_FILES])
def test_ops_on_a_ggml_server(rpc, fname):
    """Each case is rebuilt by ggml_py, serialised and computed by ggml's CPU kernels on
    the server; the results must meet ggml's references (none skipped)."""
    bad = []
    for kind, case in opscheck.load_cases(str(ops_dir() / fname)):
        res = (opscheck.run_model if kind == "model" else opscheck.run_case)(case, rpc[0])
        if not res["passed"]:
            bad.append(f"{res['name']}: {'skipped' if res['skipped'] else 'failed'} {res['message']} "
                       f"err={res['error']}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------
# models over two servers and the CPU

def by_layer(r0, r1, cpu):
    """llama.cpp's layout for two layers over two servers: layer 0 on the first, layer 1
    and the output on the second, the token embeddings on the CPU."""
    def place(name):
        if name.startswith("blk.0."):
            return r0
        if name.startswith("tok_embd"):
            return cpu
        return r1
    return place


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("name", ["llama_2L", "moe_2L"])
def test_model_files_over_two_servers(rpc, name, parallel):
    cpu = CPUBackend()
    m = Model(load_model(name), [*rpc, cpu], by_layer(*rpc, cpu))
    sched = Scheduler([*rpc, cpu], parallel=parallel)
    res = run(m, sched)
    m.check(res)                                            # ggml's reference, the file's tolerance
    ref = cpu_results(name)
    tol = float(load_model(name)["tolerance"])
    for k in ref:
        assert opscheck.nmse(ref[k], res[k])[0] < tol, k
    assert {s.backend.name for s in sched.splits} >= {rpc[0].name, rpc[1].name}
    links = sched.profile.links()
    assert links[(rpc[0].name, rpc[1].name)]["bytes"] > 0   # layer 0's output went across
    assert all(v["seconds"] > 0 for v in links.values())
    if not parallel:
        # computed again as it is: each server runs its stored graph (GRAPH_RECOMPUTE)
        before = [r.conn.stats.get("GRAPH_RECOMPUTE", [0])[0] for r in rpc]
        m.set_inputs(sched)
        sched.graph_compute(m.graph)
        m.check(m.results(sched))
        assert [r.conn.stats.get("GRAPH_RECOMPUTE", [0])[0] for r in rpc] == [n + 1 for n in before]


def test_moe_experts_from_host_memory(rpc):
    """Expert weights on the CPU, their MUL_MAT_IDs assigned to a server: the runtime sends
    only the experts the ids use (SET_TENSOR at offsets)."""
    cpu = CPUBackend()
    m = Model(load_model("moe_2L"), [rpc[0], cpu],
              lambda n: cpu if "_exps" in n or n.startswith("tok_embd") else rpc[0])
    sched = Scheduler([rpc[0], cpu])
    for t in m.graph.nodes:
        if t.op == "MUL_MAT_ID":
            sched.set_tensor_backend(t, rpc[0])
    m.check(run(m, sched))
    p = sched.profile
    assert p.moe_bytes_copied > 0 and p.moe_bytes_saved > 0
    assert p.links()[("CPU", rpc[0].name)]["bytes"] >= p.moe_bytes_copied


DEMO = {"llama": llama_config(), **{k: moe_config(k) for k in ("moe_dense", "moe_topk", "moe_shared")}}


@pytest.mark.parametrize("kind", list(DEMO))
def test_demo_models_over_two_servers(rpc, kind):
    cfg = DEMO[kind]
    cpu = CPUBackend()
    model = place_model(LlamaModel.random(cfg, seed=1), [*rpc, cpu])
    used = {b.name for b in model.layer_backend}
    assert used == {rpc[0].name, rpc[1].name}               # layers spread over both servers
    sess = Session(model, [*rpc, cpu])
    ref = Session(LlamaModel.random(cfg, seed=1).place(cpu), [cpu])
    for tokens in ([3, 1, 4, 1, 5], [9], [2]):              # a prompt, then decode steps
        got, want = sess.forward(tokens), ref.forward(tokens)
        assert opscheck.nmse(want, got)[0] < 2e-3          # the model files' tolerance
    assert {s.backend for s in sess.history[-1].splits} >= used


def random_model_configs(n, seed):
    """n model configurations drawn at random: head counts and sizes (GQA ratios 1 to 4,
    heads of 8 to 64), partial rope, both rope types and their frequencies, every
    weight type, f16 or f32 cache cells, dense and MoE FFNs, 1 to 3 layers."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        n_head_kv = int(rng.choice([1, 2, 4]))
        n_head = n_head_kv * int(rng.choice([1, 2, 4]))
        head = int(rng.choice([8, 16, 32, 64]))
        kw = dict(n_embd=head * n_head, n_head=n_head, n_head_kv=n_head_kv,
                  n_layer=int(rng.integers(1, 4)), n_ff=int(rng.choice([32, 64, 96, 160])),
                  n_vocab=int(rng.choice([64, 200, 256])), rope_mode=str(rng.choice(["NORMAL", "NEOX"])),
                  n_rot=int(rng.choice([head, head // 2])), rope_freq_base=float(rng.choice([1e4, 5e5])),
                  rope_freq_scale=float(rng.choice([1.0, 0.5])), eps=float(rng.choice([1e-5, 1e-6])),
                  wtype=str(rng.choice(["f32", "f16", "q8_0", "q4_0"])),
                  cache_type=str(rng.choice(["f16", "f32"])))
        ffn = str(rng.choice(["dense", "moe_topk", "moe_shared"]))
        try:
            out.append(llama_config(**kw) if ffn == "dense" else moe_config(ffn, **kw, n_ff_exp=64))
        except ModelError:
            continue                        # e.g. a quant type with rows of 8 or 16 values
    return out


@pytest.mark.parametrize("where", ["one server", "two servers and the CPU"])
@pytest.mark.parametrize("cfg", random_model_configs(6, seed=11), ids=lambda c: c.name)
def test_random_models_on_servers_match_the_cpu(rpc, cfg, where):
    """Models of other shapes than the model files: the whole model computed by ggml's
    kernels on a server, or its layers split over two servers and the CPU (llama.cpp's
    -ngl with a tensor split; the scheduler copies between them), and by ggml_py's CPU
    backend alone: a prompt, then decode steps."""
    cpu = CPUBackend()
    model = LlamaModel.random(cfg, seed=2)
    if where == "one server":
        backends = [rpc[0], cpu]
        model = model.place(rpc[0])
    else:
        backends = [*rpc, cpu]
        model = place_model(model, backends, n_gpu_layers=max(cfg.n_layer, 2),
                            tensor_split=[1, 1])
    sess = Session(model, backends)
    ref = Session(LlamaModel.random(cfg, seed=2).place(cpu), [cpu])
    for tokens in ([3, 1, 4, 1, 5, 9, 2], [6], [5]):
        got, want = sess.forward(tokens), ref.forward(tokens)
        assert opscheck.nmse(want, got)[0] < 2e-3, cfg


# ---------------------------------------------------------------------------
# a server that dies in the middle of a compute

def test_server_killed_during_compute(rpc_server_factory):
    import threading
    s = rpc_server_factory()
    r = RPCBackend(s.endpoint, timeout=30)
    cpu = CPUBackend()
    ctx = Context()
    w = f32(ctx, (512, 512), "w")
    wbuf = put(r, w, np.full(512 * 512, 1e-3, np.float32))
    x0 = f32(ctx, (512, 1024), "x0").set_input()
    x = x0
    for _ in range(400):                                    # ~200 GFLOP: seconds on one thread
        x = ops.mul_mat(ctx, w, x)
    g = Graph(1024).build_forward_expand(x)
    sched = Scheduler([r, cpu], graph_size=1024)
    sched.alloc_graph(g)
    cpu.set_tensor(x0, np.ones(512 * 1024, np.float32))
    killer = threading.Timer(0.3, s.stop)
    killer.start()
    try:
        with pytest.raises(RPCError, match=f"RPC server {s.endpoint}: .*(closed|failed)"):
            sched.graph_compute(g)
    finally:
        killer.join()
    with pytest.raises(RPCError, match="lost earlier"):
        r.synchronize()
    # the process, the CPU backend and new schedulers carry on
    ctx2 = Context()
    a = f32(ctx2, (4,), "a").set_input()
    out = ops.scale(ctx2, a, 3.0)
    g2 = Graph(8).build_forward_expand(out)
    s2 = Scheduler([cpu])
    s2.alloc_graph(g2)
    cpu.set_tensor(a, np.ones(4, np.float32))
    s2.graph_compute(g2)
    assert np.array_equal(values(cpu, out), [3, 3, 3, 3])
    sched.reset()
    with pytest.raises(RPCError, match="lost earlier"):    # the dead server: clear, no hang
        sched.graph_compute(g)
    assert wbuf


# ---------------------------------------------------------------------------
# the command line over servers

def test_cli_ops_check_on_a_server(rpc_servers, capsys):
    from ggml_py.__main__ import main
    ep = rpc_servers[0].endpoint
    rc = main(["ops-check", str(ops_dir() / "rms_norm.json"), "--backend", "rpc", "--rpc", ep,
               "--time", "--reps", "2", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, lines[-1]
    rows = [json.loads(line) for line in lines[:-1]]
    assert rows and all(r["passed"] and r["compute_us_median"] > 0 for r in rows)
    assert lines[-1] == f"{len(rows)} passed, 0 failed, 0 skipped"


def test_cli_demo_over_two_servers(rpc_servers, capsys):
    """`demo --rpc A,B`: the layers go to both servers (two devices, CPU last), as
    --tensor-split says, and the models generate."""
    from ggml_py.__main__ import main
    eps = ",".join(s.endpoint for s in rpc_servers)
    rc = main(["demo", "--rpc", eps, "--tensor-split", "1,1", "--layers", "2", "--prompt", "3",
               "--steps", "2", "--no-plan"])
    out = capsys.readouterr().out
    assert rc == 0
    names = [f"RPC0[{s.endpoint}]" for s in rpc_servers]
    assert "backends (priority order): " + ", ".join(names + ["CPU"]) in out
    assert out.count("greedy") == 5          # llama, 3 MoE, gemma2


def test_cli_demo_server_down_is_one_line(capsys):
    from ggml_py.__main__ import main
    from ggml_py.rpc_server import free_port
    rc = main(["demo", "--rpc", f"127.0.0.1:{free_port()}", "--no-plan", "--layers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "cannot connect" in err[0]
