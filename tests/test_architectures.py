"""Architectures as llama.cpp builds them (models.arch): llama (dense and Mixtral-style
MoE), qwen2, qwen3, qwen3moe, gemma2, gemma3 and phi3.

Without llama.cpp: each graph against the float64 reference, its node count (llama.cpp's
for that architecture), GGUF files written and read back, decode steps on the kept
graph, and the metadata a loader must refuse. With llama.cpp (llama-cpp-python, built
from source; these tests skip without it unless GGML_PY_REQUIRE_LLAMA_CPP=1): the same
random-weight GGUF file run through both, a prompt and 8 decode steps teacher-forced on
llama.cpp's own greedy tokens, logits within NMSE 1e-4 of llama.cpp's over all rows, and
llama.cpp's logged graph node counts equal to ggml_py's for the same batch.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from ggml_py import ops
from ggml_py.backends.cpu import CPUBackend
from ggml_py.errors import ModelError, UnknownNameError
from ggml_py.models.arch import ARCHITECTURES, get_builder
from ggml_py.models.config import arch_config
from ggml_py.models.reference import reference_logits
from ggml_py.models.transformer import Model, ModelConfig, Session

HERE = pathlib.Path(__file__).resolve().parent
ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3")
# the models the tests build: each architecture, and llama with experts (Mixtral-style)
KINDS = ARCHS + ("llama-moe",)
LLAMA_MOE = dict(ffn="moe_topk", n_expert=4, n_expert_used=2, n_ff_exp=128)   # (= n_ff)
SMALL = dict(n_vocab=256, n_ctx=64, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, n_ff=128,
             kv_pad=32)
# what makes an architecture's own features show on the short prompts here: a window they
# slide past, an attention soft-cap the scores reach (gemma2's 50 would barely bend them),
# gemma3's optional logit soft-cap, its sliding layers' own rope base, and global layers
# among the 2 or 3 here (its default pattern makes five sliding layers to a global one),
# phi3's rope over half of each head with the long factors (a context past n_ctx_orig)
# and an attn_factor
FEATURES = {"gemma2": dict(n_swa=5, attn_softcap=1.0),
            "gemma3": dict(n_swa=5, swa_pattern=2, rope_freq_base_swa=100.0,
                           final_softcap=10.0),
            "phi3": dict(n_rot=8, rope_factors=True, n_ctx_orig=32, rope_attn_factor=1.2)}
PROMPT = [5, 17, 3, 88, 41, 0, 62, 9, 33, 71, 200, 255]
N_DECODE = 8
FA = {"flash_attn": True}       # llama.cpp's -fa on


def nmse(ref, x):
    ref, x = np.asarray(ref, np.float64), np.asarray(x, np.float64)
    return float(np.sum((ref - x) ** 2) / np.sum(ref ** 2))


def llama_cpp_nodes(cfg):
    """llama.cpp's node count for an f16-cache graph without flash attention: per layer 36 for
    dense llama (norms 4, Q/K/V 6, rope 2, K/V stores 6, cache views 2, attention 9, output
    projection 1, FFN 4, residuals 2), qwen2 3 more (the biases), qwen3 4 more (the Q/K
    norms), gemma2 8 more (Q's scale, the scores' soft-cap 3, the post-norms 4), gemma3
    gemma2's less the scores' soft-cap plus the Q/K norms, phi3 34 (a fused QKV product and
    its 3 views, Q's scale, V copied out of the view, a fused gate/up: 3 FFN nodes; 2 more
    with separate Q/K/V); routed experts replace the FFN's 4 by 16 + 2 k (router 1, softmax
    1, top-k 2, weights 7, input reshape 1, experts 4, k views and k - 1 adds; a cont when k
    is 1); the embeddings' get_rows, the last layer's 2 get_rows of the output ids and the
    output norm and head (3) once, gemma's embedding scale and logit soft-cap (4) too."""
    per_layer = {"llama": 36, "qwen2": 39, "qwen3": 40, "qwen3moe": 40, "gemma2": 44,
                 "gemma3": 45, "phi3": 34}[cfg.arch]
    if cfg.arch == "phi3" and not cfg.fused_qkv:
        per_layer += 2
    if cfg.is_moe:
        k = cfg.n_expert_used
        per_layer += 12 + 2 * k + (k == 1)
    if cfg.flash_attn:
        # V stored as K is (2 nodes, not 4); attention a FLASH_ATTN_EXT over Q's view and
        # the three permutes, reshaped (6, not 9), soft-capping its parameter; the cache
        # cast to f16 when f32
        per_layer -= 5 + 3 * (cfg.attn_softcap > 0) - 2 * (cfg.cache_type == "f32")
    once = {"gemma2": 4, "gemma3": 4}.get(cfg.arch, 0)
    return per_layer * cfg.n_layer + 1 + 2 + 3 + once


def fa_flag(flash_attn):
    """llama.cpp's -fa value of a flash_attn setting."""
    return "on" if flash_attn else "off"


def small(kind, **kw):
    """A small config of a test model kind (KINDS): SMALL's sizes, FEATURES's settings."""
    if kind == "llama-moe":
        return arch_config("llama", **{**SMALL, **LLAMA_MOE, **kw})
    return arch_config(kind, **{**SMALL, **FEATURES.get(kind, {}), **kw})


