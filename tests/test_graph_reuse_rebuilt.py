"""Graph reuse, level 2: a newly built graph equal to the one planned last takes the
kept plan and allocation, re-pointed at its own tensors, and the result is what a
fresh scheduler's split + alloc of that graph gives; one change of any kind to the
rebuilt graph forces a fresh plan."""

import copy

import pytest
from conftest import case_files
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ggml_py._backend import get_buffer, set_buffer
from ggml_py.errors import GgmlPyError
from ggml_py.ops import VIEW_OPS
from ggml_py.tools.cases import _build_case, load_case
from ggml_py.tools.planning import scheduler_for_case
from ggml_py.tools.schedtime import time_rebuilt_reuse


def _state(sched, graph):
    """The plan file and every tensor's place (buffer type, offset, chunk)."""
    return (sched.plan("x").to_dict(explain=True),
            [sched.tensor_location(t) for t in graph.nodes + graph.leafs])


def _step(sched, case):
    """A model's step: reset, the user assignments again, allocate the case's graph."""
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)
    return sched.alloc_graph(case.graph)


def _planned_cases():
    """(case file, loaded case, its scheduler after alloc_graph) of every case that plans."""
    out = []
    for f in case_files():
        case = load_case(str(f))
        try:
            sched = scheduler_for_case(case)
            if sched.alloc_graph(case.graph):
                out.append(pytest.param(f, id=f.name.removesuffix(".case.json")))
        except GgmlPyError:
            pass
    return out


PLANNED = _planned_cases()


def test_most_cases_plan():
    assert len(PLANNED) >= 50


@pytest.mark.parametrize("path", PLANNED)
def test_rebuilt_graph_takes_the_plan_of_a_fresh_split(path):
    case = load_case(str(path))
    sched = scheduler_for_case(case)
    wiring = [list(n.src) for n in case.graph.nodes]
    assert sched.alloc_graph(case.graph)
    for step in range(1, 3):
        again = case.rebuilt()
        wiring_again = [list(n.src) for n in again.graph.nodes]
        assert _step(sched, again)
        twin = case.rebuilt()
        fresh = scheduler_for_case(twin)
        fresh.graph_reuse = False
        assert fresh.alloc_graph(twin.graph)
        # pipeline parallelism: each allocation moves to the next copy slot, the fresh
        # scheduler's too
        for _ in range(step if case.parallel else 0):
            assert _step(fresh, twin)
        assert sched.n_graph_reuses == sched.n_graph_rebuilt_reuses == step
        assert _state(sched, again.graph) == _state(fresh, twin.graph)
        # the graph before has its own sources back
        assert [list(n.src) for n in case.graph.nodes] == wiring
        wiring = wiring_again
        case = again
    # ... and the same graph again is a level-1 reuse
    assert _step(sched, case)
    assert sched.n_graph_reuses == 3 and sched.n_graph_rebuilt_reuses == 2


def test_reuse_off_splits_a_rebuilt_graph():
    case = load_case(str(PLANNED[0].values[0]))
    sched = scheduler_for_case(case)
    sched.graph_reuse = False
    sched.alloc_graph(case.graph)
    assert _step(sched, case.rebuilt()) and sched.n_graph_reuses == 0


# ---------------------------------------------------------------------------
# one change of each kind to the rebuilt graph forces a fresh plan


def _nodes(d, want):
    return [d["tensors"][i] for i in d["nodes"] if want(d["tensors"][i])]


def _leafs(d, want):
    return [d["tensors"][i] for i in d["leafs"] if want(d["tensors"][i])]


def _computing(t):
    return t["view_src"] is None and t["op"] != "NONE"


def _pick(seq, i):
    return seq[i % len(seq)] if seq else None


