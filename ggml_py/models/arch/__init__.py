"""Architectures as llama.cpp builds them, one module each over the shared blocks of
models.arch.blocks (llama.cpp's llm_graph_context): llama, qwen2, qwen3, qwen3moe,
gemma2, gemma3 and phi3 so far.

ARCHITECTURES maps a GGUF general.architecture name to its module's `build(gc)`;
`build_forward` is models.graph.build_forward for a config whose graph_kind is
'llama.cpp'. What each architecture brings over llama:

    llama     RMS norms, Q/K/V projections, NORMAL rope, SwiGLU (attn_output bias if
              any); Mixtral-style experts when the file has them
    qwen2     + Q, K and V biases; NEOX rope; output bias if any
    qwen3     + RMS norms of each Q and K head (attn_q_norm, attn_k_norm); NEOX rope
    qwen3moe  qwen3's attention; top-k experts with softmax gating and normalised weights
    gemma2    + embeddings scaled by sqrt(n_embd), sliding-window layers alternating with
                global ones (two masks), Q scaled before attention, attention and final
                logits soft-capped, post-attention and post-FFN norms, GELU-gated FFN,
                the token embedding as output head; NEOX rope
    gemma3    + (over gemma2) RMS norms of each Q and K head; no attention soft-cap; the
                window, the logit soft-cap and the output head optional; the sliding
                layers' own rope base
    phi3      + fused QKV (or separate) and gate/up matrices, Q scaled before attention,
                rope over part of each head with rope factors; NEOX rope
"""

from __future__ import annotations

from ggml_py.errors import ModelError, UnknownNameError
from ggml_py.models.arch import gemma2, gemma3, llama, phi3, qwen2, qwen3, qwen3moe
from ggml_py.models.arch.blocks import GraphContext

ARCHITECTURES = {m.ARCH: m.build for m in (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3)}


def get_builder(arch: str):
    """The graph builder of architecture `arch` (a GGUF general.architecture name)."""
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise UnknownNameError(f"unknown architecture {arch!r}; known: "
                               f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def build_forward(model, cache, tokens, n_past: int | None = None, logits: str = "all"):
    """llama.cpp's graph of one llama_decode call for the model's architecture: `tokens`
    at positions n_past.. (default: the cache's), K/V written with set_rows at the cell
    ids the inputs give (so a decode graph serves the next position too), logits of
    every row ('all') or of the last one ('last'); with flash attention when the config
    says so (llama.cpp's -fa on)."""
    from ggml_py.models.graph import Forward, check_step, padded_kv, step_inputs
    tokens, n_past = check_step(model, cache, tokens, n_past)
    cfg, T = model.config, int(tokens.size)
    if logits not in ("all", "last"):
        raise ModelError("logits must be 'all' or 'last'")
    n_kv = padded_kv(cfg, n_past, T)
    swa = cache.swa_slot(n_past, T) if cfg.iswa else None
    data = step_inputs(cfg, tokens, n_past, n_kv, kv_rows=True, swa=swa)
    data["inp_out_ids"] = list(range(T)) if logits == "all" else [T - 1]
    n_out = len(data["inp_out_ids"])
    gc = GraphContext(cfg, model.tensors, cache, T, n_past, n_kv, n_out, data,
                      flash_attn=cfg.flash_attn, n_kv_swa=swa.n_kv if swa else None)
    out = get_builder(cfg.arch)(gc).set_output()
    gc.expand(out)
    return Forward(gc.graph, gc.ctx, out, gc.inputs, T, n_past, n_kv, n_out, swa)


__all__ = ["ARCHITECTURES", "GraphContext", "build_forward", "get_builder"]