def session(cfg, seed=0):
    cpu = CPUBackend()
    return Session(Model.random(cfg, seed).place(cpu), [cpu])


# ---------------------------------------------------------------------------
# without llama.cpp

def test_registry():
    assert set(ARCHITECTURES) == set(ARCHS)
    with pytest.raises(UnknownNameError, match="gpt2"):
        get_builder("gpt2")
    with pytest.raises(UnknownNameError, match="known: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3"):
        arch_config("gpt2")


@pytest.mark.parametrize("kind", KINDS + ("llama-moe-k1",))
@pytest.mark.parametrize("wtype,tol", [("f32", 1e-6), ("f16", 1e-5)])
def test_graph_matches_reference(kind, wtype, tol):
    if kind == "llama-moe-k1":      # one expert per token: the sum is a cont, not an add
        cfg = small("llama-moe", wtype=wtype, n_expert_used=1)
    else:
        cfg = small(kind, wtype=wtype)
    s = session(cfg, seed=3)
    got = s.forward(PROMPT)
    assert nmse(reference_logits(s.model, PROMPT), got) < tol
    assert s.graph.n_nodes == llama_cpp_nodes(cfg)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_decode_steps_match_the_whole_sequence(kind, flash_attn):
    """A prompt then one token at a time on the kept decode graph: the logits of one pass
    over the whole sequence; every decode graph has llama.cpp's node count too."""
    cfg = small(kind, wtype="f32", cache_type="f32", flash_attn=flash_attn)
    s = session(cfg, seed=4)
    rows = [s.forward(PROMPT[:5])]
    for tok in PROMPT[5:]:
        rows.append(s.forward([tok]))
        assert s.graph.n_nodes == llama_cpp_nodes(cfg)
    assert s.decode.n_reuses == len(PROMPT) - 6
    whole = session(cfg, seed=4).forward(PROMPT)
    assert nmse(whole, np.concatenate(rows)) < 1e-9
    last = session(cfg, seed=4).forward(PROMPT, logits="last")
    assert np.allclose(last, whole[-1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_every_node_has_a_c_kernel(kind, flash_attn, monkeypatch):
    """The prompt and decode graphs of each architecture run in the C executor: no node
    falls back to its numpy kernel (partial rope with factors, soft-caps, GEGLU, flash
    attention, ...)."""
    from ggml_py.backends.cpu.backend import KernelPolicy
    python = []
    kernel_for = KernelPolicy.kernel_for

    def spy(self, t, compiled):
        fn = kernel_for(self, t, compiled)
        if fn is not None:
            python.append(f"{t.op} {t.name}")
        return fn

    monkeypatch.setattr(KernelPolicy, "kernel_for", spy)
    s = session(small(kind, wtype="q8_0", flash_attn=flash_attn), seed=2)
    s.forward(PROMPT)
    s.forward([7])
    assert python == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cache_type", ["f16", "f32"])
def test_flash_attention_graph_matches_reference(kind, cache_type):
    """With flash attention (llama.cpp's -fa on): V cached a row per cell as K is, one
    FLASH_ATTN_EXT per layer (an f32 cache cast to f16 first), llama.cpp's node count, and
    the logits of the float64 reference."""
    cfg = small(kind, wtype="f32", cache_type=cache_type, flash_attn=True)
    s = session(cfg, seed=3)
    got = s.forward(PROMPT)
    for il in range(cfg.n_layer):       # (the sliding layers' own cache: 256 cells)
        cells = s.cache.cells_swa if cfg.is_swa(il) else cfg.n_ctx
        assert s.cache.v[il].ne[:2] == s.cache.k[il].ne[:2] == (cfg.n_embd_gqa, cells)
    nodes = [s.graph.node(i) for i in range(s.graph.n_nodes)]
    assert sum(n.op == "FLASH_ATTN_EXT" for n in nodes) == cfg.n_layer
    assert not any(n.name.split("-")[0] in ("kq", "kq_soft_max", "kqv") for n in nodes)
    assert s.graph.n_nodes == llama_cpp_nodes(cfg)
    assert nmse(reference_logits(s.model, PROMPT), got) < 1e-6


def test_gemma2_head_is_placed_with_the_output_layer():
    """gemma2's head is its token embedding, duplicated as llama.cpp duplicates it: the
    embeddings stay on the host, the head goes with the output layer, and the logits are
    those of one backend."""
    from ggml_py._backend import get_buffer
    from ggml_py.backends.numpy_device import NumpyDeviceBackend
    cfg = small("gemma2", wtype="f32")
    model = Model.random(cfg, seed=8)
    assert model.weights["output.weight"] is model.weights["token_embd.weight"]
    cpu, dev = CPUBackend(), NumpyDeviceBackend()
    model.place(dev, host=cpu)
    W = model.tensors
    assert get_buffer(W["token_embd.weight"]).buffer_type.name == "CPU"
    assert get_buffer(W["output.weight"]).buffer_type.name != "CPU"
    got = Session(model, [dev, cpu]).forward(PROMPT)
    assert nmse(session(cfg, seed=8).forward(PROMPT), got) < 1e-10


def test_llama_keeps_its_own_graph_unless_asked():
    """A llama config builds ggml_py's llama graph (its golden node counts elsewhere) unless
    graph='llama.cpp'; both compute the same logits."""
    base = ModelConfig(**SMALL, wtype="f32")
    own = session(base, seed=2)
    ported = session(dataclasses.replace(base, graph="llama.cpp"), seed=2)
    a, b = own.forward(PROMPT), ported.forward(PROMPT)
    assert own.graph.n_nodes != ported.graph.n_nodes == llama_cpp_nodes(ported.model.config)
    assert nmse(a, b) < 1e-10


def test_graph_names_and_order_follow_llama_cpp():
    cfg = arch_config("qwen3", **{**SMALL, "n_layer": 1}, wtype="f32")
    s = session(cfg)
    s.forward(PROMPT[:3])
    g = s.graph
    names = [g.node(i).name for i in range(g.n_nodes)]
    ops = [g.node(i).op for i in range(g.n_nodes)]
    assert names[0] == "embd" and names[-1] == "result_output"
    for n in ("norm-0", "attn_norm-0", "Qcur_normed-0", "Kcur_normed-0", "kq-0", "kq_soft_max-0",
              "kqv-0", "kqv_out-0", "ffn_inp-0", "ffn_norm-0", "ffn_up-0", "ffn_gate-0",
              "ffn_swiglu-0", "ffn_out-0", "l_out-0", "result_norm"):
        assert n in names, n
    # Q (with its norm and rope) then V then K, then the K and V stores, then attention
    assert ops[0] == "GET_ROWS"
    assert ops[1:15] == ["RMS_NORM", "MUL", "MUL_MAT", "RESHAPE", "RMS_NORM", "MUL", "ROPE",
                         "MUL_MAT", "RESHAPE", "MUL_MAT", "RESHAPE", "RMS_NORM", "MUL", "ROPE"]
    assert ops.count("SET_ROWS") == 2 and ops.count("SOFT_MAX") == 1


@pytest.mark.parametrize("kw,match", [
    (dict(arch="qwen2"), "qwen2 models use NEOX rope"),
    (dict(arch="llama", graph="llama.cpp", rope_mode="NEOX"), "llama models use NORMAL rope"),
    (dict(arch="qwen3", rope_mode="NEOX"), r"qk_norm=True"),
    (dict(arch="llama", qk_norm=True, graph="llama.cpp"), "llama models have no Q/K norms"),
    (dict(attn_bias=True), "graph='llama.cpp'"),
    (dict(arch="gpt2"), "ModelConfig.arch must be one of"),
    (dict(graph="ggml"), "ModelConfig.graph must be one of"),
    (dict(arch="qwen2", rope_mode="NEOX", attn_bias=True, ffn="moe_topk", n_expert=4,
          n_expert_used=2), "llama.cpp's qwen2 graph has ffn dense, got 'moe_topk'"),
    (dict(arch="qwen3moe", rope_mode="NEOX", qk_norm=True),
     "llama.cpp's qwen3moe graph has ffn moe_topk, got 'dense'"),
    (dict(arch="qwen3moe", rope_mode="NEOX", ffn="moe_topk", n_expert=4, n_expert_used=2),
     "qwen3moe models have Q/K norms"),
    (dict(arch="llama", graph="llama.cpp", ffn="moe_shared", n_expert=4, n_expert_used=2,
          n_expert_shared=1), "llama graph has ffn dense or moe_topk, got 'moe_shared'"),
    (dict(arch="llama", graph="llama.cpp", ffn="moe_topk", n_expert=4, n_expert_used=2,
          n_ff_exp=64), r"llama experts are n_ff wide: n_ff_exp 64 != n_ff 128"),
    (dict(arch="qwen2", rope_mode="NEOX", n_rot=8), "rotates whole heads"),
    (dict(arch="llama", graph="llama.cpp", n_swa=8), "llama models have no sliding window"),
    (dict(arch="qwen3", rope_mode="NEOX", qk_norm=True, final_softcap=30.0),
     "qwen3 models have no final logit soft-capping"),
    (dict(arch="gemma2", rope_mode="NEOX"), r"gemma2 models have a sliding window"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=4, swa_layers=(1, 0)), "sorted tuple"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=4, swa_layers=(2,)), r"in \[0, 2\)"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=0, swa_layers=(0,)), "need a window"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=4, attn_softcap=-1.0), "attn_softcap"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=4, rope_freq_base_swa=0.0),
     "rope_freq_base_swa must be None or a finite number > 0"),
    (dict(arch="gemma2", rope_mode="NEOX", n_swa=4, graph="ggml_py"), "post-norms"),
    (dict(arch="gemma3", rope_mode="NEOX"), r"gemma3 models have Q/K norms"),
    (dict(arch="qwen2", rope_mode="NEOX", fused_qkv=True), "no fused QKV or rope factors"),
    (dict(arch="phi3", rope_mode="NEOX", n_rot=7), "n_rot must be even"),
    (dict(rope_attn_factor=2.0), "rope attn_factor and flash attention need graph='llama.cpp'"),
    (dict(flash_attn=True), "flash attention need graph='llama.cpp'"),
    (dict(arch="llama", graph="llama.cpp", flash_attn=1), "flash_attn must be a bool"),
])
def test_config_refusals(kw, match):
    with pytest.raises(ModelError, match=match):
        ModelConfig(**{**SMALL, **kw})


