"""Why splits exist (reasons.split_reasons), split maps (ggml_py.tools.splitmap) and the
demo's live output."""

import sys

import pytest
from conftest import shared_path

from ggml_py.tools import splitmap
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.tools.cases import load_case
from ggml_py.models.transformer import Model, ModelConfig, Session
from ggml_py.reasons import split_reasons
from ggml_py.tools.planning import plan_case
from ggml_py.tools.splitmap import SplitMap

CASES = shared_path() / "cases"
SMALL = dict(n_vocab=96, n_ctx=32, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, n_ff=96,
             kv_pad=8)


def _plan(name):
    case = load_case(CASES / f"{name}.case.json")
    sched, _ = plan_case(case)
    return case, sched


# ---------------------------------------------------------------------------
# split reasons

def test_reasons_name_op_types_and_the_backend_that_cannot():
    case, sched = _plan("llama-2L-gpu-unsupported")
    reasons = split_reasons(sched, case.graph)
    assert [r.split for r in reasons] == list(range(1, sched.n_splits))
    unsupported = [r for r in reasons if r.cannot]
    assert unsupported
    for r in unsupported:
        assert r.backend == "CPU" and r.cannot == ("GPU0",)
        assert not case.backend("GPU0").supports_op(r.node)
        assert r.text() == f"{r.op} on CPU: GPU0 can't run it"
        assert r.op.startswith(f"{r.node.op}(") and r.op.endswith(f") -> {r.node.type}")
    # a split back on the GPU gives the rule that put its first node there
    back = [r for r in reasons if r.backend == "GPU0"]
    assert back and all(r.cause and not r.cannot for r in back)


def test_reasons_of_a_weight_the_backend_cannot_use():
    """Weights in device memory, MUL_MAT unsupported there: the CPU runs each projection
    and needs a new split for every weight it must copy (ggml's need_new_split)."""
    dev, cpu = NumpyDeviceBackend(unsupported_ops=["MUL_MAT"]), CPUBackend()
    model = Model.random(ModelConfig(**SMALL)).place([dev, dev], host=cpu, output_backend=dev)
    sess = Session(model, [dev, cpu])
    sess.forward([1, 2, 3])
    reasons = split_reasons(sess.sched, sess.graph)
    assert len(reasons) == sess.sched.n_splits - 1
    matmul = [r for r in reasons if r.cannot]
    assert matmul and all(r.node.op == "MUL_MAT" and r.cannot == (dev.name,) for r in matmul)
    again = [r for r in reasons if r.same_backend]
    assert again and all(r.weight is not None and r.backend == "CPU" for r in again)
    assert all(f"weight is in {dev.name} memory" in r.text() for r in again)
    dev.close()


# ---------------------------------------------------------------------------
# split maps

def test_map_blocks_follow_the_splits():
    case, sched = _plan("llama-4L-partial-offload")
    m = SplitMap.from_scheduler(sched, case.name)
    assert m.lanes == ("GPU0", "CPU") and m.cpu_lanes == ("CPU",)
    assert [(b.backend, b.i_start, b.i_end) for b in m.blocks] == \
        [(s.backend.name, s.i_start, s.i_end) for s in sched.splits]
    assert m.n_nodes == case.graph.n_nodes
    assert m.bytes_in == sum(t.nbytes for s in sched.splits for t in s.inputs)
    assert {src for b in m.blocks for src, _ in b.copies} <= set(m.lanes)
    assert not m.timed
    assert len(m.colours()) == 2 and m.colours()["CPU"] == splitmap.CPU_COLOUR


def test_map_draws_lanes_bytes_and_times(tmp_path):
    case, sched = _plan("llama-2L-gpu-unsupported")
    untimed = splitmap.draw(SplitMap.from_scheduler(sched, case.name))
    assert len(untimed.axes) == 2
    timed_map = SplitMap.from_scheduler(sched, case.name, [1e-3] * sched.n_splits)
    assert timed_map.timed and len(splitmap.draw(timed_map).axes) == 3
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml")):
        path = tmp_path / f"map{suffix}"
        splitmap.save(timed_map, str(path))
        assert path.read_bytes()[:len(magic)] == magic
    with pytest.raises(ValueError, match="2 times for"):
        SplitMap.from_scheduler(sched, case.name, [1.0, 2.0])
    with pytest.raises(ValueError, match="written as"):
        splitmap.save(timed_map, str(tmp_path / "map.txt"))


def test_map_without_matplotlib_says_what_to_install(monkeypatch):
    _, sched = _plan("mlp-cpu-only")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install \"ggml-py-sched\[plot\]\""):
        splitmap.draw(SplitMap.from_scheduler(sched))


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                    (3 << 20, "3.0 MiB"), (5 << 30, "5.0 GiB")])
def test_fmt_bytes(n, text):
    assert splitmap.fmt_bytes(n) == text


# ---------------------------------------------------------------------------
# the demo: a model's header comes before its computation, maps and reasons after

def test_demo_prints_before_it_computes_and_explains_splits(monkeypatch, tmp_path, capsys):
    from ggml_py.__main__ import main
    from ggml_py.models import transformer
    real_forward = transformer.Session.forward

    def forward(self, *a, **k):
        print(f"@@forward {self.model.config.name}")
        return real_forward(self, *a, **k)
    monkeypatch.setattr(transformer.Session, "forward", forward)
    assert main(["demo", "--device", "numpy_device", "--layers", "1", "--prompt", "4",
                 "--steps", "2", "--plan-layers", "2", "--maps", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # the user sees what runs before it runs
    assert out.index("\n== llama:") < out.index("@@forward llama")
    assert out.index("\n== moe-dense:") < out.index("@@forward moe-dense")
    assert "   why 10 splits: split 0 starts the graph; then" in out     # the what-if without ROPE
    assert "ROPE(f32, i32) -> f32 on CPU: GPU0 can't run it [3.best]" in out
    maps = sorted(p.name for p in tmp_path.iterdir())
    assert "llama.png" in maps and "whatif-gpu-without-rope.png" in maps


def test_progress_uses_tqdm():
    import tqdm
    from ggml_py.tools.demo import progress
    bar = progress(3, "x")
    assert isinstance(bar, tqdm.tqdm)
    bar.update(1)
    bar.close()
