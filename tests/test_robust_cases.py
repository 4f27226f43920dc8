"""Hostile case files: every one ends in a plan or a GgmlPyError naming what is wrong,
never a crash, a hang, another exception or an unsound allocation. The mutation
fuzzer runs in a subprocess (tests/case_fuzz.py), bounded in time."""

import json
import os
import time

import numpy as np
import pytest

from conftest import shared_path
from ggml_py import Context, Graph, ops
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.sched import Scheduler
from ggml_py.tools.cases import load_case
from ggml_py.errors import AllocationError, CaseFormatError, GgmlPyError, SchedulerError
from ggml_py.reasons import cause_text
from ggml_py.tools.planning import plan_case
from test_robust_api import run_python

HERE = os.path.dirname(os.path.abspath(__file__))
CASE = shared_path() / "cases" / "llama-2L-gpu-unsupported.case.json"


def base():
    return json.loads(CASE.read_text())


def test_mutation_fuzzer_finds_nothing():
    rc, out = run_python([os.path.join(HERE, "case_fuzz.py"), "--seed", "20260101",
                          "--rounds", "1500", "--seconds", "12"])
    rounds = [line for line in out.splitlines() if line.startswith("round ")]
    assert rc == 0, f"the fuzzer died (rc {rc}) at: {rounds[-1] if rounds else '?'}\n{out[-3000:]}"
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM ")]
    assert not problems, "\n".join(problems[:20])
    summary = json.loads([line for line in out.splitlines() if line.startswith("SUMMARY ")][0][8:])
    assert summary["plan"] > 20 and summary["error"] > 20     # both ends were reached


def test_the_fuzzers_outcomes_repeat_for_a_seed():
    """--outcomes names what each round decided, so that two builds can be diffed on the
    same rounds: a run again with the seed prints the same lines, plans and errors."""
    outs = []
    for _ in range(2):
        rc, out = run_python([os.path.join(HERE, "case_fuzz.py"), "--seed", "7", "--rounds",
                              "60", "--seconds", "300", "--outcomes"])
        assert rc == 0, out[-3000:]
        outs.append([line for line in out.splitlines() if line.startswith("outcome ")])
    assert outs[0] == outs[1] and len(outs[0]) == 60
    kinds = {line.split()[2] for line in outs[0]}
    assert "plan" in kinds and len(kinds) > 2, kinds


# ---------------------------------------------------------------------------
# the files of the issue

@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe\x00\x00", "not UTF-8"),
    ('{"format": "ggml-sched-case/1"}'.encode("utf-16"), "not UTF-8"),
    (b"{" + b"\x80" * 10 + b"}", "byte 0x80 at offset 1"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply|not valid JSON"),
    (b'{"a": ' + b"1" * 5000 + b"}", "not a JSON document"),
    (b"", "not valid JSON"),
    (b'{"format": "ggml-sched-case/1", "name": "x"', "not valid JSON"),
])
def test_unreadable_files_are_case_format_errors(tmp_path, content, match):
    p = tmp_path / "bad.case.json"
    p.write_bytes(content)
    with pytest.raises(CaseFormatError, match=match):
        load_case(p)


def test_missing_file_and_bom(tmp_path):
    with pytest.raises(CaseFormatError, match="cannot read"):
        load_case(tmp_path / "nothing.case.json")
    p = tmp_path / "bom.case.json"
    p.write_bytes(b"\xef\xbb\xbf" + CASE.read_bytes())      # a UTF-8 BOM is fine
    assert load_case(p).name == base()["name"]


def test_lone_surrogates_are_refused():
    d = base()
    d["tensors"][3]["name"] = "a\ud800b"
    with pytest.raises(CaseFormatError, match="tensor 3 .*lone surrogate"):
        load_case(d)
    d = base()
    d["name"] = "\udfff"
    with pytest.raises(CaseFormatError, match="lone surrogate"):
        load_case(d)


def test_graph_size_at_the_int_limit_loads_and_the_scheduler_refuses_it():
    d = base()
    d["graph_size"] = 2**31 - 1
    case = load_case(d)                                    # the graph holds what it lists
    assert case.graph.size == len(d["nodes"])
    with pytest.raises(AllocationError,
                       match=r"its tables: cannot allocate \d+ bytes .* of memory available"):
        plan_case(case)


@pytest.mark.parametrize("ne", [[2**20, 2**20, 2**20, 2**20], [2**56, 2, 1, 1],
                                [2**63 - 1, 2, 1, 1]])
def test_element_counts_past_the_limit_are_refused(ne):
    d = base()
    t = d["tensors"][10]
    t["ne"] = ne
    with pytest.raises(CaseFormatError, match="tensor 10 .*elements"):
        load_case(d)


def test_strides_whose_extent_wraps_are_refused():
    d = base()
    d["tensors"][10]["nb"] = [4, 2**63, 2**63, 2**63]
    with pytest.raises(CaseFormatError, match="tensor 10 .*span"):
        load_case(d)


@pytest.mark.parametrize("alignment", [2**40, 2**62, 2**63])
def test_alignments_whose_fake_addresses_wrap(alignment):
    d = base()
    for b in d["backends"]:
        b["buffer_type_alignment"] = alignment
    try:
        sched, plan = plan_case(load_case(d), alloc=True)
    except GgmlPyError as e:
        assert isinstance(e, (AllocationError, SchedulerError)), e
        return
    assert sched.validate_allocation() > 0


def test_a_huge_backends_list_is_refused_before_anything_is_built():
    d = base()
    d["backends"] = d["backends"][:1] * 10**6
    t0 = time.perf_counter()
    with pytest.raises(CaseFormatError, match="1000000 backends"):
        load_case(d)
    assert time.perf_counter() - t0 < 0.5              # the limit first, nothing built