def test_sliding_window_hides_old_positions():
    """gemma2's even layers see the last n_swa positions only: the first n_swa rows match a
    model whose window covers everything, the later ones do not; a decode step's mask
    moves with the window (the kept graph's inputs rewritten in place)."""
    prompt = PROMPT[:9]
    wide = session(small("gemma2", n_swa=64, swa_layers=(0,), wtype="f32"), seed=6)
    narrow = session(small("gemma2", wtype="f32"), seed=6)
    a, b = wide.forward(prompt), narrow.forward(prompt)
    assert np.array_equal(a[:5], b[:5])
    assert all(nmse(a[i], b[i]) > 1e-6 for i in range(5, 9))
    steps = [narrow.forward([t]) for t in PROMPT[9:]]
    mask = narrow.decode.kept.inputs
    swa = next(v for t, v in mask if t.name == "kq_mask_swa")
    assert np.flatnonzero(swa[0] == 0).tolist() == list(range(len(PROMPT) - 5, len(PROMPT)))
    whole = session(small("gemma2", wtype="f32"), seed=6).forward(PROMPT)
    assert nmse(whole[9:], np.concatenate(steps)) < 1e-9


def test_head_size_other_than_n_embd_over_n_head():
    """Qwen3's heads need not tile n_embd (Qwen3-0.6B: 1024 wide, 16 heads of 128)."""
    cfg = arch_config("qwen3", **SMALL, n_embd_head=32, wtype="f32")
    assert cfg.n_embd_q == 128 != cfg.n_embd
    s = session(cfg, seed=1)
    assert nmse(reference_logits(s.model, PROMPT), s.forward(PROMPT)) < 1e-6