def _doc_change(kind, d, i):
    """Change the case document (before the graph is built); False where it has nothing
    of that kind."""
    if kind == "op":
        t = _pick(_nodes(d, lambda t: t["op"] in ("ADD", "MUL")), i)
        if t is None:
            return False
        t["op"] = "MUL" if t["op"] == "ADD" else "ADD"
    elif kind == "type":
        t = _pick(_leafs(d, lambda t: t["type"] == "f32" and t["view_src"] is None), i)
        if t is None:
            return False
        t["type"] = "i32"
    elif kind == "ne":
        t = _pick(_leafs(d, lambda t: t["view_src"] is None), i)
        t["ne"][3] += 1
        t["nb"] = t["nb"][:3] + [t["nb"][3]]
    elif kind == "nb":
        t = _pick(_leafs(d, lambda t: t["view_src"] is None and t["ne"][3] == 1), i)
        if t is None:
            return False
        t["nb"][3] *= 2
    elif kind == "src":
        t = _pick(_nodes(d, lambda t: len(t["src"]) >= 2 and t["src"][0] != t["src"][1]), i)
        if t is None:
            return False
        t["src"][0], t["src"][1] = t["src"][1], t["src"][0]
    elif kind == "view_offs":
        t = _pick([t for t in d["tensors"] if t["view_src"] is not None and t["view_offs"] > 0], i)
        if t is None:
            return False
        t["view_offs"] -= 1
    elif kind == "flags":
        t = _pick(_nodes(d, _computing), i)
        flags = [f for f in t["flags"] if f != "OUTPUT"]
        t["flags"] = flags if "OUTPUT" in t["flags"] else flags + ["OUTPUT"]
    elif kind == "name":
        for t in d["tensors"]:
            t["name"] = t["name"] + "'"
    elif kind == "assignment":
        t = _pick(_nodes(d, _computing), i)
        t["backend"] = d["backends"][-1]["name"] if t["backend"] is None else None
    elif kind == "view_assignment":     # to the CPU: away from its memory where that is a GPU's
        t = _pick(_nodes(d, lambda t: t["op"] in VIEW_OPS), i)
        if t is None:
            return False
        t["backend"] = d["backends"][-1]["name"] if t["backend"] is None else None
    elif kind == "node_count":
        d["nodes"] = d["nodes"][:-1]
    else:
        return True
    return True


def _built_change(kind, case, i):
    """Change the built graph through the API (the same way in both twins)."""
    if kind == "op_params":
        t = _pick(case.graph.nodes, i)
        p = list(t.op_params)
        p[0] += 1
        t.set_op_params(p)
    elif kind in ("buffer", "offset"):
        weights = [t for t in case.graph.leafs if get_buffer(t) is not None and t.view_src is None]
        if not weights:
            return False
        t = _pick(weights, i)
        old = get_buffer(t)
        offset = 0 if kind == "buffer" else 256
        if not hasattr(case, "_moved"):
            case._moved = old.buffer_type.alloc_buffer(t.nbytes + offset)
            case._moved.usage = old.usage
        set_buffer(t, case._moved, offset)
    return True


KINDS = ["op", "type", "ne", "nb", "src", "view_offs", "flags", "name", "assignment",
         "view_assignment", "node_count", "op_params", "buffer", "offset"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), index=st.integers(0, 10_000),
       path=st.sampled_from([p.values[0] for p in PLANNED]))
def test_any_single_change_to_a_rebuilt_graph_forces_a_fresh_plan(kind, index, path):
    case = load_case(str(path))
    sched = scheduler_for_case(case)
    assert sched.alloc_graph(case.graph)
    d = copy.deepcopy(case._document)
    if not _doc_change(kind, d, index):
        return
    twins = []
    for _ in range(2):
        try:
            twin = _build_case(d, case.backends, case.buffer_types, case._placements)
        except GgmlPyError:
            return                      # the change makes no valid case
        twins.append(twin)
    moved = None
    for twin in twins:
        if not _built_change(kind, twin, index):
            return
        if moved is not None:
            twin._moved = moved
        moved = getattr(twin, "_moved", None)
    changed, twin = twins
    # the reference: the same history on a scheduler that never reuses
    first = case.rebuilt()
    ref = scheduler_for_case(first)
    ref.graph_reuse = False
    assert ref.alloc_graph(first.graph)
    try:
        ok = _step(ref, twin)
    except GgmlPyError as e:
        with pytest.raises(type(e)):
            _step(sched, changed)
        assert sched.n_graph_reuses == 0
        event(f"{kind}: refused")
        return
    assert _step(sched, changed) == ok
    if kind != "name" or any(s.inputs for s in sched.splits):
        assert sched.n_graph_reuses == 0, kind       # (names matter to the split's copies)
    assert _state(sched, changed.graph) == _state(ref, twin.graph)
    event(f"{kind}: planned afresh")


# ---------------------------------------------------------------------------
# computing: each step builds its graph anew, and the numbers stay right


