"""`ggml-py run MODEL.gguf` (ggml_py.tools.run): a GGUF model's greedy tokens, logits and
node counts held to llama.cpp's for the same file (llama-cpp-python in a child process,
as tests/test_architectures.py does), its prompt batches, threads and options."""

import json

import numpy as np
import pytest

from ggml_py.models.transformer import Model
from ggml_py.tools.commands import main
from test_architectures import N_DECODE, PROMPT, _llama_cpp, nmse, small

pytest.importorskip("gguf")


def write_model(tmp_path, kind, wtype="f32", **kw):
    from ggml_py.models.gguf import save_gguf
    cfg = small(kind, **{"n_embd": 128, "n_head": 8, "n_layer": 3, "n_ctx": 256, **kw},
                wtype=wtype)
    path = str(tmp_path / f"{kind}-{wtype}.gguf")
    save_gguf(Model.random(cfg, seed=7), path)
    return path, cfg


def run_json(capsys, *argv, device=("--device", "cpu")):
    assert main(["run", *map(str, argv), *device, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind,wtype", [("qwen3moe", "f16"), ("llama-moe", "f32"),
                                        ("qwen2", "q8_0")])
@pytest.mark.parametrize("fa", ["auto", "off"])
def test_run_matches_llama_cpp(tmp_path, capsys, kind, wtype, fa):
    """Greedy decode: llama.cpp's own picks; teacher-forced on them, the logits of every
    prompt position and decode step within NMSE 1e-4 of llama.cpp's; the node counts of
    llama.cpp's log. -fa auto (the default) is on, on the CPU: llama.cpp with -fa on."""
    path, cfg = write_model(tmp_path, kind, wtype)
    prompt = ",".join(map(str, PROMPT))
    ref = _llama_cpp("logits", path, tmp_path / "theirs.npy", prompt, N_DECODE,
                     "off" if fa == "off" else "on")
    theirs = np.load(tmp_path / "theirs.npy")

    greedy = run_json(capsys, path, "--tokens", prompt, "-n", N_DECODE,
                      *(["-fa", fa] if fa == "off" else []))
    assert greedy["flash_attn"] == (fa != "off")
    assert greedy["tokens"] == ref["fed"]
    assert greedy["graph_nodes"] == [ref["pp_nodes"], ref["tg_nodes"]]
    assert greedy["decode_graph_kept"] == N_DECODE - 1        # built once, then kept
    assert greedy["pp_tok_s"] > 0 and greedy["tg_tok_s"] > 0

    out = tmp_path / "ours.npy"
    fed = run_json(capsys, path, "--tokens", prompt, "--feed", ",".join(map(str, ref["fed"])),
                   "--logits-out", out, "-ub", 5, "-fa", fa)      # the prompt in 3 batches
    ours = np.load(out)
    assert fed["tokens"] == ref["fed"]
    assert ours.shape == theirs.shape == (len(PROMPT) + N_DECODE, cfg.n_vocab)
    err = nmse(theirs, ours)
    print(f"ggml-py run {kind} {wtype} -fa {fa}: NMSE {err:.3g} vs llama.cpp")
    assert err <= 1e-4


