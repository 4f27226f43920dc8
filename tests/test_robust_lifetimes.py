"""Ownership: no tensor is ever left pointing at freed memory, and several graphs take
turns on one scheduler as in ggml.

The split rewires the user's graph to the scheduler's copies; the graph allocator
points tensors into its compute buffers. Both are taken back when they would dangle:
the rewiring when the scheduler splits another graph, is closed or is dropped; the
placements when the allocator places another graph, replaces its buffers or is
dropped. A tensor whose placement was taken back reads as unallocated, a buffer that
was released raises ReleasedMemoryError."""

import gc
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ggml_py as gp
from conftest import shared_path
from ggml_py import ops
from ggml_py._backend import clear_buffer
from ggml_py.alloc import GraphAllocator
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.tools.cases import load_case
from ggml_py.errors import (BackendError, CaseFormatError, GraphError, ReleasedMemoryError,
                            SchedulerError)
from ggml_py.tools.planning import plan_case
from ggml_py.sched import Scheduler
from test_robust_api import run_python

CASE = shared_path() / "cases" / "llama-2L-gpu-unsupported.case.json"


@pytest.fixture(scope="module")
def backends():
    dev = NumpyDeviceBackend(unsupported_ops=["SOFT_MAX"])
    yield dev, CPUBackend()
    dev.close()


class Softmax:
    """y = softmax(x * scale), the scale on the device and the softmax on the CPU (a
    copy between them), in a context of its own or a shared one."""

    def __init__(self, scale, ctx=None, x=None):
        self.ctx = ctx or gp.Context(f"softmax{scale}")
        self.x = x if x is not None else self.ctx.new_tensor("f32", (4, 16), name="x").set_input()
        self.s = ops.scale(self.ctx, self.x, scale)
        self.y = ops.soft_max(self.ctx, self.s).set_output()
        self.graph = gp.Graph(16).build_forward_expand(self.y)
        self.scale = scale

    def run(self, sched, dev, cpu, rng):
        """reset, alloc, set x, compute: y's values, and the reference."""
        sched.reset()
        sched.set_tensor_backend(self.s, dev)
        sched.alloc_graph(self.graph)
        xv = rng.random((4, 16), dtype=np.float32)
        cpu.set_tensor(self.x, xv)
        sched.graph_compute(self.graph)
        got = np.frombuffer(cpu.get_tensor(self.y), np.float32).reshape(4, 16)
        z = xv * self.scale
        e = np.exp(z - z.max(1, keepdims=True))
        return got, e / e.sum(1, keepdims=True)

    def sources(self):
        return [[s.name if s is not None else None for s in n.src] for n in self.graph.nodes]


# ---------------------------------------------------------------------------
# the crashes of the issue, each in a fresh interpreter

REPROS = {
    "view with a buffer, view_src without": """
import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.sched import Scheduler
from ggml_py.errors import GgmlPyError
cpu = CPUBackend()
ctx = gp.Context()
a = ctx.new_tensor("f32", (4, 8), name="a")
r = ctx.reshape(a, (32,))
try:
    gp.set_buffer(r, gp.host_buffer(cpu.buffer_type, 128))
except GgmlPyError as e:
    print("refused:", e)
gp.set_buffer(a, gp.host_buffer(cpu.buffer_type, 128))
gp.set_buffer(r, gp.host_buffer(cpu.buffer_type, 128))
from ggml_py._backend import clear_buffer
clear_buffer(a)                         # the same state, reached another way
g = gp.Graph(8).build_forward_expand(gp.ops.scale(ctx, r, 2.0))
try:
    Scheduler([cpu], graph_size=16).split_graph(g)
except GgmlPyError as e:
    print("refused:", e)
""",
    "scheduler dropped after a split": """
import gc
import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.sched import Scheduler
dev, cpu = NumpyDeviceBackend(unsupported_ops=["SOFT_MAX"]), CPUBackend()
ctx = gp.Context()
x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
s = gp.ops.scale(ctx, x, 0.5)
y = gp.ops.soft_max(ctx, s)
g = gp.Graph(16).build_forward_expand(y)
sch = Scheduler([dev, cpu], graph_size=16)
sch.set_tensor_backend(s, dev)
sch.split_graph(g)
first = sch.plan().to_dict()
del sch
gc.collect()
junk = [gp.Context() for _ in range(200)]
print("srcs", [t.name for t in g.nodes[-1].src])
sch2 = Scheduler([dev, cpu], graph_size=16)
sch2.set_tensor_backend(s, dev)
sch2.split_graph(g)
print("same plan", sch2.plan().to_dict() == first)
dev.close()
""",
    "reset and a bigger graph": """
import gc
import numpy as np
import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.sched import Scheduler
from ggml_py.errors import GgmlPyError
cpu = CPUBackend()
ctx = gp.Context()
x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
y = gp.ops.scale(ctx, x, 0.5)
g = gp.Graph(16).build_forward_expand(y)
sch = Scheduler([cpu], graph_size=64)
sch.alloc_graph(g)
cpu.set_tensor(x, np.ones((4, 16), np.float32))
sch.graph_compute(g)
held = gp.get_buffer(y)
ctx2 = gp.Context()
x2 = ctx2.new_tensor("f32", (400, 1600), name="x2").set_input()
g2 = gp.Graph(16).build_forward_expand(gp.ops.scale(ctx2, x2, 0.5))
sch.reset()
sch.alloc_graph(g2)
gc.collect()
junk = [np.ones(100000) for _ in range(10)]
for read in (lambda: cpu.get_tensor(y), lambda: held.memory):
    try:
        read()
        print("read")
    except GgmlPyError as e:
        print("refused:", type(e).__name__, e)
""",
}


