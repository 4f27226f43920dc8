"""Computable models: graphs against the numpy reference, KV-cache consistency,
the MoE forms, GGUF round trips, determinism, placement and the demo."""

import copy
import dataclasses
import time

import numpy as np
import pytest

from ggml_py import Backend
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.sim import SimBufferType
from ggml_py.errors import AllocationError, BackendError, ModelError
from ggml_py.models.reference import reference_logits
from ggml_py.models.transformer import (KVCache, Model, ModelConfig, Session, build_forward,
                                        moe_config)
from ggml_py.sched import Scheduler

# small enough that every test computes in milliseconds
SMALL = dict(n_vocab=96, n_ctx=32, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, n_ff=96,
             kv_pad=8)
TOKENS = [5, 17, 3, 88, 41, 0, 62, 9, 33, 71]


def nmse(ref, x):
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    return float(np.sum((ref - x) ** 2) / np.sum(ref ** 2))


def session(cfg, seed=0):
    cpu = CPUBackend()
    return Session(Model.random(cfg, seed).place(cpu), [cpu])


# tolerance per weight type: f16 and q8_0 round the activations of every matmul
# (f16 / q8_0 vec_dot types), which the float64 reference does not
@pytest.mark.parametrize("wtype,tol", [("f32", 1e-6), ("f16", 1e-5), ("q8_0", 1e-3),
                                       ("q4_0", 1e-3)])
def test_llama_graph_matches_reference(wtype, tol):
    cfg = ModelConfig(**SMALL, wtype=wtype, cache_type="f32" if wtype == "f32" else "f16")
    s = session(cfg)
    got = s.forward(TOKENS)
    ref = reference_logits(s.model, TOKENS)
    assert got.shape == (len(TOKENS), cfg.n_vocab)
    assert nmse(ref, got) < tol


@pytest.mark.parametrize("ffn", ["moe_dense", "moe_topk", "moe_shared"])
def test_moe_forms_match_reference(ffn):
    # f32 weights and cache: the graph and the reference agree to float32 rounding, so
    # the routing (which a near tie could flip under f16 rounding) is the same
    cfg = moe_config(ffn, **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32,
                     wtype="f32", cache_type="f32")
    s = session(cfg, seed=3)
    got = s.forward(TOKENS)
    assert nmse(reference_logits(s.model, TOKENS), got) < 1e-6


def test_moe_forms_differ():
    """The three gates give different models on the same weights' shapes."""
    outs = {}
    for ffn in ("moe_dense", "moe_topk", "moe_shared"):
        cfg = moe_config(ffn, **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32, wtype="f32")
        outs[ffn] = session(cfg).forward(TOKENS[:4])
    assert nmse(outs["moe_dense"], outs["moe_topk"]) > 1e-6
    assert nmse(outs["moe_topk"], outs["moe_shared"]) > 1e-6


def test_moe_graph_uses_mul_mat_id():
    cfg = moe_config("moe_topk", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32)
    s = session(cfg)
    fw = build_forward(s.model, s.cache, TOKENS[:3])
    ops = [n.op for n in fw.graph.nodes]
    assert ops.count("MUL_MAT_ID") == 3 * cfg.n_layer
    assert ops.count("TOP_K") == cfg.n_layer


@pytest.mark.parametrize("cfg", [
    ModelConfig(**SMALL),
    moe_config("moe_topk", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32),
    moe_config("moe_shared", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32, wtype="q8_0"),
], ids=["llama-f16", "moe_topk-f16", "moe_shared-q8_0"])
def test_decode_matches_prompt(cfg):
    """Logits of decode steps through the KV cache == the rows of one prompt pass."""
    s = session(cfg)
    full = s.forward(TOKENS)
    s.reset()
    n0 = 4
    part = [s.forward(TOKENS[:n0])]
    for t in TOKENS[n0:]:
        part.append(s.forward([t]))
    steps = np.concatenate(part)
    assert s.cache.n_past == len(TOKENS)
    assert nmse(full, steps) < 1e-6
    assert np.array_equal(full.argmax(-1), steps.argmax(-1))


