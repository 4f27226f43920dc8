"""qwen3moe (llama.cpp's llama_model_qwen3moe graph): qwen3's attention (per-head Q/K
norms, NEOX rope) and routed experts in place of the dense FFN: softmax gating, top-k,
the chosen probabilities renormalised (GraphContext.build_moe_ffn)."""

from __future__ import annotations

from ggml_py.models.arch.blocks import GraphContext, build_decoder
from ggml_py.models.arch.qwen3 import attention

ARCH = "qwen3moe"


def build(gc: GraphContext):
    """The logits tensor of qwen3moe's graph, built into gc.graph."""
    return build_decoder(gc, attention)
