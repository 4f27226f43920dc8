"""Tensor and graph core: type layouts, strides and sizes, views, graph order."""

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from ggml_py import Context, Graph, GraphError, BufferType
from ggml_py._backend import fake_buffer, set_buffer
from ggml_py._core import row_size, blck_size, type_size

# (block size, bytes per block), from ggml-common.h's block structs
# (ggml_half = 2 bytes, QK_K = 256, K_SCALE_SIZE = 12)
LAYOUTS = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "f64": (1, 8),
    "i8": (1, 1),
    "i32": (1, 4),
    "q4_0": (32, 2 + 32 // 2),
    "q8_0": (32, 2 + 32),
    "mxfp4": (32, 1 + 32 // 2),
    "q2_K": (256, 2 * 2 + 256 // 16 + 256 // 4),
    "q4_K": (256, 2 * 2 + 12 + 256 // 2),
    "q6_K": (256, 2 + 256 // 16 + 3 * 256 // 4),
}


def ref_row_size(type, ne):
    """ggml_row_size."""
    blck, size = LAYOUTS[type]
    return size * ne // blck


def ref_nbytes(type, ne, nb):
    """ggml_nbytes."""
    if any(x <= 0 for x in ne):
        return 0
    blck, size = LAYOUTS[type]
    if blck == 1:
        return size + sum((ne[i] - 1) * nb[i] for i in range(4))
    return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))


def ref_strides(type, ne):
    """Contiguous strides of ggml_new_tensor_impl."""
    blck, size = LAYOUTS[type]
    nb = [size, size * (ne[0] // blck)]
    nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
    return nb


# ---------------------------------------------------------------------------
# types, shapes, strides, sizes


@pytest.mark.parametrize("type", sorted(LAYOUTS))
def test_type_layout(type):
    assert (blck_size(type), type_size(type)) == LAYOUTS[type]


@pytest.mark.parametrize("type", sorted(LAYOUTS))
@settings(max_examples=30, deadline=None)
@given(ne=st.lists(st.integers(0, 6), min_size=4, max_size=4), blocks=st.integers(1, 3))
def test_contiguous_tensor_layout(type, ne, blocks):
    blck = LAYOUTS[type][0]
    ne = [blocks * blck] + ne[1:]
    t = Context().new_tensor(type, ne[::-1])
    assert list(t.ne) == ne
    assert list(t.nb) == ref_strides(type, ne)
    assert t.nbytes == ref_nbytes(type, ne, t.nb)
    assert t.nelements == ne[0] * ne[1] * ne[2] * ne[3]
    assert row_size(type, ne[0]) == ref_row_size(type, ne[0])
    if all(ne):
        # contiguous: the bytes are the rows laid end to end
        assert t.nbytes == ref_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]
        assert t.is_contiguous


@pytest.mark.parametrize("type", ["f32", "f16", "q8_0", "q4_0"])
def test_nbytes_with_strides_set_by_hand(type):
    blck, size = LAYOUTS[type]
    t = Context().new_tensor(type, (3, 5, 2 * blck))
    # a padded layout: rows 64 bytes apart more than needed
    nb = [size, 2 * size * 2 + 64, 0, 0]
    nb[2] = nb[1] * 5 + 32
    nb[3] = nb[2] * 3
    t.nb = nb
    assert t.nbytes == ref_nbytes(type, list(t.ne), nb)
    assert not t.is_contiguous
    t.ne = [2 * blck, 5, 0, 1]
    assert t.nbytes == 0


def test_shape_is_numpy_order():
    t = Context().new_tensor("f32", (2, 3, 4))
    assert t.ne == (4, 3, 2, 1) and t.shape == (2, 3, 4)


def test_bad_block_multiple_and_shapes_are_refused():
    ctx = Context()
    with pytest.raises(ValueError, match="block size"):
        ctx.new_tensor("q8_0", (2, 33))
    with pytest.raises(ValueError):
        ctx.new_tensor("f32", (1, 2, 3, 4, 5))
    with pytest.raises(ValueError):
        ctx.new_tensor("f32", (-1,))
    with pytest.raises(KeyError, match="f8"):
        ctx.new_tensor("f8", (4,))


# ---------------------------------------------------------------------------
# views


def _placed(ctx, type, shape):
    """A tensor in a (fake) buffer, so that views get a data pointer."""
    t = ctx.new_tensor(type, shape, name="base")
    buf = fake_buffer(BufferType("X", alignment=64), t.nbytes)
    set_buffer(t, buf)
    return t, buf


def test_view_of_a_view_collapses_to_the_base():
    ctx = Context()
    a, buf = _placed(ctx, "f32", (8, 16))
    v1 = ctx.view(a, (4, 16), nb=[4, 64, 256, 256], offset=128)
    v2 = ctx.view(v1, (2, 8), nb=[4, 64, 128, 128], offset=32)
    assert v1.view_src == a and v1.view_offs == 128
    assert v2.view_src == a and v2.view_offs == 160            # offsets add up
    assert v2.src == [v1] and v2.op == "VIEW"
    assert v1.data_address == buf.base + 128
    assert v2.data_address == buf.base + 160
    assert v2.ne == (8, 2, 1, 1) and v2.nb == (4, 64, 128, 128)


def test_view_of_unplaced_tensor_has_no_data():
    ctx = Context()
    a = ctx.new_tensor("f32", (8,))
    v = ctx.view(a, (4,), offset=16)
    assert v.data_address == 0 and v.view_src == a


def test_view_that_does_not_fit_is_refused():
    ctx = Context()
    a = ctx.new_tensor("f32", (8, 16))                          # 512 bytes
    ctx.view(a, (8, 8), offset=256)                             # exactly fits
    with pytest.raises(GraphError, match="does not fit"):
        ctx.view(a, (8, 8), offset=260)
    with pytest.raises(GraphError):
        ctx.view(a, (9, 16))
    ctx.view(a, (0, 16), offset=10**6)                          # empty views always fit


def test_reshape():
    ctx = Context()
    a, buf = _placed(ctx, "f16", (6, 4))
    r = ctx.reshape(a, (2, 3, 4))
    assert r.op == "RESHAPE" and r.src == [a] and r.view_src == a and r.view_offs == 0
    assert r.ne == (4, 3, 2, 1) and list(r.nb) == ref_strides("f16", [4, 3, 2, 1])
    assert r.data_address == buf.base
    with pytest.raises(GraphError, match="elements"):
        ctx.reshape(a, (5, 5))
    with pytest.raises(GraphError, match="non-contiguous"):
        ctx.reshape(ctx.transpose(a), (24,))


def test_permute():
    ctx = Context()
    a = ctx.new_tensor("f32", (5, 4, 3, 2))                     # ne = 2, 3, 4, 5
    axes = (2, 0, 3, 1)
    p = ctx.permute(a, axes)
    for i in range(4):                                          # ggml_permute's rule
        assert p.ne[axes[i]] == a.ne[i] and p.nb[axes[i]] == a.nb[i]
    assert p.op == "PERMUTE" and p.view_src == a and p.nbytes == a.nbytes
    assert not p.is_contiguous
    with pytest.raises(GraphError):
        ctx.permute(a, (0, 0, 1, 2))


def test_transpose():
    ctx = Context()
    a = ctx.new_tensor("f32", (3, 7))
    t = ctx.transpose(a)
    assert t.ne == (3, 7, 1, 1) and t.nb == (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    assert t.op == "TRANSPOSE" and t.view_src == a and t.src == [a]


# ---------------------------------------------------------------------------
# graph order


def _op(ctx, srcs, op="ADD", name=None):
    return ctx.new_op(op, srcs, "f32", (4,), name=name)


def _names(ts):
    return [t.name for t in ts]


def test_diamond_and_shared_parents():
    ctx = Context()
    x = ctx.new_tensor("f32", (4,), name="x")
    w = ctx.new_tensor("f32", (4,), name="w")
    a = _op(ctx, [x, w], name="a")
    b = _op(ctx, [x, a], name="b")
    c = _op(ctx, [a, w], name="c")
    d = _op(ctx, [b, c], name="d")
    g = Graph(16).build_forward_expand(d)
    assert _names(g.nodes) == ["a", "b", "c", "d"]
    assert _names(g.leafs) == ["x", "w"]
    assert [g.use_count(t) for t in (x, w, a, b, c, d)] == [2, 2, 2, 1, 1, 0]
    assert all("COMPUTE" in t.flags for t in (a, b, c, d))
    assert "COMPUTE" not in x.flags
    g.build_forward_expand(d)                       # idempotent
    assert g.n_nodes == 4 and g.n_leafs == 2


def test_sources_are_visited_in_slot_order():
    ctx = Context()
    leaves = [ctx.new_tensor("f32", (4,), name=f"l{i}") for i in range(10)]
    parents = [_op(ctx, [leaves[i]], name=f"p{i}") for i in range(10)]
    # slots filled in reverse creation order, with a gap at slot 3
    srcs = parents[::-1]
    srcs[3] = None
    root = _op(ctx, srcs, op="CONCAT", name="root")
    g = Graph(32).build_forward_expand(root)
    expected = [f"p{i}" for i in range(9, -1, -1) if i != 6]
    assert _names(g.nodes) == expected + ["root"]
    assert _names(g.leafs) == [f"l{i}" for i in range(9, -1, -1) if i != 6]


def test_leaf_or_node_and_auto_names():
    ctx = Context()
    x = ctx.new_tensor("f32", (4,))
    p = ctx.new_tensor("f32", (4,)).set_param()    # a PARAM is a node, even with op NONE
    named = ctx.new_tensor("f32", (4,), name="kept")
    y = _op(ctx, [x, p])
    z = _op(ctx, [y, named])
    g = Graph(8).build_forward_expand(z)
    assert g.nodes == [p, y, z] and g.leafs == [x, named]
    assert _names(g.nodes) == ["node_0", "node_1", "node_2"]
    assert _names(g.leafs) == ["leaf_0", "kept"]
    assert "COMPUTE" not in p.flags                 # op NONE never gets COMPUTE


def test_graph_full_raises():
    ctx = Context()
    t = ctx.new_tensor("f32", (4,))
    for _ in range(3):
        t = _op(ctx, [t])
    with pytest.raises(GraphError, match="full"):
        Graph(2).build_forward_expand(t)


def test_long_chain_builds_without_recursion():
    n = 100_000
    ctx = Context()
    t = ctx.new_tensor("f32", (4,), name="x")
    for _ in range(n):
        t = _op(ctx, [t], op="SCALE")
    g = Graph(n + 1).build_forward_expand(t)
    assert g.n_nodes == n and g.n_leafs == 1
    assert g.node(-1) == t and g.node(0).src[0] == g.leafs[0]


def ref_build(roots):
    """ggml_visit_parents_graph, written recursively: (nodes, leafs, use counts)."""
    visited, nodes, leafs, uses = set(), [], [], Counter()

    def visit(t):
        if t in visited:
            return
        visited.add(t)
        for s in t.src:
            if s is not None:
                visit(s)
                uses[s] += 1
        if t.op == "NONE" and "PARAM" not in t.flags:
            leafs.append(t)
        else:
            nodes.append(t)

    for r in roots:
        visit(r)
    return nodes, leafs, uses


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 40))
    specs = []
    for i in range(n):
        n_src = draw(st.integers(0, 10)) if i else 0
        srcs = [draw(st.one_of(st.none(), st.integers(0, i - 1))) for _ in range(n_src)]
        op = draw(st.sampled_from(["NONE", "ADD", "MUL_MAT", "CPY"]))
        param = draw(st.booleans()) and op == "NONE"
        specs.append((op, srcs, param))
    roots = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
    return specs, roots


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_build_order_matches_reference(dag):
    specs, roots = dag
    ctx = Context()
    ts = []
    for op, srcs, param in specs:
        t = ctx.new_op(op, [None if s is None else ts[s] for s in srcs], "f32", (4,))
        if param:
            t.set_param()
        ts.append(t)
    g = Graph(len(ts))
    for r in roots:
        g.build_forward_expand(ts[r])
    nodes, leafs, uses = ref_build([ts[r] for r in roots])
    assert g.nodes == nodes and g.leafs == leafs
    for t in nodes + leafs:
        assert g.use_count(t) == uses[t]
    assert _names(g.nodes) == [f"node_{k}" for k in range(len(nodes))]
    assert _names(g.leafs) == [f"leaf_{k}" for k in range(len(leafs))]
    for t in nodes + leafs:
        assert ("COMPUTE" in t.flags) == (t.op != "NONE")


def test_shapes_whose_size_would_wrap_are_refused():
    """Sizes are size_t in C: a wrapped product would put a huge tensor in a tiny buffer."""
    ctx = Context()
    with pytest.raises(ValueError, match="elements"):
        ctx.new_tensor("f32", (2 ** 33, 2 ** 33))
    t = ctx.new_tensor("f32", (4, 4))
    with pytest.raises(ValueError, match="elements"):
        t.ne = (2 ** 40, 2 ** 40, 1, 1)
    with pytest.raises(ValueError, match="negative"):
        t.ne = (-1, 4, 1, 1)
    assert t.ne == (4, 4, 1, 1)


def test_new_tensor_takes_numpy_shape_or_ggml_ne_by_name():
    from ggml_py.errors import ArgumentError
    ctx = Context()
    a = ctx.new_tensor("f32", (2, 3, 4))                 # numpy order
    b = ctx.new_tensor("f32", ne=[4, 3, 2])              # ggml order
    assert a.ne == b.ne == (4, 3, 2, 1) and a.shape == b.shape
    for bad in (dict(), dict(shape=(2, 3), ne=[3, 2])):
        with pytest.raises(ArgumentError, match="exactly one"):
            ctx.new_tensor("f32", **bad)


# ---- a tensor's source mask: the slots the scheduler and the allocator read ----

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from([None, "a", "b", "c"])),
                max_size=24))
