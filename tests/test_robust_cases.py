"""Hostile case files: every one ends in a plan or a GgmlPyError naming what is wrong,
never a crash, a hang, another exception or an unsound allocation. The mutation
fuzzer runs in a subprocess (tests/case_fuzz.py), bounded in time."""

import json
import os
import time

import pytest

from conftest import shared_path
from ggml_py.tools.cases import load_case
from ggml_py.errors import AllocationError, CaseFormatError, GgmlPyError, SchedulerError
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


def test_a_view_assigned_away_from_its_memory_is_refused():
    # the permute of Qcur-1 on the CPU, its ROPE on the GPU: ggml would copy the view at
    # the start of the split that reads it, before the ROPE runs
    d = json.loads((shared_path() / "cases" / "llama-2L-full-offload.case.json").read_text())
    names = [t["name"] for t in d["tensors"]]
    d["tensors"][names.index("Qcur-1 (permuted)")]["backend"] = "CPU"
    with pytest.raises(SchedulerError, match="runs where its view_src lives") as e:
        plan_case(load_case(d))
    assert e.value.kind == "view-assigned-away"


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
