"""gemma3 (llama.cpp's llama_model_gemma3 graph, text): gemma2's layers with an RMS norm
of each Q and K head before rope, no attention soft-cap, the logit soft-cap only when the
file sets one; with a sliding window (then five sliding layers to a global one by
default, the sliding ones with their own rope base, unscaled) or without (one mask)."""

from __future__ import annotations

from ggml_py._core import Tensor
from ggml_py.models.arch.blocks import GraphContext
from ggml_py.models.arch.gemma2 import build_gemma, query_scale

ARCH = "gemma3"


def build(gc: GraphContext) -> Tensor:
    """The logits tensor of gemma3's graph, built into gc.graph."""
    return build_gemma(gc, query_scale(gc.cfg, 62), qk_norm=True, ffn_post_norm_il=True)
