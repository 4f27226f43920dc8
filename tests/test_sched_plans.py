"""The scheduler reproduces every plan that ggml 0.10.1 produced, and refuses
(with a clear exception) or sensibly plans every problem on which ggml aborts."""

import json
import os

import pytest
from conftest import case_files, shared_path

from ggml_py.tools.cases import load_case
from ggml_py.errors import GgmlPyError, SchedulerError
from ggml_py.tools.planning import plan_case, scheduler_for_case
from ggml_py.sched import Scheduler

CASES = str(shared_path() / "cases")
PLAN_CASES = [str(p) for p in case_files(("", "random"))]
ABORT_CASES = [str(p) for p in case_files(("aborts",))]
SPLIT_KEYS = ("n_splits", "splits", "node_backends", "leaf_backends", "node_srcs",
              "graph_inputs", "graph_copy")



def _golden(path):
    with open(path[: -len(".case.json")] + ".plan.json") as f:
        return json.load(f)


@pytest.mark.parametrize("path", PLAN_CASES, ids=lambda p: os.path.basename(p)[:-10])
def test_plan_matches_ggml(path):
    case = load_case(path)
    _, plan = plan_case(case)
    ours = plan.to_dict()
    ref = _golden(path)
    assert ours["case"] == ref["case"]
    for key in SPLIT_KEYS:
        assert ours[key] == ref[key], key


@pytest.mark.parametrize("path", PLAN_CASES[:6], ids=lambda p: os.path.basename(p)[:-10])
def test_split_twice_after_restore_is_identical(path):
    from ggml_py._schedtime import GraphSnapshot
    case = load_case(path)
    snap = GraphSnapshot(case.graph)
    sched = scheduler_for_case(case)
    plans = []
    for _ in range(2):
        sched.split_graph(case.graph)
        plans.append(sched.plan(case.name).to_dict())
        snap.restore()
        sched.reset()
        for t, b in case.assignments:
            sched.set_tensor_backend(t, b)
    assert plans[0] == plans[1]
    assert all(plans[0][k] == _golden(path)[k] for k in SPLIT_KEYS)


def _abort_info(path):
    with open(path[: -len(".case.json")] + ".abort.json") as f:
        return json.load(f)


@pytest.mark.parametrize("path", ABORT_CASES, ids=lambda p: os.path.basename(p)[:-10])
def test_abort_cases_raise_or_plan_sensibly(path):
    info = _abort_info(path)
    case = load_case(path)
    cls = info["class"]
    if cls in ("hash-set-null-key", "too-many-split-inputs", "leaf-without-backend"):
        # ggml bugs or fixed limits: we plan these
        sched, plan = plan_case(case)
        for s in sched.splits:
            assert len(s.inputs) <= 30
        for node in case.graph.nodes:
            if node.op not in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
                b = sched.get_tensor_backend(node)
                assert b is not None and b.supports_op(node)
        if cls == "leaf-without-backend":
            assert None in plan.leaf_backends
        return
    with pytest.raises(SchedulerError) as e:
        plan_case(case)
    assert e.value.kind == cls
    assert str(e.value)


def test_scheduler_usable_after_error():
    """A failed split leaves the scheduler ready for the next graph."""
    bad = load_case(os.path.join(CASES, "aborts", "no-backend-supports-op-softmax-cpu-only.case.json"))
    sched = Scheduler(bad.backends, graph_size=bad.graph_size)
    with pytest.raises(SchedulerError):
        sched.split_graph(bad.graph)
    good = load_case(os.path.join(CASES, "mlp-cpu-only.case.json"))
    sched2 = scheduler_for_case(good)
    sched2.split_graph(good.graph)
    assert sched2.plan(good.name).to_dict()["splits"] == _golden(
        os.path.join(CASES, "mlp-cpu-only.case.json"))["splits"]


def test_unknown_backend_in_set_tensor_backend():
    case = load_case(os.path.join(CASES, "user-assigned.case.json"))
    sched = scheduler_for_case(case)
    with pytest.raises(GgmlPyError, match="unknown backend 'NOPE'"):
        sched.set_tensor_backend(case.tensors[0], "NOPE")
    sched.split_graph(case.graph)
    assert sched.n_splits == _golden(os.path.join(CASES, "user-assigned.case.json"))["n_splits"]


def test_causes_are_recorded():
    case = load_case(os.path.join(CASES, "llama-2L-gpu-unsupported.case.json"))
    sched, plan = plan_case(case)
    causes = set(plan.causes)
    assert causes <= {"1.dst", "1.vsrc", "1.inp", "1.off", "2.sup", "3.best", "3.upg", "4.vsrc",
                      "4.cur", "usr", ""} | {f"1.wgt{i}" for i in range(10)}
    assert any(c.startswith("1.wgt") for c in causes)
    assert "2.sup" in causes
