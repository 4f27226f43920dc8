"""Issue 33's rough edges of a first day: the RPC device entry, RPCBackend's error type,
the progress bar on a terminal, --device auto's choice, SplitMap.save, the bench output
and the pictures."""

import json
import os
import select
import subprocess
import sys

import pytest
from conftest import shared_path

from ggml_py import backends
from ggml_py.__main__ import main
from ggml_py.errors import ArgumentError, GgmlPyError

CASES = shared_path() / "cases"


def _fails(capsys, argv, status, *words):
    assert main(argv) == status
    out, err = capsys.readouterr()
    assert "internal error" not in err
    for w in words:
        assert w in err, (w, err)
    return out, err


# ---------------------------------------------------------------------------
# RPC: the registry entry and the endpoint's error

def test_demo_device_rpc_without_servers_is_a_usage_error(capsys):
    out, err = _fails(capsys, ["demo", "--device", "rpc", "--no-plan"], 2,
                      "--device rpc needs", "--rpc HOST:PORT")
    assert out == "" and len(err.strip().splitlines()) == 1


def test_registry_knows_rpc_needs_an_endpoint():
    assert backends.needs("rpc") and "HOST:PORT" in backends.needs("rpc")
    assert backends.needs("cpu") == ""
    with pytest.raises(ArgumentError, match=r"backend 'rpc' needs .*HOST:PORT"):
        backends.create("rpc")


@pytest.mark.parametrize("bad,wrong", [("localhost", "no port"), ("host:", "no port"),
                                       (":50052", "no host"), ("host:70000", "not in 1..65535"),
                                       ("host:port", "'port' is not a number")])
def test_rpc_endpoint_errors_are_ggml_py_errors(bad, wrong):
    from ggml_py.backends.rpc import RPCBackend
    with pytest.raises(ArgumentError) as e:
        RPCBackend(bad)
    assert isinstance(e.value, GgmlPyError) and isinstance(e.value, ValueError)
    assert repr(bad) in str(e.value) and "HOST:PORT" in str(e.value) and wrong in str(e.value)


def test_rpc_endpoint_lists_raise_argument_errors():
    from ggml_py.backends.rpc import parse_endpoints
    for bad in ("", ",", "a:1,a:1"):
        with pytest.raises(ArgumentError):
            parse_endpoints(bad)


# ---------------------------------------------------------------------------
# the progress bar, seen on a pseudo-terminal