def test_rebuilt_graphs_compute_new_inputs():
    import numpy as np

    from ggml_py import Context, Graph, ops
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.sched import Scheduler
    cpu = CPUBackend()
    weights = Context()
    w = weights.new_tensor("f32", (64, 64), name="w")
    wbuf = cpu.buffer_type.alloc_buffer(w.nbytes)
    set_buffer(w, wbuf)
    wbuf.usage = "weights"
    rng = np.random.default_rng(0)
    wdata = rng.standard_normal((64, 64)).astype(np.float32)
    cpu.set_tensor(w, wdata)
    sched = Scheduler([cpu], graph_size=64)
    for step in range(4):
        ctx = Context()
        x = ctx.new_tensor("f32", (4, 64), name="x").set_input()
        y = ops.soft_max(ctx, ops.scale(ctx, ops.mul_mat(ctx, w, x), 0.5)).set_output()
        g = Graph(64).build_forward_expand(y)
        sched.reset()
        assert sched.alloc_graph(g)
        data = rng.standard_normal((4, 64)).astype(np.float32)
        cpu.set_tensor(x, data)
        sched.graph_compute(g)
        got = np.frombuffer(cpu.get_tensor(y), np.float32).reshape(4, 64)
        z = 0.5 * data @ wdata.T
        e = np.exp(z - z.max(axis=1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    assert sched.n_graph_rebuilt_reuses == 3


def test_time_rebuilt_reuse_times_level_2_only():
    from ggml_py.models.synthetic import synthetic_llama_builder
    from ggml_py.sched import Scheduler
    backends, build, _keep = synthetic_llama_builder(2)
    graph = build()
    sched = Scheduler(backends, graph_size=1024)
    times = time_rebuilt_reuse(sched, graph, build(), 6)
    assert len(times) == 6 and all(t > 0 for t in times)
    assert sched.n_graph_rebuilt_reuses >= 6
    other = build()
    node = other.nodes[3]
    node.set_op_params([node.op_params[0] + 1] + list(node.op_params[1:]))
    with pytest.raises(GgmlPyError, match="reused the plan"):
        time_rebuilt_reuse(sched, graph, other, 2)


# ---------------------------------------------------------------------------
# what a reuse leaves out: the allocator's walk (its placements are replayed) and the
# re-keying of the hash set (done when something reads it)


def _one_backend_scheduler(buffer_class):
    from ggml_py._backend import Backend, BufferType, host_buffer
    from ggml_py.sched import Scheduler

    class HostType(BufferType):
        def alloc_buffer(self, size):
            mem = host_buffer(self, size)
            return buffer_class(self, size, mem.base, memory=mem.memory)

    return Scheduler([Backend("CPU", HostType("T", alignment=32, is_host=True), "cpu")],
                     graph_size=64)


def _small_graph(duplicate=False):
    """x -> h = x + x -> a view v of h -> y = 2 * v, z = 2 * v; where `duplicate`, y
    in z's place too (a graph that lists one tensor at two places, each of them as
    the other graph has it)."""
    from ggml_py import Context, Graph, ops
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
    v = ops.view_1d(ctx, ops.add(ctx, x, x), 8, 0)
    y = ops.scale(ctx, v, 2.0).set_output()
    z = ops.scale(ctx, v, 2.0).set_output()
    g = Graph(64).build_forward_expand(y).build_forward_expand(z)
    if not duplicate:
        return g
    nodes = list(g.nodes)
    return Graph.from_lists(nodes[:-1] + [nodes[-2]], list(g.leafs), allow_duplicates=True)


def _late_sources_graph(late):
    """h = x + x that also reads w in source slot 5 and `late` ("x" or "w") in slot 8:
    the leafs are x then w either way."""
    from ggml_py import Context, Graph, ops
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 16), name="x").set_input()
    w = ctx.new_tensor("f32", (4, 16), name="w").set_input()
    h = ops.add(ctx, x, x)
    h.set_src(5, w)
    h.set_src(8, x if late == "x" else w)
    return Graph(64).build_forward_expand(ops.scale(ctx, h, 2.0).set_output())


def test_sources_past_the_first_cache_line_are_compared():
    from ggml_py._backend import Buffer
    sched = _one_backend_scheduler(Buffer)
    ref = _one_backend_scheduler(Buffer)       # the same history, never reusing
    ref.graph_reuse = False
    for late, reuses in (("x", 0), ("x", 1), ("w", 1), ("w", 2)):
        graph, twin = _late_sources_graph(late), _late_sources_graph(late)
        sched.reset()
        ref.reset()
        assert sched.alloc_graph(graph) and ref.alloc_graph(twin)
        assert sched.n_graph_rebuilt_reuses == reuses, late
        assert _state(sched, graph) == _state(ref, twin)
        assert [t.name for t in graph.leafs] == ["x", "w"]


def test_a_replayed_allocation_runs_the_init_tensor_slot_as_alloc_graph_does():
    from ggml_py._backend import Buffer
    seen = []

    class Tracking(Buffer):
        def init_tensor(self, tensor):
            seen.append(tensor.name)

    sched = _one_backend_scheduler(Tracking)
    fresh = _one_backend_scheduler(Buffer)          # (a new backend is a change to plans)
    fresh.graph_reuse = False
    assert sched.alloc_graph(_small_graph())
    first = sorted(seen)
    assert first                                    # (views are not initialised)
    for step in range(1, 3):
        seen.clear()
        sched.reset()
        graph = _small_graph()
        assert sched.alloc_graph(graph) and sched.n_graph_rebuilt_reuses == step
        assert sorted(seen) == first
        fresh.reset()
        twin = _small_graph()
        assert fresh.alloc_graph(twin)
        assert _state(sched, graph) == _state(fresh, twin)