# ---------------------------------------------------------------------------
# GGUF files

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_gguf_round_trip(tmp_path, kind, wtype):
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, read_config, save_gguf
    cfg = small(kind, wtype=wtype)
    arch = cfg.arch
    model = Model.random(cfg, seed=5)
    path = tmp_path / f"{kind}.gguf"
    save_gguf(model, path)
    graph = "llama.cpp" if arch == "llama" else None
    loaded = load_gguf(path, graph=graph)
    assert loaded.config == dataclasses.replace(cfg, graph=graph)
    assert read_config(path, graph=graph) == loaded.config
    for name, (t, stored) in model.weights.items():
        lt, ls = loaded.weights[name]
        assert lt == t and ls.tobytes() == stored.tobytes(), name
    cpu = CPUBackend()
    assert np.array_equal(Session(model.place(cpu), [cpu]).forward(PROMPT),
                          Session(loaded.place(cpu), [cpu]).forward(PROMPT))
    if arch == "llama":        # without graph=: llama's own graph
        assert load_gguf(path).config.graph_kind == "ggml_py"


def test_gguf_qwen3_head_size_round_trip(tmp_path):
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import read_config, save_gguf
    cfg = arch_config("qwen3", **SMALL, n_embd_head=32, wtype="f32")
    save_gguf(Model.random(cfg), tmp_path / "q3.gguf")
    assert read_config(tmp_path / "q3.gguf") == cfg


def file_weights(model):
    """A model's weights as its GGUF file holds them (gemma2's head is its token_embd)."""
    tied = model.config.tied_output
    return {k: v for k, v in model.weights.items() if not (tied and k == "output.weight")}