def test_seventeen_backends_load_and_the_scheduler_refuses_them():
    case = load_case(shared_path() / "cases" / "aborts" / "too-many-backends-17.case.json")
    with pytest.raises(SchedulerError) as e:
        plan_case(case)
    assert e.value.kind == "too-many-backends"


def test_a_view_assigned_away_from_its_memory_is_planned_as_ggml_plans_it():
    # the permute of Qcur-1 on the CPU, its ROPE on the GPU: ggml keeps the view on the
    # CPU and copies it to the GPU at the start of the split that reads it (before the
    # ROPE runs: computing it is refused, test_a_view_on_a_backend_that_cannot_reach_...)
    d = json.loads((shared_path() / "cases" / "llama-2L-full-offload.case.json").read_text())
    names = [t["name"] for t in d["tensors"]]
    d["tensors"][names.index("Qcur-1 (permuted)")]["backend"] = "CPU"
    case = load_case(d)
    sched, plan = plan_case(case)
    view = next(t for t in case.graph.nodes if t.name == "Qcur-1 (permuted)")
    assert sched.get_tensor_backend(view).name == "CPU"
    assert sched.get_cause(view) == "usr.away"
    assert cause_text("usr.away").startswith("assigned by the user away from the memory")
    reader = next(s for s in sched.splits if view in s.inputs)
    assert reader.backend.name == "GPU0"
    assert view.view_src in [case.graph.nodes[i] for i in range(reader.i_start, reader.i_end)]


def _away_view_graph(backends, view_backend):
    """x -> h = gelu(x + x) on backends[0] -> its transpose v (a view of h's memory) ->
    y = cont(v) on backends[0], read back; v assigned to `view_backend` (None: not
    assigned, it goes with h). ggml reads v in place where y runs, or copies it there at
    the start of y's split, before h is computed."""
    ctx = Context()
    x = ctx.new_tensor(np.float32, (6, 8), name="x").set_input()
    h = ops.gelu(ctx, ops.add(ctx, x, x))
    v = ops.transpose(ctx, h)
    v.name = "h (transposed)"
    y = ops.cont(ctx, v).set_output()
    graph = Graph(64).build_forward_expand(y)
    sched = Scheduler(backends)
    for t, b in ((h, backends[0]), (v, view_backend), (y, backends[0])):
        if b is not None:
            sched.set_tensor_backend(t, b)
    sched.alloc_graph(graph)
    sched.set_input(x, np.linspace(-2, 2, 48).reshape(6, 8))
    return sched, graph, v, y


def test_a_view_on_a_backend_that_cannot_reach_its_memory_is_refused_at_compute():
    dev, cpu = NumpyDeviceBackend(), CPUBackend()
    sched, graph, v, _ = _away_view_graph([dev, cpu], cpu)
    assert sched.get_cause(v) == "usr.away"             # planned: ggml plans it
    with pytest.raises(SchedulerError, match=r"view 'h \(transposed\)' is assigned to "
                       r"backend CPU, which cannot use .* buffer type 'NUMPY_DEV'") as e:
        sched.graph_compute(graph)
    assert e.value.kind == "view-assigned-away"
    sched, graph, v, _ = _away_view_graph([dev, cpu], dev)  # where its memory is
    assert sched.get_cause(v) == "usr"
    sched.graph_compute(graph)


def test_a_view_copied_before_its_view_src_is_computed_is_refused():
    # the CPU told it may use the device's memory, the device not the CPU's: y's split on
    # the device copies v at its start, where h is computed later (ggml reads stale bytes)
    dev, cpu = NumpyDeviceBackend(), CPUBackend()
    cpu.set_supported_buffer_types([cpu.buffer_type, dev.buffer_type])
    sched, graph, v, _ = _away_view_graph([dev, cpu], cpu)
    with pytest.raises(SchedulerError, match=r"view 'h \(transposed\)' is assigned to backend "
                       r"CPU, and NUMPY_DEV would copy it at the start of the split that "
                       r"computes its view_src") as e:
        sched.graph_compute(graph)
    assert e.value.kind == "view-assigned-away"


def test_a_view_on_a_backend_that_reaches_its_memory_computes():
    # two host-memory backends (as ggml's BLAS beside its CPU): each uses the other's memory
    backends = [CPUBackend("CPU0"), CPUBackend()]
    expected_sched, expected_graph, _, expected_y = _away_view_graph(backends, None)
    expected_sched.graph_compute(expected_graph)
    sched, graph, v, y = _away_view_graph(backends, backends[1])
    assert sched.get_cause(v) == "usr.away"
    sched.graph_compute(graph)
    out = sched.get_output(y)
    assert out.shape == (8, 6)
    np.testing.assert_array_equal(out, expected_sched.get_output(expected_y))
    assert np.abs(out).max() > 0.5                      # gelu of 2x over [-4, 4], not zeros


def test_a_computed_input_is_refused():
    d = base()
    t = next(t for t in d["tensors"] if t["op"] == "MUL_MAT")
    t["flags"] = sorted(set(t["flags"]) | {"INPUT"})
    with pytest.raises(GgmlPyError, match="flagged INPUT"):
        plan_case(load_case(d))


def test_the_command_line_reports_hostile_files_without_a_traceback(tmp_path):
    p = tmp_path / "bad.case.json"
    p.write_bytes("{}".encode("utf-16"))
    rc, out = run_python(["-m", "ggml_py", "plan", str(p)])
    assert rc != 0 and "Traceback" not in out and "not UTF-8" in out, out