def test_every_write_of_a_source_slot_keeps_the_source_mask(writes):
    """Tensor.src reads the slots the source mask names (as the split does): after any
    sequence of set_src calls it is the list the writes made."""
    ctx = Context()
    named = {n: ctx.new_tensor("f32", (4,), name=n) for n in "abc"}
    t = ctx.new_op("ADD", [named["a"], named["b"]], "f32", (4,))
    model = [named["a"], named["b"]] + [None] * 8
    for j, name in writes:
        src = None if name is None else named[name]
        t.set_src(j, src)
        model[j] = src
    while model and model[-1] is None:
        model.pop()
    assert t.src == model


def test_a_late_source_slot_is_read_by_the_split_and_its_removal_too():
    """A source in slot 9 (past the tensor's first cache line) on a memory the node's
    backend cannot read gets a copy; once the slot is emptied it gets none."""
    from ggml_py import Backend, ops
    from ggml_py.backends.sim import SimBufferType
    from ggml_py.sched import Scheduler
    gpu_buft = SimBufferType("GPU0", 32, None, False)
    gpu = Backend("GPU0", gpu_buft, "gpu")
    cpu = Backend("CPU", BufferType("CPU", 32, None, True), "cpu")
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 16), name="x")
    far = ctx.new_tensor("f32", (4, 16), name="far")
    set_buffer(far, fake_buffer(gpu_buft, 1 << 12), 0)
    h = ops.add(ctx, x, x)
    h.set_src(9, far)
    graph = Graph(64).build_forward_expand(ops.scale(ctx, h, 2.0).set_output())
    sched = Scheduler([gpu, cpu], graph_size=64)

    def split_inputs():
        sched.reset()
        sched.set_tensor_backend(h, cpu)
        sched.split_graph(graph)
        return [t.name for split in sched.splits for t in split.inputs]

    assert "far" in split_inputs()
    h.set_src(9, None)
    assert "far" not in split_inputs()