def _write(gguf, path, arch, cfg, weights, drop=(), extra=None):
    """A GGUF file of `arch` with cfg's metadata (keys named by gguf.Keys) less `drop`, plus
    `extra` {key: (value, GGUFValueType)}, and these weights."""
    K = gguf.Keys
    w = gguf.GGUFWriter(path, arch)
    keys = {K.LLM.CONTEXT_LENGTH: cfg.n_ctx, K.LLM.EMBEDDING_LENGTH: cfg.n_embd,
            K.LLM.BLOCK_COUNT: cfg.n_layer, K.LLM.FEED_FORWARD_LENGTH: cfg.n_ff,
            K.Attention.HEAD_COUNT: cfg.n_head, K.Attention.HEAD_COUNT_KV: cfg.n_head_kv}
    for k, v in keys.items():
        if k not in drop:
            w.add_uint32(k.format(arch=arch), v)
    if cfg.n_rot is not None:
        w.add_uint32(K.Rope.DIMENSION_COUNT.format(arch=arch), cfg.n_rot)
    if K.Attention.LAYERNORM_RMS_EPS not in drop:
        w.add_float32(K.Attention.LAYERNORM_RMS_EPS.format(arch=arch), cfg.eps)
    for k, (v, vtype) in (extra or {}).items():
        w.add_key_value(k.format(arch=arch), v, vtype)
    for name, (t, stored) in weights.items():
        w.add_tensor(name, stored)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_refuses_missing_and_inconsistent_metadata(tmp_path):
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, read_config
    K, U32 = gguf.Keys, gguf.GGUFValueType.UINT32
    cfgs = {a: small(a, wtype="f32") for a in ARCHS}
    weights = {a: file_weights(Model.random(c)) for a, c in cfgs.items()}

    def path(name):
        return str(tmp_path / f"{name}.gguf")

    # each architecture loads from the keys alone (qwen3moe with its expert keys)
    moe = cfgs["qwen3moe"]
    experts = {K.LLM.EXPERT_COUNT: (moe.n_expert, U32),
               K.LLM.EXPERT_USED_COUNT: (moe.n_expert_used, U32),
               K.LLM.EXPERT_FEED_FORWARD_LENGTH: (moe.ff_exp, U32)}
    for a in ARCHS:
        _write(gguf, path(a), a, cfgs[a], weights[a], extra=experts if a == "qwen3moe" else None)
        assert load_gguf(path(a)).config.arch == a
    # a required key missing: named, with the file
    for a, k in [("qwen2", K.Attention.LAYERNORM_RMS_EPS), ("qwen3", K.LLM.BLOCK_COUNT),
                 ("llama", K.Attention.HEAD_COUNT)]:
        _write(gguf, path(f"no-{a}"), a, cfgs[a], weights[a], drop=(k,))
        with pytest.raises(GGUFError, match=rf"no-{a}\.gguf: metadata key "
                                            rf"'{re.escape(k.format(arch=a))}' is missing"):
            read_config(path(f"no-{a}"))
    # K and V heads of different sizes, rope over part of a head
    _write(gguf, path("kv"), "qwen3", cfgs["qwen3"], weights["qwen3"],
           extra={K.Attention.KEY_LENGTH: (16, U32), K.Attention.VALUE_LENGTH: (32, U32)})
    with pytest.raises(GGUFError, match=r"kv\.gguf: qwen3\.attention\.key_length 16 != "
                                        r"qwen3\.attention\.value_length 32"):
        read_config(path("kv"))
    _write(gguf, path("rot"), "qwen2", cfgs["qwen2"], weights["qwen2"],
           extra={K.Rope.DIMENSION_COUNT: (8, U32)})
    with pytest.raises(GGUFError, match=r"rot\.gguf: qwen2\.rope\.dimension_count 8 is not "
                                        r"the head size 16"):
        read_config(path("rot"))
    # qwen2 with a Q bias but no K / V bias; qwen3 without its K norm; a fused QKV
    w = {k: v for k, v in weights["qwen2"].items() if not k.startswith(("blk.0.attn_k.bias",
                                                                          "blk.0.attn_v.bias"))}
    _write(gguf, path("bias"), "qwen2", cfgs["qwen2"], w)
    with pytest.raises(GGUFError, match=r"bias\.gguf: has Q biases but not all three"):
        load_gguf(path("bias"))
    w = {k: v for k, v in weights["qwen3"].items() if k != "blk.1.attn_k_norm.weight"}
    _write(gguf, path("norm"), "qwen3", cfgs["qwen3"], w)
    with pytest.raises(GGUFError, match=r"norm\.gguf: has no tensor 'blk\.1\.attn_k_norm"):
        load_gguf(path("norm"))
    w = dict(weights["qwen2"])
    w["blk.0.ffn_up.bias"] = ("f32", np.zeros(cfgs["qwen2"].n_ff, np.float32))
    _write(gguf, path("ffnb"), "qwen2", cfgs["qwen2"], w)
    with pytest.raises(GGUFError, match=r"ffnb\.gguf: tensor 'blk\.0\.ffn_up\.bias' \(qwen2\) "
                                        r"is not supported yet"):
        load_gguf(path("ffnb"))
    # a tensor of the wrong shape for the metadata
    w = dict(weights["qwen3"])
    w["blk.0.attn_q_norm.weight"] = ("f32", np.ones(8, np.float32))
    _write(gguf, path("shape"), "qwen3", cfgs["qwen3"], w)
    with pytest.raises(GGUFError, match=r"'blk\.0\.attn_q_norm\.weight' has ne \[8\], the "
                                        r"config implies \[16\]"):
        load_gguf(path("shape"))
    # an architecture not (yet) built
    _write(gguf, path("gpt2"), "gpt2", cfgs["llama"], weights["llama"])
    with pytest.raises(GGUFError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported "
                                        r"\(only 'llama', 'qwen2', 'qwen3', 'qwen3moe', "
                                        r"'gemma2', 'gemma3', 'phi3'\)"):
        read_config(path("gpt2"))


def test_gguf_gemma2_defaults_and_refusals(tmp_path):
    """A gemma2 file without window or soft-cap keys takes llama.cpp's defaults (a window of
    4096 on the even layers, caps 50 and 30); a per-layer pattern array is read as flags;
    an output.weight (llama.cpp's gemma2 has none) or a pattern of the wrong length is
    refused."""
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, read_config
    K = gguf.Keys
    cfg = small("gemma2", n_layer=3, wtype="f32")
    weights = file_weights(Model.random(cfg))
    path = str(tmp_path / "g.gguf")
    _write(gguf, path, "gemma2", cfg, weights)
    got = read_config(path)
    assert (got.n_swa, got.swa_layers, got.attn_softcap, got.final_softcap) == \
        (4096, (0, 2), 50.0, 30.0)
    flags = gguf.GGUFValueType.ARRAY
    _write(gguf, path, "gemma2", cfg, weights,
           extra={K.Attention.SLIDING_WINDOW_PATTERN: ([True, True, False], flags)})
    assert read_config(path).swa_layers == (0, 1)
    _write(gguf, path, "gemma2", cfg, weights,
           extra={K.Attention.SLIDING_WINDOW_PATTERN: ([True, False], flags)})
    with pytest.raises(GGUFError, match=r"g\.gguf: gemma2\.attention\.sliding_window_pattern "
                                        r"has 2 flags for 3 layers"):
        read_config(path)
    _write(gguf, path, "gemma2", cfg, {**weights, "output.weight": weights["token_embd.weight"]})
    with pytest.raises(GGUFError, match=r"g\.gguf: tensor 'output\.weight': gemma2's output "
                                        r"head is token_embd\.weight"):
        load_gguf(path)


