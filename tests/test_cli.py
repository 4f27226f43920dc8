"""The command line: plan, bench, ops-check and their errors."""

import json
import logging
import subprocess
import sys

import pytest
from conftest import shared_path

from ggml_py.__main__ import main

CASES = shared_path() / "cases"


def _golden(name):
    return json.loads((CASES / f"{name}.plan.json").read_text())


def test_plan_writes_ggmls_plan(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", str(CASES / "llama-4L-partial-offload.case.json"), "-o", str(out),
                 "--alloc"]) == 0
    ours, ref = json.loads(out.read_text()), _golden("llama-4L-partial-offload")
    for key in ("format", "case", "n_splits", "splits", "node_backends", "leaf_backends",
                "node_srcs", "graph_inputs", "graph_copy", "alloc"):
        assert ours[key] == ref[key], key


def test_plan_explain_names_passes(capsys):
    assert main(["plan", str(CASES / "llama-2L-gpu-unsupported.case.json"), "--explain"]) == 0
    text = capsys.readouterr().out
    assert "## split 0:" in text
    assert "1.wgt" in text and "2.sup" in text


def test_plan_dot_picture(tmp_path):
    dot = tmp_path / "plan.dot"
    assert main(["plan", str(CASES / "llama-2L-two-gpus-parallel.case.json"), "--dot", str(dot),
                 "-o", str(tmp_path / "p.json")]) == 0
    text = dot.read_text()
    assert text.startswith("digraph plan {")
    assert text.count("subgraph cluster_") == _golden("llama-2L-two-gpus-parallel")["n_splits"]
    assert "copy to GPU1#0" in text and "style=dashed" in text
    import shutil
    if shutil.which("dot"):
        svg = tmp_path / "plan.svg"
        main(["plan", str(CASES / "mlp-cpu-only.case.json"), "--dot", str(svg),
              "-o", str(tmp_path / "q.json")])
        assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_plan_abort_is_one_line_and_exit_code_1(capsys):
    rc = main(["plan", str(CASES / "aborts" / "no-backend-supports-op-softmax-cpu-only.case.json")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "no backend supports node 'probs'" in err and "[no-backend-supports-op]" in err


def test_bench_json_keys(capsys):
    assert main(["bench", str(CASES / "mlp-cpu-only.case.json"), "--json", "--min-time", "0.01"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("case", "n_nodes", "split_us_median", "ggml_split_us", "split_ratio",
                "alloc_graph_us_median", "ggml_alloc_graph_us", "alloc_ratio"):
        assert key in row
    assert row["case"] == "mlp-cpu-only" and row["split_us_median"] > 0
    assert row["ggml_split_us"] == _golden("mlp-cpu-only")["timing"]["split_us_median"]


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "ggml_py", "plan", str(CASES / "mlp-cpu-only.case.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_splits"] == _golden("mlp-cpu-only")["n_splits"]


def test_ggml_sched_debug_logs_splits(monkeypatch, caplog):
    from ggml_py.cases import load_case
    from ggml_py.planning import scheduler_for_case
    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")
    case = load_case(CASES / "llama-2L-gpu-unsupported.case.json")
    sched = scheduler_for_case(case)
    with caplog.at_level(logging.DEBUG, logger="ggml_py.sched"):
        sched.split_graph(case.graph)
    text = caplog.text
    assert text.count("## SPLIT #") == sched.n_splits
    assert "node #" in text


def test_ggml_style_aliases():
    from ggml_py.cases import load_case
    from ggml_py import sched as S
    case = load_case(CASES / "llama-2L-full-offload.case.json")
    s = S.ggml_backend_sched_new(case.backends, None, len(case.backends), case.graph_size, False, False)
    S.ggml_backend_sched_split_graph(s, case.graph)
    assert S.ggml_backend_sched_get_n_splits(s) == _golden("llama-2L-full-offload")["n_splits"]
    assert S.ggml_backend_sched_get_n_backends(s) == 2
    assert S.ggml_backend_sched_get_backend(s, 1).name == "CPU"
