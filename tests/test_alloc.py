"""Tests of the graph allocator (port of ggml-alloc.c).

Expected offsets in the hand-built cases are derived from ggml's rules in the
comments next to them; the golden plans of /work/shared/cases check the port
against ggml itself (plan_harness.py rebuilds ggml's graph copy from them).
"""

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from ggml_py import Context, Graph, BufferType, AllocationError, SchedulerError
from ggml_py._backend import fake_buffer, host_buffer, set_buffer, clear_buffer, get_buffer
from ggml_py.alloc import (GraphAllocator, TensorAllocator, validate_allocation,
                           allocation_problems, op_can_inplace)

import plan_harness


class Sim(BufferType):
    """Simulated device memory: fake bases, counts its allocations, can be made to fail."""

    def __init__(self, name, alignment=32, max_size=None, limit=None):
        super().__init__(name, alignment=alignment, max_size=max_size)
        self.calls = []
        self.limit = limit          # alloc_buffer fails above this size

    def alloc_buffer(self, size):
        self.calls.append(size)
        if self.limit is not None and size > self.limit:
            raise AllocationError(f"{self.name}: out of memory for {size} bytes")
        return fake_buffer(self, size)


def f32(ctx, n, name, rows=1, flags=()):
    t = ctx.new_tensor("f32", (rows, n) if rows > 1 else (n,), name=name)
    t.flags = list(flags)
    return t


def op(ctx, name, srcs, shape, opname="ADD", flags=()):
    t = ctx.new_op(opname, srcs, "f32", shape, name=name)
    t.flags = list(flags)
    return t


def loc(ga, t):
    """(offset, chunk) of a tensor in the allocator's buffers."""
    _, off, chunk = ga.tensor_location(t)
    return off, chunk


def reset_graph(graph, keep=()):
    """Forget the placement of every tensor except `keep` (pre-allocated)."""
    for t in list(graph.leafs) + list(graph.nodes):
        for x in [t] + [s for s in t.src if s is not None]:
            if x not in keep:
                clear_buffer(x)


# ---------------------------------------------------------------------------
# ggml itself: the golden plans

@pytest.mark.parametrize("name", plan_harness.case_names())
def test_golden_alloc_block(name):
    ours, ggml, (ga, graph, _, _) = plan_harness.run_case(name)
    assert ours["buffer_sizes"] == ggml["buffer_sizes"]
    assert ours["chunk_sizes"] == ggml["chunk_sizes"]
    assert ours["graph_copy_nodes"] == ggml["graph_copy_nodes"]
    assert ours["graph_copy_leafs"] == ggml["graph_copy_leafs"]
    validate_allocation(graph, ga)


# ---------------------------------------------------------------------------
# hand-built graphs

def chain(output_a=False):
    """x (INPUT, 4x16 f32 = 256 B), w (16 f32 = 64 B);
    a = MUL(x, w), b = ADD(a, w), c = MUL_MAT(b, b) (4x4 = 64 B)."""
    ctx = Context()
    x = f32(ctx, 16, "x", rows=4, flags=["INPUT"])
    w = f32(ctx, 16, "w")
    a = op(ctx, "a", [x, w], (4, 16), "MUL", flags=["OUTPUT"] if output_a else [])
    b = op(ctx, "b", [a, w], (4, 16), "ADD")
    c = op(ctx, "c", [b, b], (4, 4), "MUL_MAT")
    g = Graph(16, ctx)
    g.build_forward_expand(c)
    return g, dict(x=x, w=w, a=a, b=b, c=c)


