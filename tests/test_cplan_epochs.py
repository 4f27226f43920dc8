"""The CPU executor's cplans have one source of staleness, the mutation epochs: every
write of a field a cplan depends on (a node's or a source's op, shape, strides,
op_params, sources, memory) stamps the tensor, through each public path and through
the scheduler's rewiring, and the next compute of the same graph builds a new cplan
and gets the new result. Each test fails when the stamp it covers is missing: the
executor would keep the cplan (n_builds), and where the kept one would run on stale
choices (a kernel, a memory check) the result or the error shows it too."""

import numpy as np
import pytest

from ggml_py import ops
from ggml_py._backend import clear_buffer, host_buffer, set_buffer, view_init
from ggml_py._core import Context, Graph, mutation_epochs
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.backends.cpu import CPUBackend, tensor_array
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import ComputeError, ReleasedMemoryError
from ggml_py.sched import Scheduler
from ggml_py.tools import opscheck

X = np.arange(32, dtype=np.float32).reshape(4, 8)
Y = np.full((4, 8), 0.5, np.float32)


class AddScale:
    """out = scale(add(x, y), 2) on a 1-thread CPU backend, each tensor in a buffer of
    its own; y is a view of `base` (view_init places it again after its base moves).
    Computed once: one cplan."""

    def __init__(self):
        self.cpu = CPUBackend(n_threads=1)
        ctx = self.ctx = Context()
        self.x = ctx.new_tensor("f32", (4, 8), name="x")
        self.base = ctx.new_tensor("f32", (4, 8), name="base")
        self.y = ctx.view(self.base, (4, 8), name="y")
        self.sum = ops.add(ctx, self.x, self.y)
        self.out = ops.scale(ctx, self.sum, 2.0)
        self.graph, self.alloc = opscheck.prepare(self.cpu, self.out,
                                                  [(self.x, X), (self.base, Y)])
        assert self.recomputes() and self.cpu.executor.n_builds == 1
        self.check((X + Y) * 2)
        assert not self.recomputes()            # unchanged: the cplan is kept

    def recomputes(self):
        """Compute the graph again: did it take a new cplan?"""
        builds = self.cpu.executor.n_builds
        self.cpu.graph_compute(self.graph)
        return self.cpu.executor.n_builds > builds

    def check(self, want):
        got = np.array(tensor_array(self.out)).reshape(-1, 8)
        np.testing.assert_allclose(got[:len(want)], want, rtol=1e-6)

    def moved(self, t):
        """A new buffer of t's size (t not placed in it yet)."""
        buf = host_buffer(self.cpu.get_default_buffer_type(), t.nbytes)
        self.alloc.buffers.append(buf)
        return buf


# ---------------------------------------------------------------------------
# the node's own fields

def test_op():
    c = AddScale()
    c.sum.op = "MUL"
    assert c.recomputes()
    c.check(X * Y * 2)          # a kept cplan would run ADD's kernel


def test_op_params():
    c = AddScale()
    c.out.set_op_params([ops.f32_bits(0.25), 0])
    assert c.recomputes()
    c.check((X + Y) * 0.25)


def test_ne():
    c = AddScale()
    c.out.ne = [8, 40, 1, 1]        # more rows than its buffer holds
    with pytest.raises(ComputeError, match="reaches past the end of its buffer"):
        c.cpu.graph_compute(c.graph)
    for t in (c.x, c.y, c.sum, c.out):
        t.ne = [8, 2, 1, 1]         # fewer rows: fine
    assert c.recomputes()
    c.check((X + Y)[:2] * 2)


def test_nb():
    c = AddScale()
    c.x.nb = [4, 0, 128, 128]       # every row of x reads its first
    assert c.recomputes()
    c.check((X[:1] + Y) * 2)
    c.x.nb = [4, 64, 128, 128]      # past x's buffer
    with pytest.raises(ComputeError, match="reaches past the end of its buffer"):
        c.cpu.graph_compute(c.graph)


def test_set_src():
    c = AddScale()
    c.sum.set_src(1, c.x)
    assert c.recomputes()
    c.check((X + X) * 2)


# ---------------------------------------------------------------------------
# memory: every way a tensor is placed or unplaced

def test_set_buffer():
    c = AddScale()
    set_buffer(c.x, c.moved(c.x))
    c.cpu.set_tensor(c.x, (3 * X).tobytes())
    assert c.recomputes()
    c.check((3 * X + Y) * 2)


def test_tensor_alloc_and_clear_buffer():
    c = AddScale()
    clear_buffer(c.x)
    with pytest.raises(ComputeError, match="not allocated"):
        c.cpu.graph_compute(c.graph)
    c.moved(c.x).tensor_alloc(c.x, 0)
    c.cpu.set_tensor(c.x, (5 * X).tobytes())
    assert c.recomputes()
    c.check((5 * X + Y) * 2)