def test_last_logits_and_greedy_generate():
    cfg = ModelConfig(**SMALL, wtype="f32", cache_type="f32")
    s = session(cfg)
    last = s.forward(TOKENS, logits="last")
    s.reset()
    full = s.forward(TOKENS)
    np.testing.assert_allclose(last[0], full[-1], rtol=1e-5, atol=1e-5)
    # greedy decoding through the cache picks what the reference picks
    s.reset()
    new = s.generate(TOKENS[:5], 4)
    seq = list(TOKENS[:5])
    for _ in range(4):
        seq.append(int(np.argmax(reference_logits(s.model, seq)[-1])))
    assert new == seq[5:]


def test_cache_limits_and_padding():
    cfg = ModelConfig(**SMALL)
    s = session(cfg)
    fw = build_forward(s.model, s.cache, TOKENS[:3])
    assert fw.n_kv == cfg.kv_pad            # attention runs over padded cells
    with pytest.raises(ValueError, match="exceed the context"):
        build_forward(s.model, s.cache, list(range(cfg.n_ctx + 1)))
    with pytest.raises(ValueError, match="token ids"):
        build_forward(s.model, s.cache, [cfg.n_vocab])


def test_seeded_determinism():
    cfg = moe_config("moe_topk", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32)
    a, b, c = Model.random(cfg, 7), Model.random(cfg, 7), Model.random(cfg, 8)
    for name in a.weights:
        assert np.array_equal(a.weights[name][1], b.weights[name][1])
    assert not np.array_equal(a.weights["output.weight"][1], c.weights["output.weight"][1])
    cpu = CPUBackend()
    la = Session(a.place(cpu), [cpu]).forward(TOKENS)
    lb = Session(b.place(cpu), [cpu]).forward(TOKENS)
    assert np.array_equal(la, lb)


def test_config_checks():
    with pytest.raises(ValueError, match="ffn"):
        ModelConfig(ffn="nope")
    with pytest.raises(ValueError, match="n_expert_used"):
        ModelConfig(ffn="moe_topk", n_expert=2, n_expert_used=3)
    with pytest.raises(ValueError, match="multiples of 32"):
        ModelConfig(n_embd=48, n_head=4, n_head_kv=2, wtype="q8_0")
    assert moe_config("moe_dense", n_expert=6).n_expert_used == 6


@pytest.mark.parametrize("field,value", [
    ("n_head", 0), ("n_head_kv", 0), ("n_vocab", 0), ("n_embd", -64), ("n_ctx", 2**31),
    ("n_layer", 0), ("n_layer", 2**31), ("kv_pad", 0), ("n_ff", 1.5), ("n_ctx", True),
    ("n_vocab", None), ("n_rot", 0), ("n_expert", -1), ("rope_freq_base", 0.0),
    ("rope_freq_base", float("inf")), ("rope_freq_scale", float("nan")), ("eps", -1e-5),
    ("eps", "1e-5"), ("cache_type", "i32"), ("cache_type", "q8_0"), ("rope_mode", "MROPE"),
    ("rope_mode", 2), ("name", None)])
def test_config_refuses_each_bad_field(field, value):
    """Each field on its own: a ModelError naming it, before anything is built (ZeroDivision
    at n_head 0, minutes of listing at 2^31 layers, an i32 cache computing garbage)."""
    with pytest.raises(ModelError, match=rf"ModelConfig\.{field} must be"):
        ModelConfig(**{**SMALL, field: value})


def test_random_weights_past_the_machines_memory_are_refused_first():
    """(Filled one by one, they would end in the out-of-memory killer, not an error.)"""
    t0 = time.perf_counter()
    huge = {**SMALL, "n_vocab": 2**31 - 1, "n_embd": 2**16, "n_head": 64, "n_head_kv": 64}
    with pytest.raises(AllocationError, match=r"model llama: its weights: cannot allocate \d+ bytes "
                                              r"\(\d+\.\d GiB\), more than the \d+ bytes .* available"):
        Model.random(ModelConfig(**huge))          # (petabytes)
    assert time.perf_counter() - t0 < 1