def test_inplace_chain():
    g, t = chain()
    assert [n.name for n in g.nodes] == ["a", "b", "c"]
    assert [n.name for n in g.leafs] == ["x", "w"]
    ga = GraphAllocator([Sim("GPU")])
    assert ga.reserve(g) and ga.alloc_graph(g)
    # leafs first: x@0 (256), w@256 (64); a takes x's memory in place (x has one
    # child, is no output, same layout), b takes a's; after b, w is freed and
    # merges with the tail block at 320 -> [256, ...); c (64 B, MUL_MAT cannot
    # work in place) goes there: the tail block whose reuse factor is 0
    assert loc(ga, t["x"]) == (0, 0)
    assert loc(ga, t["w"]) == (256, 0)
    assert loc(ga, t["a"]) == (0, 0)
    assert loc(ga, t["b"]) == (0, 0)
    assert loc(ga, t["c"]) == (256, 0)
    assert ga.get_buffer_size(0) == 320
    assert ga.chunk_sizes(0) == [320]
    validate_allocation(g, ga)


def test_output_is_not_reused_nor_freed():
    g, t = chain(output_a=True)
    ga = GraphAllocator([Sim("GPU")])
    assert ga.reserve(g) and ga.alloc_graph(g)
    # a still takes x in place (x is no output), but b may not take a (an output):
    # b goes to the tail at 320 (chunk grows to 576); after b, w [256, 320) is
    # freed as a separate block; c (64 B) fits it exactly (best fit among the
    # blocks that are not the last)
    assert loc(ga, t["a"]) == (0, 0)
    assert loc(ga, t["b"]) == (320, 0)
    assert loc(ga, t["c"]) == (256, 0)
    assert ga.get_buffer_size(0) == 576
    validate_allocation(g, ga)


def test_view_keeps_its_source_alive_and_is_never_reused_in_place():
    ctx = Context()
    x = f32(ctx, 16, "x", rows=4, flags=["INPUT"])       # 256 B
    a = op(ctx, "a", [x], (4, 16), "CONT")                 # 256 B, not in place
    v = ctx.reshape(a, (64,), name="v")                    # view of a
    b = op(ctx, "b", [v, v], (64,), "ADD")                 # 256 B
    c = op(ctx, "c", [b], (4, 16), "CONT")
    g = Graph(16, ctx)
    g.build_forward_expand(c)
    assert [n.name for n in g.nodes] == ["a", "v", "b", "c"]
    ga = GraphAllocator([Sim("GPU", alignment=64)])
    assert ga.reserve(g) and ga.alloc_graph(g)
    # x@0; a@256 (x is still read by a); after a, x is freed -> block [0,256);
    # v shares a's memory; b cannot take v in place (a view is never "own") and
    # a is alive through v: b goes to the best fit [0,256) -> 0. After b, v's last
    # child is gone, so a (its view source) is freed; c takes the tail block at
    # 256 (reuse factor 0)
    assert loc(ga, x) == (0, 0)
    assert loc(ga, a) == (256, 0)
    assert loc(ga, v) == (256, 0)
    assert loc(ga, b) == (0, 0)
    assert loc(ga, c) == (256, 0)
    assert ga.get_buffer_size(0) == 512
    validate_allocation(g, ga)


def test_alignment_pads_sizes():
    ctx = Context()
    x = f32(ctx, 3, "x", flags=["INPUT"])                  # 12 B -> 32
    y = f32(ctx, 5, "y", flags=["INPUT"])                  # 20 B -> 32
    z = op(ctx, "z", [x, y], (7,), "CONCAT")               # 28 B -> 32
    g = Graph(8, ctx)
    g.build_forward_expand(z)
    ga = GraphAllocator([Sim("GPU", alignment=32)])
    ga.reserve(g)
    ga.alloc_graph(g)
    assert [loc(ga, t) for t in (x, y, z)] == [(0, 0), (32, 0), (64, 0)]
    # the chunk ends at the last tensor's padded end
    assert ga.get_buffer_size(0) == 96


