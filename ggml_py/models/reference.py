"""A plain-numpy forward pass of the transformer models, for testing the graphs.

Written from the models' definitions, not from ggml's kernels: float64 throughout,
no KV cache (the whole sequence at once), heads and experts looped over in the
obvious way. It reads the same (dequantised) weights as the graph, so a graph and
this reference differ only by the graph's float32 arithmetic and its f16/q8_0
rounding of activations and cache cells.
"""

from __future__ import annotations

import numpy as np

from ggml_py._core import instance_arg
from ggml_py.models.arch.gemma2 import query_scale
from ggml_py.models.graph import token_ids
from ggml_py.models.model import Model


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, n_rot, base, freq_scale, neox, factors=None, mscale=1.0):
    """x (T, heads, D): rotate the first n_rot dims by position; NORMAL rotates adjacent
    pairs (2i, 2i+1), NEOX the halves (i, i + n_rot/2). factors divide each pair's
    frequency; mscale (rope's attn_factor) scales the rotated pairs."""
    i = np.arange(n_rot // 2)
    theta = pos[:, None] * freq_scale * base ** (-2.0 * i / n_rot)      # (T, n_rot/2)
    if factors is not None:
        theta = theta / factors
    c, s = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    out = x.copy()
    a, b = (i, i + n_rot // 2) if neox else (2 * i, 2 * i + 1)
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., a] * s + x[..., b] * c
    return out


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu(x):
    """GELU, tanh form (ggml's GELU and GEGLU)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def _swiglu(x, gate, up, down, act=_silu):
    return (act(x @ gate.T) * (x @ up.T)) @ down.T


def _softcap(x, cap):
    return cap * np.tanh(x / cap) if cap else x


def _moe(cfg, x, w):
    """Routed experts for every token of x (T, E); w(name) gives a layer weight."""
    logits = x @ w("ffn_gate_inp").T                         # (T, n_expert)
    gate, up, down = w("ffn_gate_exps"), w("ffn_up_exps"), w("ffn_down_exps")
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        if cfg.ffn == "moe_dense":
            chosen = np.arange(cfg.n_expert)
            weights = _softmax(logits[t])
        else:
            chosen = np.argsort(-logits[t], kind="stable")[: cfg.n_expert_used]
            if cfg.ffn == "moe_topk":
                weights = _softmax(logits[t, chosen])
            else:
                weights = _softmax(logits[t])[chosen]
        for e, g in zip(chosen, weights):
            out[t] += g * _swiglu(x[t], gate[e], up[e], down[e])
    if cfg.ffn == "moe_shared":
        out += _swiglu(x, w("ffn_gate_shexp"), w("ffn_up_shexp"), w("ffn_down_shexp"))
    return out


def reference_logits(model: Model, tokens) -> np.ndarray:
    """Logits (n_tokens, n_vocab) of a causal pass over `tokens` from position 0."""
    cfg = instance_arg(model, Model, "model").config
    tokens = token_ids(tokens, cfg)
    T, H, Hkv, D = tokens.size, cfg.n_head, cfg.n_head_kv, cfg.head_dim
    V = {name: model.values(name).astype(np.float64) for name in model.weights}
    pos = np.arange(T, dtype=np.float64)
    neox = cfg.rope_neox
    x = V["token_embd.weight"][tokens]
    gemma = cfg.post_norms      # gemma: scaled embeddings, Q scaled, post-norms, GEGLU
    if gemma:
        x = x * np.sqrt(cfg.n_embd)
    q_scale = query_scale(cfg, {"gemma2": 46}.get(cfg.arch, 62)) if gemma else 1 / np.sqrt(D)
    causal = np.tril(np.ones((T, T), dtype=bool))
    window = causal & (pos[:, None] - pos[None, :] < cfg.n_swa)
    for il in range(cfg.n_layer):
        def w(n, il=il):
            return V[f"blk.{il}.{n}.weight"]
        def proj(part, heads, il=il):
            if cfg.fused_qkv:                            # phi3: rows of Q, then K, then V
                start = {"q": 0, "k": H * D, "v": (H + Hkv) * D}[part]
                y = h @ w("attn_qkv")[start:start + heads * D].T
            else:
                y = h @ w(f"attn_{part}").T
            if cfg.attn_bias:                            # qwen2's Q, K and V biases
                y = y + V[f"blk.{il}.attn_{part}.bias"]
            y = y.reshape(T, heads, D)
            if cfg.qk_norm and part != "v":              # qwen3's per-head Q/K norms
                y = _rms_norm(y, w(f"attn_{part}_norm"), cfg.eps)
            return y

        def post_norm(y, n, il=il):
            return _rms_norm(y, w(n), cfg.eps) if gemma else y

        h = _rms_norm(x, w("attn_norm"), cfg.eps)
        base, scale = cfg.rope_base_scale(il)
        factors = V[cfg.rope_factors_name] if cfg.rope_factors_name else None
        rope = (cfg.n_rot_, base, scale, neox, factors, cfg.rope_attn_factor)
        q = _rope(proj("q", H), pos, *rope)
        k = _rope(proj("k", Hkv), pos, *rope)
        v = proj("v", Hkv)
        mask = window if cfg.is_swa(il) else causal
        att = np.empty((T, H, D))
        for hd in range(H):
            g = hd // (H // Hkv)                         # the KV head of this query head
            s = _softcap(q[:, hd] * q_scale @ k[:, g].T, cfg.attn_softcap)
            s = np.where(mask, s, -np.inf)
            att[:, hd] = _softmax(s) @ v[:, g]
        x = x + post_norm(att.reshape(T, H * D) @ w("attn_output").T, "post_attention_norm")
        h = _rms_norm(x, w("ffn_norm"), cfg.eps)
        if cfg.fused_up:                                 # phi3: gate and up in one matrix
            gate, up = np.split(w("ffn_up"), 2)
            x = x + _swiglu(h, gate, up, w("ffn_down"))
        elif cfg.ffn == "dense":
            act = _gelu if gemma else _silu
            x = x + post_norm(_swiglu(h, w("ffn_gate"), w("ffn_up"), w("ffn_down"), act),
                              "post_ffw_norm")
        else:
            x = x + _moe(cfg, h, w)
    x = _rms_norm(x, V["output_norm.weight"], cfg.eps)
    return _softcap(x @ V["output.weight"].T, cfg.final_softcap)