def test_a_leaf_that_reads_weights_goes_where_they_are():
    """ggml's pass 1 applies the weights rule to every tensor it visits, leafs included:
    a leaf (op NONE, no memory) with a weight in slot 2 runs where the weight is, cause
    1.wgt2 -- and a leaf whose source is a plain tensor gets no backend from it."""
    from ggml_py import Backend, ops
    from ggml_py.backends.sim import SimBufferType
    from ggml_py.sched import Scheduler
    gpu_buft = SimBufferType("GPU0", 32, None, False)
    gpu = Backend("GPU0", gpu_buft, "gpu")
    cpu = Backend("CPU", BufferType("CPU", 32, None, True), "cpu")
    ctx = Context()
    w = ctx.new_tensor("f32", (4, 16), name="w")
    wbuf = fake_buffer(gpu_buft, 1 << 12)
    wbuf.usage = "weights"
    set_buffer(w, wbuf, 0)
    plain = ctx.new_tensor("f32", (4, 16), name="plain")
    reads_w = ctx.new_tensor("f32", (4, 16), name="reads_w")
    reads_w.set_src(2, w)
    reads_plain = ctx.new_tensor("f32", (4, 16), name="reads_plain")
    reads_plain.set_src(0, plain)
    x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
    out = ops.add(ctx, ops.add(ctx, reads_w, x), reads_plain).set_output()
    graph = Graph(64).build_forward_expand(out)
    assert {"reads_w", "reads_plain", "w", "plain"} <= {t.name for t in graph.leafs}
    sched = Scheduler([gpu, cpu], graph_size=64)
    sched.split_graph(graph)
    assert sched.get_tensor_backend(reads_w) is gpu and sched.get_cause(reads_w) == "1.wgt2"
    assert sched.get_cause(reads_plain) != "1.wgt0"


@pytest.mark.parametrize("huge_pages", ["on", "off"])
def test_a_large_arena_keeps_its_tensors_with_huge_pages_on_or_off(huge_pages):
    """Past its first block the tensor arena takes a 2 MiB page per block (unless
    GGML_PY_NO_HUGE_PAGES is set): tensors stay where they were made and keep what was
    written to them, in every block. A subprocess, as the setting is read at import."""
    import os
    import subprocess
    import sys
    code = (
        "from ggml_py import Context, Graph\n"
        "ctx = Context()\n"
        "ts = [ctx.new_tensor('f32', (i % 7 + 1,), name=f't{i}') for i in range(20000)]\n"
        "assert all(t.name == f't{i}' and t.ne[0] == i % 7 + 1 for i, t in enumerate(ts))\n"
        "g = Graph(64).build_forward_expand(ts[-1])\n"
        "assert g.leafs == [ts[-1]]\n"
        "print('ok')\n")
    env = dict(os.environ)
    env.pop("GGML_PY_NO_HUGE_PAGES", None)
    if huge_pages == "off":
        env["GGML_PY_NO_HUGE_PAGES"] = "1"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
