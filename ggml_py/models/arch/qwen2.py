"""qwen2 (llama.cpp's llama_model_qwen2 graph): llama's layers with Q, K and V biases and
NEOX rope (an output bias, which llama.cpp allows, is refused by the loader so far)."""

from __future__ import annotations

from ggml_py.models.arch.blocks import GraphContext, build_decoder, name

ARCH = "qwen2"


def attention(gc: GraphContext, p: str, cur, inp_pos, inp_attn, kq_scale: float, il: int):
    """Q, K (roped) and V with their biases, attention over the cache."""
    q, k, v = gc.build_qkv(p, cur, il)          # (+ the biases)
    q = gc.rope(q, inp_pos)
    k = gc.rope(k, inp_pos)
    name(q, "Qcur", il)
    name(k, "Kcur", il)
    return gc.build_attn(inp_attn, gc.W[p + "attn_output.weight"], None, q, k, v, kq_scale, il)


def build(gc: GraphContext):
    """The logits tensor of qwen2's graph, built into gc.graph."""
    return build_decoder(gc, attention)