def test_gguf_phi3_fused_weights_and_rope_factors(tmp_path):
    """A phi3 file's fused attn_qkv is read as such (separate Q/K/V too), its rope factors
    come in pairs, the long ones past the training context (rope.scaling's
    original_context_length, else context_length); other architectures refuse both."""
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, read_config
    cfg = small("phi3", n_ctx_orig=None, wtype="f32")
    weights = Model.random(cfg).weights
    path = str(tmp_path / "p.gguf")
    _write(gguf, path, "phi3", cfg, weights)
    got = read_config(path)
    assert got.fused_qkv and got.rope_factors and got.n_rot == 8 and got.n_ctx_orig == 64
    assert got.rope_factors_name == "rope_factors_short.weight"
    assert read_config(path, n_ctx=128).rope_factors_name == "rope_factors_long.weight"
    _write(gguf, path, "phi3", cfg,
           {k: v for k, v in weights.items() if k != "rope_factors_long.weight"})
    with pytest.raises(GGUFError, match=r"p\.gguf: rope factors \(phi3\) are read for phi3 "
                                        r"files with both the long and the short ones only"):
        read_config(path)
    sep = small("phi3", fused_qkv=False, rope_factors=False, n_ctx_orig=None,
                rope_attn_factor=1.0, wtype="f32")
    _write(gguf, path, "phi3", sep, Model.random(sep).weights)
    assert load_gguf(path).config == dataclasses.replace(sep, name="gguf")
    q2 = small("qwen2", wtype="f32")
    w = dict(Model.random(q2).weights)
    w["blk.0.attn_qkv.weight"] = ("f32", np.zeros((3 * 64, 64), np.float32))
    _write(gguf, path, "qwen2", q2, w)
    with pytest.raises(GGUFError, match=r"tensor 'blk\.0\.attn_qkv\.weight' \(qwen2\) is not "
                                        r"supported yet"):
        read_config(path)


def test_gguf_expert_metadata(tmp_path):
    """qwen3moe's experts are expert_feed_forward_length wide, by default n_ff /
    n_expert_used (llama.cpp's rule); it must have experts; llama.cpp's llama ignores that
    key (its experts are n_ff wide), so a llama file read for llama.cpp's graph must not
    contradict it; more experts used than there are is refused."""
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import GGUFError, load_gguf, read_config
    K, U32 = gguf.Keys, gguf.GGUFValueType.UINT32
    cfg = arch_config("qwen3moe", **SMALL, wtype="f32", n_expert=4, n_expert_used=2, n_ff_exp=64)
    weights = Model.random(cfg).weights
    experts = {K.LLM.EXPERT_COUNT: (4, U32), K.LLM.EXPERT_USED_COUNT: (2, U32)}

    def path(name):
        return str(tmp_path / f"{name}.gguf")

    _write(gguf, path("q3moe"), "qwen3moe", cfg, weights, extra=experts)
    loaded = load_gguf(path("q3moe"))
    assert (loaded.config.ffn, loaded.config.ff_exp, loaded.config.n_expert_used) == \
        ("moe_topk", 64, 2)                 # 128 / 2
    _write(gguf, path("nox"), "qwen3moe", cfg, weights, extra={K.LLM.EXPERT_USED_COUNT: (2, U32)})
    with pytest.raises(GGUFError, match=r"nox\.gguf: qwen3moe needs experts: "
                                        r"qwen3moe\.expert_count is missing"):
        read_config(path("nox"))
    _write(gguf, path("used"), "qwen3moe", cfg, weights,
           extra={**experts, K.LLM.EXPERT_USED_COUNT: (5, U32)})
    with pytest.raises(GGUFError, match=r"used\.gguf: qwen3moe\.expert_used_count 5 is not in "
                                        r"1\.\.qwen3moe\.expert_count 4"):
        read_config(path("used"))
    dense = arch_config("llama", **SMALL, wtype="f32")
    _write(gguf, path("used0"), "llama", dense, Model.random(dense).weights,
           extra={K.LLM.EXPERT_USED_COUNT: (2, U32)})
    with pytest.raises(GGUFError, match=r"used0\.gguf: llama\.expert_used_count 2 without "
                                        r"experts \(llama\.expert_count\)"):
        read_config(path("used0"))
    lcfg = arch_config("llama", **SMALL, wtype="f32", **LLAMA_MOE)
    _write(gguf, path("llama"), "llama", lcfg, Model.random(lcfg).weights,
           extra={**experts, K.LLM.EXPERT_FEED_FORWARD_LENGTH: (64, U32)})
    assert read_config(path("llama")).ff_exp == 64          # ggml_py's own llama reads it
    with pytest.raises(GGUFError, match=r"llama\.gguf: llama\.expert_feed_forward_length 64 != "
                                        r"llama\.feed_forward_length 128; llama\.cpp's llama "
                                        r"experts are llama\.feed_forward_length wide"):
        read_config(path("llama"), graph="llama.cpp")