# a window of 8 and ubatches of 16: the sliding layers' cache has 256 cells (8 + 16, padded
# to 256), which a prompt of 280 tokens and the decode steps after it run past
SWA_CTX, SWA_UBATCH, SWA_PROMPT = 512, 16, 280


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
@pytest.mark.parametrize("fa", ["on", "off"])
def test_run_sliding_window_cache_matches_llama_cpp(tmp_path, capsys, kind, fa):
    """The sliding layers' own KV cache, llama_kv_cache_iswa's second one, past its size:
    once full, each token takes the cell of a position no token sees any more. Teacher-
    forced on llama.cpp's picks with the same cache (its C API's default is --swa-full,
    turned off here), the logits of every prompt position and decode step within NMSE 1e-4
    of llama.cpp's and the node counts its; the cache's bytes what `ggml-py plan` reports
    for the same file and options, and with --swa-full the full-size cache's, as plan's."""
    path, cfg = write_model(tmp_path, kind, n_swa=8, n_ctx=SWA_CTX)
    prompt = ",".join(map(str, np.random.default_rng(5).integers(0, cfg.n_vocab, SWA_PROMPT)))
    ref = _llama_cpp("logits", path, tmp_path / "theirs.npy", prompt, N_DECODE, fa,
                     json.dumps({"n_ctx": SWA_CTX, "n_batch": SWA_UBATCH, "swa_full": False}))
    theirs = np.load(tmp_path / "theirs.npy")

    out = tmp_path / "ours.npy"
    flags = ("-c", SWA_CTX, "-b", SWA_UBATCH, "-ub", SWA_UBATCH, "-fa", fa)
    ours = run_json(capsys, path, "--tokens", prompt, "--feed", ",".join(map(str, ref["fed"])),
                    "--logits-out", out, *flags)
    assert ours["graph_nodes"] == [ref["pp_nodes"], ref["tg_nodes"]]
    assert ours["decode_graph_kept"] == N_DECODE - 1
    err = nmse(theirs, np.load(out))
    print(f"ggml-py run {kind} -fa {fa}, {SWA_PROMPT} + {N_DECODE} tokens over the sliding "
          f"layers' 256 cells: NMSE {err:.3g} vs llama.cpp")
    assert err <= 1e-4

    def plan_kv_bytes(*extra):
        assert main(["plan", path, "--device", "cpu", *map(str, flags), *extra, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        return sum(b["bytes"] for b in plan["buffers"] if b["kind"] == "kv")
    full = run_json(capsys, path, "--tokens", prompt[:20], "-n", 1, "--swa-full", *flags)
    assert ours["kv_cache_bytes"] == plan_kv_bytes()
    assert full["kv_cache_bytes"] == plan_kv_bytes("--swa-full")
    # K and V of each layer: 256 cells of the sliding ones instead of 512
    n_swa_layers = len(cfg.swa_layers)
    row = cfg.n_embd_gqa * 2            # (f16)
    assert full["kv_cache_bytes"] - ours["kv_cache_bytes"] == 2 * n_swa_layers * row * 256


def test_run_batches_threads_and_text_output(tmp_path, capsys):
    """The prompt's logits do not depend on -b/-ub or --threads; the text output names
    the tokens, node counts and both rates."""
    path, _ = write_model(tmp_path, "qwen3moe")
    rows = []
    for extra in ([], ["-b", "4"], ["-ub", "3", "--threads", "2"]):
        run_json(capsys, path, "--prompt-len", 10, "-n", 2, "--seed", 3,
                 "--logits-out", tmp_path / "l.npy", *extra)
        rows.append(np.load(tmp_path / "l.npy"))
    assert rows[0].shape == (12, 256)
    for r in rows[1:]:
        assert nmse(rows[0], r) < 1e-10
    assert main(["run", path, "--tokens", "1,2,3", "-n", "3", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "qwen3moe: 3 layers" in text and "prompt   3 tokens [1, 2, 3]" in text
    assert "graph nodes: prompt 159, decode 159 (kept in 2 of 3 steps); scheduler splits: " \
        "prompt 1, decode 1; flash attention on" in text
    assert " pp " in text and " tg " in text


def test_run_offloads_layers(tmp_path, capsys):
    """-ngl 2 on the numpy device: the last two layers there, the rest on the CPU; the same
    logits within float32 rounding, the same graph."""
    path, _ = write_model(tmp_path, "llama-moe")
    rows, nodes, splits = [], [], []
    for device in (("--device", "cpu"), ("--device", "numpy_device", "-ngl", "2")):
        r = run_json(capsys, path, "--tokens", "3,1,4,1,5", "--feed", "9,2,6",
                     "--logits-out", tmp_path / "l.npy", device=device)
        rows.append(np.load(tmp_path / "l.npy"))
        nodes.append(r["graph_nodes"])
        splits.append(r["splits"])
    assert nodes[0] == nodes[1]
    assert splits[0] == [1, 1] and splits[1][0] > 1 and splits[1][1] > 1
    assert nmse(rows[0], rows[1]) < 1e-6


def test_run_fa_auto_turns_flash_attention_off_where_a_device_lacks_it(tmp_path, capsys,
                                                                         monkeypatch):
    """-fa auto as llama.cpp resolves it: off when a layer's FLASH_ATTN_EXT would not run on
    its device (then the graph and logits of -fa off); on where it runs, as -fa on."""
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.backends.numpy_device import NumpyDeviceBackend
    from ggml_py.tools import demo
    path, _ = write_model(tmp_path, "qwen3")
    run = dict(device=("--device", "numpy_device", "-ngl", "2"))
    argv = (path, "--tokens", "3,1,4,1,5", "--feed", "9,2,6", "--logits-out", tmp_path / "l.npy")
    rows, results = [], []
    for fa in ("on", "off", "auto"):
        results.append(run_json(capsys, *argv, "-fa", fa, **run))
        rows.append(np.load(tmp_path / "l.npy"))
    assert [r["flash_attn"] for r in results] == [True, False, True]
    assert results[2]["graph_nodes"] == results[0]["graph_nodes"] != results[1]["graph_nodes"]
    monkeypatch.setattr(demo, "model_backends", lambda *a, **kw: [
        NumpyDeviceBackend(unsupported_ops=("FLASH_ATTN_EXT",)), CPUBackend()])
    assert main(["run", *map(str, argv), *run["device"]]) == 0
    assert "-fa auto: layer 2's flash attention would not run on its device: off" in \
        capsys.readouterr().out
    auto_off = run_json(capsys, *argv, **run)
    assert not auto_off["flash_attn"] and auto_off["graph_nodes"] == results[1]["graph_nodes"]
    assert nmse(rows[1], np.load(tmp_path / "l.npy")) < 1e-12
    assert nmse(rows[1], rows[0]) < 1e-5


@pytest.mark.parametrize("argv,words", [
    (["--tokens", "1,2", "--prompt-len", "4"], ["not allowed with argument"]),
    (["--feed", "1,2", "-n", "3"], ["-n 3 and --feed's 2 tokens disagree"]),
    (["--tokens", "1,256"], ["token id 256 is not in", "vocabulary (0..255)"]),
    (["--tokens", "1,-2"], ["token ids are not negative"]),
    (["--prompt-len", "30", "-n", "5", "-c", "32"], ["30 tokens + 5 decode steps exceed the "
                                                    "context (-c 32)"]),
    (["--tokens", "1", "--seed", "2"], ["--seed makes a random prompt"]),
    (["--device", "cpu", "-ngl", "2"], ["--gpu-layers would be ignored with --device cpu"]),
    (["-fa", "yes"], ["argument -fa/--flash-attn: invalid choice: 'yes'"]),
])
def test_run_usage_errors(tmp_path, capsys, argv, words):
    path, _ = write_model(tmp_path, "qwen2")
    assert main(["run", path, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_run_refuses_a_file_it_cannot_build(tmp_path, capsys):
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + bytes(60))
    assert main(["run", str(tmp_path / "x.gguf"), "--device", "cpu"]) == 2
    assert "x.gguf" in capsys.readouterr().err
    (tmp_path / "model.bin").write_bytes(b"GGUF")
    assert main(["run", str(tmp_path / "model.bin")]) == 2
    assert "expected a .gguf file" in capsys.readouterr().err