def _on_pty(argv, columns=0, timeout=120):
    """Run argv in a child whose stdin, stdout and stderr are a new pty (`columns` wide;
    0: a pty nobody sized, as Python's pty module and `script` in a pipe make); all it
    wrote there."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    child = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                             close_fds=True)
    os.close(slave)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:         # EIO: the child closed the pty
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(master)
        child.wait(timeout=timeout)
    assert child.returncode == 0, data[-2000:]
    return data.decode("utf-8", "replace")


@pytest.mark.parametrize("columns", [0, 100])
def test_demo_shows_a_progress_bar_on_a_terminal(columns):
    pytest.importorskip("tqdm")
    text = _on_pty([sys.executable, "-m", "ggml_py", "demo", "--device", "numpy_device",
                    "--layers", "1", "--prompt", "4", "--steps", "3", "--no-plan"], columns)
    # every model's bar, finished and left on screen: 1 untimed pass + prompt + 2 decodes
    for name in ("llama", "moe-dense", "moe-topk", "moe-shared"):
        assert f"   {name}: 100%|" in text, text[-1500:]
    assert text.count("4/4 [") >= 4 and "pass/s]" in text
    if columns:
        bars = [ln for ln in text.replace("\r", "\n").splitlines() if "%|" in ln]
        assert bars and all(len(ln) < columns for ln in bars)


def test_no_progress_bar_through_a_pipe():
    r = subprocess.run([sys.executable, "-m", "ggml_py", "demo", "--device", "numpy_device",
                        "--layers", "1", "--prompt", "2", "--steps", "1", "--no-plan"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "100%|" not in r.stderr + r.stdout


# ---------------------------------------------------------------------------
# --device auto: the registry's order, a real device before a CPU-emulated OpenCL one

POCL = {"index": 0, "name": "pthread-skylake-avx512", "platform": "Portable Computing Language",
        "device_type": 2}            # CL_DEVICE_TYPE_CPU
GPU = {"index": 1, "name": "Radeon 780M", "platform": "AMD Accelerated Parallel Processing",
       "device_type": 4}             # CL_DEVICE_TYPE_GPU


@pytest.fixture
def fake_opencl(monkeypatch):
    """OpenCL with the given device infos; OpenCLBackend(i) records i instead of opening."""
    from ggml_py.backends import opencl
    made = []

    class FakeOpenCL:
        def __init__(self, index):
            made.append(index)
            self.name = f"OPENCL{index}"

    def install(*infos):
        monkeypatch.setattr(opencl, "available", lambda: (True, "libOpenCL.so.1"))
        monkeypatch.setattr(opencl, "list_devices", lambda: [dict(i) for i in infos])
        monkeypatch.setattr(opencl, "OpenCLBackend", FakeOpenCL)
        return made
    return install


def test_auto_order_comes_from_the_registry():
    from ggml_py.tools import demo
    assert backends.auto_order() == ["opencl", "numpy_device"]
    assert not hasattr(demo, "AUTO_DEVICES")


def test_auto_skips_a_cpu_emulated_opencl_device(fake_opencl):
    fake_opencl(POCL)
    backend, why = backends.choose_auto()
    try:
        assert backend.name == "NUMPY_DEV"
        assert why.startswith("numpy_device (NUMPY_DEV); skipped opencl: only CPU-emulated "
                              "OpenCL here ('pthread-skylake-avx512' of Portable Computing "
                              "Language: CL_DEVICE_TYPE_CPU)")
        assert "slower than the numpy device" in why and "\n" not in why
    finally:
        backend.close()


def test_auto_takes_the_real_opencl_device_after_an_emulated_one(fake_opencl):
    made = fake_opencl(POCL, GPU)
    backend, why = backends.choose_auto()
    assert made == [1] and backend.name == "OPENCL1"
    assert why == "opencl (OPENCL1), the first of opencl, numpy_device that works here"


def test_demo_says_what_auto_chose(fake_opencl, capsys):
    fake_opencl(POCL)
    assert main(["demo", "--layers", "1", "--prompt", "2", "--steps", "1", "--no-plan"]) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "--device auto" in ln]
    assert len(said) == 1 and "numpy_device (NUMPY_DEV)" in said[0] and "CPU-emulated" in said[0]
    assert "backends (priority order): NUMPY_DEV, CPU" in out


def test_auto_tries_a_registered_backend(monkeypatch, fake_opencl):
    """A backend registered with an auto rank is one of auto's candidates, in its order."""
    import types
    from ggml_py.backends.cpu import CPUBackend
    fake_opencl(POCL)
    mod = types.ModuleType("fake_auto_device")
    mod.FakeDevice = CPUBackend
    mod.pick = lambda: CPUBackend()
    monkeypatch.setitem(sys.modules, "fake_auto_device", mod)
    monkeypatch.setitem(backends._REGISTRY, "fake", backends.Entry(
        "fake_auto_device", "FakeDevice", True, auto=1, auto_backend="pick"))
    for name, rank in (("opencl", 2), ("numpy_device", 3)):
        monkeypatch.setitem(backends._REGISTRY, name, backends._REGISTRY[name]._replace(auto=rank))
    assert backends.auto_order() == ["fake", "opencl", "numpy_device"]
    backend, why = backends.choose_auto()
    assert backend.name == "CPU" and why.startswith("fake (CPU), the first of fake")


# ---------------------------------------------------------------------------
# split maps: SplitMap.save and the pictures' labels (read from the figure's artists)

def _map(name):
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import plan_case
    from ggml_py.tools.splitmap import SplitMap
    case = load_case(CASES / f"{name}.case.json")
    sched, _ = plan_case(case)
    return SplitMap.from_scheduler(sched, case.name, graph=case.graph)


def _texts(fig):
    fig.canvas.draw()           # tick labels and offset texts are set at draw time
    out = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in out if t]


def test_splitmap_save_by_extension(tmp_path):
    pytest.importorskip("matplotlib")
    m = _map("mlp-cpu-only")
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")):
        path = tmp_path / f"map{suffix}"
        m.save(path)                                # a Path, as savefig takes
        assert path.read_bytes()[:len(magic)] == magic
    m.save(str(tmp_path / "small.png"), dpi=30)
    assert (tmp_path / "small.png").stat().st_size < (tmp_path / "map.png").stat().st_size
    with pytest.raises(ValueError, match=r"map\.xyz: a split map is written as .*\.png"):
        m.save(tmp_path / "map.xyz")
    assert not (tmp_path / "map.xyz").exists()


def test_small_graph_ticks_are_whole_numbers_and_counts_singular():
    pytest.importorskip("matplotlib")
    from ggml_py.tools.splitmap import Block, SplitMap, draw
    m = SplitMap("tiny", ("CPU",), (Block(0, "CPU", 0, 1), Block(1, "CPU", 1, 4)), ("CPU",))
    fig = draw(m)
    fig.canvas.draw()
    ax = fig.axes[-1]
    lo, hi = ax.get_xlim()
    ticks = [lab.get_text() for x, lab in zip(ax.get_xticks(), ax.get_xticklabels())
             if lo <= x <= hi]
    assert len(ticks) == len(set(ticks)) and all(t.isdigit() for t in ticks), ticks
    texts = _texts(fig)
    assert "tiny: 4 nodes in 2 splits on 1 backend, 0 B copied between them per evaluation" \
        in texts
    assert "split 0\n1 node" in texts and not any("1 nodes" in t for t in texts)
    one = draw(SplitMap("one", ("CPU",), (Block(0, "CPU", 0, 1),), ("CPU",)))
    texts = _texts(one)
    assert any(t.startswith("one: 1 node in 1 split on 1 backend") for t in texts)
    assert "CPU\n1 split, 1 node" in texts