def test_view_init():
    c = AddScale()
    set_buffer(c.base, c.moved(c.base))
    c.cpu.set_tensor(c.base, (7 * Y).tobytes())
    assert c.recomputes()           # base is y's source; y still reads the old bytes
    c.check((X + Y) * 2)
    clear_buffer(c.y)
    view_init(c.y)                  # y follows its base
    assert c.recomputes()
    c.check((X + 7 * Y) * 2)


def test_a_released_buffer():
    c = AddScale()
    buf = c.moved(c.x)
    set_buffer(c.x, buf)
    c.cpu.set_tensor(c.x, X.tobytes())
    assert c.recomputes()
    buf.release()
    with pytest.raises(ReleasedMemoryError, match="was released"):
        c.cpu.graph_compute(c.graph)


def test_a_list_of_nodes_is_its_own_key():
    # compute_nodes keys a cplan by the very tensors: another list of as many nodes,
    # with the same first and last, is not taken for it
    c = AddScale()
    other = ops.sub(c.ctx, c.x, c.y)
    opscheck.HostAllocation(c.cpu).alloc(other)
    c.cpu.graph_compute([c.sum, c.out])
    builds = c.cpu.executor.n_builds
    c.cpu.graph_compute([c.sum, c.out])
    assert c.cpu.executor.n_builds == builds
    c.cpu.graph_compute([c.sum, other, c.out])
    c.cpu.graph_compute([c.sum, other, c.out])
    assert c.cpu.executor.n_builds == builds + 1
    np.testing.assert_allclose(np.array(tensor_array(other)).reshape(4, 8), X - Y)


def test_an_unchanged_graph_keeps_its_cplan_and_computing_stamps_nothing():
    c = AddScale()
    before = mutation_epochs()
    for _ in range(3):
        assert not c.recomputes()
    assert mutation_epochs() == before      # computing stamps nothing


def test_a_new_tensor_is_stamped():
    # a context's arena (the scheduler's, reset at each split) makes new tensors where
    # old ones were: a new one is newer than anything made before it
    c = AddScale()
    epoch, _ = mutation_epochs()
    t = c.ctx.new_tensor("f32", (4, 8), name="t")
    assert t.generation > epoch and mutation_epochs()[0] == t.generation


# ---------------------------------------------------------------------------
# the scheduler's rewiring of the user's graph

def _device_and_cpu():
    return NumpyDeviceBackend(unsupported_ops=["SOFT_MAX"]), CPUBackend(n_threads=1)


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_the_rewiring_to_the_next_copy_slot_stamps_the_node():
    # pipeline parallel: at every step the kept plan points the CPU's nodes at the next
    # slot's copies, made at the first split (older than the CPU's cplan): only the
    # rewired node's own stamp tells the executor
    dev, cpu = _device_and_cpu()
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 64), name="x").set_input()
    s = ops.scale(ctx, x, 0.5)
    y = ops.scale(ctx, ops.soft_max(ctx, s), 2.0).set_output()
    g = Graph(64).build_forward_expand(y)
    sched = Scheduler([dev, cpu], graph_size=64, parallel=True)
    rng = np.random.default_rng(1)
    for step in range(2 * sched.n_copies):
        sched.reset()
        sched.set_tensor_backend(s, dev)
        assert sched.alloc_graph(g)
        data = rng.standard_normal((4, 64)).astype(np.float32)
        sched.get_tensor_backend(x).set_tensor(x, data)
        builds = cpu.executor.n_builds
        sched.graph_compute(g)
        assert cpu.executor.n_builds == builds + 1, step
        got = np.frombuffer(sched.get_tensor_backend(y).get_tensor(y), np.float32)
        np.testing.assert_allclose(got.reshape(4, 64), 2 * _softmax(0.5 * data), rtol=1e-5)
    assert sched.n_graph_reuses == 2 * sched.n_copies - 1


def test_the_rewiring_and_its_undoing_stamp_the_node():
    # y lives in the CPU's memory, its source s in the device's: the CPU cannot read s
    # until the split points y at s's copy, and cannot again once close() points it back
    dev, cpu = _device_and_cpu()
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 16), name="x")
    s = ops.scale(ctx, x, 0.5)
    y = ops.soft_max(ctx, s).set_output()
    g = Graph(16).build_forward_expand(y)
    buffers = (alloc_ctx_tensors_from_buft([x, s], dev.get_default_buffer_type()) +
            alloc_ctx_tensors_from_buft([y], cpu.get_default_buffer_type()))
    with pytest.raises(ComputeError, match="host memory"):
        cpu.graph_compute_range(g, 1, 2)
    sched = Scheduler([dev, cpu], graph_size=32)
    assert sched.alloc_graph(g)
    assert y.src[0] is not s and y.src[0] is not None
    data = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    dev.set_tensor(x, data)
    sched.graph_compute(g)
    np.testing.assert_allclose(np.frombuffer(cpu.get_tensor(y), np.float32).reshape(4, 16),
                               _softmax(0.5 * data), rtol=1e-5)
    sched.close()
    assert y.src[0] == s
    with pytest.raises(ComputeError, match="host memory"):
        cpu.graph_compute_range(g, 1, 2)
    del buffers                     # (alive until here)