def test_preallocated_tensors_are_left_alone():
    ctx = Context()
    wt = Sim("WEIGHTS")
    w = f32(ctx, 16, "w")
    wbuf = fake_buffer(wt, 64)
    set_buffer(w, wbuf)
    x = f32(ctx, 16, "x", flags=["INPUT"])
    y = op(ctx, "y", [x, w], (16,), "ADD")
    g = Graph(8, ctx)
    g.build_forward_expand(y)
    ga = GraphAllocator([Sim("GPU")])
    ga.reserve(g)
    ga.alloc_graph(g)
    assert ga.tensor_location(w) == ("WEIGHTS", 0, None)
    assert ga.tensor_location(x) == ("GPU", 0, 0)
    assert ga.tensor_location(y) == ("GPU", 0, 0)      # in place of x, not of w
    assert get_buffer(w) is wbuf


def test_dependency_view_does_not_count_as_a_view():
    # the scheduler's "dep:" node: an op-NONE view of an input with src[0] = input
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "CONT")
    dep = ctx.new_op("NONE", [a], "f32", (16,), view_of=a, name="dep")
    b = op(ctx, "b", [x], (16,), "CONT")
    g = Graph.from_lists([a, dep, b], [x], context=ctx)
    ga = GraphAllocator([Sim("GPU")])
    ga.reserve(g)
    ga.alloc_graph(g)
    # a is read once (by dep) and not counted as viewed, so it is freed at dep;
    # b then reuses a's memory (best fit of the freed block)
    assert loc(ga, a) == (64, 0)
    assert loc(ga, dep) == (64, 0)
    assert loc(ga, b) == (64, 0)
    validate_allocation(g, ga)


def test_shared_buffer_types():
    gpu, cpu = Sim("GPU"), Sim("CPU")
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "CONT")
    b = op(ctx, "b", [a], (16,), "CONT")
    c = op(ctx, "c", [b], (16,), "CONT")
    g = Graph(8, ctx)
    g.build_forward_expand(c)
    ga = GraphAllocator([gpu, cpu, gpu])
    # x on cpu (id 1); a on id 0, b on id 2 (same type as 0: same planner), c on cpu
    ga.reserve_n(g, [0, 2, 1], [1])
    ga.alloc_graph(g)
    assert loc(ga, a) == (0, 0) and loc(ga, b) == (64, 0)
    assert ga.get_buffer_size(0) == 128
    assert ga.get_buffer_size(2) == 0          # shared with id 0: counted once
    assert ga.chunk_sizes(2) == []
    assert ga.buffer(2) is ga.buffer(0)
    assert ga.get_buffer_size(1) == 64 and ga.chunk_sizes(1) == [64]
    # reserve_n_size reports the shared planner's size for both ids (as ggml);
    # tensors that have data count as placed elsewhere, hence the reset
    reset_graph(g)
    assert ga.reserve_n_size(g, [0, 2, 1], [1]) == [128, 64, 128]
    assert len(gpu.calls) == 1 and len(cpu.calls) == 1


def test_empty_buffer_id():
    g, t = chain()
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    ga.reserve_n(g, [0, 0, 0], [0, 0])
    assert ga.get_buffer_size(1) == 0
    assert ga.chunk_sizes(1) == []
    assert ga.buffer(1) is not None            # allocated, but without chunks


# ---------------------------------------------------------------------------
# chunks

def test_chunks_grow_for_large_tensors():
    ctx = Context()
    x = f32(ctx, 64, "x", flags=["INPUT"])                     # 256 B
    n1 = op(ctx, "n1", [x], (64,), "CONT")
    n2 = op(ctx, "n2", [n1], (64,), "CONT")
    n3 = op(ctx, "n3", [n2], (256,), "CONT")                   # 1024 B > max
    g = Graph(8, ctx)
    g.build_forward_expand(n3)
    bt = Sim("GPU", max_size=512)
    ga = GraphAllocator([bt])
    ga.reserve(g)
    ga.alloc_graph(g)
    # x opens chunk 0 (512 B of room) at 0; n1 takes the rest of its last block
    # (256); x freed -> [0,256); n2 takes it; n1 freed; n3 fits no chunk and
    # opens chunk 1 of max(1024, 512) bytes
    assert [loc(ga, t) for t in (x, n1, n2, n3)] == [(0, 0), (256, 0), (0, 0), (0, 1)]
    assert ga.chunk_sizes(0) == [512, 1024]
    assert ga.get_buffer_size(0) == 1536
    assert bt.calls == [512, 1024]             # one buffer per chunk
    # the graph is planned whole even while it is placed (ggml would count its own
    # placements as data from outside and plan nothing: [0])
    assert ga.reserve_n_size(g) == [1536]
    reset_graph(g)
    assert ga.reserve_n_size(g) == [1536]
    validate_allocation(g, ga)