def test_a_call_back_into_the_allocator_while_a_reuse_places_is_refused():
    # as alloc_graph refuses it (test_alloc_steady.py): the replay of a kept plan's
    # placements lists them in the allocator too
    from ggml_py import AllocationError
    from ggml_py._backend import Buffer
    calling = []

    class Reentrant(Buffer):
        def init_tensor(self, tensor):
            if calling:
                sched._core.galloc.reserve(calling[0])

    sched = _one_backend_scheduler(Reentrant)
    assert sched.alloc_graph(_small_graph())
    sched.reset()
    graph = _small_graph()
    calling.append(graph)
    with pytest.raises(AllocationError, match="called again while it places"):
        sched.alloc_graph(graph)
    calling.clear()
    fresh = _one_backend_scheduler(Buffer)
    for _ in range(2):
        sched.reset()
        graph, twin = _small_graph(), _small_graph()
        fresh.reset()
        assert sched.alloc_graph(graph) and fresh.alloc_graph(twin)
        assert _state(sched, graph) == _state(fresh, twin)


def test_a_reused_plan_answers_for_the_new_graphs_tensors():
    case = load_case(str(PLANNED[0].values[0]))
    sched = scheduler_for_case(case)
    assert sched.alloc_graph(case.graph)
    again = case.rebuilt()
    assert _step(sched, again) and sched.n_graph_rebuilt_reuses == 1
    twin = case.rebuilt()
    fresh = scheduler_for_case(twin)
    assert fresh.alloc_graph(twin.graph)
    tensors, twins = again.graph.nodes + again.graph.leafs, twin.graph.nodes + twin.graph.leafs

    def answers(s, ts):
        return [(getattr(s.get_tensor_backend(t), "name", None), s.get_cause(t)) for t in ts]

    assert answers(sched, tensors) == answers(fresh, twins)
    assert all(sched.get_tensor_backend(t) is None for t in case.graph.nodes)
    # and the next split of the same graph, without a reset, keeps those assignments
    sched.split_graph(again.graph)
    fresh.split_graph(twin.graph)
    assert _state(sched, again.graph) == _state(fresh, twin.graph)


def test_a_graph_with_a_tensor_at_two_places_is_planned_afresh():
    from ggml_py._backend import Buffer
    sched = _one_backend_scheduler(Buffer)
    fresh = _one_backend_scheduler(Buffer)
    assert sched.alloc_graph(_small_graph())
    sched.reset()
    assert sched.alloc_graph(_small_graph()) and sched.n_graph_rebuilt_reuses == 1
    sched.reset()
    graph, twin = _small_graph(duplicate=True), _small_graph(duplicate=True)
    try:
        ok = fresh.alloc_graph(twin)
    except GgmlPyError as e:
        with pytest.raises(type(e)):
            sched.alloc_graph(graph)
    else:
        assert sched.alloc_graph(graph) == ok
        assert _state(sched, graph) == _state(fresh, twin)
    assert sched.n_graph_rebuilt_reuses == 1


def test_every_tensor_keeps_the_layout_id_of_its_fields():
    """The compare takes equal layout ids for equal type, ne, nb and op_params: every
    way of making or changing a tensor keeps its id that of its fields."""
    from ggml_py import Context, ops
    from ggml_py._core import layout_is_current
    ctx = Context()
    x = ctx.new_tensor("f32", (4, 16), name="x")
    w = ops.new_tensor_2d(ctx, "f16", 16, 8)
    made = [x, w, ops.view_1d(ctx, x, 8, 4), ops.view_2d(ctx, x, 8, 2, 64, 0),
            ops.transpose(ctx, x), ops.permute(ctx, x, 1, 0, 2, 3), ops.reshape_2d(ctx, x, 8, 8),
            ops.cont(ctx, ops.transpose(ctx, x)), ops.scale(ctx, x, 2.0), ops.mul_mat(ctx, w, x),
            ops.view_tensor(ctx, x), ops.cpy(ctx, x, ctx.new_tensor("f32", (4, 16)))]
    assert all(layout_is_current(t) for t in made)
    assert len({tuple(t.ne) + tuple(t.nb) for t in made}) > 1
    before = [t for t in made]
    y = made[8]
    y.set_op_params([7] + y.op_params[1:])
    x.ne = (1, 1, 8, 8)
    x.nb = (4, 32, 256, 256)
    assert all(layout_is_current(t) for t in before + [y, x])
