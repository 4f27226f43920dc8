"""alloc_graph with a recorded plan (ggml_gallocr_alloc_graph): the steady state.

One sweep checks the plan against the graph (ggml_gallocr_needs_realloc) and lists the
init_tensor calls that can do something; a second makes them, the common cases in line.
These tests pin what that must keep of ggml's behaviour: every source slot is seen
(tensors may use any of the ten, with holes), a graph that no longer fits places
nothing, buffers with an init_tensor slot see every placement in ggml's order, and a
graph allocated again lands exactly where the model of ggml-alloc puts it.
"""

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from ggml_py import AllocationError, Context, Graph
from ggml_py._backend import Buffer, fake_address, fake_buffer, get_buffer, set_buffer
from ggml_py.alloc import GraphAllocator, validate_allocation

from test_alloc import Sim, f32, op, random_problem
from test_alloc_records import check_against_model, forget, model_plan

MAX_SRC = 10
HYP = dict(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scattered_problem(draw):
    """A random problem whose nodes keep their sources in other slots: any of the ten,
    in any order, with holes (ggml's ops use slot 2 and beyond, some leave slot 1 empty)."""
    g, id_types, node_ids, leaf_ids = draw(random_problem())
    for t in g.nodes:
        srcs = [s for s in t.src if s is not None]
        slots = draw(st.lists(st.integers(0, MAX_SRC - 1), min_size=len(srcs),
                              max_size=len(srcs), unique=True))
        for j in range(MAX_SRC):
            t.set_src(j, None)
        for s, j in zip(srcs, slots):
            t.set_src(j, s)
    return g, id_types, node_ids, leaf_ids


def places(ga, g):
    return [ga.tensor_location(t) for t in list(g.leafs) + list(g.nodes)]


@settings(**HYP)
@given(scattered_problem())
def test_sources_in_any_slot_are_planned_checked_and_placed(problem):
    g, id_types, node_ids, leaf_ids = problem
    ga = GraphAllocator(id_types)
    check_against_model(ga, g, id_types, node_ids, leaf_ids)
    # the steady state: the plan is reused and every tensor lands where it did
    assert ga.reserve_n(g, node_ids, leaf_ids) and ga.alloc_graph(g)
    first = places(ga, g)
    calls = [len(bt.calls) for bt in id_types]
    forget(g)
    assert ga.alloc_graph(g)
    assert places(ga, g) == first
    assert [len(bt.calls) for bt in id_types] == calls       # no buffer allocated again
    validate_allocation(g, ga)
    forget(g)


def _reads_through_slot(slot):
    """x -> a, and b reading `a` through `slot` only (every other slot empty)."""
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "CONT")
    big = op(ctx, "big", [x], (64,), "CONT")
    b = op(ctx, "b", [x], (16,), "CONT", flags=["OUTPUT"])
    b.set_src(0, None)
    b.set_src(slot, a)
    return ctx, x, a, big, b


@settings(max_examples=20, deadline=None)
@given(st.integers(0, MAX_SRC - 1))
def test_a_source_swapped_in_a_late_slot_is_checked(slot):
    # b's source in `slot` becomes a larger tensor, not at the graph position planned
    # for that slot: with several buffer ids alloc_graph must see it and refuse (the
    # caller reserves again), leaving nothing in the allocator's buffers
    ctx, x, a, big, b = _reads_through_slot(slot)
    g = Graph.from_lists([a, big, b], [x])
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    assert ga.reserve_n(g, [0, 0, 0], [0]) and ga.alloc_graph(g)
    b.set_src(slot, big)
    assert not ga.alloc_graph(g)
    for t in (x, a, big, b):
        assert get_buffer(t) is None, t.name


@settings(max_examples=20, deadline=None)
@given(st.integers(0, MAX_SRC - 1))
def test_a_source_outside_the_graph_in_a_late_slot_is_placed(slot):
    ctx, x, a, big, b = _reads_through_slot(slot)
    g = Graph.from_lists([big, b], [x])          # `a` is read by b but is no node
    bt = Sim("GPU")
    ga = GraphAllocator([bt])
    place, _ = model_plan(g, [bt], [0, 0], [0])
    assert ga.reserve_n(g, [0, 0], [0])
    for _ in range(2):                           # planned, then the steady state
        assert ga.alloc_graph(g)
        assert ga.tensor_location(a) == ("GPU", place[a][1][1], place[a][1][0])
        forget(g)


