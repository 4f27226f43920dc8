"""A graph whose nodes are not in topological order is refused: backends run nodes in
order, so a node before a source it reads (or before the base of a view it reads)
would compute from garbage."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ggml_py as gp
from ggml_py import ops
from ggml_py.alloc import GraphAllocator
from ggml_py.backends.cpu import CPUBackend
from ggml_py.errors import GraphError
from ggml_py.sched import Scheduler


def chain(ctx):
    x = ctx.new_tensor("f32", (4, 8), name="x").set_input()
    a = ops.scale(ctx, x, 2.0)
    a.name = "a"
    b = ops.add(ctx, a, x)
    b.name = "b"
    c = ops.mul(ctx, b, a)
    c.name = "c"
    return x, a, b, c


def test_a_node_before_its_source_is_refused_by_split_alloc_and_compute():
    cpu = CPUBackend()
    ctx = gp.Context()
    x, a, b, c = chain(ctx)
    g = gp.Graph.from_lists([a, c, b], [x])         # c reads b, computed after it
    sched = Scheduler([cpu], graph_size=16)
    for call in (sched.split_graph, sched.alloc_graph, sched.graph_compute):
        with pytest.raises(GraphError, match="node 1 'c' reads 'b'"):
            call(g)
    with pytest.raises(GraphError, match="topological"):
        g.check_order()
    with pytest.raises(GraphError, match="topological"):
        GraphAllocator([cpu.buffer_type]).reserve(g)
    # the scheduler is fine afterwards, and the graph's sources are its own
    assert [s.name for s in c.src] == ["b", "a"]
    good = gp.Graph.from_lists([a, b, c], [x])
    sched.reset()
    sched.alloc_graph(good)
    cpu.set_tensor(x, np.ones((8, 4), np.float32))
    sched.graph_compute(good)
    assert np.frombuffer(cpu.get_tensor(c), np.float32).tolist() == [6.0] * 32


def test_reading_a_view_of_a_later_node_is_refused():
    cpu = CPUBackend()
    ctx = gp.Context()
    x, a, b, _ = chain(ctx)
    v = ctx.reshape(b, (32,), name="v")
    d = ops.scale(ctx, v, 3.0)
    d.name = "d"
    # d reads v, a view of b that is not a node of this graph: nothing orders v after b
    g = gp.Graph.from_lists([a, b, d], [x])
    for check in (Scheduler([cpu], graph_size=16).split_graph, lambda g: g.check_order()):
        with pytest.raises(GraphError, match="'v' is not a node of the graph but a view of 'b'"):
            check(g)
    # nor may a leaf be such a view
    g = gp.Graph.from_lists([a, b, d], [x, v])
    with pytest.raises(GraphError, match="'v' is not a node"):
        Scheduler([cpu], graph_size=16).split_graph(g)
    # a view before its base, too: the allocator takes its source as used there
    with pytest.raises(GraphError, match="'v' reads 'b'"):
        gp.Graph.from_lists([a, v, b, d], [x]).check_order()
    ok = gp.Graph.from_lists([a, b, v, d], [x])
    ok.check_order()
    Scheduler([cpu], graph_size=16).split_graph(ok)


def test_an_input_the_graph_computes_is_refused():
    cpu = CPUBackend()
    ctx = gp.Context()
    x, a, b, c = chain(ctx)
    g = gp.Graph.from_lists([a, b, c], [x])
    b.set_input()           # the scheduler would copy it before computing it
    with pytest.raises(GraphError, match="'b' is flagged INPUT"):
        Scheduler([cpu], graph_size=16).split_graph(g)
    ctx2 = gp.Context()
    x, a, b, c = chain(ctx2)
    v = ctx2.reshape(a, (32,), name="v").set_input()        # a view of a computed node
    d = ops.scale(ctx2, v, 2.0)
    g = gp.Graph.from_lists([a, b, c, v, d], [x])
    with pytest.raises(GraphError, match="'v' is flagged INPUT"):
        Scheduler([cpu], graph_size=16).split_graph(g)


def test_a_node_reading_itself_is_refused_but_ggml_cast():
    """ggml_cast's CPY names itself as its src[1] (its destination) and is in order, as in
    ggml (llama.cpp's flash attention casts an f32 cache so); any other self-read is not."""
    cpu = CPUBackend()
    ctx = gp.Context()
    x, a, b, c = chain(ctx)
    h = ops.cast(ctx, a, "f16")
    assert h.src[1] == h
    g = gp.Graph.from_lists([a, h], [x])
    sched = Scheduler([cpu], graph_size=16)
    values = np.arange(32, dtype=np.float32).reshape(4, 8) / 3
    sched.alloc_graph(g)
    sched.set_input(x, values)
    sched.graph_compute(g)
    assert np.array_equal(sched.get_output(h), (values * 2).astype(np.float16))
    b.set_src(1, b)
    with pytest.raises(GraphError, match="node 1 'b' reads 'b'"):
        Scheduler([cpu], graph_size=16).split_graph(gp.Graph.from_lists([a, b], [x]))


@st.composite
def dags(draw):
    """A random DAG of element-wise nodes over two inputs, in a random node order."""
    n = draw(st.integers(2, 12))
    srcs = [draw(st.lists(st.integers(-2, i - 1), min_size=1, max_size=2)) for i in range(n)]
    order = draw(st.permutations(range(n)))
    return srcs, list(order)


@settings(max_examples=60)
@given(dags())
def test_refused_exactly_when_a_node_comes_before_what_it_reads(dag):
    srcs, order = dag
    ctx = gp.Context()
    inputs = [ctx.new_tensor("f32", (8,), name=f"in{k}").set_input() for k in range(2)]
    nodes = []
    for i, ss in enumerate(srcs):
        args = [inputs[-s - 1] if s < 0 else nodes[s] for s in ss]
        t = ops.add(ctx, args[0], args[-1]) if len(args) == 2 else ops.scale(ctx, args[0], 2.0)
        t.name = f"n{i}"
        nodes.append(t)
    g = gp.Graph.from_lists([nodes[i] for i in order], inputs)
    pos = {i: k for k, i in enumerate(order)}
    ordered = all(pos[s] < pos[i] for i, ss in enumerate(srcs) for s in ss if s >= 0)
    sched = Scheduler([CPUBackend()], graph_size=64)
    if ordered:
        g.check_order()
        sched.split_graph(g)
        assert sched.n_splits == 1
    else:
        with pytest.raises(GraphError, match="topological"):
            sched.split_graph(g)
        with pytest.raises(GraphError, match="topological"):
            g.check_order()
