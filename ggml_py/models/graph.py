"""The forward graph of one llama_decode call, built the way llama.cpp builds it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from ggml_py import ops, quants
from ggml_py._core import Context, Graph, Tensor, instance_arg, int_arg, row_size, type_size
from ggml_py.errors import GraphError, ModelError
from ggml_py.models.config import ModelConfig, graph_size
from ggml_py.models.model import KVCache, Model, SwaSlot

# ---------------------------------------------------------------------------
# the forward graph

@dataclass
class Forward:
    """One built forward graph and what to do around its computation."""
    graph: Graph
    ctx: Context
    logits: object                                  # Tensor [n_vocab, n_outputs]
    inputs: list = field(default_factory=list)      # [(Tensor, numpy data)]
    n_tokens: int = 0
    n_past: int = 0
    n_kv: int = 0
    n_outputs: int = 0
    swa: SwaSlot | None = None                      # the sliding layers' cells, if any


def _name(t, name):
    t.name = name
    return t


def padded_kv(cfg: ModelConfig, n_past: int, n_tokens: int) -> int:
    """The cells attention runs over: the used ones rounded up to kv_pad."""
    instance_arg(cfg, ModelConfig, "config")
    n_past = int_arg(n_past, "n_past", 0, cfg.n_ctx)
    n_tokens = int_arg(n_tokens, "n_tokens", 0, cfg.n_ctx)
    return min(cfg.n_ctx, -(-(n_past + n_tokens) // cfg.kv_pad) * cfg.kv_pad)


def step_inputs(cfg: ModelConfig, tokens: np.ndarray, n_past: int, n_kv: int,
                kv_rows: bool = False, swa: SwaSlot | None = None) -> dict[str, np.ndarray]:
    """{input name: data} of a forward graph for `tokens` at positions n_past..: what
    changes from step to step lives in these inputs. swa: where the sliding layers' cells
    are (KVCache.swa_slot); None: at the positions, as in the global layers' cache."""
    tokens = token_ids(tokens, cfg)
    n_past = int_arg(n_past, "n_past", 0, cfg.n_ctx)
    n_kv = int_arg(n_kv, "n_kv", 0, cfg.n_ctx)
    instance_arg(swa, SwaSlot, "swa", optional=True)
    T = int(tokens.size)
    pos = np.arange(n_past, n_past + T)
    allowed = np.arange(n_kv)[None, :] <= pos[:, None]          # causal, one sequence
    data = {"inp_tokens": tokens, "inp_pos": pos,
            "kq_mask": np.where(allowed, 0.0, -np.inf)}
    if cfg.iswa:
        data["kq_mask_swa"] = swa_mask(cfg, np.arange(n_kv) if swa is None
                                       else swa.pos[:swa.n_kv], pos)
    if cfg.ffn == "moe_dense":
        data["inp_all_experts"] = np.tile(np.arange(cfg.n_expert), (T, 1))
    if kv_rows:
        data["inp_k_idxs"] = pos
        data["inp_v_idxs"] = _v_rows(cfg, pos, cfg.n_ctx)
        if cfg.iswa:
            cells, idxs = (cfg.n_ctx, pos) if swa is None else (swa.pos.size, swa.idxs)
            data["inp_k_idxs_swa"], data["inp_v_idxs_swa"] = idxs, _v_rows(cfg, idxs, cells)
    return data


