"""Invariants of the split on random graphs and random backends (hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_py import Backend, BufferType, Context, Graph
from ggml_py._backend import fake_buffer, set_buffer
from ggml_py._schedtime import GraphSnapshot
from ggml_py.backends.sim import SimBufferType
from ggml_py.sched import Scheduler

VIEW_OPS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
COMPUTE_OPS = ["ADD", "MUL", "MUL_MAT", "RMS_NORM", "SOFT_MAX", "ROPE", "GLU", "SCALE", "CPY",
               "CONT", "CONCAT", "GET_ROWS", "UNARY"]


@st.composite
def problems(draw):
    n_backends = draw(st.integers(1, 4))
    host = BufferType("CPU", 32, None, True)
    bufts, backends = [], []
    for b in range(n_backends):
        last = b == n_backends - 1
        if last or draw(st.integers(0, 3)) == 0:
            buft = host     # the CPU, or a device that shares the host's memory
        else:
            buft = SimBufferType(f"B{b}", 32, None, False)     # fake memory, plans only
        ops = "*" if last else ["NONE", *VIEW_OPS, *draw(st.lists(st.sampled_from(COMPUTE_OPS),
                                                                  unique=True))]
        supported = [buft] + ([host] if buft is not host and draw(st.booleans()) else [])
        backends.append(Backend("CPU" if last else f"DEV{b}", buft,
                                "cpu" if last else draw(st.sampled_from(["gpu", "igpu", "accel"])),
                                supports_ops=ops, supported_buffer_types=supported,
                                offload_ops=draw(st.sampled_from([(), "*"])),
                                offload_min_batch=draw(st.integers(0, 8))))
        bufts.append(buft)
    ctx = Context("prop")
    keep = []
    tensors = []
    n_leafs = draw(st.integers(1, 8))
    for i in range(n_leafs):
        t = ctx.new_tensor("f32", (4, 8), name=f"leaf{i}")
        kind = draw(st.sampled_from(["weight", "input", "plain"]))
        if kind == "weight":
            owner = draw(st.integers(0, n_backends - 1))
            buf = fake_buffer(bufts[owner], t.nbytes)
            buf.usage = "weights"
            set_buffer(t, buf)
            keep.append(buf)
        elif kind == "input":
            t.set_input()
        tensors.append(t)
    n_nodes = draw(st.integers(1, 40))
    for i in range(n_nodes):
        op = draw(st.sampled_from(COMPUTE_OPS + ["RESHAPE", "VIEW"]))
        if op in VIEW_OPS:
            src = draw(st.sampled_from(tensors))
            t = ctx.new_op(op, [src], "f32", (4, 8), view_of=src, name=f"n{i}")
        else:
            n_src = draw(st.integers(1, 3))
            srcs = [draw(st.sampled_from(tensors)) for _ in range(n_src)]
            t = ctx.new_op(op, srcs, "f32", (4, 8), name=f"n{i}")
        tensors.append(t)
    out = tensors[-1]
    g = Graph(256)
    # every tensor without a consumer is an output, so nothing is dead code
    for t in tensors[n_leafs:]:
        g.build_forward_expand(t)
    out.set_output()
    parallel = draw(st.booleans())
    max_inputs = draw(st.sampled_from([3, 4, 5, 30]))  # at least a node's 3 sources
    return backends, bufts, g, keep, parallel, max_inputs


def _buffer_type_of(sched, t):
    base = t.view_src if t.view_src is not None else t
    from ggml_py._backend import get_buffer
    buf = get_buffer(base)
    if buf is not None:
        return buf.buffer_type
    b = sched.get_tensor_backend(t)
    if b is None and t.view_src is not None:
        b = sched.get_tensor_backend(t.view_src)
    return None if b is None else sched.buffer_types[sched.backend_id(b)]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(problems())
def test_split_invariants(problem):
    backends, bufts, graph, keep, parallel, max_inputs = problem
    sched = Scheduler(backends, graph_size=512, parallel=parallel, max_split_inputs=max_inputs)
    snap = GraphSnapshot(graph)
    sched.split_graph(graph)
    nodes = graph.nodes
    splits = sched.splits
    assert splits[0].i_start == 0 and splits[-1].i_end == len(nodes)
    for a, b in zip(splits, splits[1:]):
        assert a.i_end == b.i_start

    gnodes, _, _, _ = sched.graph_copy
    originals = [t for t in gnodes if sched.describe(t) is None]
    assert originals == nodes                       # each node once, in order

    for split in splits:
        assert len(split.inputs) <= max_inputs
        for node in nodes[split.i_start:split.i_end]:
            if node.op in VIEW_OPS:
                continue
            b = sched.get_tensor_backend(node)
            assert b is split.backend
            assert b.supports_op(node)
            for src in node.src:
                if src is None:
                    continue
                d = sched.describe(src)
                if d is not None:
                    assert d[0] == "copy" and d[2] is split.backend
                    continue
                # not copied: readable in place by the split's backend
                src_b = sched.get_tensor_backend(src)
                buft = _buffer_type_of(sched, src)
                assert src_b is split.backend or (buft is not None and split.backend.supports_buft(buft))

    first = sched.plan().to_dict()
    snap.restore()
    sched.reset()
    sched.split_graph(graph)
    assert sched.plan().to_dict() == first


@st.composite
def hostile_problems(draw):
    """problems() plus what users get wrong: pre-allocated nodes, unsupported ops on
    placed memory, random user assignments, tiny limits and graph sizes."""
    backends, bufts, g, keep, parallel, max_inputs = draw(problems())
    nodes = g.nodes
    for t in nodes:
        if draw(st.integers(0, 9)) == 0 and not t.is_view:
            buf = fake_buffer(draw(st.sampled_from(bufts)), max(t.nbytes, 1))
            set_buffer(t, buf)
            keep.append(buf)
    assign = [(t, draw(st.integers(0, len(backends) - 1)))
              for t in nodes + g.leafs if draw(st.integers(0, 7)) == 0]
    graph_size = draw(st.sampled_from([8, 64, 512]))
    return backends, g, keep, parallel, max_inputs, assign, graph_size


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_problems())
def test_bad_problems_raise_cleanly_and_scheduler_stays_usable(problem):
    from ggml_py.errors import GgmlPyError
    backends, graph, keep, parallel, max_inputs, assign, graph_size = problem
    sched = Scheduler(backends, graph_size=graph_size, parallel=parallel,
                      max_split_inputs=max_inputs, validate=True)
    snap = GraphSnapshot(graph)
    for _ in range(2):
        try:
            for t, b in assign:
                sched.set_tensor_backend(t, b)
            sched.alloc_graph(graph)
        except GgmlPyError as e:
            assert str(e)
        snap.restore()
        sched.reset()