def test_config_rope_spellings():
    for mode, neox in [("NORMAL", False), ("neox", True), ("GGML_ROPE_TYPE_NEOX", True),
                       ("GGML_ROPE_TYPE_NORMAL", False)]:
        assert ModelConfig(**SMALL, rope_mode=mode).rope_neox is neox


def test_layers_offloaded_to_a_simulated_gpu_split_like_llama_cpp():
    """Weights and cache per layer on a device: the scheduler keeps the input layer on
    the CPU and runs the offloaded layers on the device."""
    cfg = ModelConfig(**SMALL)
    gpu = Backend("GPU0", SimBufferType("GPU0", 32, None, False), "gpu")
    cpu = CPUBackend()
    model = Model.random(cfg).place([cpu, gpu], host=cpu, output_backend=gpu)
    assert not model.has_data                  # a simulated device holds no bytes
    fw = build_forward(model, KVCache(model), TOKENS[:4])
    sched = Scheduler([gpu, cpu], graph_size=2048)
    sched.split_graph(fw.graph)
    names = [s.backend.name for s in sched.splits]
    assert names[0] == "CPU" and names[-1] == "GPU0" and sched.n_splits >= 2
    assert sched.get_tensor_backend(fw.logits).name == "GPU0"


# ---------------------------------------------------------------------------
# offloaded layers computed through the scheduler's runtime

def _device(name):
    from ggml_py.tools.demo import device_backends
    try:
        return device_backends(name)[0]
    except BackendError as e:
        pytest.skip(f"no {name} device backend here: {e}")


@pytest.mark.parametrize("device,tol", [("numpy_device", 1e-12), ("opencl", 1e-4)])
@pytest.mark.parametrize("ffn", ["dense", "moe_topk", "moe_shared"])
def test_offloaded_layers_match_cpu(device, tol, ffn):
    """Half the layers on a device, the rest and the embeddings on the CPU: the same
    logits as a CPU-only run (the numpy device runs the CPU kernels: equal up to the
    last bit; OpenCL's kernels compute activations in f32)."""
    dev = _device(device)
    cfg = ModelConfig(**SMALL) if ffn == "dense" else \
        moe_config(ffn, **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32)
    cpu = CPUBackend()
    ref = Session(Model.random(cfg).place(cpu), [cpu])
    want = [ref.forward(TOKENS[:6]), ref.forward([TOKENS[6]])]
    model = Model.random(cfg).place([cpu, dev], host=cpu, output_backend=dev)
    s = Session(model, [dev, cpu], profile_splits=True)
    got = [s.forward(TOKENS[:6]), s.forward([TOKENS[6]])]
    for w, g in zip(want, got):
        assert nmse(w, g) < tol
    st = s.history[0]
    assert st.n_splits >= 2 and {sp.backend for sp in st.splits} == {dev.name, "CPU"}
    assert st.copy_bytes > 0 and all(sp.compute_s is not None for sp in st.splits)


# ---------------------------------------------------------------------------
# GGUF

@pytest.mark.parametrize("cfg", [
    ModelConfig(**SMALL, wtype="q8_0"),
    ModelConfig(**SMALL, wtype="q4_0", rope_freq_base=500000.0, eps=1e-6),
    moe_config("moe_topk", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32, wtype="f16"),
], ids=["llama-q8_0", "llama-q4_0", "mixtral-f16"])
def test_gguf_round_trip(tmp_path, cfg):
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, save_gguf
    model = Model.random(cfg, seed=5)
    path = tmp_path / "tiny.gguf"
    save_gguf(model, path)
    loaded = load_gguf(path)
    assert loaded.config == dataclasses.replace(cfg, kv_pad=32)    # kv_pad is not in the file
    for name, (t, stored) in model.weights.items():
        lt, ls = loaded.weights[name]
        assert lt == t and ls.tobytes() == stored.tobytes(), name
    cpu = CPUBackend()
    direct = Session(model.place(cpu), [cpu]).forward(TOKENS)
    from_file = Session(loaded.place(cpu), [cpu]).forward(TOKENS)
    assert np.array_equal(direct, from_file)


