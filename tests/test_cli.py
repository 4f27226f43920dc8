"""The command line: plan, bench, ops-check and their errors."""

import json
import logging
import subprocess
import sys

import pytest
from conftest import shared_path

from ggml_py.__main__ import main

CASES = shared_path() / "cases"
CASE = str(CASES / "mlp-cpu-only.case.json")
OPS_FILE = str(shared_path() / "ops" / "scale.json")


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
    legend = text[text.index("legend"):].splitlines()[1:]
    assert "  1.wgtN  it runs where its weight is" in legend
    assert "  2.sup   it follows its neighbours there" in legend
    # a sentence for each rule met, once
    assert len(legend) == len(set(legend)) and all(" " in line.strip() for line in legend)


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
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[-1])
    # the machine inside the row: a time means little without it
    machine = row["machine"]
    assert machine["cores"] >= 1 and machine["cpu"]
    for key in ("case", "n_nodes", "split_us_median", "ggml_split_us", "split_ratio",
                "alloc_graph_us_median", "ggml_alloc_graph_us", "alloc_ratio"):
        assert key in row
    assert row["case"] == "mlp-cpu-only" and row["split_us_median"] > 0
    assert row["ggml_split_us"] == _golden("mlp-cpu-only")["timing"]["split_us_median"]
    # issue 11's keys: per node, split + reserve + alloc against ggml, graph reuse
    assert row["split_us_per_node"] == round(row["split_us_median"] / row["n_nodes"], 5)
    assert row["alloc_reserve_us_median"] > 0 and row["alloc_reserve_ratio"] > 0
    assert 0 < row["reuse_same_graph_us"] < row["split_us_median"]
    assert "reuse_rebuilt_graph_us" in row and "reuse_ratio" in row


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "ggml_py", "plan", str(CASES / "mlp-cpu-only.case.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_splits"] == _golden("mlp-cpu-only")["n_splits"]


def test_ggml_sched_debug_logs_splits(monkeypatch, caplog):
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import scheduler_for_case
    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")
    case = load_case(CASES / "llama-2L-gpu-unsupported.case.json")
    sched = scheduler_for_case(case)
    with caplog.at_level(logging.DEBUG, logger="ggml_py.sched"):
        sched.split_graph(case.graph)
    text = caplog.text
    assert text.count("## SPLIT #") == sched.n_splits
    assert "node #" in text


def test_ggml_style_aliases():
    from ggml_py.tools.cases import load_case
    from ggml_py import sched as S
    case = load_case(CASES / "llama-2L-full-offload.case.json")
    s = S.ggml_backend_sched_new(case.backends, None, len(case.backends), case.graph_size, False, False)
    S.ggml_backend_sched_split_graph(s, case.graph)
    assert S.ggml_backend_sched_get_n_splits(s) == _golden("llama-2L-full-offload")["n_splits"]
    assert S.ggml_backend_sched_get_n_backends(s) == 2
    assert S.ggml_backend_sched_get_backend(s, 1).name == "CPU"


# ---------------------------------------------------------------------------
# every mistake: one line on stderr, exit status 2 (usage) or 1 (a failed run)

