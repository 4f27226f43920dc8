"""Graph reuse: the same Graph, unchanged since its last split, is allocated and
computed again without a split or an allocation; any change through the API (a
tensor, the graph, a user assignment, a buffer, a backend's tables) forces a fresh
plan, and a reused plan is the plan a fresh split + alloc makes."""

import numpy as np
import pytest
from conftest import case_files, shared_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_py import Graph, ops
from ggml_py._backend import get_buffer, set_buffer
from ggml_py._core import mutation_epochs
from ggml_py.backends.cpu import CPUBackend
from ggml_py.tools.cases import load_case
from ggml_py.tools.schedtime import time_split, time_struct_sweep
from ggml_py.errors import GgmlPyError
from ggml_py.tools.planning import scheduler_for_case
from ggml_py.sched import Scheduler

CASES = ["llama-4L-partial-offload", "llama-2L-gpu-unsupported", "moe-2L-experts-on-cpu",
         "user-assigned", "op-offload-batch64"]


def _case(name):
    return load_case(str(shared_path() / "cases" / f"{name}.case.json"))


def _state(sched, graph):
    """Everything a plan and its allocation decide, as plain data."""
    tensors = graph.nodes + graph.leafs
    return (sched.plan("x").to_dict(explain=True),
            [sched.tensor_location(t) for t in tensors],
            [t.data_address for t in tensors])


def _again(case, sched):
    """A serving loop's step: reset, the user assignments again, allocate."""
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)
    assert sched.alloc_graph(case.graph)


@pytest.mark.parametrize("name", CASES)
def test_same_graph_is_reused_and_equals_a_fresh_plan(name):
    case = _case(name)
    sched = scheduler_for_case(case)
    assert sched.graph_reuse and sched.n_graph_reuses == 0
    sched.alloc_graph(case.graph)
    first = _state(sched, case.graph)
    reallocs = sched.n_reallocs
    for k in range(3):
        _again(case, sched)
        assert sched.n_graph_reuses == k + 1
        assert _state(sched, case.graph) == first
    assert sched.n_reallocs == reallocs
    # the same plan as a fresh scheduler's split + alloc of the same graph
    again = _case(name)
    fresh = scheduler_for_case(again)
    fresh.alloc_graph(again.graph)
    assert fresh.plan("x").to_dict(explain=True) == first[0]
    assert [fresh.tensor_location(t) for t in again.graph.nodes + again.graph.leafs] == first[1]


def test_reuse_off_splits_every_time():
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    sched.graph_reuse = False
    sched.alloc_graph(case.graph)
    first = _state(sched, case.graph)
    _again(case, sched)
    assert sched.n_graph_reuses == 0 and _state(sched, case.graph) == first
    sched2 = Scheduler(case.backends, graph_size=case.graph_size, graph_reuse=False)
    assert not sched2.graph_reuse


def test_split_graph_and_graph_compute_reuse_too():
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)
    sched.split_graph(case.graph)
    assert sched.n_graph_reuses == 1 and not sched.is_alloc


def test_reset_forgets_assignments_while_the_plan_is_kept():
    case = _case("user-assigned")
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    node = case.graph.nodes[-1]
    assert sched.get_tensor_backend(node) is not None
    sched.reset()
    # ggml: a reset forgets every assignment (the kept tables are not visible)
    assert sched.get_tensor_backend(node) is None
    t, b = case.assignments[0]
    sched.set_tensor_backend(t, b)
    assert sched.get_tensor_backend(t) is sched.get_backend(sched.backend_id(b))
    assert sched.get_cause(node) == ""          # reading causes gives the plan up
    for t, b in case.assignments[1:]:
        sched.set_tensor_backend(t, b)
    sched.alloc_graph(case.graph)
    assert sched.n_graph_reuses == 0


