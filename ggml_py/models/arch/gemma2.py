"""gemma2 (llama.cpp's llama_model_gemma2 graph, always with its two attention inputs):
embeddings scaled by sqrt(n_embd); sliding-window layers alternating with global ones;
Q scaled before attention (not the scores); attention scores soft-capped; RMS norms
after attention and after the FFN as well as before; a GELU-gated FFN; the logits
soft-capped; the output head is the token embedding (duplicated, as llama.cpp does).

`build_gemma` is the layer stack gemma2 and gemma3 share (models.arch.gemma3 adds Q/K
norms and makes the window and the final soft-cap optional)."""

from __future__ import annotations

import math

from ggml_py import ops
from ggml_py._core import Tensor
from ggml_py.models.arch.blocks import GraphContext, name
from ggml_py.models.config import ModelConfig

ARCH = "gemma2"


def query_scale(cfg: ModelConfig, n_layer_27b: int) -> float:
    """The scale of Q before attention (llama.cpp's f_attention_scale): 1 / sqrt(head
    size), except for the 27B models (n_layer_27b layers), whose is 1 / sqrt(n_embd /
    n_head) (gemma_pytorch's query_pre_attn_scalar)."""
    width = cfg.n_embd // cfg.n_head if cfg.n_layer == n_layer_27b else cfg.head_dim
    return 1.0 / math.sqrt(width)


def build_gemma(gc: GraphContext, q_scale: float, qk_norm: bool,
                ffn_post_norm_il: bool) -> Tensor:
    """The gemma layer stack and head; returns the logits tensor. qk_norm: RMS-norm each
    Q and K head before rope (gemma3); ffn_post_norm_il: name the FFN's post-norm per
    layer (gemma3) rather than once for all (gemma2's `ffn_post_norm`)."""
    cfg, W, ctx = gc.cfg, gc.W, gc.ctx
    inpL, inp_pos, inp_attn, inp_out_ids = gc.build_inputs()
    inpL = name(ops.scale(ctx, inpL, math.sqrt(cfg.n_embd)), "inp_scaled")
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        cur = name(gc.build_norm(inpL, W[p + "attn_norm.weight"], il), "attn_norm", il)
        q, k, v = gc.build_qkv(p, cur, il)
        if qk_norm:
            q = name(gc.build_norm(q, W[p + "attn_q_norm.weight"], il), "Qcur_normed", il)
        q = gc.rope(q, inp_pos, il)
        if qk_norm:
            k = name(gc.build_norm(k, W[p + "attn_k_norm.weight"], il), "Kcur_normed", il)
        k = gc.rope(k, inp_pos, il)
        name(q, "Qcur", il)
        name(k, "Kcur", il)
        q = ops.scale(ctx, q, q_scale)
        cur = gc.build_attn(inp_attn, W[p + "attn_output.weight"], None, q, k, v, 1.0, il)
        if il == cfg.n_layer - 1:
            cur = ops.get_rows(ctx, cur, inp_out_ids)
            inpL = ops.get_rows(ctx, inpL, inp_out_ids)
        cur = gc.build_norm(cur, W[p + "post_attention_norm.weight"], il)
        name(cur, "attn_post_norm", il)
        sa_out = name(ops.add(ctx, cur, inpL), "sa_out", il)
        cur = name(gc.build_norm(sa_out, W[p + "ffn_norm.weight"], il), "ffn_norm", il)
        cur = gc.build_ffn_par(W[p + "ffn_up.weight"], W[p + "ffn_gate.weight"],
                               W[p + "ffn_down.weight"], cur, "geglu", il)
        name(cur, "ffn_out", il)
        cur = gc.build_norm(cur, W[p + "post_ffw_norm.weight"], -1)
        name(cur, "ffn_post_norm", il if ffn_post_norm_il else -1)
        inpL = name(ops.add(ctx, cur, sa_out), "l_out", il)
    cur = name(gc.build_norm(inpL, W["output_norm.weight"], -1), "result_norm")
    logits = gc.build_lora_mm(W["output.weight"], cur)
    if cfg.final_softcap:
        return gc.softcap(logits, cfg.final_softcap, (None, None, "result_output"))
    return name(logits, "result_output")


def build(gc: GraphContext) -> Tensor:
    """The logits tensor of gemma2's graph, built into gc.graph."""
    return build_gemma(gc, query_scale(gc.cfg, 46), qk_norm=False, ffn_post_norm_il=False)