def test_empty_bytes_panel_has_no_stray_scale():
    pytest.importorskip("matplotlib")
    from ggml_py.tools.splitmap import draw
    fig = draw(_map("mlp-cpu-only"))
    bytes_ax = fig.axes[1]
    fig.canvas.draw()
    assert bytes_ax.yaxis.get_offset_text().get_text() == ""
    assert bytes_ax.get_ylim() == (0, 1) and list(bytes_ax.get_yticks()) == []
    assert "1e-9" not in " ".join(_texts(fig)) and "none" in _texts(fig)


def test_small_graph_shows_ops_and_each_split_says_why():
    pytest.importorskip("matplotlib")
    from ggml_py.tools.splitmap import draw
    texts = _texts(draw(_map("mlp-cpu-only")))          # 6 nodes: every op is named
    for op in ("MUL_MAT", "ADD", "UNARY", "SOFT_MAX"):
        assert op in texts
    m = _map("llama-2L-gpu-unsupported")
    assert [b.reason != "" for b in m.blocks] == [False] + [True] * (len(m.blocks) - 1)
    assert m.blocks[2].brief == "ROPE: GPU0 can't run it"
    texts = _texts(draw(m))
    assert "split 2: ROPE: GPU0 can't run it" in texts        # beside the split
    assert "split 1: RMS_NORM [2.sup]" in texts
    why = draw(m).axes[-1].get_xlabel()
    assert "4 x ROPE(f32, i32) -> f32 on CPU: GPU0 can't run it (splits 2, 4, 8, 10)" in why


def test_many_splits_labels_keep_apart():
    """A split every few nodes: of the labels that would overlap, one is drawn."""
    pytest.importorskip("matplotlib")
    from ggml_py.tools.splitmap import LABEL_GAP, REASON_GAP, Block, SplitMap, draw
    blocks = tuple(Block(k, ("GPU0", "CPU")[k % 2], 3 * k, 3 * k + 3,
                         (("CPU" if k % 2 == 0 else "GPU0", 200_000 + k),) if k else (),
                         reason="r" if k else "", brief=f"OP{k}: why" if k else "")
                   for k in range(60))
    fig = draw(SplitMap("many", ("GPU0", "CPU"), blocks, ("CPU",)))
    lanes_ax, bytes_ax = fig.axes[0], fig.axes[1]
    width = blocks[-1].i_end
    named = sorted(a.xy[0] for a in bytes_ax.texts if a.get_text().startswith("split "))
    assert named and all(b - a >= LABEL_GAP * width for a, b in zip(named, named[1:]))
    for y in (0, 1):
        # where each label starts (one ending at the right end starts REASON_GAP before it)
        notes = sorted(t.get_position()[0] - (REASON_GAP * width if t.get_ha() == "right" else 0)
                       for t in lanes_ax.texts
                       if ": why" in t.get_text() and abs(t.get_position()[1] - y) < 0.5)
        assert notes and all(b - a >= REASON_GAP * width * 0.99 for a, b in zip(notes, notes[1:]))
        assert max(notes) <= (1 - REASON_GAP) * width + 1e-9


class _FakeSched:
    """What SplitMap.from_scheduler reads of a scheduler: two RPC servers and the CPU."""

    def __init__(self, names):
        from types import SimpleNamespace as NS
        self.backends = [NS(name=n, device_type="cpu" if n == "CPU" else "gpu") for n in names]
        self.splits = [NS(backend=b, i_start=i, i_end=i + 2, inputs=[])
                       for i, b in enumerate(self.backends)]

    def backend_id(self, b):
        return next(i for i, x in enumerate(self.backends) if x is b)

    def get_tensor_backend(self, t):
        return None


def test_rpc_lanes_are_told_apart():
    pytest.importorskip("matplotlib")
    from ggml_py.tools.splitmap import SplitMap, draw
    m = SplitMap.from_scheduler(_FakeSched(["RPC0[10.0.0.1:50052]", "RPC0[10.0.0.2:50052]",
                                            "CPU"]))
    labels = [t.get_text() for t in draw(m).axes[0].get_yticklabels()]
    assert labels[0].startswith("RPC0\n[10.0.0.1:50052]\n")
    assert labels[1].startswith("RPC0\n[10.0.0.2:50052]\n")
    same = SplitMap.from_scheduler(_FakeSched(["RPC0[h:1]", "RPC0[h:1]", "CPU"]))
    assert same.lanes == ("RPC0[h:1] #0", "RPC0[h:1] #1", "CPU")
    assert [b.backend for b in same.blocks] == list(same.lanes)
    labels = [t.get_text() for t in draw(same).axes[0].get_yticklabels()]
    assert len(set(labels)) == 3


