"""qwen3 (llama.cpp's llama_model_qwen3 graph, dense): llama's layers with an RMS norm of
each Q and K head (attn_q_norm, attn_k_norm) before NEOX rope."""

from __future__ import annotations

from ggml_py.models.arch.blocks import GraphContext, build_decoder, name

ARCH = "qwen3"


def attention(gc: GraphContext, p: str, cur, inp_pos, inp_attn, kq_scale: float, il: int):
    """Q and K normed per head then roped, V, attention over the cache."""
    W = gc.W
    q, k, v = gc.build_qkv(p, cur, il)
    q = name(gc.build_norm(q, W[p + "attn_q_norm.weight"], il), "Qcur_normed", il)
    q = gc.rope(q, inp_pos)
    k = name(gc.build_norm(k, W[p + "attn_k_norm.weight"], il), "Kcur_normed", il)
    k = gc.rope(k, inp_pos)
    name(q, "Qcur", il)
    name(k, "Kcur", il)
    return gc.build_attn(inp_attn, W[p + "attn_output.weight"], None, q, k, v, kq_scale, il)


def build(gc: GraphContext):
    """The logits tensor of qwen3's graph, built into gc.graph."""
    return build_decoder(gc, attention)