def test_other_user_assignments_force_a_fresh_plan():
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    before = sched.plan("x").to_dict()
    node = next(n for n in case.graph.nodes if sched.get_tensor_backend(n).name != "CPU")
    sched.reset()
    sched.set_tensor_backend(node, "CPU")
    sched.alloc_graph(case.graph)
    assert sched.n_graph_reuses == 0
    assert sched.plan("x").to_dict() != before
    assert sched.get_tensor_backend(node).name == "CPU"
    # the same assignment again: the new plan is reused
    sched.reset()
    sched.set_tensor_backend(node, "CPU")
    sched.alloc_graph(case.graph)
    assert sched.n_graph_reuses == 1


def test_unrelated_changes_keep_the_plan():
    case = _case("llama-4L-partial-offload")
    other = _case("mlp-cpu-only")
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    first = _state(sched, case.graph)
    epoch = mutation_epochs()[0]
    other.graph.nodes[0].set_op_params(other.graph.nodes[0].op_params)   # another graph
    other.graph.nodes[1].name = "renamed"
    assert mutation_epochs()[0] > epoch
    _again(case, sched)
    assert sched.n_graph_reuses == 1
    assert _state(sched, case.graph) == first


def test_another_graph_in_between_forces_a_fresh_plan():
    case = _case("llama-4L-partial-offload")
    other = Graph.from_lists(case.graph.nodes, case.graph.leafs)    # another Graph object
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    _again(case, sched)
    assert sched.n_graph_reuses == 1
    sched.reset()
    sched.split_graph(other)
    _again(case, sched)
    assert sched.n_graph_reuses == 1
    sched.validate_allocation()


def _copy_state(sched):
    """The graph copy's tensors, by name, with their places: what pipeline parallelism
    rotates (which copy stands at each slot's place)."""
    nodes, _, leafs, _ = sched._core.get_graph_copy()
    return [(t.name, sched.tensor_location(t)) for t in nodes + leafs]


def _parallel_cases():
    """The case files of parallel schedulers whose graphs plan."""
    out = []
    for path in case_files():
        case = load_case(str(path))
        try:
            if case.parallel and scheduler_for_case(case).alloc_graph(case.graph):
                out.append(pytest.param(str(path), id=path.name.removesuffix(".case.json")))
        except GgmlPyError:
            pass
    return out


@pytest.mark.parametrize("path", _parallel_cases())
def test_pipeline_parallel_reuses_while_the_copy_slot_rotates(path):
    # each alloc_graph moves to the next copy slot: the kept plan moves with it, and
    # stands as a scheduler that never reuses stands after the same steps
    case, twin = load_case(path), load_case(path)
    sched, ref = scheduler_for_case(case), scheduler_for_case(twin)
    ref.graph_reuse = False
    assert sched.alloc_graph(case.graph) and ref.alloc_graph(twin.graph)
    inputs = sched._core.get_graph_inputs()
    for k in range(2 * sched.n_copies + 1):
        _again(case, sched)
        _again(twin, ref)
        assert sched.n_graph_reuses == k + 1
        assert sched._core.cur_copy == ref._core.cur_copy
        assert _state(sched, case.graph)[:2] == _state(ref, twin.graph)[:2]
        assert _copy_state(sched) == _copy_state(ref)
        if inputs:
            sched.validate_allocation()
    assert ref.n_graph_reuses == 0


def test_reserve_and_close_give_the_plan_up():
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    sched.reset()
    sched.reserve(case.graph)           # its split may reuse; the reservation ends the plan
    reuses = sched.n_graph_reuses
    _again(case, sched)
    assert sched.n_graph_reuses == reuses
    sched.close()
    _again(case, sched)
    assert sched.n_graph_reuses == reuses
    sched.validate_allocation()


