"""phi3 (llama.cpp's llama_model_phi3 graph, dense; llama.cpp turns a file's sliding window
off): Q, K and V from one fused matrix (or separate ones), NEOX rope over n_rot channels
of each head with the file's rope factors (long past the training context, else short),
Q scaled before attention, a fused gate/up matrix (SwiGLU of its halves)."""

from __future__ import annotations

from ggml_py import ops
from ggml_py._core import Tensor
from ggml_py.models.arch.blocks import GraphContext, name

ARCH = "phi3"


def build(gc: GraphContext) -> Tensor:
    """The logits tensor of phi3's graph, built into gc.graph."""
    cfg, W, ctx = gc.cfg, gc.W, gc.ctx
    q_scale = gc.build_inp_attn_scale()
    inpL, inp_pos, inp_attn, inp_out_ids = gc.build_inputs()
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        residual = inpL
        cur = name(gc.build_norm(inpL, W[p + "attn_norm.weight"], il), "attn_norm", il)
        q, k, v = gc.build_qkv(p, cur, il)
        q = name(gc.rope(q, inp_pos, il), "Qcur", il)
        k = name(gc.rope(k, inp_pos, il), "Kcur", il)
        q = name(ops.scale(ctx, q, q_scale), "Qcur", il)
        cur = gc.build_attn(inp_attn, W[p + "attn_output.weight"], None, q, k, v, 1.0, il)
        if il == cfg.n_layer - 1:
            cur = ops.get_rows(ctx, cur, inp_out_ids)
            residual = ops.get_rows(ctx, residual, inp_out_ids)
        residual = ops.add(ctx, cur, residual)
        cur = name(gc.build_norm(residual, W[p + "ffn_norm.weight"], il), "ffn_norm", il)
        cur = name(gc.build_ffn_fused_swiglu(W[p + "ffn_up.weight"], W[p + "ffn_down.weight"],
                                             cur, il), "ffn_out", il)
        inpL = name(ops.add(ctx, residual, cur), "l_out", il)
    cur = name(gc.build_norm(inpL, W["output_norm.weight"], -1), "result_norm")
    return name(gc.build_lora_mm(W["output.weight"], cur), "result_output")
