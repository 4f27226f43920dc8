"""Computable transformer models in ggml's graph form: a llama and MoE variants.

The graphs are built the way llama.cpp builds them (llm_build_llama and its MoE
helper), with the op builders of ggml_py.ops:

  * attention: GQA heads, rope_ext, scores soft_max_ext'ed with a causal mask,
    a KV cache per layer written with cpy into views of the cache tensors (K row
    per cell; V stored transposed, one row per channel) and read back through
    strided views (llama.cpp's graphs, models.arch, also with flash attention:
    config.flash_attn caches V a row per cell, one FLASH_ATTN_EXT per layer);
  * FFN kinds (FFN_KINDS):
      dense      llama SwiGLU;
      moe_dense  every expert runs, weighted by a softmax over all router logits;
      moe_topk   Mixtral: the top-k experts, weighted by a softmax over their logits;
      moe_shared DeepSeek-MoE: top-k routed experts weighted by their softmax
                 probabilities (not renormalised) plus always-on shared experts.
    The MoE forms share one expert path (mul_mat_id over the selected experts).

Weights are kept in their stored form (`Model.weights`: name -> (ggml type,
numpy array: values for plain types, row bytes for block types)) and placed in
backend buffers by `Model.place` (one weights buffer per layer and backend, so
layers can be offloaded). `Session` owns a KV cache and a Scheduler and runs
prompt and decode steps: build graph, alloc_graph, set inputs, compute, read
logits, as llama_decode does.

This module gathers them; the code lives by concern:

    config.py   ModelConfig, llama_config, moe_config, arch_config, weight shapes, graph_size
    arch/       llama.cpp's graphs per architecture (llama, qwen2, qwen3, gemma2, gemma3,
                phi3) over shared blocks; a config with graph_kind 'llama.cpp' is built there
    model.py    Model (weights in backend buffers), KVCache, tensor_values
    graph.py    build_forward (the graph of one decode call), Forward, token_ids,
                step_inputs (what changes from step to step), padded_kv
    decode_graph.py  DecodeGraph: the one-token graph kept across decode steps
    session.py  Session (prompt and decode steps over a Scheduler), StepStats, SplitStats
"""

from ggml_py.models.config import (FFN_KINDS, MOE_DEFAULTS, WEIGHT_TYPES, ModelConfig,
                                   arch_config, graph_size, layer_of, llama_config, moe_config,
                                   weight_shapes)
from ggml_py.models.graph import Forward, build_forward, padded_kv, step_inputs, token_ids
from ggml_py.models.model import KVCache, Model, random_weights, tensor_values, to_stored
from ggml_py.models.session import Session, SplitStats, StepStats

__all__ = ["FFN_KINDS", "MOE_DEFAULTS", "WEIGHT_TYPES", "ModelConfig", "arch_config",
           "graph_size", "layer_of",
           "llama_config", "moe_config", "weight_shapes", "Forward", "build_forward",
           "token_ids", "padded_kv", "step_inputs", "KVCache", "Model", "random_weights",
           "tensor_values", "to_stored", "Session", "SplitStats", "StepStats"]