def test_time_reps_reuse_checks_that_it_reused():
    from ggml_py._schedtime import TIME_REUSE, GraphSnapshot, time_reps
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    snap = GraphSnapshot(case.graph)
    times = time_reps(sched._core, case.graph, snap, case.assignments, 5, TIME_REUSE)
    assert len(times) == 5 and sched.n_graph_reuses == 5
    par = _case("llama-2L-two-gpus-parallel")
    psched = scheduler_for_case(par)
    times = time_reps(psched._core, par.graph, GraphSnapshot(par.graph), par.assignments, 5,
                      TIME_REUSE)
    assert len(times) == 5 and psched.n_graph_reuses == 5     # (pipeline parallel too)


def test_time_split_and_the_struct_sweep_leave_the_graph_and_the_plan_as_they_were():
    case = _case("llama-4L-partial-offload")
    sched = scheduler_for_case(case)
    sources = [list(t.src) for t in case.graph.nodes]      # (the split rewires them)
    sched.alloc_graph(case.graph)
    before = _state(sched, case.graph)
    sched.reset()
    # the memory floor's sweep reads the graph and decides nothing
    times = time_struct_sweep(sched, case.graph, 4)
    assert len(times) == 4 and all(t > 0 for t in times)
    splits = time_split(sched, case.graph, 3, case.assignments)
    assert len(splits) == 3 and all(t > 0 for t in splits)
    assert [list(t.src) for t in case.graph.nodes] == sources
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)
    sched.alloc_graph(case.graph)
    assert _state(sched, case.graph) == before
    with pytest.raises(GgmlPyError, match="reps"):
        time_struct_sweep(sched, case.graph, -1)


# ---------------------------------------------------------------------------
# one change of each kind through the API always forces a fresh plan


def _views(graph):
    return [t for t in graph.nodes + graph.leafs if t.view_src is not None]


def _weights(graph):
    return [t for t in graph.leafs if get_buffer(t) is not None and t.view_src is None]


MUTATIONS = {
    # each leaves the graph as it was (or changes it validly), but goes through the API
    "op": lambda g, i, s: _pick(g.nodes, i).__setattr__("op", _pick(g.nodes, i).op),
    "name": lambda g, i, s: _pick(g.leafs, i).__setattr__("name", _pick(g.leafs, i).name),
    "ne": lambda g, i, s: _pick(g.nodes, i).__setattr__("ne", _pick(g.nodes, i).ne),
    "nb": lambda g, i, s: _pick(g.leafs, i).__setattr__("nb", _pick(g.leafs, i).nb),
    "flags": lambda g, i, s: _pick(g.nodes, i).__setattr__("flags", _pick(g.nodes, i).flags),
    "set_output": lambda g, i, s: _pick(g.nodes, i).set_output(),
    "set_input": lambda g, i, s: _pick(g.leafs, i).set_input(),
    "op_params": lambda g, i, s: _pick(g.nodes, i).set_op_params(_pick(g.nodes, i).op_params),
    "src": lambda g, i, s: _pick(g.nodes, i).set_src(9, None),
    "view": lambda g, i, s: _pick(_views(g), i).set_view_src(_pick(_views(g), i).view_src,
                                                             _pick(_views(g), i).view_offs),
    "buffer": lambda g, i, s: set_buffer(_pick(_weights(g), i), get_buffer(_pick(_weights(g), i))),
    "buffer_usage": lambda g, i, s: setattr(get_buffer(_pick(_weights(g), i)), "usage",
                                            get_buffer(_pick(_weights(g), i)).usage),
    "graph": lambda g, i, s: g.build_forward_expand(g.nodes[-1]),
    "assignment": lambda g, i, s: s.set_tensor_backend(_pick(_computed(g), i), "CPU"),
    # a view op to the CPU: away from its memory where that is a GPU's (cause usr.away)
    "view_assignment": lambda g, i, s: s.set_tensor_backend(_pick(_view_ops(g), i), "CPU"),
    "backend_tables": lambda g, i, s: s.backends[-1].set_offload_ops(()),
}


def _computed(graph):
    return [t for t in graph.nodes if t.view_src is None]


def _view_ops(graph):
    return [t for t in graph.nodes if t.op in ops.VIEW_OPS]