def _fails(capsys, argv, status, *words):
    """main(argv) returns `status` with one line on stderr naming `words`; nothing ran."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == status, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return out, lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    files = {"folder": d / "a-folder", "empty": d / "empty.json", "text": d / "text.json",
             "list": d / "list.json", "object": d / "object.json", "binary": d / "blob.bin",
             "missing": d / "missing.json"}
    files["folder"].mkdir()
    files["empty"].write_text("")
    files["text"].write_text("not json\n")
    files["list"].write_text("[1, 2, 3]\n")
    files["object"].write_text('{"a": 1}\n')
    files["binary"].write_bytes(b"GGUF\x03\x00\xff\xfe\x00garbage")
    return {k: str(v) for k, v in files.items()}


@pytest.mark.parametrize("kind,status,words", [
    ("missing", 2, ["no such file"]),
    ("folder", 2, ["is a folder"]),
    ("empty", 2, ["is empty"]),
    ("text", 2, ["not valid JSON"]),
    ("list", 2, ["expected an object"]),
    ("object", 2, ["missing keys"]),
    ("binary", 2, ["not UTF-8 text"]),
])
@pytest.mark.parametrize("command", ["plan", "bench"])
def test_case_file_mistakes(capsys, bad_files, command, kind, status, words):
    _, line = _fails(capsys, [command, bad_files[kind]], status, *words)
    assert line.startswith(f"ggml-py {command}: error:") and bad_files[kind] in line


def test_bench_checks_every_file_before_timing(capsys, bad_files):
    out, _ = _fails(capsys, ["bench", str(CASES / "mlp-cpu-only.case.json"), bad_files["list"]],
                    2, bad_files["list"])
    assert out == ""


def test_unreadable_file(capsys, monkeypatch):
    import os
    path = str(CASES / "mlp-cpu-only.case.json")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if p == path else real(p, mode))
    _fails(capsys, ["plan", path], 2, "permission denied")


@pytest.mark.parametrize("kind,words", [
    ("missing", ["no such file"]), ("empty", ["is empty"]), ("text", ["not a JSON file"]),
    ("list", ["neither a list of op cases"]), ("object", ["neither a list of op cases"]),
])
def test_ops_check_file_mistakes(capsys, bad_files, kind, words):
    out, _ = _fails(capsys, ["ops-check", bad_files[kind]], 2, bad_files[kind], *words)
    assert out == ""


def test_ops_check_folder_without_cases(capsys, bad_files):
    _fails(capsys, ["ops-check", bad_files["folder"]], 2, "no *.json files")


def test_ops_check_failed_case_is_exit_1(capsys, tmp_path):
    cases = json.loads((shared_path() / "ops" / "scale.json").read_text())[:1]
    out = cases[0]["output"]
    out["data"] = __import__("base64").b64encode(b"\0" * len(
        __import__("base64").b64decode(out["data"]))).decode()
    f = tmp_path / "wrong.json"
    f.write_text(json.dumps(cases))
    assert main(["ops-check", str(f)]) == 1
    assert capsys.readouterr().out.strip().endswith("0 passed, 1 failed, 0 skipped")


def test_ops_check_case_too_large_to_allocate_fails_alone(capsys, tmp_path):
    """A case whose input cannot be allocated (256 TiB) fails with the reason, and the
    next case of the file still runs."""
    cases = json.loads((shared_path() / "ops" / "scale.json").read_text())[:1] * 2
    cases[0] = json.loads(json.dumps(cases[0]))
    cases[0]["inputs"][0]["ne"] = [2**20, 2**20, 64, 1]
    f = tmp_path / "huge.json"
    f.write_text(json.dumps(cases))
    assert main(["ops-check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "AllocationError" in out and "cannot allocate" in out, out
    assert out.strip().endswith("1 passed, 1 failed, 0 skipped"), out


@pytest.mark.parametrize("argv,words", [
    (["ops-check", OPS_FILE, "--backend", "nope"], ["invalid choice: 'nope'", "cpu",
                                                    "numpy_device", "opencl"]),
    (["ops-check", OPS_FILE, "--backend", "sim"], ["invalid choice: 'sim'"]),
    (["demo", "--device", "nope"], ["invalid choice: 'nope'", "auto", "numpy_device"]),
    (["demo", "--wtype", "q5_k"], ["invalid choice: 'q5_k'"]),
    (["demo", "--layers", "513"], ["--layers: must be at most 512, got 513"]),
    (["demo", "--plan-layers", "100001"], ["--plan-layers: must be at most 100000"]),
    (["nope"], ["invalid choice: 'nope'"]),
    ([], ["required: COMMAND"]),
])
def test_unknown_names(capsys, argv, words):
    _fails(capsys, argv, 2, *words)


@pytest.mark.parametrize("argv,words", [
    (["demo", "--layers", "0"], ["--layers", "must be positive, got 0"]),
    (["demo", "--gpu-layers", "-5"], ["--gpu-layers", "must be at least 0, got -5"]),
    (["demo", "--prompt", "0"], ["--prompt", "must be positive"]),
    (["demo", "--steps", "-1"], ["--steps", "must be at least 0"]),
    (["demo", "--plan-layers", "0"], ["--plan-layers", "must be positive"]),
    (["demo", "--seed", "-1"], ["--seed", "must be at least 0"]),
    (["demo", "--layers", "two"], ["'two' is not a whole number"]),
    (["bench", CASE, "--min-time", "0"], ["--min-time", "must be a positive number"]),
    (["demo", "--tensor-split", "1,x"], ["--tensor-split", "not a list of numbers"]),
    (["demo", "--tensor-split", "0,0"], ["--tensor-split", "positive sum"]),
    (["demo", "--rpc", "nohost"], ["--rpc"]),
    (["ops-check", OPS_FILE, "--threads", "0"], ["--threads", "must be positive"]),
    (["bench", CASE, "--min-time", "nan"], ["--min-time", "must be a positive number"]),
])
def test_bad_counts(capsys, argv, words):
    out, _ = _fails(capsys, argv, 2, *words)
    assert out == ""


def test_prompt_longer_than_context_is_refused_before_running(capsys):
    out, line = _fails(capsys, ["demo", "--prompt", "60", "--steps", "5"], 2,
                       "--prompt 60 + --steps 5 = 65 tokens", "context (64)")
    assert out == ""


def test_demo_help_states_limits_and_choices(capsys):
    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: ggml-py demo")
    assert "auto, cpu, numpy_device, opencl" in text
    assert "64 for the random models" in text and "context_length" in text
    assert "exit status: 0 done, 1 the run failed, 2 usage error" in text


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    commands = text[text.index("commands:"):]
    for cmd in ("demo", "plan", "bench", "ops-check"):
        assert f"\n    {cmd}" in commands
    assert main(["ops-check", "--help"]) == 0
    assert "cpu, numpy_device, opencl" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv,words", [
    (["demo", "--no-models", "--layers", "2"], ["--layers would be ignored with --no-models"]),
    (["demo", "--no-plan", "--plan-layers", "2"], ["--plan-layers would be ignored"]),
    (["demo", "--no-plan", "--no-models"], ["nothing to do"]),
    (["demo", "--device", "cpu", "--gpu-layers", "2"], ["--gpu-layers would be ignored"]),
    (["demo", "--device", "cpu", "--tensor-split", "1"], ["--tensor-split would be ignored"]),
    (["demo", "--rpc", "127.0.0.1:9", "--device", "cpu"], ["--rpc and --device"]),
    (["demo", "--no-models", "--rpc", "127.0.0.1:9"], ["--rpc would be ignored"]),
    (["demo", "--device", "numpy_device", "--tensor-split", "1,1", "--no-plan"],
     ["--tensor-split gives 2 shares for 1 device"]),
    (["ops-check", OPS_FILE, "--backend", "rpc"], ["needs its server: --rpc HOST:PORT"]),
    (["ops-check", OPS_FILE, "--rpc", "127.0.0.1:9"], ["--rpc names a server", "not for cpu"]),
    (["ops-check", OPS_FILE, "--backend", "numpy_device", "--threads", "2"],
     ["--threads", "not numpy_device"]),
    (["ops-check", OPS_FILE, "--reps", "3"], ["--reps would be ignored without --time"]),
    (["ops-check", OPS_FILE, "--backend", "rpc", "--rpc", "127.0.0.1:9,127.0.0.1:10"],
     ["--rpc takes one server"]),
])
def test_options_that_would_be_ignored(capsys, argv, words):
    out, _ = _fails(capsys, argv, 2, *words)
    assert out == ""


def _gguf(tmp_path, n_ctx=32):
    from ggml_py.models.gguf import save_gguf
    from ggml_py.models.transformer import Model, ModelConfig
    cfg = ModelConfig(n_vocab=96, n_ctx=n_ctx, n_embd=64, n_head=4, n_head_kv=2, n_layer=1,
                      n_ff=96, kv_pad=8, name="tiny")
    path = tmp_path / "tiny.gguf"
    save_gguf(Model.random(cfg), path)
    return str(path)


@pytest.mark.parametrize("kind,words", [
    ("missing", ["no such file"]), ("folder", ["is a folder"]), ("empty", ["is empty"]),
    ("text", ["is not a GGUF file"]), ("binary", ["not a readable GGUF file"]),
])
def test_gguf_mistakes(capsys, bad_files, kind, words):
    out, _ = _fails(capsys, ["demo", "--gguf", bad_files[kind]], 2, *words)
    assert out == ""


def test_gguf_without_the_package(capsys, tmp_path, monkeypatch):
    path = _gguf(tmp_path)
    monkeypatch.setitem(sys.modules, "gguf", None)      # as if not installed
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    _fails(capsys, ["demo", "--gguf", path], 2, "needs the gguf package",
           'pip install "ggml-py-sched[gguf]"')


def test_gguf_options_and_context(capsys, tmp_path):
    path = _gguf(tmp_path, n_ctx=16)
    _fails(capsys, ["demo", "--gguf", path, "--wtype", "q8_0"], 2,
           "--wtype apply to the random models")
    out, _ = _fails(capsys, ["demo", "--gguf", path, "--prompt", "12", "--steps", "8"], 2,
                    "context_length (16)")
    assert out == ""


@pytest.mark.parametrize("option,target,words", [
    ("-o", "{missing}/plan.json", ["does not exist"]),
    ("-o", "{folder}", ["is a folder"]),
    ("--dot", "plan.jpeg", ["must end in .dot, .gv, .svg, .png, .pdf"]),
    ("--dot", "{missing}/p.svg", ["does not exist"]),
    ("--map", "{missing}/map.png", ["does not exist"]),
    ("--map", "map.gif", ["must end in .png, .svg, .pdf"]),
])
def test_output_paths_checked_first(capsys, bad_files, option, target, words):
    target = target.format(missing=bad_files["missing"], folder=bad_files["folder"])
    out, _ = _fails(capsys, ["plan", str(CASES / "mlp-cpu-only.case.json"), option, target], 2,
                    *words)
    assert out == ""


def test_demo_maps_must_be_a_folder(capsys, bad_files):
    _fails(capsys, ["demo", "--maps", bad_files["list"]], 2, "is a file, not a folder")


def test_map_without_matplotlib(capsys, tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    _fails(capsys, ["plan", str(CASES / "mlp-cpu-only.case.json"), "--map",
                    str(tmp_path / "m.png")], 2, "needs the matplotlib package",
           'pip install "ggml-py-sched[plot]"')
    assert not (tmp_path / "m.png").exists()


def test_internal_error_is_one_line(capsys, monkeypatch):
    import ggml_py.tools.planning as planning

    def broken(*a, **k):
        raise TypeError("a bug")
    monkeypatch.setattr(planning, "plan_case", broken)
    _fails(capsys, ["plan", str(CASES / "mlp-cpu-only.case.json")], 1,
           "internal error", "TypeError: a bug", "GGML_PY_TRACEBACK=1")


def test_write_error_is_exit_1(capsys, monkeypatch, tmp_path):
    import builtins
    real_open = builtins.open
    target = str(tmp_path / "plan.json")

    def full_disk(path, *a, **k):
        if str(path) == target:
            raise OSError(28, "No space left on device", target)
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", full_disk)
    _fails(capsys, ["plan", str(CASES / "mlp-cpu-only.case.json"), "-o", target], 1,
           "No space left on device", target)


def test_closed_pipe_is_quiet():
    """`ggml-py plan BIG | head -c 100`: no BrokenPipeError, no traceback."""
    p = subprocess.Popen([sys.executable, "-m", "ggml_py", "plan",
                          str(CASES / "llama-80L-full-offload.case.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(100)
    p.stdout.close()                    # the reader goes away long before the end
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert err == ""


def test_version_from_both_entry_points(capsys):
    import os
    from ggml_py import __version__
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ggml-py {__version__}"
    r = subprocess.run([sys.executable, "-m", "ggml_py", "--version"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"python -m ggml_py {__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "ggml-py")
    r = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"ggml-py {__version__}"


def test_usage_error_from_the_installed_command_names_it():
    import os
    script = os.path.join(os.path.dirname(sys.executable), "ggml-py")
    r = subprocess.run([script, "demo", "--layers", "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("ggml-py demo: error: argument --layers: must be positive, got 0 "
                        "(see 'ggml-py demo --help')\n")


# ---------------------------------------------------------------------------
# pictures

def test_dot_labels_are_single_escaped(tmp_path):
    dot = tmp_path / "plan.dot"
    assert main(["plan", str(CASES / "llama-2L-gpu-unsupported.case.json"), "--dot", str(dot),
                 "-o", str(tmp_path / "p.json")]) == 0
    text = dot.read_text()
    assert '\\n' in text and '\\\\n' not in text        # DOT's line break, not a literal \n
    import shutil
    if shutil.which("dot"):
        svg = tmp_path / "plan.svg"
        assert main(["plan", str(CASES / "llama-2L-gpu-unsupported.case.json"), "--dot",
                     str(svg), "-o", str(tmp_path / "p.json")]) == 0
        assert "\\n" not in svg.read_text()


def test_plan_map_of_80_layers(tmp_path):
    png = tmp_path / "map.png"
    assert main(["plan", str(CASES / "llama-80L-full-offload.case.json"), "-o",
                 str(tmp_path / "p.json"), "--map", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width <= 1920 and height <= 1080          # one screen


def test_ops_check_on_the_numpy_device(capsys):
    """The README's `ops-check --backend numpy_device`: a name of the backend registry."""
    assert main(["ops-check", OPS_FILE, "--backend", "numpy_device"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "6 passed, 0 failed, 0 skipped"


def test_demo_device_asked_for_but_unavailable(capsys, monkeypatch):
    """--device opencl where OpenCL does not work: one line and exit 1 (auto falls back)."""
    from ggml_py import backends
    from ggml_py.backends import opencl
    from ggml_py.errors import BackendError
    real = backends.create

    def create(name, *a, **k):
        if name == "opencl":
            raise BackendError("no OpenCL platform")
        return real(name, *a, **k)

    def no_opencl():
        raise BackendError("no OpenCL platform")
    monkeypatch.setattr(backends, "create", create)
    monkeypatch.setattr(opencl, "auto_backend", no_opencl)
    out, _ = _fails(capsys, ["demo", "--device", "opencl", "--no-plan"], 1,
                    "no OpenCL platform")
    assert "== llama" not in out
    assert main(["demo", "--layers", "1", "--prompt", "2", "--steps", "1", "--no-plan"]) == 0
    out = capsys.readouterr().out
    assert ("--device auto: numpy_device (NUMPY_DEV); skipped opencl: no OpenCL platform"
            in out)
    assert "backends (priority order): NUMPY_DEV, CPU" in out


def test_ops_check_time_adds_compute_time_and_nodes(capsys, tmp_path):
    """`ops-check --time --json`: every case line carries compute_us_median and n_nodes."""
    rc = main(["ops-check", OPS_FILE, "--time", "--reps", "2", "--threads", "1", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, out[-1]
    rows = [json.loads(line) for line in out[:-1]]
    assert rows and all(r["compute_us_median"] > 0 and r["n_nodes"] >= 1 for r in rows)
    assert main(["ops-check", OPS_FILE, "--time", "--reps", "2"]) == 0
    assert " us (" in capsys.readouterr().out


def test_machine_description_reads_the_first_processor(tmp_path):
    from ggml_py.tools.machine import describe, summary
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Fast CPU\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "cpu MHz\t\t: 3699.998\ncache size\t: 1024 KB\n\n"
                    "processor\t: 1\nmodel name\t: Other CPU\ncpu MHz\t\t: 1500.0\n")
    d = describe(str(info))
    assert (d["cpu"], d["family"], d["model"], d["mhz"], d["cache"]) == \
        ("Fast CPU", "25", "17", 3700, "1024 KB")
    assert summary(str(info)).startswith("Fast CPU (family 25 model 17), 3700 MHz, ")
    # no /proc (another system): what the platform module says, and no MHz
    bare = describe(str(tmp_path / "none"))
    assert bare["cpu"] and bare["mhz"] is None and bare["family"] is None