@pytest.mark.parametrize("name", list(REPROS))
def test_issue_crash_repros_run_cleanly(name):
    rc, out = run_python(REPROS[name])
    assert rc == 0, out
    assert "Traceback" not in out and "read\n" not in out, out
    if name == "scheduler dropped after a split":
        assert "srcs ['node_0']" in out and "same plan True" in out, out
    else:
        assert out.count("refused:") == 2, out
    if name == "reset and a bigger graph":
        assert "is not allocated" in out and "ReleasedMemoryError" in out, out


# ---------------------------------------------------------------------------
# views whose memory is not there

def test_view_with_a_buffer_and_no_view_src_buffer_is_refused_by_the_split():
    cpu = CPUBackend()
    ctx = gp.Context()
    a = ctx.new_tensor("f32", (4, 8), name="a")
    r = ctx.reshape(a, (32,))
    with pytest.raises(GraphError, match="view_src 'a' has none"):
        gp.set_buffer(r, gp.host_buffer(cpu.buffer_type, 128))
    gp.set_buffer(a, gp.host_buffer(cpu.buffer_type, 128))
    gp.set_buffer(r, gp.host_buffer(cpu.buffer_type, 128))
    clear_buffer(a)
    g = gp.Graph(8).build_forward_expand(ops.scale(ctx, r, 2.0))
    sched = Scheduler([cpu], graph_size=16)
    with pytest.raises(SchedulerError, match="view_src 'a' has none") as e:
        sched.split_graph(g)
    assert e.value.kind == "unsupported-preallocated"
    # usable afterwards
    gp.set_buffer(a, gp.host_buffer(cpu.buffer_type, 128))
    sched.reset()
    sched.split_graph(g)
    assert sched.n_splits == 1


def test_case_file_view_with_a_buffer_and_no_view_src_buffer_is_refused():
    d = json.loads(CASE.read_text())
    d["tensors"][61]["buffer"] = {"buffer_type": "CPU", "usage": "any"}     # Kcur-1 (reshaped)
    with pytest.raises(CaseFormatError, match="tensor 61 .* a view with a buffer"):
        load_case(d)
    # its view_src placed too: loads and plans (views are placed after their bases)
    d["tensors"][60]["buffer"] = {"buffer_type": "CPU", "usage": "any"}
    _, plan = plan_case(load_case(d), alloc=True)
    assert plan.n_splits >= 1


# ---------------------------------------------------------------------------
# the rewiring

def test_a_dropped_scheduler_gives_the_graph_its_sources_back(backends):
    dev, cpu = backends
    m = Softmax(0.5)
    before = m.sources()
    sched = Scheduler([dev, cpu], graph_size=32)
    sched.set_tensor_backend(m.s, dev)
    sched.split_graph(m.graph)
    assert m.sources() != before            # the softmax reads the copy on the CPU
    del sched
    gc.collect()
    assert m.sources() == before


def test_close_gives_back_sources_and_placements_and_the_scheduler_goes_on(backends):
    dev, cpu = backends
    m = Softmax(2.0)
    before = m.sources()
    rng = np.random.default_rng(0)
    with Scheduler([dev, cpu], graph_size=32) as sched:
        got, ref = m.run(sched, dev, cpu, rng)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        chunk = gp.get_buffer(m.y)
        sched.close()
        assert m.sources() == before and m.y.data_address == 0 and chunk.released
        with pytest.raises(BackendError, match="'node_1' .* is not allocated"):
            cpu.get_tensor(m.y)
        with pytest.raises(ReleasedMemoryError):
            chunk.memory
        got, ref = m.run(sched, dev, cpu, rng)        # allocates again
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert m.sources() == before                      # left by `with`


@pytest.mark.parametrize("parallel", [False, True])
def test_two_graphs_take_turns_on_one_scheduler(backends, parallel):
    """The issue's alternation: 2 right results out of 20 before."""
    dev, cpu = backends
    ctx = gp.Context()
    x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
    graphs = [Softmax(0.5, ctx, x), Softmax(1.5, ctx, x)]      # sharing their input
    sched = Scheduler([dev, cpu], graph_size=32, parallel=parallel)
    rng = np.random.default_rng(1)
    for i in range(20):
        got, ref = graphs[i % 2].run(sched, dev, cpu, rng)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    sched.close()


