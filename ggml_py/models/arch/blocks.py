"""The blocks llama.cpp's architectures are built from (its llm_graph_context): input
embeddings, positions, the KV-cache attention inputs and output ids, norms, the Q/K/V
projections, attention over the KV cache and the feed-forward network.

Each block adds the ops llama.cpp's adds, in its order and with its names (a name
`x` of layer il is `x-il`, as llama.cpp's graph callback writes it), so that an
architecture written over them (models.arch.llama, qwen2, qwen3) gives llama.cpp's
graph node for node: the same node count for the same batch, and the same order.
By default this is llama.cpp's graph without flash attention (its `-fa off`): the
scores are a mul_mat, soft_max_ext'ed with the causal mask, and V is cached transposed.
With `flash_attn` (its `-fa on`), V is cached row by row like K, the mask is f16 and
one FLASH_ATTN_EXT per layer reads them. `v_trans` False without flash attention is
llama.cpp's -fa auto turned off: V cached by rows still, copied out transposed (v_cont)
for the kqv product.

The inputs keep ggml_py's names (inp_tokens, inp_pos, kq_mask, inp_k_idxs,
inp_v_idxs, inp_out_ids; the sliding layers' kq_mask_swa, inp_k_idxs_swa and
inp_v_idxs_swa), which models.decode_graph rewrites between decode steps.
"""

from __future__ import annotations

import math

import numpy as np

from ggml_py import ops, quants
from ggml_py._core import Context, Graph, Tensor, row_size, type_size
from ggml_py.models.config import ModelConfig, graph_size


def _name(t: Tensor, name: str, il: int = -1) -> Tensor:
    """llama.cpp's cb(t, name, il): `name-il` inside a layer, `name` outside."""
    t.name = f"{name}-{il}" if il >= 0 else name
    return t


def _stored(t: Tensor, dst: Tensor) -> Tensor:
    """A set_rows result named as ggml names it: a view of its destination."""
    t.name = f"{dst.name} (view)"
    return t