def test_sixteenth_chunk_is_unbounded():
    ctx = Context()
    leafs = [f32(ctx, 16, f"x{i}") for i in range(20)]       # 64 B each
    g = Graph.from_lists([], leafs, context=ctx)
    ga = GraphAllocator([Sim("GPU", max_size=64)])
    ga.reserve(g)
    ga.alloc_graph(g)
    assert ga.chunk_sizes(0) == [64] * 15 + [5 * 64]
    assert [loc(ga, t) for t in leafs[14:17]] == [(0, 14), (0, 15), (64, 15)]
    assert ga.get_buffer_size(0) == 20 * 64


# ---------------------------------------------------------------------------
# reserve_n_size, alloc_graph's reuse and realloc rules

def test_reserve_n_size_equals_reserve():
    g, _ = chain()
    ga = GraphAllocator([Sim("GPU")])
    sizes = ga.reserve_n_size(g)
    assert ga.buffer(0) is None                # a dry run allocates nothing
    ga.reserve(g)
    assert sizes == [ga.get_buffer_size(0)] == [320]


def make_chain(n, width):
    ctx = Context()
    x = f32(ctx, width, "x", flags=["INPUT"])
    t = x
    for i in range(n):
        t = op(ctx, f"n{i}", [t], (width,), "CONT")
    g = Graph(64, ctx)
    g.build_forward_expand(t)
    return g


def test_alloc_graph_reuses_a_plan_that_still_fits():
    bt = Sim("GPU")
    ga = GraphAllocator([bt, Sim("CPU")])
    g = make_chain(3, 16)
    ga.reserve_n(g, [0, 0, 0], [0])
    assert ga.alloc_graph(g)
    assert len(bt.calls) == 1
    # same structure, smaller tensors: no realloc needed, same offsets
    g2 = make_chain(3, 8)
    assert ga.alloc_graph(g2)
    assert [loc(ga, t) for t in g2.nodes] == [(64, 0), (0, 0), (64, 0)]
    assert len(bt.calls) == 1
    # a tensor that grew: with several buffer ids, the caller must reserve again
    g3 = make_chain(3, 32)
    assert not ga.alloc_graph(g3)
    # other node count
    assert not ga.alloc_graph(make_chain(4, 8))
    ga.reserve_n(g3, [0, 0, 0], [0])
    assert ga.alloc_graph(g3)
    assert len(bt.calls) == 2                  # the chunk grew: reallocated
    # reserving a smaller graph keeps the larger buffer
    g4 = make_chain(3, 8)
    ga.reserve_n(g4, [0, 0, 0], [0])
    assert len(bt.calls) == 2
    assert ga.get_buffer_size(0) == 256


def test_alloc_graph_single_buffer_reserves_automatically():
    bt = Sim("GPU")
    ga = GraphAllocator([bt])
    g = make_chain(2, 16)
    assert ga.alloc_graph(g)                   # nothing reserved yet: reserves
    assert len(bt.calls) == 1
    g2 = make_chain(2, 64)
    assert ga.alloc_graph(g2)
    assert len(bt.calls) == 2 and ga.get_buffer_size(0) == 512
    validate_allocation(g2, ga)