def test_map_file_names_have_single_hyphens(tmp_path):
    pytest.importorskip("matplotlib")
    from ggml_py.tools import demo
    assert demo.slug("two GPUs, pipeline parallel") == "two-gpus-pipeline-parallel"
    assert demo.slug("moe-dense") == "moe-dense"
    demo.run_whatif(1, out=lambda s: None, maps=str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "whatif-two-gpus-pipeline-parallel.png" in names
    assert not any("--" in n for n in names), names


# ---------------------------------------------------------------------------
# bench: one whole JSON object a line, the machine inside; labels; a missing plan file

def _json_lines(text):
    lines = text.strip().splitlines()
    assert lines
    return [json.loads(line) for line in lines]        # each line alone is JSON


def test_bench_json_is_one_object_per_case_with_the_machine(capsys, tmp_path):
    lone = tmp_path / "mlp-cpu-only.case.json"          # no plan file beside it
    lone.write_bytes((CASES / "mlp-cpu-only.case.json").read_bytes())
    assert main(["bench", str(CASES / "mlp-cpu-only.case.json"), str(lone), "--json",
                 "--min-time", "0.01"]) == 0
    out, err = capsys.readouterr()
    rows = _json_lines(out)
    assert [r["case"] for r in rows] == ["mlp-cpu-only", "mlp-cpu-only"]
    assert all(r["machine"]["cores"] >= 1 for r in rows)
    assert rows[0]["ggml_source"] == "plan file" and rows[0]["split_ratio"] > 0
    assert rows[1]["ggml_split_us"] is None and rows[1]["split_ratio"] is None
    # the comparison that is missing is said, on stderr
    assert f"warning: {tmp_path / 'mlp-cpu-only.plan.json'}: no ggml times to compare with" in err
    assert err.count("warning:") == 1


def test_bench_says_lower_is_better_and_where_ggml_times_come_from(capsys):
    assert main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("lower is better", "reuse alloc_graph of the same Graph again",
                  "rebuilt alloc_graph of a rebuilt graph of equal structure",
                  "recorded by ggml 0.10.1 on the machine that wrote the case, another machine",
                  "with a warning on stderr"):
        assert words in text, words
    assert main(["bench", str(CASES / "mlp-cpu-only.case.json"), "--min-time", "0.01"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("machine: ")
    assert "lower is better" in lines[1] and "plan file (recorded on another machine)" in lines[1]
    assert "reuse: same Graph again" in lines[1] and "rebuilt: an equal rebuilt graph" in lines[1]


def test_bench_split_script_json_lines(tmp_path):
    """bench/bench_split.py --json: every line a whole object with the machine in it; a
    case without its plan file is timed with a warning, not a crash."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "mlp-cpu-only.case.json").write_bytes(
        (CASES / "mlp-cpu-only.case.json").read_bytes())
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "bench_split.py")
    r = subprocess.run([sys.executable, script, "--cases", str(tmp_path), "--sizes", "100",
                        "--no-ggml", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = _json_lines(r.stdout)
    assert [row["case"] for row in rows] == ["mlp-cpu-only", "synthetic-llama-3L"]
    assert all("cpu" in row["machine"] for row in rows)
    assert rows[0]["split_ratio"] is None
    assert "no plan file to compare with" in r.stderr
    help_text = subprocess.run([sys.executable, script, "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert "lower is better" in help_text and "rebuilt" in help_text and "reuse" in help_text


def test_machine_announce_prints_nothing_for_json(capsys):
    from ggml_py.tools.machine import announce, with_machine
    d = announce(as_json=True)
    assert capsys.readouterr().out == ""
    assert json.loads(with_machine({"x": 1}, d)) == {"x": 1, "machine": d}
    announce()
    assert capsys.readouterr().out.startswith("machine: ")


def test_dot_clusters_say_why_each_split_exists():
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.dot import plan_to_dot
    from ggml_py.tools.planning import plan_case
    case = load_case(CASES / "llama-2L-gpu-unsupported.case.json")
    sched, _ = plan_case(case)
    text = plan_to_dot(sched, case.graph, case.name)
    assert "label=\"split 0: " in text and "inputs)\";" in text      # split 0: no reason
    assert "split 2: CPU (" in text and "inputs)\\nROPE: GPU0 can't run it" in text