def test_gguf_tied_output_qwen2(tmp_path):
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf
    cfg = arch_config("qwen2", **SMALL, wtype="f32")
    model = Model.random(cfg, seed=1)
    _write(gguf, str(tmp_path / "tied.gguf"), "qwen2", cfg,
           {k: v for k, v in model.weights.items() if k != "output.weight"})
    loaded = load_gguf(str(tmp_path / "tied.gguf"))
    assert loaded.weights["output.weight"][1].tobytes() == \
        model.weights["token_embd.weight"][1].tobytes()


# ---------------------------------------------------------------------------
# held to llama.cpp itself

def _llama_cpp(*args):
    """tests/llama_cpp_ref.py in a child process (llama.cpp's ggml never shares a process
    with ggml 0.10.1's, which other tests load): its JSON answer. Skips without
    llama-cpp-python, unless GGML_PY_REQUIRE_LLAMA_CPP=1."""
    r = subprocess.run([sys.executable, str(HERE / "llama_cpp_ref.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 3 and os.environ.get("GGML_PY_REQUIRE_LLAMA_CPP") != "1":
        pytest.skip("llama-cpp-python is not installed (GGML_PY_REQUIRE_LLAMA_CPP=1 makes "
                    "this a failure)")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("kind,wtype,extra", [
    *[(k, w, {}) for w in ("f32", "f16") for k in KINDS],
    ("qwen3", "f16", {"n_embd_head": 32}),       # heads that do not tile n_embd
    ("gemma3", "f16", {"n_swa": 0}),             # no window: one mask, llama's input
    ("gemma3", "f16", {"swa_pattern": 6}),       # every layer sliding: no global mask
    ("phi3", "f16", {"fused_qkv": False, "n_ctx_orig": 512}),   # separate Q/K/V, short factors
    ("llama-moe", "q8_0", {"n_expert": 8, "n_expert_used": 1}),     # one expert: a cont
    # llama.cpp's default on the CPU: flash attention (-fa on)
    *[(k, "f16", FA) for k in KINDS],
    ("gemma3", "f16", {"n_swa": 0, **FA}),
    ("gemma3", "f16", {"swa_pattern": 6, **FA}),
    ("phi3", "f16", {"fused_qkv": False, "n_ctx_orig": 512, **FA}),
    ("llama-moe", "q8_0", {"n_expert": 8, "n_expert_used": 1, **FA}),
], ids=[*[f"{k}-{w}" for w in ("f32", "f16") for k in KINDS], "qwen3-f16-head32",
        "gemma3-f16-global", "gemma3-f16-all-sliding", "phi3-f16-separate-short",
        "llama-moe-q8_0-k1", *[f"{k}-f16-fa" for k in KINDS], "gemma3-f16-global-fa",
        "gemma3-f16-all-sliding-fa", "phi3-f16-separate-short-fa", "llama-moe-q8_0-k1-fa"])
def test_logits_and_node_counts_match_llama_cpp(tmp_path, kind, wtype, extra):
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, save_gguf
    cfg = small(kind, **{"n_embd": 128, "n_head": 8, "n_layer": 3, "n_ctx": 256, **extra},
                wtype=wtype)
    path = str(tmp_path / f"{kind}-{wtype}.gguf")
    save_gguf(Model.random(cfg, seed=11), path)

    ref = _llama_cpp("logits", path, tmp_path / "theirs.npy", ",".join(map(str, PROMPT)), N_DECODE,
                     fa_flag(cfg.flash_attn))
    pp_nodes, tg_nodes, fed = ref["pp_nodes"], ref["tg_nodes"], ref["fed"]
    theirs = np.load(tmp_path / "theirs.npy")

    cpu = CPUBackend()
    model = load_gguf(path, n_ctx=64, graph="llama.cpp", flash_attn=cfg.flash_attn).place(cpu)
    s = Session(model, [cpu])
    rows = [s.forward(PROMPT)]
    ours_pp = s.graph.n_nodes
    for tok in fed:
        rows.append(s.forward([tok]))
    ours_tg = s.graph.n_nodes
    ours = np.concatenate(rows)
    assert ours.shape == theirs.shape == (len(PROMPT) + N_DECODE, cfg.n_vocab)
    err = nmse(theirs, ours)
    print(f"{kind} {wtype} -fa {fa_flag(cfg.flash_attn)}: NMSE {err:.3g}, graph nodes "
          f"llama.cpp {pp_nodes}/{tg_nodes}, ggml_py {ours_pp}/{ours_tg}")
    assert err <= 1e-4
    assert (ours_pp, ours_tg) == (pp_nodes, tg_nodes) == (llama_cpp_nodes(cfg),) * 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_node_names_and_order_match_llama_cpp(tmp_path, kind, flash_attn):
    """Every node of the prompt graph and of a decode step's graph, in order, with its name
    (views and reshapes named as ggml names them): llama.cpp's scheduler asks its eval
    callback about each node it computes, in graph order. With flash attention too. The
    attention's precision (GGML_PREC_F32 on KQ or on the flash attention) is llama.cpp's
    value too, so ops.PRECS holds ggml.h's numbers."""
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, save_gguf
    cfg = small(kind, n_ctx=256, wtype="f32", flash_attn=flash_attn)
    path = str(tmp_path / f"{kind}.gguf")
    save_gguf(Model.random(cfg, seed=1), path)
    ref = _llama_cpp("names", path, ",".join(map(str, PROMPT[:7])), 6, fa_flag(flash_attn))
    theirs = ref["names"]
    cpu = CPUBackend()
    s = Session(load_gguf(path, n_ctx=64, graph="llama.cpp", flash_attn=flash_attn).place(cpu),
                [cpu])
    ours = []
    for toks in (PROMPT[:6], PROMPT[6:7]):
        s.forward(toks)
        nodes = map(s.graph.node, range(s.graph.n_nodes))
        ours.append([(t.name, t.op, t.op_params) for t in nodes])
    assert [name for name, _, _ in ours[0]] == theirs[0]
    assert [name for name, _, _ in ours[1]] == theirs[1]
    assert len(ours[0]) == llama_cpp_nodes(cfg)
    word = {"MUL_MAT": 0, "FLASH_ATTN_EXT": 3}      # the op_params word of the precision
    for nodes, their_params in zip(ours, ref["op_params"]):
        precs = [(params[word[op]], their_params[i][word[op]])
                 for i, (name, op, params) in enumerate(nodes)
                 if (op == "MUL_MAT" and name.startswith("kq-")) or op == "FLASH_ATTN_EXT"]
        assert precs == [(ops.PRECS["F32"], ops.PRECS["F32"])] * cfg.n_layer


def test_llama_sliding_window_is_full_attention_as_in_llama_cpp(tmp_path, monkeypatch):
    """Mistral-style files carry llama.attention.sliding_window; llama.cpp's llama graph
    never reads it (its llama hparams have no window: every layer attends over the whole
    context), and neither does ggml_py's loader. Held to llama.cpp with a window of 4 over
    a 12-token prompt and 8 decode steps."""
    gguf = pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, read_config, save_gguf
    cfg = arch_config("llama", **{**SMALL, "n_ctx": 256}, wtype="f32")
    add_eps = gguf.GGUFWriter.add_layer_norm_rms_eps

    def add_eps_and_window(self, value):
        add_eps(self, value)
        self.add_sliding_window(4)
    monkeypatch.setattr(gguf.GGUFWriter, "add_layer_norm_rms_eps", add_eps_and_window)
    path = str(tmp_path / "mistral-style.gguf")
    save_gguf(Model.random(cfg, seed=2), path)
    assert gguf.GGUFReader(path).get_field("llama.attention.sliding_window").contents() == 4
    assert read_config(path, graph="llama.cpp") == dataclasses.replace(cfg, graph="llama.cpp")

    ref = _llama_cpp("logits", path, tmp_path / "theirs.npy", ",".join(map(str, PROMPT)), N_DECODE)
    theirs = np.load(tmp_path / "theirs.npy")
    cpu = CPUBackend()
    s = Session(load_gguf(path, n_ctx=64, graph="llama.cpp").place(cpu), [cpu])
    ours = np.concatenate([s.forward(PROMPT)] + [s.forward([t]) for t in ref["fed"]])
    assert nmse(theirs, ours) <= 1e-4
    full = reference_logits(s.model, PROMPT + ref["fed"])      # whole-context attention
    assert nmse(full, theirs) <= 1e-4


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_sliding_cache_cells_are_llama_cpps(tmp_path, kind):
    """The sliding layers' own cache (a window of 232 and ubatches of 24: 256 cells, as
    many as a ubatch needs, so that each takes every cell the window has left) over 280
    prompt tokens and 12 decode steps: before each ubatch, its head and every cell's
    position are those llama.cpp's find_slot logs (LLAMA_KV_CACHE_DEBUG=2), once past its
    size too, where each token takes a cell no later token sees; the logits within NMSE
    1e-4 of llama.cpp's."""
    pytest.importorskip("gguf")
    from ggml_py.models.gguf import load_gguf, save_gguf
    cfg = small(kind, n_ctx=512, n_swa=232, wtype="f16")
    path = str(tmp_path / f"{kind}.gguf")
    save_gguf(Model.random(cfg, seed=4), path)
    prompt = np.random.default_rng(2).integers(0, cfg.n_vocab, 280).tolist()
    ref = _llama_cpp("logits", path, tmp_path / "theirs.npy", ",".join(map(str, prompt)), 12,
                     "off", json.dumps({"n_ctx": 512, "n_batch": 24, "swa_full": False,
                                        "swa_cells": True}))
    cpu = CPUBackend()
    s = Session(load_gguf(path, n_ctx=512, graph="llama.cpp").place(cpu), [cpu], n_ubatch=24)
    assert s.cache.cells_swa == 256
    rows, cells = [], []
    for batch in [prompt[i:i + 24] for i in range(0, len(prompt), 24)] + [[t] for t in ref["fed"]]:
        cells.append([s.cache.swa.head, s.cache.swa.pos.tolist()])
        rows.append(s.forward(batch))
    assert len(cells) == len(ref["swa_cells"]) == 12 + 12
    for i, (ours, theirs) in enumerate(zip(cells, ref["swa_cells"])):
        assert ours == theirs, f"ubatch {i}"
    assert min(cells[-1][1]) > 0           # (every cell taken again at least once)
    assert nmse(np.load(tmp_path / "theirs.npy"), np.concatenate(rows)) <= 1e-4