def test_tensor_that_lost_its_data_needs_realloc():
    ctx = Context()
    w = f32(ctx, 16, "w")
    buf = fake_buffer(Sim("W"), 64)
    set_buffer(w, buf)
    a = op(ctx, "a", [w], (16,), "CONT")
    g = Graph(8, ctx)
    g.build_forward_expand(a)
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    ga.reserve_n(g, [0], [0])
    assert ga.alloc_graph(g)
    clear_buffer(w)
    clear_buffer(a)
    # w was pre-allocated when the plan was made; without data it has no place
    assert not ga.alloc_graph(g)


def test_alloc_graph_twice_is_harmless():
    g, t = chain()
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    ga.reserve_n(g, [0, 0, 0], [0, 0])
    assert ga.alloc_graph(g)
    before = [ga.tensor_location(x) for x in g.nodes]
    assert ga.alloc_graph(g)                   # tensors have data now: kept
    assert [ga.tensor_location(x) for x in g.nodes] == before


# ---------------------------------------------------------------------------
# failures

def test_failed_buffer_allocation_raises_and_allocator_stays_usable():
    bt = Sim("GPU", limit=100)
    ga = GraphAllocator([bt, Sim("CPU")])
    g = make_chain(2, 16)                      # needs 128 B
    with pytest.raises(AllocationError) as e:
        ga.reserve_n(g, [0, 0], [0])
    assert "GPU" in str(e.value) and "128" in str(e.value)
    assert "failed to allocate GPU buffer of size 128" in ga.last_error
    assert ga.buffer(0) is None
    assert not ga.alloc_graph(g)               # no usable plan: reserve first
    bt.limit = None
    assert ga.reserve_n(g, [0, 0], [0])
    assert ga.alloc_graph(g)
    validate_allocation(g, ga)


def test_failed_automatic_reserve_raises():
    bt = Sim("GPU", limit=100)
    ga = GraphAllocator([bt])
    with pytest.raises(AllocationError):
        ga.alloc_graph(make_chain(2, 16))
    bt.limit = None
    assert ga.alloc_graph(make_chain(2, 16))


