"""llama (llama.cpp's llama_model_llama graph, dense FFN): RMS norms, Q/K/V projections
(with biases when the file has them), NORMAL rope, attention over the KV cache, SwiGLU
feed-forward; the last layer keeps only the output rows (get_rows of the output ids)
before its residual add."""

from __future__ import annotations

from ggml_py.models.arch.blocks import GraphContext, build_decoder, name

ARCH = "llama"


def attention(gc: GraphContext, p: str, cur, inp_pos, inp_attn, kq_scale: float, il: int):
    """Q, K (roped) and V of the normed input, attention over the cache, attn_out."""
    q, k, v = gc.build_qkv(p, cur, il)
    q = name(gc.rope(q, inp_pos), "Qcur", il)
    k = name(gc.rope(k, inp_pos), "Kcur", il)
    cur = gc.build_attn(inp_attn, gc.W[p + "attn_output.weight"],
                        gc.W.get(p + "attn_output.bias"), q, k, v, kq_scale, il)
    return name(cur, "attn_out", il)


def build(gc: GraphContext):
    """The logits tensor of llama's graph, built into gc.graph."""
    return build_decoder(gc, attention)
