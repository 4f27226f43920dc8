"""qwen3 (llama.cpp's llama_model_qwen3 graph, dense): llama's layers with an RMS norm of
each Q and K head (attn_q_norm, attn_k_norm) before NEOX rope."""

from __future__ import annotations

from ggml_py import ops
from ggml_py.models.arch.blocks import GraphContext, name

ARCH = "qwen3"


def build(gc: GraphContext) -> object:
    """The logits tensor of qwen3's graph, built into gc.graph."""
    cfg, W, ctx = gc.cfg, gc.W, gc.ctx
    inpL = gc.build_inp_embd(W["token_embd.weight"])
    inp_pos = gc.build_inp_pos()
    inp_attn = gc.build_attn_inp_kv()
    inp_out_ids = gc.build_inp_out_ids()
    kq_scale = gc.build_inp_attn_scale()
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        inpSA = inpL
        cur = name(gc.build_norm(inpL, W[p + "attn_norm.weight"], il), "attn_norm", il)
        q, k, v = gc.build_qkv(p, cur, il)
        q = name(gc.build_norm(q, W[p + "attn_q_norm.weight"], il), "Qcur_normed", il)
        q = gc.rope(q, inp_pos)
        k = name(gc.build_norm(k, W[p + "attn_k_norm.weight"], il), "Kcur_normed", il)
        k = gc.rope(k, inp_pos)
        name(q, "Qcur", il)
        name(k, "Kcur", il)
        cur = gc.build_attn(inp_attn, W[p + "attn_output.weight"], None, q, k, v, kq_scale, il)
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
    return name(gc.build_lora_mm(W["output.weight"], cur), "result_output")