def test_splitting_a_graph_again_after_another_gives_the_same_plan():
    case_a = load_case(CASE)
    case_b = load_case(shared_path() / "cases" / "llama-4L-partial-offload.case.json")
    # one scheduler over A's backends: B's graph on them has the same buffer types
    sched = Scheduler(case_a.backends, graph_size=4096)
    plans = []
    for case in (case_a, case_b, case_a, case_b, case_a):
        sched.reset()
        if case is case_a:
            for t, b in case.assignments:
                sched.set_tensor_backend(t, b)
        try:
            sched.split_graph(case.graph)
        except SchedulerError:
            continue                                    # B may not fit A's backends
        plans.append((case.name, sched.plan(case.name).to_dict()))
    a_plans = [p for n, p in plans if n == case_a.name]
    assert len(a_plans) == 3 and a_plans[0] == a_plans[1] == a_plans[2]


def test_standalone_allocator_takes_back_placements_and_releases_buffers():
    buft = gp.BufferType("CPU", 32, is_host=True)
    ctx = gp.Context()
    a = ctx.new_tensor("f32", (16,), name="a").set_input()
    g1 = gp.Graph(8).build_forward_expand(ops.scale(ctx, a, 2.0))
    b = ctx.new_tensor("f32", (4096,), name="b").set_input()
    g2 = gp.Graph(8).build_forward_expand(ops.scale(ctx, b, 2.0))
    with GraphAllocator([buft]) as galloc:
        galloc.reserve(g1)
        galloc.alloc_graph(g1)
        held = gp.get_buffer(a)
        galloc.reserve(g2)              # a larger buffer: the first one is released
        galloc.alloc_graph(g2)
        assert a.data_address == 0 and gp.get_buffer(a) is None and held.released
        assert b.data_address != 0
    assert b.data_address == 0 and galloc.get_buffer_size(0) == 0


@settings(max_examples=25)
@given(st.lists(st.tuples(st.sampled_from(["compute", "split", "reserve", "reserve_size",
                                           "reset", "close"]),
                          st.integers(0, 2)), min_size=1, max_size=14),
       st.booleans())
def test_interleavings_of_graphs_on_one_scheduler(steps, parallel):
    """Any order of computes, splits, reservations (real and dry-run), resets and closes
    of three graphs (two sharing an input) on one scheduler: every compute is right,
    every graph not split last has its own sources, every split gives the graph's plan."""
    dev, cpu = _BACKENDS
    ctx = gp.Context()
    x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
    graphs = [Softmax(0.5, ctx, x), Softmax(1.5, ctx, x), Softmax(3.0)]
    sources = [m.sources() for m in graphs]
    sched = Scheduler([dev, cpu], graph_size=32, parallel=parallel)
    rng = np.random.default_rng(2)
    plans = {}
    last = None
    for what, k in steps:
        m = graphs[k]
        if what == "compute":
            got, ref = m.run(sched, dev, cpu, rng)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
            last = k
        elif what == "split":
            sched.reset()
            sched.set_tensor_backend(m.s, dev)
            sched.split_graph(m.graph)
            plan = json.dumps(sched.plan().to_dict()["splits"])
            assert plans.setdefault(k, plan) == plan
            last = k
        elif what == "reserve":
            sched.reset()
            sched.set_tensor_backend(m.s, dev)
            assert sched.reserve(m.graph)
            last = k
        elif what == "reserve_size":
            sizes = sched.reserve_size(m.graph)
            assert sizes[cpu.name] > 0
            last = k
        elif what == "reset":
            sched.reset()
        else:
            sched.close()
            last = None
        for j, other in enumerate(graphs):
            if j != last:
                assert other.sources() == sources[j]
    sched.close()
    assert [m.sources() for m in graphs] == sources


_BACKENDS = (NumpyDeviceBackend("DEV_H", unsupported_ops=["SOFT_MAX"]), CPUBackend())


def teardown_module():
    _BACKENDS[0].close()


def test_scheduler_copies_kept_by_the_user_stay_safe(backends):
    dev, cpu = backends
    m = Softmax(0.5)
    sched = Scheduler([dev, cpu], graph_size=32)
    sched.set_tensor_backend(m.s, dev)
    sched.split_graph(m.graph)
    nodes, _, _, _ = sched.graph_copy
    mine = [t for t in nodes if sched.describe(t) is not None]
    assert mine
    del sched, m
    gc.collect()
    for t in mine:      # the arena lives on in the handles; what it pointed at is cut
        assert t.view_src is None and t.src == [] and t.data_address == 0


def test_snapshot_restore_after_the_buffers_were_released():
    from ggml_py._schedtime import GraphSnapshot
    cpu = CPUBackend()
    m = Softmax(1.0)
    sched = Scheduler([cpu], graph_size=32)
    sched.alloc_graph(m.graph)
    snap = GraphSnapshot(m.graph)       # holds addresses in the compute buffer
    sched.close()                       # ... which is released
    snap.restore()
    assert m.y.data_address == 0 and gp.get_buffer(m.y) is None
    sched.alloc_graph(m.graph)          # and the graph allocates again
    assert m.y.data_address != 0