def test_gguf_in_llama_cpps_q4_K_M_mix(tmp_path):
    """A file as llama.cpp's Q4_K_M writes one: q4_K matrices, q6_K for attn_v, ffn_down and
    the output head, f32 norms. It loads byte for byte, and its logits are the model's own
    and within the quantisation's distance of the float64 reference."""
    pytest.importorskip("gguf")
    from ggml_py import quants
    from ggml_py.models.gguf import load_gguf, save_gguf
    cfg = ModelConfig(**{**SMALL, "n_embd": 256, "n_ff": 512}, wtype="q4_K", cache_type="f16")
    model = Model.random(cfg, seed=2)
    for name, (t, stored) in list(model.weights.items()):
        if name.endswith(("attn_v.weight", "ffn_down.weight", "output.weight")):
            x = quants.dequantize(t, stored)
            model.weights[name] = ("q6_K", quants.quantize("q6_K", x, cpu=False))
    path = tmp_path / "q4_K_M.gguf"
    save_gguf(model, path)
    loaded = load_gguf(path)
    assert {t for t, _ in loaded.weights.values()} == {"f32", "q4_K", "q6_K"}
    for name, (t, stored) in model.weights.items():
        assert loaded.weights[name][0] == t and loaded.weights[name][1].tobytes() == stored.tobytes()
    cpu = CPUBackend()
    got = Session(loaded.place(cpu), [cpu]).forward(TOKENS)
    assert np.array_equal(got, Session(model.place(cpu), [cpu]).forward(TOKENS))
    assert nmse(reference_logits(loaded, TOKENS), got) < 2e-3


def test_gguf_smaller_context_and_tied_output(tmp_path):
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, _write_gguf
    cfg = ModelConfig(**SMALL, wtype="f32")
    model = Model.random(cfg, seed=1)
    path = str(tmp_path / "tied.gguf")
    _write_gguf(cfg, {k: v for k, v in model.weights.items() if k != "output.weight"}, path)
    loaded = load_gguf(path, n_ctx=16)
    assert loaded.config.n_ctx == 16
    assert loaded.weights["output.weight"][1].tobytes() == \
        model.weights["token_embd.weight"][1].tobytes()


