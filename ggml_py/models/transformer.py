"""Computable transformer models in ggml's graph form: a llama and MoE variants.

The graphs are built the way llama.cpp builds them (llm_build_llama and its MoE
helper), with the op builders of ggml_py.ops:

  * attention: GQA heads, rope_ext, scores soft_max_ext'ed with a causal mask,
    a KV cache per layer written with cpy into views of the cache tensors (K row
    per cell; V stored transposed, one row per channel) and read back through
    strided views;
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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ggml_py import ops, quants
from ggml_py._backend import get_buffer
from ggml_py._backend import Backend
from ggml_py._core import Context, Graph, Tensor, instance_arg, int_arg, row_size, type_size
from ggml_py.alloc import TensorAllocator
from ggml_py.errors import BackendError, GraphError, ModelError, UnknownNameError
from ggml_py.runtime import Status

if TYPE_CHECKING:
    from ggml_py._backend import Backend
    from ggml_py.sched import Scheduler

FFN_KINDS = ("dense", "moe_dense", "moe_topk", "moe_shared")
WEIGHT_TYPES = ("f32", "f16", "q8_0", "q4_0")


# ---------------------------------------------------------------------------
# configuration

@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a llama-style model (llama.cpp's llama_hparams subset)."""
    n_vocab: int = 256
    n_ctx: int = 64               # KV cache cells
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_layer: int = 2
    n_ff: int = 128               # dense FFN width (and each expert's, unless n_ff_exp)
    n_rot: int | None = None      # rope dimensions (default: the head size)
    rope_mode: str = "NORMAL"     # llama's rope type (adjacent pairs)
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    eps: float = 1e-5             # rms_norm epsilon
    wtype: str = "f16"            # matrices; norms and the router stay f32
    cache_type: str = "f16"       # K/V cache cells
    ffn: str = "dense"
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int | None = None   # width of each expert (default n_ff)
    n_expert_shared: int = 0      # moe_shared: shared experts (their FFN is n_ff_exp wide each)
    kv_pad: int = 32              # attention runs over the used cells rounded up to this
    name: str = "llama"

    def __post_init__(self):
        if self.ffn not in FFN_KINDS:
            raise ModelError(f"ffn must be one of {FFN_KINDS}, got {self.ffn!r}")
        if self.wtype not in WEIGHT_TYPES:
            raise ModelError(f"wtype must be one of {WEIGHT_TYPES}, got {self.wtype!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ModelError("n_embd must divide into n_head heads, n_head into n_head_kv groups")
        if self.ffn != "dense":
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ModelError(f"{self.ffn} needs 0 < n_expert_used <= n_expert")
            if self.ffn == "moe_shared" and self.n_expert_shared < 1:
                raise ModelError("moe_shared needs n_expert_shared >= 1")
        if self.n_rot_ % 2 or self.n_rot_ > self.head_dim:
            raise ModelError(f"n_rot must be even and at most the head size {self.head_dim}")
        if quants.is_quantized(self.wtype):
            qk = quants.BLOCKS[self.wtype][0]
            widths = {self.n_embd, self.n_ff, self.ff_exp}
            if any(w % qk for w in widths):
                raise ModelError(f"{self.wtype} weights need row lengths that are multiples of {qk}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_rot_(self) -> int:
        return self.head_dim if self.n_rot is None else self.n_rot

    @property
    def ff_exp(self) -> int:
        return self.n_ff if self.n_ff_exp is None else self.n_ff_exp

    @property
    def is_moe(self) -> bool:
        return self.ffn != "dense"


def llama_config(**kw: Any) -> ModelConfig:
    """The small llama of the demo (and the base of the MoE configs)."""
    base = dict(n_vocab=512, n_ctx=64, n_embd=128, n_head=8, n_head_kv=4, n_layer=4, n_ff=256)
    base.update(kw)
    return ModelConfig(**base)


MOE_DEFAULTS = {
    "moe_dense": dict(n_expert=4, n_expert_used=4, n_ff_exp=128),     # all experts run
    "moe_topk": dict(n_expert=8, n_expert_used=2, n_ff_exp=128),
    "moe_shared": dict(n_expert=8, n_expert_used=2, n_ff_exp=64, n_expert_shared=2),
}


def moe_config(ffn: str, **kw: Any) -> ModelConfig:
    """A small MoE in one of the three classic forms, llama-sized otherwise.
    moe_dense always uses every expert (n_expert_used = n_expert)."""
    if not isinstance(ffn, str) or ffn not in MOE_DEFAULTS:
        raise UnknownNameError(f"unknown MoE form {ffn!r}; known: {', '.join(MOE_DEFAULTS)}")
    base = dict(name=ffn.replace("_", "-"), ffn=ffn, **MOE_DEFAULTS[ffn])
    base.update(kw)
    if ffn == "moe_dense":
        base["n_expert_used"] = base["n_expert"]
    return llama_config(**base)


# ---------------------------------------------------------------------------
# weights

def weight_shapes(cfg: ModelConfig) -> dict:
    """name -> (ggml type, ggml ne) of every weight, with GGUF's tensor names."""
    instance_arg(cfg, ModelConfig, "config")
    E, V, F = cfg.n_embd, cfg.n_vocab, cfg.n_ff
    G, X, Fe = cfg.n_embd_gqa, cfg.n_expert, cfg.ff_exp
    w = cfg.wtype
    shapes = {"token_embd.weight": (w, (E, V))}
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        shapes.update({
            p + "attn_norm.weight": ("f32", (E,)),
            p + "attn_q.weight": (w, (E, E)),
            p + "attn_k.weight": (w, (E, G)),
            p + "attn_v.weight": (w, (E, G)),
            p + "attn_output.weight": (w, (E, E)),
            p + "ffn_norm.weight": ("f32", (E,)),
        })
        if cfg.ffn == "dense":
            shapes.update({p + "ffn_gate.weight": (w, (E, F)), p + "ffn_up.weight": (w, (E, F)),
                           p + "ffn_down.weight": (w, (F, E))})
        else:
            shapes.update({
                p + "ffn_gate_inp.weight": ("f32", (E, X)),      # the router stays f32
                p + "ffn_gate_exps.weight": (w, (E, Fe, X)),
                p + "ffn_up_exps.weight": (w, (E, Fe, X)),
                p + "ffn_down_exps.weight": (w, (Fe, E, X)),
            })
        if cfg.ffn == "moe_shared":
            Fs = Fe * cfg.n_expert_shared
            shapes.update({p + "ffn_gate_shexp.weight": (w, (E, Fs)),
                           p + "ffn_up_shexp.weight": (w, (E, Fs)),
                           p + "ffn_down_shexp.weight": (w, (Fs, E))})
    shapes["output_norm.weight"] = ("f32", (E,))
    shapes["output.weight"] = (w, (E, V))
    return shapes


def layer_of(name: str) -> int | None:
    """The block index of a weight name ('blk.3.attn_q.weight' -> 3), None outside blocks."""
    instance_arg(name, str, "weight name")
    if name.startswith("blk."):
        part = name.split(".", 2)[1]
        if not part.isdigit():
            raise ModelError(f"weight {name!r}: 'blk.' is not followed by a layer index")
        return int(part)
    return None


def to_stored(type_name: str, values: np.ndarray) -> np.ndarray:
    """float32 values (numpy order) -> the stored form of `type_name` (ggml's reference
    quantiser for block types, as ggml_quantize_chunk / llama-quantize use)."""
    return quants.from_f32(type_name, values, cpu=False)


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict:
    """Seeded random weights in stored form: matrices ~ N(0, 1/fan_in) so activations keep
    their scale through the layers, norms ~ 1, embeddings ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (t, ne) in weight_shapes(cfg).items():
        shape = tuple(reversed(ne))
        if len(ne) == 1:
            x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif name == "token_embd.weight":
            x = rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(ne[0]))
        out[name] = (t, to_stored(t, x.astype(np.float32)))
    return out


# ---------------------------------------------------------------------------
# tensor data in and out (ggml_backend_tensor_set / _get)

def tensor_set(t, data: np.ndarray, backends=()):
    """Write `data` (the tensor's stored form, any shape with the right bytes) into t."""
    instance_arg(t, Tensor, "tensor")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size != t.nbytes:
        raise BackendError(f"tensor '{t.name}': {raw.size} bytes given, it holds {t.nbytes}")
    buf = get_buffer(t)
    if buf is None or t.data_address == 0:
        raise BackendError(f"tensor '{t.name}' is not allocated")
    if buf.memory is not None:
        off = t.data_address - buf.base
        buf.memory[off:off + raw.size] = raw
        return
    _owner(t, backends).set_tensor(t, raw)


def tensor_get(t, backends=()) -> np.ndarray:
    """t's bytes as a new uint8 array."""
    buf = get_buffer(instance_arg(t, Tensor, "tensor"))
    if buf is None or t.data_address == 0:
        raise BackendError(f"tensor '{t.name}' is not allocated")
    if buf.memory is not None:
        off = t.data_address - buf.base
        return np.array(buf.memory[off:off + t.nbytes], dtype=np.uint8)
    return np.frombuffer(_owner(t, backends).get_tensor(t), dtype=np.uint8).copy()


def tensor_values(t, backends=()) -> np.ndarray:
    """A contiguous float tensor's values as float32, numpy order (dequantised)."""
    raw = tensor_get(t, backends)
    shape = tuple(reversed(t.ne))
    if quants.is_quantized(t.type):
        return quants.to_f32(t.type, raw.reshape(shape[:-1] + (-1,)))
    return quants.to_f32(t.type, raw.view(quants.PLAIN_DTYPES[t.type]).reshape(shape))


def _owner(t, backends):
    buft = get_buffer(t).buffer_type
    for b in backends:
        if b.get_default_buffer_type() is buft or buft in b.supported_buffer_types:
            return b
    raise BackendError(f"tensor '{t.name}' is in a {buft.name} buffer without host memory and "
                       "no backend given that owns it")


def _alloc_group(buft, tensors, usage):
    """One buffer of `buft` holding `tensors` one after another (ggml_backend_alloc_ctx_tensors)."""
    size = sum(-(-buft.get_alloc_size(t) // buft.alignment) * buft.alignment for t in tensors)
    buf = buft.alloc_buffer(max(size, 1) + buft.alignment)
    buf.usage = usage
    talloc = TensorAllocator(buf)
    for t in tensors:
        talloc.alloc(t)
    return buf


# ---------------------------------------------------------------------------
# the model: weights placed in backend buffers

def _check_stored(name, type_name, ne, stored):
    """A weight's stored array must hold exactly the bytes of a `type_name` tensor of `ne`."""
    if type_name not in WEIGHT_TYPES:
        raise GraphError(f"weight {name}: type {type_name} is not one of {WEIGHT_TYPES}")
    want = row_size(type_name, ne[0]) * math.prod(ne[1:])
    if ne[0] % quants.BLOCKS.get(type_name, (1,))[0] or stored.nbytes != want:
        raise GraphError(f"weight {name}: {stored.nbytes} bytes of {type_name} do not make "
                         f"a tensor of ne {list(ne)}")


class Model:
    """A model's config and weights; `place` puts the weights into backend buffers.

    weights: name -> (ggml type, stored numpy array) as weight_shapes(config) names them.
    """

    def __init__(self, config: ModelConfig, weights: dict):
        instance_arg(weights, dict, "weights")
        want = weight_shapes(config)
        missing = sorted(set(want) - set(weights))
        if missing:
            raise GraphError(f"model {config.name}: missing weights {', '.join(missing[:5])}"
                             + (" ..." if len(missing) > 5 else ""))
        self.config = config
        self.weights = weights
        self.tensors = {}           # name -> Tensor, after place()
        self.buffers = []
        self.backends = []          # every backend a weight lives on
        self.layer_backend = []     # per layer

    @classmethod
    def random(cls, config: ModelConfig, seed: int = 0) -> Model:
        return cls(config, random_weights(config, seed))

    def values(self, name: str) -> np.ndarray:
        """A weight's float32 values in numpy order (dequantised): what the graph sees."""
        if not isinstance(name, str) or name not in self.weights:
            raise UnknownNameError(f"model {self.config.name} has no weight {name!r}")
        t, stored = self.weights[name]
        return quants.to_f32(t, stored)

    def place(self, layer_backends: Backend | Sequence[Backend], host: Backend | None = None,
              output_backend: Backend | None = None) -> Model:
        """Create the weight tensors and write them into buffers.

        layer_backends: a backend per layer (a single backend: all layers); host: where the
        token embeddings live (llama.cpp keeps the input layer on the CPU; default: the
        last layer's backend); output_backend: output norm and matrix (default: the last
        layer's). Each (layer, backend) gets its own weights buffer."""
        cfg = self.config
        if not isinstance(layer_backends, (list, tuple)):
            layer_backends = [layer_backends] * cfg.n_layer
        if len(layer_backends) != cfg.n_layer:
            raise ModelError(f"{len(layer_backends)} layer backends for {cfg.n_layer} layers")
        host = host or layer_backends[-1]
        output_backend = output_backend or layer_backends[-1]
        for b in (*layer_backends, host, output_backend):
            instance_arg(b, Backend, "a layer's backend")
        self.layer_backend = list(layer_backends)
        self.ctx = Context(f"{cfg.name}.weights")
        groups = {}             # (group key, backend id) -> (backend, [tensors])
        for name, (_, ne) in weight_shapes(cfg).items():
            stored_t, stored = self.weights[name]       # a GGUF file may mix types
            _check_stored(name, stored_t, ne, stored)
            tensor = ops.new_tensor(self.ctx, stored_t, ne, name=name)
            il = layer_of(name)
            if il is not None:
                key, be = f"blk.{il}", layer_backends[il]
            elif name == "token_embd.weight":
                key, be = "input", host
            else:
                key, be = "output", output_backend
            groups.setdefault((key, id(be)), (be, []))[1].append(tensor)
            self.tensors[name] = tensor
        self.buffers = [_alloc_group(be.get_default_buffer_type(), ts, "weights")
                        for be, ts in groups.values()]
        self.backends = list({id(b): b for b, _ in groups.values()}.values())
        self.has_data = True
        for name, tensor in self.tensors.items():
            try:
                tensor_set(tensor, self.weights[name][1], self.backends)
            except BackendError:
                if get_buffer(tensor).memory is not None:
                    raise
                self.has_data = False       # a simulated device: placement only, no data
        return self

    @property
    def n_params(self) -> int:
        return sum(math.prod(ne) for _, ne in weight_shapes(self.config).values())

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for _, s in self.weights.values())


class KVCache:
    """Per-layer K and V cache tensors in the layer's backend (llama_kv_cache, one
    sequence). K: ne [n_embd_gqa, n_ctx], a row per cell; V: ne [n_ctx, n_embd_gqa],
    stored transposed (a row per channel), as llama.cpp does without flash attention."""

    def __init__(self, model: Model):
        if not instance_arg(model, Model, "model").tensors:
            raise ModelError("the model's weights are not placed (Model.place)")
        cfg = model.config
        self.config = cfg
        self.ctx = Context(f"{cfg.name}.kv")
        self.k, self.v = [], []
        groups = {}
        for il in range(cfg.n_layer):
            k = ops.new_tensor_2d(self.ctx, cfg.cache_type, cfg.n_embd_gqa, cfg.n_ctx,
                                  name=f"cache_k_l{il}")
            v = ops.new_tensor_2d(self.ctx, cfg.cache_type, cfg.n_ctx, cfg.n_embd_gqa,
                                  name=f"cache_v_l{il}")
            self.k.append(k)
            self.v.append(v)
            be = model.layer_backend[il]
            groups.setdefault(id(be), (be, []))[1].extend([k, v])
        # llama.cpp leaves the cache buffer's usage at 'any': the scheduler places
        # its views by the buffer's backend, not as weights
        self.buffers = [_alloc_group(be.get_default_buffer_type(), ts, "any")
                        for be, ts in groups.values()]
        self.backends = [be for be, _ in groups.values()]
        self.clear()

    def clear(self) -> None:
        """Empty the cache: n_past 0 and every cell zeroed (ggml_backend_buffer_clear), since
        masked cells still enter the V product with weight 0, and 0 * NaN is NaN."""
        self.n_past = 0
        for buf in self.buffers:
            if buf.memory is not None:
                buf.memory[...] = 0
        for t in self.k + self.v:
            if get_buffer(t).memory is None:
                try:
                    tensor_set(t, np.zeros(t.nbytes, np.uint8), self.backends)
                except BackendError:
                    pass                # a simulated device: no bytes to clear


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
                kv_rows: bool = False) -> dict[str, np.ndarray]:
    """{input name: data} of a forward graph for `tokens` at positions n_past..: what
    changes from step to step lives in these inputs."""
    tokens = token_ids(tokens, cfg)
    n_past = int_arg(n_past, "n_past", 0, cfg.n_ctx)
    n_kv = int_arg(n_kv, "n_kv", 0, cfg.n_ctx)
    T = int(tokens.size)
    pos = np.arange(n_past, n_past + T)
    allowed = np.arange(n_kv)[None, :] <= pos[:, None]          # causal, one sequence
    data = {"inp_tokens": tokens, "inp_pos": pos,
            "kq_mask": np.where(allowed, 0.0, -np.inf)}
    if cfg.ffn == "moe_dense":
        data["inp_all_experts"] = np.tile(np.arange(cfg.n_expert), (T, 1))
    if kv_rows:
        # K: a cache row per cell; V (transposed): one element per (channel, cell), the
        # source element (channel c, token t) is row c + t * n_embd_gqa of the reshape
        data["inp_k_idxs"] = pos
        data["inp_v_idxs"] = (np.arange(cfg.n_embd_gqa)[None, :] * cfg.n_ctx
                              + pos[:, None]).reshape(-1)
    return data


def build_forward(model: Model, cache: KVCache, tokens, n_past: int | None = None,
                  logits: str = "all", kv_rows: bool = False) -> Forward:
    """The graph of one llama_decode call: `tokens` at positions n_past.. (default: the
    cache's), writing their K/V into the cache. logits 'all' or 'last' (a get_rows of
    the output ids before the output norm, as llama.cpp does).

    kv_rows: write K/V with set_rows at cell ids given as inputs (llama.cpp's
    set_rows path) instead of cpy into views at n_past: the graph then depends on
    n_past only through the padded KV length, and can be computed again for the next
    position with new inputs (models.decode_graph)."""
    cfg = instance_arg(model, Model, "model").config
    instance_arg(cache, KVCache, "cache")
    tokens = token_ids(tokens, cfg)
    T = int(tokens.size)
    n_past = cache.n_past if n_past is None else int_arg(n_past, "n_past", 0, cfg.n_ctx)
    if T < 1:
        raise ModelError("no tokens")
    if n_past + T > cfg.n_ctx:
        raise ModelError(f"{n_past} cached + {T} new tokens exceed the context of {cfg.n_ctx}")
    W = model.tensors
    if not W:
        raise GraphError("the model's weights are not placed (Model.place)")
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
    try:
        ids = np.asarray(tokens).reshape(-1)
    except (TypeError, ValueError) as e:
        raise ModelError(f"tokens must be a list of token ids: {e}") from None
    if ids.size and (ids.dtype.kind not in "iu" or not 0 <= ids.min() <= ids.max() < cfg.n_vocab):
        raise ModelError(f"token ids must be integers in 0..{cfg.n_vocab - 1}")
    return ids.astype(np.int32, copy=False)


def graph_size(cfg: ModelConfig) -> int:
    """Nodes plus leafs a forward graph can have, with room to spare (llama.cpp's
    graph_max_nodes is generous too)."""
    instance_arg(cfg, ModelConfig, "config")
    return 128 + cfg.n_layer * (96 + 8 * cfg.n_expert_used)


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


# ---------------------------------------------------------------------------
# running: a session of prompt and decode steps

@dataclass
class SplitStats:
    """One split of a step: where it ran, what it copied in and what it cost (from the
    runtime's profile; compute_s is enqueue time on an asynchronous device unless the
    session profiles splits)."""
    backend: str
    n_nodes: int
    n_inputs: int
    input_bytes: int           # the split inputs' sizes
    bytes_copied: int = 0      # what the runtime copied (MoE weights: used experts only)
    copy_s: float = 0.0
    compute_s: float = 0.0


@dataclass
class StepStats:
    """What one forward pass cost and how the scheduler cut it."""
    kind: str                  # 'prompt' or 'decode'
    n_tokens: int
    n_nodes: int
    n_splits: int
    n_copies: int              # copy slots (pipeline parallelism)
    build_s: float             # graph build
    alloc_s: float             # split + alloc_graph + setting the inputs
    compute_s: float           # graph compute, copies included
    splits: list[SplitStats]
    graph_reused: bool = False     # the decode graph of the step before (no build)
    plan_reused: bool = False      # the scheduler's plan and allocation (no split, no alloc)

    @property
    def n_inputs(self) -> int:
        return sum(s.n_inputs for s in self.splits)

    @property
    def copy_bytes(self) -> int:
        """Bytes the runtime copied between backends."""
        return sum(s.bytes_copied for s in self.splits)


class Session:
    """A model, its KV cache and a Scheduler over `backends` (priority order, CPU last).

    profile_splits: time every split to completion (the runtime's sync_splits: an
    asynchronous device is waited for after each split, so split times are real, at
    the price of the overlap).
    reuse_decode_graph: keep the one-token graph across decode steps while the padded
    KV length holds, as llama.cpp does (models.decode_graph); with the scheduler's
    graph reuse such a step builds, splits and allocates nothing."""

    def __init__(self, model: Model, backends: Sequence[Backend],
                 scheduler: Scheduler | None = None, profile_splits: bool = False,
                 reuse_decode_graph: bool = True) -> None:
        from ggml_py.models.decode_graph import DecodeGraph
        from ggml_py.sched import Scheduler
        instance_arg(model, Model, "model")
        instance_arg(scheduler, Scheduler, "scheduler", optional=True)
        self.model = model
        self.backends = list(backends)
        self.cache = KVCache(model)
        self.sched = scheduler or Scheduler(self.backends, graph_size=graph_size(model.config))
        self.sched.runtime.sync_splits = bool(profile_splits)
        self.history: list[StepStats] = []
        self.graph: Graph | None = None     # the last forward graph (split as sched.splits)
        self.decode = DecodeGraph(model, self.cache) if reuse_decode_graph else None
        self._layout: list[tuple[str, int, int, int]] = []     # the last plan's splits

    def forward(self, tokens: Sequence[int] | np.ndarray, logits: str = "all") -> np.ndarray:
        """Run `tokens` through the model after the cached ones (llama_decode: build the
        graph, allocate it, set the inputs, compute); returns their logits, numpy
        [n_outputs, n_vocab]."""
        t0 = time.perf_counter()
        if self.decode is not None and np.size(tokens) == 1:
            fw, graph_reused = self.decode.forward(tokens, logits)
        else:
            fw, graph_reused = build_forward(self.model, self.cache, tokens, logits=logits), False
        t1 = time.perf_counter()
        sched = self.sched
        reuses = sched.n_graph_reuses
        sched.reset()
        sched.alloc_graph(fw.graph)
        plan_reused = sched.n_graph_reuses > reuses
        for t, data in fw.inputs:
            tensor_set(t, data, self.backends)
        sched.profile.reset()
        t2 = time.perf_counter()
        status = sched.graph_compute(fw.graph)
        t3 = time.perf_counter()
        if status != Status.SUCCESS:
            raise BackendError(f"graph compute of {self.model.config.name}: {status.name}")
        out = tensor_values(fw.logits, self.backends).reshape(fw.n_outputs, -1)
        self.cache.n_past += fw.n_tokens
        self.graph = fw.graph
        self.history.append(self._stats(fw, t1 - t0, t2 - t1, t3 - t2, sched.profile,
                                        graph_reused, plan_reused))
        return out

    def _stats(self, fw, build_s, alloc_s, compute_s, profile, graph_reused, plan_reused):
        s = self.sched
        if not (plan_reused and self._layout):      # a kept plan keeps its splits
            self._layout = [(sp.backend.name, sp.i_end - sp.i_start, len(sp.inputs),
                             sum(t.nbytes for t in sp.inputs)) for sp in s.splits]
        splits = [SplitStats(*layout) for layout in self._layout]
        for st, p in zip(splits, profile.splits):
            st.bytes_copied, st.copy_s, st.compute_s = p.bytes_copied, p.copy_s, p.compute_s
        return StepStats("prompt" if fw.n_tokens > 1 else "decode", fw.n_tokens,
                         fw.graph.n_nodes, s.n_splits, s.n_copies, build_s, alloc_s, compute_s,
                         splits, graph_reused, plan_reused)

    def generate(self, prompt: Sequence[int], n_new: int) -> list[int]:
        """Greedy decoding: the prompt in one pass, then one token per step; the new ids."""
        logits = self.forward(prompt, logits="last")
        out = []
        for i in range(n_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            if i + 1 < n_new:
                logits = self.forward([tok], logits="last")
        return out

    def reset(self) -> None:
        self.cache.clear()
        self.history.clear()