def test_alloc_buffer_returning_none_or_too_small():
    class Bad(BufferType):
        mode = None

        def alloc_buffer(self, size):
            return None if self.mode is None else fake_buffer(self, size // 2)
    bt = Bad("BAD")
    ga = GraphAllocator([bt, bt])
    g = make_chain(2, 16)
    with pytest.raises(AllocationError, match="returned nothing"):
        ga.reserve_n(g, [0, 1], [0])
    bt.mode = "small"
    with pytest.raises(AllocationError, match="returned 64 bytes"):
        ga.reserve_n(g, [0, 1], [0])


def test_leaf_without_backend():
    ctx = Context()
    x = f32(ctx, 16, "lonely")
    a = op(ctx, "a", [x], (16,), "CONT")
    g = Graph(8, ctx)
    g.build_forward_expand(a)
    ga = GraphAllocator([Sim("GPU"), Sim("CPU")])
    with pytest.raises(SchedulerError, match="lonely") as e:
        ga.reserve_n(g, [0], [-1])
    assert e.value.kind == "leaf-without-backend"
    assert not ga.alloc_graph(g)
    assert ga.reserve_n(g, [0], [1]) and ga.alloc_graph(g)


def test_bad_id_lists():
    g, _ = chain()
    ga = GraphAllocator([Sim("GPU")])
    with pytest.raises(ValueError):
        ga.reserve_n(g, [0, 0], [0, 0])
    with pytest.raises(SchedulerError):
        ga.reserve_n(g, [0, 5, 0], [0, 0])


def test_custom_alloc_size_is_used():
    class Padded(Sim):
        def get_alloc_size(self, tensor):
            return tensor.nbytes + 100
    ga = GraphAllocator([Padded("PAD", alignment=32)])
    g, t = chain()
    ga.reserve(g)
    ga.alloc_graph(g)
    # x: 356 -> 384, w: 164 -> 192 at 384; a, b in place; c after w: 576
    assert loc(ga, t["w"]) == (384, 0)
    assert loc(ga, t["c"]) == (384, 0)
    assert ga.get_buffer_size(0) == 576


# ---------------------------------------------------------------------------
# the linear allocator

def test_tensor_allocator():
    bt = BufferType("HOST", alignment=64, is_host=True)
    buf = host_buffer(bt, 256)
    ta = TensorAllocator(buf)
    ctx = Context()
    a = f32(ctx, 3, "a")                       # 12 B -> 64
    b = f32(ctx, 32, "b")                      # 128 B
    c = f32(ctx, 32, "c")
    ta.alloc(a)
    ta.alloc(b)
    assert a.data_address - buf.base == 0 and b.data_address - buf.base == 64
    assert ta.offset == 192
    with pytest.raises(AllocationError, match="'c'.*needed 128, available 64"):
        ta.alloc(c)
    assert ta.offset == 192 and c.data_address == 0
    with pytest.raises(AllocationError):
        ta.alloc(a)                            # already allocated


def test_inplace_op_list():
    assert op_can_inplace("ADD") and op_can_inplace("SOFT_MAX") and op_can_inplace("UNARY")
    assert not op_can_inplace("MUL_MAT") and not op_can_inplace("CPY")
    assert not op_can_inplace("GLU") and not op_can_inplace("VIEW")


# ---------------------------------------------------------------------------
# the validator

def test_validator_finds_overlap_and_out_of_bounds():
    g, t = chain()
    ga = GraphAllocator([Sim("GPU")])
    ga.reserve(g)
    ga.alloc_graph(g)
    assert allocation_problems(g, ga) == []
    # move c onto b, its source (MUL_MAT cannot work in place)
    buf = get_buffer(t["c"])
    clear_buffer(t["c"])
    set_buffer(t["c"], buf, 0)
    probs = allocation_problems(g, ga)
    assert len(probs) == 1 and "'b'" in probs[0] and "'c'" in probs[0]
    # and past the end of its buffer (set_buffer refuses that: grow it in place)
    clear_buffer(t["c"])
    set_buffer(t["c"], buf, buf.size - t["c"].nbytes)
    t["c"].ne = (t["c"].ne[0] * 2,) + t["c"].ne[1:]
    with pytest.raises(AllocationError, match="outside"):
        validate_allocation(g, ga)


OPS_INPLACE = ["ADD", "MUL", "SCALE", "SOFT_MAX", "UNARY", "RMS_NORM"]
OPS_OTHER = ["CONT", "MUL_MAT", "CPY", "GET_ROWS", "CONCAT"]


@st.composite
def random_problem(draw):
    """A random DAG: leafs (some INPUT), elementwise / other / view nodes, some OUTPUT;
    1-3 buffer ids over 1-2 buffer types with random alignment and max size."""
    ctx = Context()
    n_types = draw(st.integers(1, 2))
    types = [Sim(f"T{i}", alignment=draw(st.sampled_from([16, 32, 64, 256])),
                 max_size=draw(st.sampled_from([None, None, 256, 1024, 4096])))
             for i in range(n_types)]
    id_types = [types[draw(st.integers(0, n_types - 1))] for _ in range(draw(st.integers(1, 3)))]
    widths = [4, 16, 64, 256]
    leafs = []
    for i in range(draw(st.integers(1, 5))):
        leafs.append(f32(ctx, draw(st.sampled_from(widths)), f"l{i}",
                         rows=draw(st.sampled_from([1, 2])),
                         flags=["INPUT"] if draw(st.booleans()) else []))
    pool = list(leafs)
    nodes = []
    for i in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["inplace", "inplace", "other", "view"]))
        a = pool[draw(st.integers(0, len(pool) - 1))]
        if kind == "view" and a.is_contiguous:
            n = ctx.reshape(a, (a.nelements,), name=f"v{i}")
        elif kind == "view":
            continue
        elif kind == "inplace":
            srcs = [a] + ([pool[draw(st.integers(0, len(pool) - 1))]] if draw(st.booleans()) else [])
            # same layout as its first source, so that it may take its memory
            n = ctx.new_op(draw(st.sampled_from(OPS_INPLACE)), srcs, "f32",
                           list(reversed(a.ne)), name=f"n{i}", nb=a.nb)
        else:
            srcs = [a] + ([pool[draw(st.integers(0, len(pool) - 1))]] if draw(st.booleans()) else [])
            n = ctx.new_op(draw(st.sampled_from(OPS_OTHER)), srcs, "f32",
                           (draw(st.sampled_from(widths)),), name=f"n{i}")
        if draw(st.integers(0, 5)) == 0:
            n.set_output()
        nodes.append(n)
        pool.append(n)
    g = Graph.from_lists(nodes, leafs, context=ctx)
    node_ids = [draw(st.integers(0, len(id_types) - 1)) for _ in nodes]
    leaf_ids = [draw(st.integers(0, len(id_types) - 1)) for _ in leafs]
    return g, id_types, node_ids, leaf_ids


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_problem())
def test_random_graphs_are_allocated_soundly(problem):
    g, id_types, node_ids, leaf_ids = problem
    ga = GraphAllocator(id_types)
    sizes = ga.reserve_n_size(g, node_ids, leaf_ids)
    assert ga.reserve_n(g, node_ids, leaf_ids)
    assert ga.alloc_graph(g)
    validate_allocation(g, ga)
    # a dry run plans what a real one allocates
    for i in range(len(id_types)):
        first = next(j for j in range(len(id_types)) if id_types[j] is id_types[i])
        assert ga.get_buffer_size(i) == (sizes[i] if first == i else 0)
        assert sum(ga.chunk_sizes(i)) == ga.get_buffer_size(i)
        assert len(ga.chunk_sizes(i)) <= 16
    # every chunk but the last respects the buffer type's max size unless one
    # tensor alone is larger
    for bt in set(id_types):
        i = id_types.index(bt)
        if bt.max_size is not None:
            biggest = max([t.nbytes for t in g.nodes + g.leafs] + [0])
            for s in ga.chunk_sizes(i)[:-1]:
                assert s <= max(bt.max_size, (biggest + bt.alignment - 1) // bt.alignment * bt.alignment)
    # the plan is reused for the same graph once its placements are forgotten
    reset_graph(g)
    calls = [len(bt.calls) for bt in id_types]
    assert ga.alloc_graph(g)
    assert [len(bt.calls) for bt in id_types] == calls
    validate_allocation(g, ga)


@pytest.mark.parametrize("graph_reuse", [False, True])
def test_a_new_output_flag_is_not_overwritten_by_the_old_plan(graph_reuse):
    """ggml reuses its plan when only a flag changed (ggml_gallocr_needs_realloc checks
    sizes): a node marked OUTPUT after the graph was planned would then share memory
    with later nodes and read back their values. Here the plan is made again."""
    import numpy as np

    from ggml_py import Context, Graph, ops
    from ggml_py._backend import host_bytes, tensor_set
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.sched import Scheduler
    ctx = Context("flags")
    x = ctx.new_tensor("f32", (64,)).set_input()
    a = ops.scale(ctx, x, 2.0)
    b = ops.add(ctx, a, a)                 # 4 x
    c = ops.scale(ctx, b, 3.0)             # in place over b in the first plan
    e = ops.scale(ctx, ops.add(ctx, c, c), 0.5)
    g = Graph(64).build_forward_expand(e)
    sched = Scheduler([CPUBackend()], graph_reuse=graph_reuse)
    sched.alloc_graph(g)
    b.set_output()
    sched.reset()
    sched.alloc_graph(g)
    tensor_set(x, np.ones(64, np.float32))
    sched.graph_compute(g)
    np.testing.assert_array_equal(np.frombuffer(host_bytes(b), np.float32), 4.0)
    np.testing.assert_array_equal(np.frombuffer(host_bytes(e), np.float32), 12.0)