ASSIGNED = {"assignment": _computed, "view_assignment": _view_ops}   # what each assigns


def _pick(seq, i):
    return seq[i % len(seq)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(MUTATIONS)), index=st.integers(0, 10_000),
       name=st.sampled_from(["llama-4L-partial-offload", "moe-2L-experts-on-cpu",
                             "llama-2L-two-gpus-parallel"]))
def test_any_single_change_forces_a_fresh_plan(kind, index, name):
    case = _case(name)
    sched = scheduler_for_case(case)
    sched.alloc_graph(case.graph)
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)
    MUTATIONS[kind](case.graph, index, sched)
    sched.alloc_graph(case.graph)
    assert sched.n_graph_reuses == 0, kind
    # ... and then the new plan is kept
    state = _state(sched, case.graph)
    extra = [(_pick(ASSIGNED[kind](case.graph), index), sched.backend_id("CPU"))] \
        if kind in ASSIGNED else []
    # (pipeline parallelism: round the copy slots, back to the plan's)
    for _ in range(sched.n_copies):
        sched.reset()
        for t, b in case.assignments + extra:
            sched.set_tensor_backend(t, b)
        sched.alloc_graph(case.graph)
    assert sched.n_graph_reuses == sched.n_copies and _state(sched, case.graph) == state


# ---------------------------------------------------------------------------
# computing: a reused graph computes new inputs right


def test_reused_graph_computes_new_inputs():
    cpu = CPUBackend()
    ctx = __import__("ggml_py").Context()
    x = ctx.new_tensor("f32", (4, 64), name="x").set_input()
    y = ops.soft_max(ctx, ops.scale(ctx, x, 0.5)).set_output()
    g = Graph(64).build_forward_expand(y)
    sched = Scheduler([cpu], graph_size=64)
    rng = np.random.default_rng(0)
    for step in range(4):
        sched.reset()
        sched.alloc_graph(g)
        data = rng.standard_normal((4, 64)).astype(np.float32)
        cpu.set_tensor(x, data)
        sched.graph_compute(g)
        got = np.frombuffer(cpu.get_tensor(y), np.float32).reshape(4, 64)
        e = np.exp(0.5 * data - (0.5 * data).max(axis=1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    assert sched.n_graph_reuses == 3


def test_pipeline_parallel_reuse_computes_new_inputs_in_every_copy_slot():
    # the input moves to the next slot's memory at each step, the device reads its
    # copies from the next slot's: every step must compute its own input
    from ggml_py.backends.numpy_device import NumpyDeviceBackend
    dev, cpu = NumpyDeviceBackend(unsupported_ops=["SOFT_MAX"]), CPUBackend()
    ctx = __import__("ggml_py").Context()
    x = ctx.new_tensor("f32", (4, 64), name="x").set_input()
    s = ops.scale(ctx, x, 0.5)
    y = ops.scale(ctx, ops.soft_max(ctx, s), 2.0).set_output()
    g = Graph(64).build_forward_expand(y)
    sched = Scheduler([dev, cpu], graph_size=64, parallel=True)
    rng = np.random.default_rng(1)
    places = set()
    for step in range(2 * sched.n_copies + 1):
        sched.reset()
        sched.set_tensor_backend(s, dev)
        assert sched.alloc_graph(g)
        places.add(x.data_address)
        data = rng.standard_normal((4, 64)).astype(np.float32)
        sched.get_tensor_backend(x).set_tensor(x, data)
        sched.graph_compute(g)
        got = np.frombuffer(sched.get_tensor_backend(y).get_tensor(y), np.float32)
        e = np.exp(0.5 * data - (0.5 * data).max(axis=1, keepdims=True))
        np.testing.assert_allclose(got.reshape(4, 64), 2 * e / e.sum(axis=1, keepdims=True),
                                   rtol=1e-5)
    assert sched.n_graph_reuses == 2 * sched.n_copies
    assert len(places) == sched.n_copies          # the input took every slot's memory
