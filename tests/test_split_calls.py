"""Backends answer the split in C: splitting a llama over [device, CPU] makes no Python
call per node, whatever language the backends are written in (the numpy device and
OpenCL in Python with tables / a C rule; RPC with the CPU-server rule; the CPU).

Counted two ways: the backends' Python methods are wrapped (supports_op, offload_op,
supports_buft must never be called), and every Python function call made while the
graph is split is counted with sys.setprofile: the count does not grow with the
number of layers."""

import sys

import pytest

from ggml_py._backend import Backend
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.models.transformer import KVCache, Model, build_forward, graph_size, llama_config
from ggml_py.sched import Scheduler

SPLIT_SLOTS = ("supports_op", "offload_op", "supports_buft")


def _python_calls(fn):
    """(result, number of Python function calls fn made)."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "call":
            n += 1
    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, n - 1                   # fn itself


def _split_calls(device, cpu, n_layer, called):
    """Python calls of one split of a llama of n_layer layers, weights on `device`."""
    model = Model.random(llama_config(n_layer=n_layer, n_embd=64, n_ff=128), seed=1)
    model.place(device, host=cpu)
    fw = build_forward(model, KVCache(model), list(range(8)))
    sched = Scheduler([device, cpu], graph_size=graph_size(model.config))
    called.clear()
    sched.split_graph(fw.graph)                          # warm: first-use imports, caches
    sched.reset()
    _, n = _python_calls(lambda: sched.split_graph(fw.graph))
    assert called == [], f"Python split-time slots were called: {sorted(set(called))}"
    assert len(sched.splits) >= 1
    return n, fw.graph.n_nodes


def _assert_no_calls_per_node(device, monkeypatch):
    cpu = CPUBackend(n_threads=1)
    called = []
    # wrap the Python classes' slots (made after the backends, whose tables are filled)
    for cls in {type(device), type(cpu)}:              # (Backend itself is a C type)
        for slot in SPLIT_SLOTS:
            orig = getattr(cls, slot)

            def wrapped(self, *a, _orig=orig, _slot=slot):
                called.append(_slot)
                return _orig(self, *a)
            monkeypatch.setattr(cls, slot, wrapped)
    n2, nodes2 = _split_calls(device, cpu, 2, called)
    n8, nodes8 = _split_calls(device, cpu, 8, called)
    assert nodes8 > nodes2 + 100
    assert n8 == n2, f"{n8 - n2} more Python calls for {nodes8 - nodes2} more nodes"


def test_numpy_device_split_makes_no_python_call_per_node(monkeypatch):
    with NumpyDeviceBackend(unsupported_ops=["ROPE"]) as dev:
        _assert_no_calls_per_node(dev, monkeypatch)


def test_opencl_split_makes_no_python_call_per_node(monkeypatch):
    from conftest import require_opencl
    require_opencl()
    from ggml_py.backends.opencl import OpenCLBackend
    _assert_no_calls_per_node(OpenCLBackend(), monkeypatch)


def test_rpc_split_makes_no_python_call_per_node(rpc_servers, monkeypatch):
    from ggml_py.backends.rpc import RPCBackend
    r = RPCBackend(rpc_servers[0].endpoint)
    try:
        _assert_no_calls_per_node(r, monkeypatch)
    finally:
        r.close()


def test_a_python_override_is_asked_only_where_the_table_allows_and_super_agrees():
    from ggml_py import Context, ops
    asked = []

    class Picky(Backend):
        def supports_op(self, op):
            asked.append(op.op)
            return op.op != "SCALE" and super().supports_op(op)

    cpu = CPUBackend(n_threads=1)
    dev = Picky("PICKY", cpu.buffer_type, unsupported_ops=["SOFT_MAX"])
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 8))
    a = ops.add(ctx, x, x)
    s = ops.scale(ctx, a, 2.0)
    m = ops.soft_max(ctx, a)
    assert dev.supports_op(a) and not dev.supports_op(s) and not dev.supports_op(m)
    assert Backend.supports_op(dev, s)                  # super(): what the table allows
    assert not Backend.supports_op(dev, m)
    assert asked == ["ADD", "SCALE", "SOFT_MAX"]