def test_a_graph_that_no_longer_fits_places_nothing():
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    w = f32(ctx, 16, "w")
    wbuf = fake_buffer(Sim("W"), 64)
    set_buffer(w, wbuf)
    nodes = [op(ctx, "n0", [x, w], (16,), "ADD")]
    for i in range(1, 8):
        nodes.append(op(ctx, f"n{i}", [nodes[-1]], (16,), "CONT"))
    view = ctx.reshape(nodes[3], (16,), name="view")
    last = op(ctx, "last", [view, nodes[-1]], (16,), "ADD", flags=["OUTPUT"])
    g = Graph.from_lists(nodes + [view, last], [x, w])
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    ids = [0] * g.n_nodes
    assert ga.reserve_n(g, ids, [0, 0]) and ga.alloc_graph(g)
    assert all(get_buffer(t) is not None for t in g.nodes)
    # the last node grows: found after every other node passed the check
    last.ne = (32,) + last.ne[1:]
    assert not ga.alloc_graph(g)
    for t in list(g.nodes) + [x]:
        assert get_buffer(t) is None, t.name           # the last placements taken back
    assert get_buffer(w) is wbuf                       # memory from outside kept
    last.ne = (16,) + last.ne[1:]
    assert ga.alloc_graph(g)                           # fits again: placed by the plan
    validate_allocation(g, ga)


class Initialising(Sim):
    """Buffers with an init_tensor slot (ggml_backend_buffer_init_tensor) that records
    every call."""

    def __init__(self, name):
        super().__init__(name)
        self.inits = []

    def alloc_buffer(self, size):
        self.calls.append(size)
        inits = self.inits

        class Recording(Buffer):
            def init_tensor(self, tensor):
                inits.append(tensor.name)
        return Recording(self, size, fake_address(size, self.alignment))


def test_init_tensor_slot_sees_every_placement_in_order():
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "CONT")
    v = ctx.reshape(a, (16,), name="v")
    b = op(ctx, "b", [v], (16,), "CONT")
    c = op(ctx, "c", [b, a], (16,), "ADD", flags=["OUTPUT"])
    g = Graph.from_lists([a, v, b, c], [x])
    bt = Initialising("GPU")
    ga = GraphAllocator([bt])
    assert ga.reserve(g)
    for _ in range(3):                                 # each alloc_graph places anew
        # in ggml's order; views take their view_src's memory (no call)
        bt.inits.clear()
        assert ga.alloc_graph(g)
        assert bt.inits == ["x", "a", "b", "c"]
        assert get_buffer(v) is get_buffer(a)
        forget(g)


def test_a_call_back_into_the_allocator_while_it_places_is_refused():
    # an init_tensor slot that allocates a graph with the same allocator: refused with a
    # clear error (the placement under way lists places in the plan), and the allocator
    # stays usable
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "CONT", flags=["OUTPUT"])
    g = Graph.from_lists([a], [x])
    ga = None
    calling = [True]

    class Calling(Sim):
        def alloc_buffer(self, size):
            self.calls.append(size)

            class Reentrant(Buffer):
                def init_tensor(self, tensor):
                    if calling[0]:
                        ga.alloc_graph(g)
            return Reentrant(self, size, fake_address(size, self.alignment))

    ga = GraphAllocator([Calling("GPU")])
    assert ga.reserve(g)
    for _ in range(2):
        with pytest.raises(AllocationError, match="called again while it places"):
            ga.alloc_graph(g)
    calling[0] = False
    forget(g)
    assert ga.alloc_graph(g)
    validate_allocation(g, ga)


@pytest.mark.parametrize("change", ["ne", "nb"])
def test_a_node_whose_layout_grows_is_refused_and_fits_again_when_restored(change):
    # the check measures a node only where its layout changed since the plan (a layout
    # id names type, shape and strides); a larger extent through either is seen
    ctx = Context()
    x = f32(ctx, 16, "x", rows=2, flags=["INPUT"])
    a = op(ctx, "a", [x], (2, 16), "CONT")
    b = op(ctx, "b", [a], (2, 16), "CONT", flags=["OUTPUT"])
    g = Graph.from_lists([a, b], [x])
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    assert ga.reserve_n(g, [0, 0], [0]) and ga.alloc_graph(g)
    planned = getattr(a, change)
    grown = (16, 3, 1, 1) if change == "ne" else (4, 128, 256, 256)
    forget(g)
    setattr(a, change, grown)
    assert a.nbytes > 128
    assert not ga.alloc_graph(g)
    setattr(a, change, planned)
    assert ga.alloc_graph(g)
    validate_allocation(g, ga)