def swa_mask(cfg: ModelConfig, cell_pos: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The sliding layers' mask [tokens, cells]: a token at `pos` sees a cell holding
    position `cell_pos` (-1: empty) at or before its own, within the n_swa last ones."""
    instance_arg(cfg, ModelConfig, "config")
    try:
        cell_pos, pos = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (cell_pos, pos))
    except (TypeError, ValueError, OverflowError) as e:
        raise ModelError(f"swa_mask: cell positions and positions must be integer vectors "
                         f"({e})") from None
    age = pos[:, None] - cell_pos[None, :]
    return np.where((cell_pos >= 0)[None, :] & (age >= 0) & (age < cfg.n_swa), 0.0, -np.inf)


def _v_rows(cfg: ModelConfig, cells: np.ndarray, n_cells: int) -> np.ndarray:
    """The rows of a V cache of `n_cells` cells that set_rows writes the tokens' V to: K's
    (a row per cell) with flash attention, else (V transposed, a row per channel) one
    element per (token, channel), channel c of cell i at c * n_cells + i, in the order of
    the V values (token-major) the graph writes."""
    if cfg.flash_attn:
        return cells
    rows: np.ndarray = np.arange(cfg.n_embd_gqa)[None, :] * n_cells + cells[:, None]
    return rows.reshape(-1)


def check_step(model: Model, cache: KVCache, tokens,
               n_past: int | None) -> tuple[np.ndarray, int]:
    """(token ids, n_past) of a forward step, checked: at least one token, within the
    context after the cached ones (n_past None: the cache's), the weights placed."""
    cfg = instance_arg(model, Model, "model").config
    instance_arg(cache, KVCache, "cache")
    tokens = token_ids(tokens, cfg)
    T = int(tokens.size)
    n_past = cache.n_past if n_past is None else int_arg(n_past, "n_past", 0, cfg.n_ctx)
    if T < 1:
        raise ModelError("no tokens")
    if n_past + T > cfg.n_ctx:
        raise ModelError(f"{n_past} cached + {T} new tokens exceed the context of {cfg.n_ctx}")
    if not model.tensors:
        raise GraphError("the model's weights are not placed (Model.place)")
    return tokens, n_past


def build_forward(model: Model, cache: KVCache, tokens, n_past: int | None = None,
                  logits: str = "all", kv_rows: bool = False) -> Forward:
    """The graph of one llama_decode call: `tokens` at positions n_past.. (default: the
    cache's), writing their K/V into the cache. logits 'all' or 'last' (a get_rows of
    the output ids before the output norm, as llama.cpp does).

    kv_rows: write K/V with set_rows at cell ids given as inputs (llama.cpp's
    set_rows path) instead of cpy into views at n_past: the graph then depends on
    n_past only through the padded KV length, and can be computed again for the next
    position with new inputs (models.decode_graph).

    A config whose graph_kind is 'llama.cpp' (every architecture but llama's default)
    gets models.arch's graph of its architecture instead: llama.cpp's, node for node,
    which always writes K/V with set_rows."""
    cfg = instance_arg(model, Model, "model").config
    if cfg.graph_kind == "llama.cpp":       # llama.cpp's graph (always set_rows)
        from ggml_py.models.arch import build_forward as build_arch_forward
        return build_arch_forward(model, cache, tokens, n_past, logits)
    tokens, n_past = check_step(model, cache, tokens, n_past)
    T = int(tokens.size)
    W = model.tensors
    n_kv = padded_kv(cfg, n_past, T)
    E, H, Hkv, D = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim

    ctx = Context(f"{cfg.name}.forward")
    graph = Graph(graph_size(cfg))
    inputs = []
    data = step_inputs(cfg, tokens, n_past, n_kv, kv_rows)

    def inp(type_name, ne, name, values=None):
        t = ops.new_tensor(ctx, type_name, ne, name=name).set_input()
        values = data[name] if values is None else values
        inputs.append((t, np.ascontiguousarray(values, dtype=quants.PLAIN_DTYPES[type_name])))
        return t

    inp_tokens = inp("i32", (T,), "inp_tokens")
    inp_pos = inp("i32", (T,), "inp_pos")
    kq_mask = inp("f32", (n_kv, T), "kq_mask")
    all_ids = None
    if cfg.ffn == "moe_dense":
        all_ids = inp("i32", (cfg.n_expert, T), "inp_all_experts")
    if kv_rows:
        k_idxs = inp("i64", (T,), "inp_k_idxs")
        v_idxs = inp("i64", (T * cfg.n_embd_gqa,), "inp_v_idxs")

    x = _name(ops.get_rows(ctx, W["token_embd.weight"], inp_tokens), "inp_embd")
    kq_scale = 1.0 / math.sqrt(D)
    ck, cv = cache.k, cache.v
    esv = type_size(cfg.cache_type)
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        cur = ops.mul(ctx, ops.rms_norm(ctx, x, cfg.eps), W[p + "attn_norm.weight"])
        cur.name = f"attn_norm-{il}"
        q = ops.mul_mat(ctx, W[p + "attn_q.weight"], cur)
        k = ops.mul_mat(ctx, W[p + "attn_k.weight"], cur)
        v = _name(ops.mul_mat(ctx, W[p + "attn_v.weight"], cur), f"Vcur-{il}")
        q = _rope(ctx, cfg, ops.reshape_3d(ctx, q, D, H, T), inp_pos, f"Qcur-{il}")
        k = _rope(ctx, cfg, ops.reshape_3d(ctx, k, D, Hkv, T), inp_pos, f"Kcur-{il}")

        # store this batch's K and V in the cache; expanded now so the writes come before
        # the reads below in graph order (llama.cpp's cpy_k / cpy_v)
        if kv_rows:
            graph.build_forward_expand(ops.set_rows(
                ctx, ck[il], ops.reshape_2d(ctx, k, cfg.n_embd_gqa, T), k_idxs))
            cells = ops.view_2d(ctx, cv[il], 1, cfg.n_ctx * cfg.n_embd_gqa, esv)
            graph.build_forward_expand(ops.set_rows(
                ctx, cells, ops.reshape_2d(ctx, v, 1, T * cfg.n_embd_gqa), v_idxs))
        else:
            k_view = ops.view_1d(ctx, ck[il], T * cfg.n_embd_gqa,
                                 row_size(cfg.cache_type, cfg.n_embd_gqa) * n_past)
            v_view = ops.view_2d(ctx, cv[il], T, cfg.n_embd_gqa, cfg.n_ctx * esv,
                                 n_past * esv)
            graph.build_forward_expand(ops.cpy(ctx, k, k_view))
            graph.build_forward_expand(ops.cpy(ctx, ops.transpose(ctx, v), v_view))

        kk = ops.view_3d(ctx, ck[il], D, n_kv, Hkv, row_size(cfg.cache_type, cfg.n_embd_gqa),
                         row_size(cfg.cache_type, D), 0)
        vv = ops.view_3d(ctx, cv[il], n_kv, D, Hkv, cfg.n_ctx * esv, cfg.n_ctx * esv * D, 0)
        qp = ops.permute(ctx, q, 0, 2, 1, 3)                            # [D, T, H]
        kq = _name(ops.mul_mat(ctx, kk, qp), f"kq-{il}")                # [n_kv, T, H]
        kq = _name(ops.soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0), f"kq_soft_max-{il}")
        kqv = ops.mul_mat(ctx, vv, kq)                                  # [D, T, H]
        cur = ops.cont_2d(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), E, T)
        cur = _name(ops.mul_mat(ctx, W[p + "attn_output.weight"], cur), f"attn_out-{il}")
        ffn_inp = _name(ops.add(ctx, cur, x), f"ffn_inp-{il}")

        cur = ops.mul(ctx, ops.rms_norm(ctx, ffn_inp, cfg.eps), W[p + "ffn_norm.weight"])
        cur.name = f"ffn_norm-{il}"
        cur = _ffn(ctx, cfg, W, p, cur, T, il, all_ids)
        x = _name(ops.add(ctx, cur, ffn_inp), f"l_out-{il}")

    n_out = T
    if logits == "last":
        ids = inp("i32", (1,), "inp_out_ids", [T - 1])
        x = ops.get_rows(ctx, x, ids)
        n_out = 1
    elif logits != "all":
        raise ModelError("logits must be 'all' or 'last'")
    x = _name(ops.mul(ctx, ops.rms_norm(ctx, x, cfg.eps), W["output_norm.weight"]), "result_norm")
    out = _name(ops.mul_mat(ctx, W["output.weight"], x), "result_output").set_output()
    graph.build_forward_expand(out)
    return Forward(graph, ctx, out, inputs, T, n_past, n_kv, n_out)