class GraphContext:
    """One graph under construction (llama.cpp's llm_graph_context): the model's config
    and weights, the cache, the batch, the graph and its inputs.

    data: {input name: values} of the step (graph.step_inputs with kv_rows). n_kv_swa:
    the cells the sliding layers read (their own cache's; default n_kv). n_stream: the
    sequences of the batch, each attending over its own stream of the cache (llama.cpp's
    non-unified KV cache with --parallel; the batch's tokens split evenly between them).
    v_trans: whether V is cached transposed (default: without flash attention)."""

    def __init__(self, cfg: ModelConfig, weights: dict, cache, n_tokens: int, n_past: int,
                 n_kv: int, n_outputs: int, data: dict, embd_input: bool = False,
                 flash_attn: bool = False, n_kv_swa: int | None = None,
                 n_stream: int = 1, v_trans: bool | None = None) -> None:
        self.cfg = cfg
        self.W = weights
        self.cache = cache
        self.n_tokens = n_tokens
        self.n_past = n_past
        self.n_kv = n_kv
        self.n_kv_swa = n_kv if n_kv_swa is None else n_kv_swa    # the sliding layers'
        self.n_stream = n_stream
        self.n_outputs = n_outputs
        self.data = data
        self.embd_input = embd_input
        self.flash_attn = flash_attn
        self.v_trans = not flash_attn if v_trans is None else v_trans
        self.ctx = Context(f"{cfg.name}.forward")
        self.graph = Graph(graph_size(cfg))
        self.inputs: list = []          # [(Tensor, numpy values)]

    # -- inputs ------------------------------------------------------------

    def input(self, type_name: str, ne, name: str) -> Tensor:
        """A graph input named `name`, its values taken from the step's data."""
        t = ops.new_tensor(self.ctx, type_name, ne, name=name).set_input()
        values = np.ascontiguousarray(self.data[name], dtype=quants.PLAIN_DTYPES[type_name])
        self.inputs.append((t, values))
        return t

    def expand(self, t: Tensor) -> Tensor:
        """ggml_build_forward_expand(gf, t)."""
        self.graph.build_forward_expand(t)
        return t

    def build_inp_embd(self, tok_embd: Tensor) -> Tensor:
        """The token embeddings (get_rows of the batch's ids), expanded at once. With
        `embd_input`, llama.cpp's other input beside them too: the embeddings of a batch
        given as vectors (inp_embd), a leaf no node reads in a batch of tokens, which the
        scheduler and allocator still give memory (what planning must count)."""
        tokens = self.input("i32", (self.n_tokens,), "inp_tokens")
        embd = self.expand(_name(ops.get_rows(self.ctx, tok_embd, tokens), "embd"))
        if self.embd_input:
            self.expand(self.input("f32", (self.cfg.n_embd, self.n_tokens), "inp_embd"))
        return embd

    def build_inp_pos(self) -> Tensor:
        """The batch's positions."""
        return self.input("i32", (self.n_tokens,), "inp_pos")

    def build_attn_inp_kv(self) -> dict:
        """The KV-cache attention inputs, per kind of layer ('base': the global layers,
        'swa': the sliding ones): the cell ids K and V are written at and the mask over
        the cells attention reads. A model with a sliding window has llama.cpp's kv_iswa
        inputs, a set for each of its two caches (the sliding layers' mask and cells are
        their own: n_kv_swa), and the global set only if a layer is global."""
        cfg, T, G, ns = self.cfg, self.n_tokens, self.cfg.n_embd_gqa, self.n_stream
        mask_type = "f16" if self.flash_attn else "f32"     # (FLASH_ATTN_EXT's mask is f16)

        def inputs(suffix: str, n_kv: int) -> dict:
            return {"k_idxs": self.input("i64", (T,), f"inp_k_idxs{suffix}"),
                    # a cell per token, or (V transposed) per channel and token
                    "v_idxs": self.input("i64", (T * G if self.v_trans else T,),
                                         f"inp_v_idxs{suffix}"),
                    "kq_mask": self.input(mask_type, (n_kv, T // ns, 1, ns),
                                          f"kq_mask{suffix}")}
        inp = {}
        if len(cfg.swa_layers) < cfg.n_layer:
            inp["base"] = inputs("", self.n_kv)
        if cfg.iswa:
            inp["swa"] = inputs("_swa", self.n_kv_swa)
        return inp

    def build_inp_out_ids(self) -> Tensor:
        """The ids of the rows whose logits are computed (llama.cpp always has them)."""
        return self.input("i32", (self.n_outputs,), "inp_out_ids")

    def build_inputs(self) -> tuple[Tensor, Tensor, dict, Tensor]:
        """(token embeddings, positions, KV attention inputs, output ids): what every
        builder starts with."""
        inpL = self.build_inp_embd(self.W["token_embd.weight"])
        return inpL, self.build_inp_pos(), self.build_attn_inp_kv(), self.build_inp_out_ids()

    # -- blocks ------------------------------------------------------------

    def build_norm(self, cur: Tensor, weight: Tensor | None, il: int) -> Tensor:
        """RMS norm, times its weight (build_norm with LLM_NORM_RMS)."""
        cur = ops.rms_norm(self.ctx, cur, self.cfg.eps)
        if weight is not None:
            _name(cur, "norm", il)
            cur = ops.mul(self.ctx, cur, weight)
        return cur

    def build_lora_mm(self, w: Tensor, cur: Tensor) -> Tensor:
        """w @ cur (no adapters here)."""
        return ops.mul_mat(self.ctx, w, cur)

    def build_qkv(self, p: str, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Separate Q, K and V projections (with their biases when the model has them),
        reshaped to [head, heads, tokens]; or views of a fused QKV projection."""
        cfg, W, T, D = self.cfg, self.W, self.n_tokens, self.cfg.head_dim
        if cfg.fused_qkv:
            return self.build_qkv_fused(W[f"{p}attn_qkv.weight"], cur, il)
        out = []
        for part, heads in (("q", cfg.n_head), ("k", cfg.n_head_kv), ("v", cfg.n_head_kv)):
            label = part.upper() + "cur"
            t = _name(self.build_lora_mm(W[f"{p}attn_{part}.weight"], cur), label, il)
            if cfg.attn_bias:
                t = _name(ops.add(self.ctx, t, W[f"{p}attn_{part}.bias"]), label, il)
            out.append(t)
        q, k, v = (_name(ops.reshape_3d(self.ctx, t, D, h, T), lbl, il) for t, h, lbl in
                   zip(out, (cfg.n_head, cfg.n_head_kv, cfg.n_head_kv), ("Qcur", "Kcur", "Vcur")))
        return q, k, v

    def build_qkv_fused(self, wqkv: Tensor, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K and V as [head, heads, tokens] views of one projection (build_qkv's fused
        path): Q's rows first, then K's, then V's."""
        cfg, T, D = self.cfg, self.n_tokens, self.cfg.head_dim
        qkv = _name(self.build_lora_mm(wqkv, cur), "wqkv", il)
        out, offset = [], 0
        for heads, label in ((cfg.n_head, "Qcur"), (cfg.n_head_kv, "Kcur"),
                             (cfg.n_head_kv, "Vcur")):
            out.append(_name(ops.view_3d(self.ctx, qkv, D, heads, T, row_size(qkv.type, D),
                                         qkv.nb[1], row_size(qkv.type, offset)), label, il))
            offset += D * heads
        q, k, v = out
        return q, k, v

    def rope(self, t: Tensor, pos: Tensor, il: int = -1) -> Tensor:
        """ggml_rope_ext of a [head, heads, tokens] tensor with the model's rope (layer
        il's frequencies: a sliding layer may have its own; the rope factors and
        attn_factor when the model has them)."""
        cfg = self.cfg
        base, scale = cfg.rope_base_scale(il)
        factors = None
        if cfg.rope_factors_name:       # (layer il's copy where the weights hold one)
            factors = self.W.get(f"blk.{il}.{cfg.rope_factors_name}",
                                 self.W[cfg.rope_factors_name])
        return ops.rope_ext(self.ctx, t, pos, factors, cfg.n_rot_, cfg.rope_mode, cfg.n_ctx,
                            base, scale, 0.0, cfg.rope_attn_factor, 32.0, 1.0)

    def build_attn(self, inp: dict, wo: Tensor, wo_b: Tensor | None, q: Tensor, k: Tensor,
                   v: Tensor, kq_scale: float, il: int) -> Tensor:
        """Attention with the KV cache (build_attn over llm_graph_input_attn_kv): this
        batch's K and V stored with set_rows, the scores over the cache's n_kv cells, the
        output projection. A sliding layer writes and reads through the sliding inputs,
        over its own cells. With streams, each sequence reads its own (K and V are [...,
        cells, streams]), and the cell ids written are over all of them."""
        ctx, cfg, cache, T, ns = self.ctx, self.cfg, self.cache, self.n_tokens, self.n_stream
        G, D, Hkv = cfg.n_embd_gqa, cfg.head_dim, cfg.n_head_kv
        ck, cv = cache.k[il], cache.v[il]
        cells = ck.ne[1]                                    # (K: a row per cell)
        n_kv = self.n_kv_swa if cfg.is_swa(il) else self.n_kv
        inp = inp["swa" if cfg.is_swa(il) else "base"]
        # added together, so that they are not reordered; K last (rope fusion), but in
        # Q, K, V order with the iswa input (llama.cpp's two build_attn differ there)
        for t in (q, k, v) if cfg.iswa else (q, v, k):
            self.expand(t)
        # cpy_k: the batch's K rows at their cells
        k_cur = ops.view_2d(ctx, k, G, T, k.nb[2], 0)
        k_rows = ck if ns == 1 else ops.reshape_2d(ctx, ck, G, cells * ns)
        self.expand(_stored(ops.set_rows(ctx, k_rows, k_cur, inp["k_idxs"]), k_rows))
        if not self.v_trans:
            # cpy_v: V cached as K is, a row per cell
            v_cur = ops.view_2d(ctx, v, G, T, v.nb[2], 0)
            v_rows = cv if ns == 1 else ops.reshape_2d(ctx, cv, G, cells * ns)
            self.expand(_stored(ops.set_rows(ctx, v_rows, v_cur, inp["v_idxs"]), v_rows))
        else:
            # cpy_v: V is cached transposed, one element per (channel, cell)
            # (V viewed out of a fused QKV is copied out first: its tokens' rows have gaps)
            v_cur = (ops.reshape_2d(ctx, v, G, T) if v.nb[2] == row_size(v.type, G)
                     else ops.cont_2d(ctx, v, G, T))
            v_view = ops.reshape_2d(ctx, cv, 1, G * cells * ns)
            v_cur = ops.reshape_2d(ctx, v_cur, 1, G * T)
            self.expand(_stored(ops.set_rows(ctx, v_view, v_cur, inp["v_idxs"]), v_view))
        # get_k / get_v: the first n_kv cells
        kk = ops.view_4d(ctx, ck, D, Hkv, n_kv, ns, row_size(ck.type, D),
                         row_size(ck.type, G), row_size(ck.type, G * cells), 0)
        if not self.v_trans:
            vv = ops.view_4d(ctx, cv, D, Hkv, n_kv, ns, row_size(cv.type, D),
                             row_size(cv.type, G), row_size(cv.type, G * cells), 0)
        else:
            es = type_size(cv.type)
            vv = ops.view_4d(ctx, cv, n_kv, Hkv, D, ns, es * cells * D, es * cells,
                             es * cells * G, 0)
        mask = inp["kq_mask"]
        cur = _name(self.build_attn_mha(q, kk, vv, mask, kq_scale, il), "kqv_out", il)
        cur = self.build_lora_mm(wo, cur)
        if wo_b is not None:
            cur = ops.add(ctx, cur, wo_b)
        return cur

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor,
                       kq_scale: float, il: int) -> Tensor:
        """Multi-head attention. Without flash attention: kq = k q (soft-capped when the
        model caps attention), soft_max_ext with the mask and scale, kqv = v kq over the
        transposed V cache (a V cache by rows is copied out transposed first, v_cont),
        heads merged again; with it, one FLASH_ATTN_EXT (f32 K or V
        cast to f16 first, the soft-cap its parameter), reshaped to rows."""
        ctx, ns = self.ctx, k.ne[3]                         # (the batch's streams)
        q = ops.view_4d(ctx, q, q.ne[0], q.ne[1], q.ne[2] // ns, ns, q.nb[1], q.nb[2],
                        q.nb[2] * (q.ne[2] // ns), 0)
        q = ops.permute(ctx, q, 0, 2, 1, 3)
        k = ops.permute(ctx, k, 0, 2, 1, 3)
        v = ops.permute(ctx, v, 0, 2, 1, 3)
        if self.flash_attn:
            k, v = (ops.cast(ctx, t, "f16") if t.type == "f32" else t for t in (k, v))
            cur = ops.flash_attn_ext(ctx, q, k, v, kq_mask, kq_scale, 0.0, self.cfg.attn_softcap)
            ops.flash_attn_ext_set_prec(cur, "F32")
            cur = ops.reshape_2d(ctx, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            return self.expand(cur)
        kq = _name(ops.mul_mat(ctx, k, q), "kq", il)
        ops.mul_mat_set_prec(kq, "F32")
        if self.cfg.attn_softcap:
            kq = self.softcap(kq, self.cfg.attn_softcap, ("kq_scaled_1", "kq_tanh", "kq_scaled_2"),
                              il)
        kq = _name(ops.soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0), "kq_soft_max", il)
        if not self.v_trans:
            v = _name(ops.cont(ctx, ops.transpose(ctx, v)), "v_cont", il)
        kqv = _name(ops.mul_mat(ctx, v, kq), "kqv", il)
        cur = ops.permute(ctx, kqv, 0, 2, 1, 3)
        cur = ops.cont_2d(ctx, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        return self.expand(cur)

    def softcap(self, t: Tensor, cap: float, names: tuple, il: int = -1) -> Tensor:
        """cap * tanh(t / cap), its three nodes named `names` (None: left unnamed), as
        llama.cpp soft-caps attention scores and logits."""
        scaled = ops.scale(self.ctx, t, 1.0 / cap)
        capped = ops.tanh(self.ctx, scaled)
        out = ops.scale(self.ctx, capped, cap)
        for part, label in zip((scaled, capped, out), names):
            if label is not None:
                _name(part, label, il)
        return out

    def build_ffn_swiglu(self, up: Tensor, gate: Tensor, down: Tensor, cur: Tensor,
                         il: int) -> Tensor:
        """The SwiGLU feed-forward (build_ffn with LLM_FFN_SILU, LLM_FFN_PAR):
        down(silu(gate cur) * up cur)."""
        return self.build_ffn_par(up, gate, down, cur, "swiglu", il)

    def build_ffn_fused_swiglu(self, up: Tensor, down: Tensor, cur: Tensor, il: int) -> Tensor:
        """The feed-forward of a fused gate/up matrix (build_ffn with LLM_FFN_SWIGLU and no
        gate): down(swiglu(up cur)), silu of the first half times the second."""
        tmp = _name(self.build_lora_mm(up, cur), "ffn_up", il)
        h = _name(ops.swiglu(self.ctx, tmp), "ffn_swiglu", il)
        return self.build_lora_mm(down, h)

    def build_ffn_par(self, up: Tensor, gate: Tensor, down: Tensor, cur: Tensor, glu: str,
                      il: int) -> Tensor:
        """A gated feed-forward with parallel gate and up (build_ffn with LLM_FFN_PAR):
        down(act(gate cur) * up cur), glu 'swiglu' (silu) or 'geglu' (gelu)."""
        tmp = _name(self.build_lora_mm(up, cur), "ffn_up", il)
        g = _name(self.build_lora_mm(gate, cur), "ffn_gate", il)
        h = _name(ops.glu_split(self.ctx, g, tmp, glu.upper()), f"ffn_{glu}", il)
        return self.build_lora_mm(down, h)

    def build_moe_ffn(self, cur: Tensor, gate_inp: Tensor, up_exps: Tensor, gate_exps: Tensor,
                      down_exps: Tensor, il: int) -> Tensor:
        """The routed experts (build_moe_ffn with softmax gating, SwiGLU and normalised
        weights, as llama's and qwen3moe's call it): the router's softmax, the top-k experts
        (a DESC argsort's first k), their probabilities renormalised to sum 1, each chosen
        expert's SwiGLU FFN (mul_mat_id), weighted and summed over the experts."""
        ctx, cfg = self.ctx, self.cfg
        E, T, X, K = cur.ne[0], cur.ne[1], cfg.n_expert, cfg.n_expert_used
        logits = _name(self.build_lora_mm(gate_inp, cur), "ffn_moe_logits", il)
        probs = _name(ops.soft_max(ctx, logits), "ffn_moe_probs", il)        # [X, T]
        selected = ops.argsort_top_k(ctx, probs, K)                          # [K, T]
        _name(selected.view_src, "ffn_moe_argsort", il)
        _name(selected, "ffn_moe_topk", il)
        weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, X, T), selected)
        weights = ops.reshape_2d(ctx, _name(weights, "ffn_moe_weights", il), K, T)
        total = _name(ops.sum_rows(ctx, weights), "ffn_moe_weights_sum", il)
        # (a floor at f16's smallest normal: no division by zero)
        total = _name(ops.clamp(ctx, total, 6.103515625e-5, math.inf),
                      "ffn_moe_weights_sum_clamped", il)
        weights = _name(ops.div(ctx, weights, total), "ffn_moe_weights_norm", il)
        weights = self.expand(ops.reshape_3d(ctx, weights, 1, K, T))
        cur = ops.reshape_3d(ctx, cur, E, 1, T)
        up = _name(ops.mul_mat_id(ctx, up_exps, cur, selected), "ffn_moe_up", il)
        gate = _name(ops.mul_mat_id(ctx, gate_exps, cur, selected), "ffn_moe_gate", il)
        h = _name(ops.swiglu_split(ctx, gate, up), "ffn_moe_swiglu", il)
        experts = _name(ops.mul_mat_id(ctx, down_exps, h, selected), "ffn_moe_down", il)
        experts = self.expand(_name(ops.mul(ctx, experts, weights), "ffn_moe_weighted", il))
        # the experts' rows summed by adds of views, every view added to the graph first
        views = [self.expand(ops.view_2d(ctx, experts, E, T, experts.nb[2], i * experts.nb[1]))
                 for i in range(K)]
        out = views[0]
        for v in views[1:]:
            out = self.expand(ops.add(ctx, out, v))
        if K == 1:
            out = ops.cont(ctx, out)        # (not a view)
        return _name(out, "ffn_moe_out", il)

    def build_inp_attn_scale(self) -> float:
        """The attention scale: 1 / sqrt(head size)."""
        return 1.0 / math.sqrt(self.cfg.head_dim)


def name(t: Tensor, label: str, il: int = -1) -> Tensor:
    """Name `t` as llama.cpp's graph callback does: `label-il` in layer il, else `label`."""
    return _name(t, label, il)


def build_decoder(gc: GraphContext, attention) -> Tensor:
    """The decoder llama.cpp's llama, qwen2, qwen3 and qwen3moe builders each write out:
    embeddings; per layer an RMS-normed `attention(gc, p, cur, inp_pos, inp_attn,
    kq_scale, il)` (the architecture's own part) and its residual, the last layer's
    rows cut to the output ids, an RMS-normed SwiGLU FFN (or the routed experts of a
    MoE config) and its residual; the output norm and head. Returns the logits tensor."""
    cfg, W, ctx = gc.cfg, gc.W, gc.ctx
    inpL = gc.build_inp_embd(W["token_embd.weight"])
    inp_pos = gc.build_inp_pos()
    inp_attn = gc.build_attn_inp_kv()
    kq_scale = gc.build_inp_attn_scale()
    inp_out_ids = gc.build_inp_out_ids()
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        inpSA = inpL
        cur = _name(gc.build_norm(inpL, W[p + "attn_norm.weight"], il), "attn_norm", il)
        cur = attention(gc, p, cur, inp_pos, inp_attn, kq_scale, il)
        if il == cfg.n_layer - 1:
            cur = ops.get_rows(ctx, cur, inp_out_ids)
            inpSA = ops.get_rows(ctx, inpSA, inp_out_ids)
        ffn_inp = _name(ops.add(ctx, cur, inpSA), "ffn_inp", il)
        cur = _name(gc.build_norm(ffn_inp, W[p + "ffn_norm.weight"], il), "ffn_norm", il)
        if cfg.is_moe:
            cur = gc.build_moe_ffn(cur, W[p + "ffn_gate_inp.weight"], W[p + "ffn_up_exps.weight"],
                                   W[p + "ffn_gate_exps.weight"], W[p + "ffn_down_exps.weight"],
                                   il)
        else:
            cur = gc.build_ffn_swiglu(W[p + "ffn_up.weight"], W[p + "ffn_gate.weight"],
                                      W[p + "ffn_down.weight"], cur, il)
            _name(cur, "ffn_out", il)
        inpL = _name(ops.add(ctx, cur, ffn_inp), "l_out", il)
    cur = _name(gc.build_norm(inpL, W["output_norm.weight"], -1), "result_norm")
    return _name(gc.build_lora_mm(W["output.weight"], cur), "result_output")