def test_gguf_rejects_unsupported_type_and_arch(tmp_path):
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, _write_gguf
    cfg = ModelConfig(**{**SMALL, "n_embd": 256}, wtype="f32")
    weights = dict(Model.random(cfg).weights)
    # tq2_0 blocks (66 bytes per 256 values): a type the models do not compute
    rows = cfg.n_embd
    weights["blk.1.attn_q.weight"] = ("tq2_0", np.zeros((rows, cfg.n_embd // 256 * 66), np.uint8))
    path = str(tmp_path / "tq20.gguf")
    _write_gguf(cfg, weights, path)
    with pytest.raises(GGUFError, match=r"blk\.1\.attn_q\.weight.*TQ2_0"):
        load_gguf(path)
    other = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(other, "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="gpt2"):
        load_gguf(other)


def test_gguf_damaged_files_are_clear_errors(tmp_path):
    """A file that says more than it holds (billions of blocks, hundreds, a tensor gone)
    is a GGUFError naming the file, at once; bytes damaged anywhere in the header or cut off
    anywhere load or raise GGUFError, never another error, never a long wait."""
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, _write_gguf
    cfg = ModelConfig(**SMALL, wtype="q8_0")
    weights = dict(Model.random(cfg).weights)
    for n_layer, match in [(2**31, r"ModelConfig\.n_layer must be an integer in \[1, 512\]"),
                           (400, r"has no tensor 'blk\.2\.attn_norm\.weight' \(and 3581 more\)")]:
        many = str(tmp_path / f"blocks{n_layer}.gguf")
        _write_gguf(_claiming(cfg, n_layer=n_layer), weights, many)
        t0 = time.perf_counter()
        with pytest.raises(GGUFError, match=rf"blocks{n_layer}\.gguf: .*{match}"):
            load_gguf(many)
        assert time.perf_counter() - t0 < 2
    gone = str(tmp_path / "gone.gguf")
    _write_gguf(cfg, {k: v for k, v in weights.items() if k != "blk.1.ffn_up.weight"}, gone)
    with pytest.raises(GGUFError, match=r"gone\.gguf: has no tensor 'blk\.1\.ffn_up\.weight'"):
        load_gguf(gone)
    good = str(tmp_path / "good.gguf")
    _write_gguf(cfg, weights, good)
    data = open(good, "rb").read()
    rng = np.random.default_rng(3)
    damaged, outcomes = str(tmp_path / "damaged.gguf"), {"loaded": 0, "GGUFError": 0}
    for _ in range(200):
        b = bytearray(data)
        if rng.random() < 0.25:
            b = b[:rng.integers(len(b))]
        else:                       # bytes, or 8-byte counts and offsets, in the header
            for _ in range(rng.integers(1, 4)):
                p = int(rng.integers(min(len(b), 2000))) & ~7
                values = [2**63 - 1, 2**64 - 1, 2**32, 2**31, 0, 1, int(rng.integers(2**32))]
                b[p:p + 8] = values[rng.integers(len(values))].to_bytes(8, "little")
        open(damaged, "wb").write(b)
        t0 = time.perf_counter()
        try:
            load_gguf(damaged)
            outcomes["loaded"] += 1
        except GGUFError:
            outcomes["GGUFError"] += 1
        assert time.perf_counter() - t0 < 2
    assert outcomes["GGUFError"] > 100, outcomes


def _claiming(cfg, **fields):
    """A copy of cfg whose metadata says `fields`, past ModelConfig's checks (a file that
    claims more than it holds)."""
    claim = copy.copy(cfg)
    for name, value in fields.items():
        object.__setattr__(claim, name, value)
    return claim


# ---------------------------------------------------------------------------
# the demo

def test_demo_runs_models_and_plans(capsys):
    from ggml_py.__main__ import main
    assert main(["demo", "--layers", "1", "--prompt", "4", "--steps", "3",
                 "--plan-layers", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("llama", "moe-dense", "moe-topk", "moe-shared", "gemma2"):
        assert f"== {name}:" in out
    assert "== gemma2: 1 layers, a window of 8 tokens in 1 of them" in out
    assert out.count("greedy   [") == 5
    assert "what-if" in out and "GPU without ROPE" in out


def test_demo_loads_gguf(tmp_path, capsys):
    pytest.importorskip("gguf")
    from ggml_py.__main__ import main
    from ggml_py.models.gguf import save_gguf
    path = tmp_path / "m.gguf"
    save_gguf(Model.random(ModelConfig(**SMALL, name="tiny-gguf")), path)
    assert main(["demo", "--gguf", str(path), "--prompt", "3", "--steps", "2", "--no-plan"]) == 0
    out = capsys.readouterr().out
    assert "== tiny-gguf:" in out and out.count("greedy   [") == 1


def test_demo_loads_a_gguf_of_another_architecture(tmp_path, capsys):
    """A qwen3 file runs on llama.cpp's qwen3 graph, its greedy tokens those of the float64
    reference."""
    pytest.importorskip("gguf")
    from ggml_py.__main__ import main
    from ggml_py.models.config import arch_config
    from ggml_py.models.gguf import load_gguf, save_gguf
    from ggml_py.models.reference import reference_logits
    path = tmp_path / "q3.gguf"
    save_gguf(Model.random(arch_config("qwen3", **SMALL, name="tiny-qwen3", wtype="f32"),
                           seed=4), path)
    assert main(["demo", "--gguf", str(path), "--prompt", "3", "--steps", "2", "--no-plan",
                 "--seed", "1"]) == 0
    out = capsys.readouterr().out
    prompt = [int(t) for t in out.split("prompt   [")[1].split("]")[0].split(",")]
    greedy = [int(t) for t in out.split("greedy   [")[1].split("]")[0].split(",")]
    model = load_gguf(path, n_ctx=32)
    tokens = list(prompt)
    for _ in range(2):
        tokens.append(int(np.argmax(reference_logits(model, tokens)[-1])))
    assert "== tiny-qwen3:" in out and greedy == tokens[3:]