def token_ids(tokens, cfg: ModelConfig) -> np.ndarray:
    """tokens as an int32 vector of ids of cfg's vocabulary (ModelError otherwise)."""
    instance_arg(cfg, ModelConfig, "config")
    # a list of ints, or a few int32 ids already converted (a decode step's token):
    # checked in Python, which costs less than numpy's reductions
    values = None
    if type(tokens) is list and all(type(x) is int for x in tokens):
        values = tokens
    elif (type(tokens) is np.ndarray and tokens.dtype == np.int32 and tokens.ndim == 1
          and tokens.size <= 16):
        values = tokens.tolist()
    if values is not None:
        if not all(0 <= x < cfg.n_vocab for x in values):
            raise ModelError(f"token ids must be integers in 0..{cfg.n_vocab - 1}")
        return tokens if type(tokens) is np.ndarray else np.array(values, dtype=np.int32)
    try:
        ids = np.asarray(tokens).reshape(-1)
    except (TypeError, ValueError) as e:
        raise ModelError(f"tokens must be a list of token ids: {e}") from None
    if ids.size and (ids.dtype.kind not in "iu" or not 0 <= ids.min() <= ids.max() < cfg.n_vocab):
        raise ModelError(f"token ids must be integers in 0..{cfg.n_vocab - 1}")
    return ids.astype(np.int32, copy=False)


