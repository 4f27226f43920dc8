"""llama (llama.cpp's llama_model_llama graph, dense FFN): RMS norms, Q/K/V projections,
NORMAL rope, attention over the KV cache, SwiGLU feed-forward; the last layer keeps
only the output rows (get_rows of the output ids) before its residual add."""

from __future__ import annotations

from ggml_py import ops
from ggml_py.models.arch.blocks import GraphContext, name

ARCH = "llama"


def build(gc: GraphContext) -> object:
    """The logits tensor of llama's graph, built into gc.graph."""
    cfg, W, ctx = gc.cfg, gc.W, gc.ctx
    inpL = gc.build_inp_embd(W["token_embd.weight"])
    inp_pos = gc.build_inp_pos()
    inp_attn = gc.build_attn_inp_kv()
    kq_scale = gc.build_inp_attn_scale()
    inp_out_ids = gc.build_inp_out_ids()
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        inpSA = inpL
        cur = name(gc.build_norm(inpL, W[p + "attn_norm.weight"], il), "attn_norm", il)
        q, k, v = gc.build_qkv(p, cur, il)
        q = name(gc.rope(q, inp_pos), "Qcur", il)
        k = name(gc.rope(k, inp_pos), "Kcur", il)
        cur = gc.build_attn(inp_attn, W[p + "attn_output.weight"], W.get(p + "attn_output.bias"),
                            q, k, v, kq_scale, il)
        name(cur, "attn_out", il)
        if il == cfg.n_layer - 1:
            cur = ops.get_rows(ctx, cur, inp_out_ids)
            inpSA = ops.get_rows(ctx, inpSA, inp_out_ids)
        ffn_inp = name(ops.add(ctx, cur, inpSA), "ffn_inp", il)
        cur = name(gc.build_norm(ffn_inp, W[p + "ffn_norm.weight"], il), "ffn_norm", il)
        cur = gc.build_ffn_swiglu(W[p + "ffn_up.weight"], W[p + "ffn_gate.weight"],
                                  W[p + "ffn_down.weight"], cur, il)
        name(cur, "ffn_out", il)
        inpL = name(ops.add(ctx, cur, ffn_inp), "l_out", il)
    cur = name(gc.build_norm(inpL, W["output_norm.weight"], -1), "result_norm")
    cur = name(gc.build_lora_mm(W["output.weight"], cur), "result_output")
    return cur
