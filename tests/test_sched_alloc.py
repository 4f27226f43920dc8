"""The scheduler's allocation path: ggml's `alloc` block for every shared case,
the validator, reallocation rules, and failures that leave the scheduler usable."""

import json

import pytest
from conftest import case_files, shared_path

from ggml_py import Backend, BufferType, Context, Graph
from ggml_py.tools.cases import load_case
from ggml_py.errors import AllocationError, SchedulerError
from ggml_py.tools.planning import plan_case, scheduler_for_case
from ggml_py.sched import Scheduler

PLAN_CASES = [str(p) for p in case_files(("", "random"))]


def _golden(path):
    with open(path[: -len(".case.json")] + ".plan.json") as f:
        return json.load(f)


@pytest.mark.parametrize("path", PLAN_CASES, ids=lambda p: p.rsplit("/", 1)[-1][:-10])
def test_alloc_block_matches_ggml(path):
    case = load_case(path)
    sched, plan = plan_case(case, alloc=True)
    ours, ref = plan.to_dict(), _golden(path)
    assert ours["alloc"] == ref["alloc"]
    # the split part is the same after alloc_graph as after the split alone
    for key in ("splits", "node_backends", "leaf_backends", "node_srcs", "graph_copy"):
        assert ours[key] == ref[key], key
    assert sched.validate_allocation() > 0


@pytest.mark.parametrize("path", PLAN_CASES, ids=lambda p: p.rsplit("/", 1)[-1][:-10])
def test_repeated_allocation_stays_sound(path):
    """alloc_graph again and again, as a serving loop does (restore, reset, allocate):
    copy slots rotate in parallel mode; every allocation must be valid."""
    from ggml_py._schedtime import GraphSnapshot
    case = load_case(path)
    sched = scheduler_for_case(case)
    snap = GraphSnapshot(case.graph)
    for _ in range(5):
        _restore(case, sched, snap)
        assert sched.alloc_graph(case.graph)
        assert sched.validate_allocation() > 0
    if not case.parallel:
        # the first allocation reserves (in ggml-alloc itself with one buffer), then reuse
        assert sched.n_reallocs <= 1 and sched.n_unexpected_reallocs == 0


def test_reserve_size_matches_allocation():
    path = str(shared_path() / "cases" / "llama-4L-partial-offload.case.json")
    case = load_case(path)
    sched = scheduler_for_case(case)
    sizes = sched.reserve_size(case.graph)
    assert sizes == _golden(path)["alloc"]["buffer_sizes"]


def _restore(case, sched, snap):
    snap.restore()
    sched.reset()
    for t, b in case.assignments:
        sched.set_tensor_backend(t, b)


def test_steady_state_reuses_the_reservation():
    from ggml_py._schedtime import GraphSnapshot
    case = load_case(str(shared_path() / "cases" / "llama-2L-two-gpus-parallel.case.json"))
    sched = scheduler_for_case(case)
    snap = GraphSnapshot(case.graph)
    sched.alloc_graph(case.graph)
    assert sched.is_alloc and sched.n_reallocs == 1      # the first allocation reserves
    with pytest.raises(SchedulerError, match="reset"):
        sched.alloc_graph(case.graph)                    # ggml asserts !is_alloc
    for _ in range(3):
        _restore(case, sched, snap)
        sched.alloc_graph(case.graph)
    # parallel: the copy slots rotate, the graph keeps its size: no new reservation
    assert sched.n_reallocs == 1
    assert sched.n_unexpected_reallocs == 0


def _chain(ctx, n, ne0):
    x = ctx.new_tensor("f32", (4, ne0), name="x").set_input()
    t = x
    for i in range(n):
        t = ctx.new_op("MUL_MAT", [t, t], "f32", (4, ne0), name=f"n{i}")   # never in place
    t.set_output()
    return Graph(64).build_forward_expand(t)


def _cpu(buft=None):
    buft = buft or BufferType("CPU", 32, None, True)
    return Backend("CPU", buft, "cpu")


def _grow(graph):
    """The same graph with tensors twice as large: same size, same backends."""
    from ggml_py._backend import clear_buffer
    for t in graph.nodes + graph.leafs:
        t.ne = (16, 4, 1, 1)
        t.nb = (4, 64, 256, 256)
        clear_buffer(t)


@pytest.mark.parametrize("raises", [False, True])
def test_unexpected_reallocation_is_counted_warned_or_raised(raises):
    from ggml_py.backends.sim import SimBufferType
    # two buffer ids: ggml-alloc no longer re-reserves by itself, the scheduler does
    gpu = Backend("GPU0", SimBufferType("GPU0", 32, None, False), "gpu")
    sched = Scheduler([gpu, _cpu()], graph_size=64, debug_realloc=1, realloc_raises=raises)
    g = _chain(Context(), 3, 8)
    sched.alloc_graph(g)
    assert sched.n_reallocs == 1 and sched.n_unexpected_reallocs == 0
    sched.reset()
    _grow(g)
    if raises:
        with pytest.raises(SchedulerError) as e:
            sched.alloc_graph(g)
        assert e.value.kind == "unexpected-realloc"
        sched.reset()
    else:
        with pytest.warns(RuntimeWarning, match="unexpected graph reallocation"):
            sched.alloc_graph(g)
        assert sched.validate_allocation() > 0
    assert sched.n_unexpected_reallocs == 1


class _SmallBufferType(BufferType):
    """Host memory that refuses buffers above a limit."""

    def alloc_buffer(self, size):
        if size > 1024:
            raise AllocationError(f"buffer type '{self.name}': {size} bytes is over the 1024 limit")
        return super().alloc_buffer(size)


def test_allocation_failure_names_size_and_leaves_scheduler_usable():
    buft = _SmallBufferType("SMALL", 32, None, True)
    sched = Scheduler([_cpu(buft)], graph_size=64)
    with pytest.raises(AllocationError, match="backend CPU: .*SMALL"):
        sched.alloc_graph(_chain(Context(), 4, 64))          # 4x64 floats: over the limit
    assert not sched.is_alloc
    sched.reset()
    assert sched.alloc_graph(_chain(Context(), 4, 8))       # fits: the scheduler still works
    assert 0 < sched.get_buffer_size(0) <= 1024


@pytest.mark.parametrize("name", ["leaf-without-backend-reshaped-unflagged-leaf",
                                  "leaf-without-backend-rand-031753"])
def test_leaf_without_backend_is_refused_at_allocation(name):
    case = load_case(str(shared_path() / "cases" / "aborts" / f"{name}.case.json"))
    sched = scheduler_for_case(case)
    with pytest.raises(SchedulerError) as e:
        sched.alloc_graph(case.graph)
    assert e.value.kind == "leaf-without-backend"
    ok = load_case(str(shared_path() / "cases" / "mlp-cpu-only.case.json"))
    s2 = scheduler_for_case(ok)
    assert s2.alloc_graph(ok.graph)


def test_hash_set_too_small_is_refused_before_splitting():
    case = load_case(str(shared_path() / "cases" / "aborts" / "hash-set-too-small-rand-004800.case.json"))
    sched = scheduler_for_case(case)
    with pytest.raises(SchedulerError) as e:
        sched.alloc_graph(case.graph)
    assert e.value.kind == "hash-set-too-small"
    assert not sched.is_alloc