def _rope(ctx, cfg, t, pos, name):
    return _name(ops.rope_ext(ctx, t, pos, None, cfg.n_rot_, cfg.rope_mode, cfg.n_ctx,
                              cfg.rope_freq_base, cfg.rope_freq_scale, 0.0, 1.0, 32.0, 1.0), name)


def _swiglu_ffn(ctx, W, gate, up, down, cur, name):
    g = ops.mul_mat(ctx, W[gate], cur)
    u = ops.mul_mat(ctx, W[up], cur)
    return _name(ops.mul_mat(ctx, W[down], ops.swiglu_split(ctx, g, u)), name)


def _ffn(ctx, cfg, W, p, cur, T, il, all_ids):
    if cfg.ffn == "dense":
        return _swiglu_ffn(ctx, W, p + "ffn_gate.weight", p + "ffn_up.weight",
                           p + "ffn_down.weight", cur, f"ffn_out-{il}")
    X, K = cfg.n_expert, cfg.n_expert_used
    logits = _name(ops.mul_mat(ctx, W[p + "ffn_gate_inp.weight"], cur), f"ffn_moe_logits-{il}")
    if cfg.ffn == "moe_dense":
        # every expert, weighted by the softmax over all of them
        selected = all_ids
        weights = ops.reshape_3d(ctx, ops.soft_max(ctx, logits), 1, X, T)
    elif cfg.ffn == "moe_topk":
        # Mixtral: softmax over the chosen experts' logits (= softmax, top-k, renormalise)
        selected = _name(ops.top_k(ctx, logits, K), f"ffn_moe_topk-{il}")
        chosen = ops.get_rows(ctx, ops.reshape_3d(ctx, logits, 1, X, T), selected)
        weights = ops.reshape_3d(ctx, ops.soft_max(ctx, ops.reshape_2d(ctx, chosen, K, T)), 1, K, T)
    else:
        # DeepSeek-MoE: the top-k of the softmax probabilities, used as they are
        probs = _name(ops.soft_max(ctx, logits), f"ffn_moe_probs-{il}")
        selected = _name(ops.top_k(ctx, probs, K), f"ffn_moe_topk-{il}")
        weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, X, T), selected)
    weights.name = f"ffn_moe_weights-{il}"
    out = _moe_experts(ctx, cfg, W, p, cur, selected, weights, T, il)
    if cfg.ffn == "moe_shared":
        sh = _swiglu_ffn(ctx, W, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight",
                         p + "ffn_down_shexp.weight", cur, f"ffn_shexp-{il}")
        out = _name(ops.add(ctx, out, sh), f"ffn_out-{il}")
    return out


def _moe_experts(ctx, cfg, W, p, cur, selected, weights, T, il):
    """The selected experts' SwiGLU FFNs (mul_mat_id), weighted and summed per token."""
    k = selected.ne[0]
    x3 = ops.reshape_3d(ctx, cur, cfg.n_embd, 1, T)
    up = ops.mul_mat_id(ctx, W[p + "ffn_up_exps.weight"], x3, selected)      # [Fe, k, T]
    gate = ops.mul_mat_id(ctx, W[p + "ffn_gate_exps.weight"], x3, selected)
    h = ops.swiglu_split(ctx, gate, up)
    experts = ops.mul_mat_id(ctx, W[p + "ffn_down_exps.weight"], h, selected)  # [E, k, T]
    experts = _name(ops.mul(ctx, experts, weights), f"ffn_moe_weighted-{il}")
    # sum over the k experts with views (llama.cpp avoids a reduction op here)
    out = None
    for i in range(k):
        v = ops.view_2d(ctx, experts, cfg.n_embd, T, experts.nb[2], i * experts.nb[1])
        out = v if out is None else ops.add(ctx, out, v)
    if k == 1:
        out = ops.cont(ctx, out)
    return _name(out, f"ffn_moe_out-{il}")
