"""A model's weights in stored form and placed in backend buffers (Model), its KV cache
(KVCache), and reading tensor values back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ggml_py import ops, quants
from ggml_py._backend import Backend, get_buffer, host_bytes, tensor_get, tensor_set
from ggml_py._core import (Context, Tensor, check_memory_available, instance_arg, int_arg,
                           row_size)
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.errors import AllocationError, GraphError, ModelError, UnknownNameError
from ggml_py.models.config import WEIGHT_TYPES, ModelConfig, layer_of, weight_shapes

def to_stored(type_name: str, values: np.ndarray) -> np.ndarray:
    """float32 values (numpy order) -> the stored form of `type_name` (ggml's reference
    quantiser for block types, as ggml_quantize_chunk / llama-quantize use)."""
    return quants.from_f32(type_name, values, cpu=False)


def _check_fits_in_memory(cfg: ModelConfig, shapes: dict) -> None:
    """AllocationError when the weights (stored, and the largest one's float32 values while
    it is made) exceed the memory available: refused before any is made, rather than
    filled until the kernel's out-of-memory killer ends the process."""
    need = sum(row_size(t, ne[0]) * math.prod(ne[1:]) for t, ne in shapes.values())
    need += max(4 * math.prod(ne) for _, ne in shapes.values())
    check_memory_available(need, f"model {cfg.name}: its weights")


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict:
    """Seeded random weights in stored form: matrices ~ N(0, 1/fan_in) so activations keep
    their scale through the layers, norms ~ 1, embeddings ~ N(0, 1)."""
    shapes = weight_shapes(cfg)
    _check_fits_in_memory(cfg, shapes)
    rng = np.random.default_rng(seed)
    out = {}
    for name, (t, ne) in shapes.items():
        shape = tuple(reversed(ne))
        try:
            if name.endswith(".bias"):
                x = 0.1 * rng.standard_normal(shape, dtype=np.float32)
            elif len(ne) == 1:
                x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            elif name == "token_embd.weight":
                x = rng.standard_normal(shape, dtype=np.float32)
            else:
                x = rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(ne[0]))
            out[name] = (t, to_stored(t, x.astype(np.float32)))
        except (MemoryError, ValueError) as e:     # (numpy: past its largest array)
            raise AllocationError(f"model {cfg.name}: cannot make weight {name} {list(ne)} "
                                  f"({type(e).__name__}: {e})") from None
    if cfg.tied_output:
        out["output.weight"] = out["token_embd.weight"]
    return out


# ---------------------------------------------------------------------------
# tensor data out

def tensor_values(t: Tensor) -> np.ndarray:
    """A contiguous float tensor's values as float32, numpy order (dequantised)."""
    raw = host_bytes(instance_arg(t, Tensor, "tensor"))   # a view; to_f32 copies
    if raw is None:
        raw = np.frombuffer(tensor_get(t), dtype=np.uint8)
    shape = tuple(reversed(t.ne))
    if quants.is_quantized(t.type):
        return quants.to_f32(t.type, raw.reshape(shape[:-1] + (-1,)))
    return quants.to_f32(t.type, raw.view(quants.PLAIN_DTYPES[t.type]).reshape(shape))


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
        """A model of `config` with seeded random weights (random_weights)."""
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
        self.buffers = [buf for be, ts in groups.values() for buf in
                        alloc_ctx_tensors_from_buft(ts, be.get_default_buffer_type(), "weights")]
        self.backends = list({id(b): b for b, _ in groups.values()}.values())
        # a simulated device holds no bytes: the model is placed, without data
        self.has_data = not any(buf.is_simulated for buf in self.buffers)
        for name, tensor in self.tensors.items():
            if not get_buffer(tensor).is_simulated:
                tensor_set(tensor, self.weights[name][1])
        return self

    @property
    def n_params(self) -> int:
        """The number of weights."""
        return sum(math.prod(ne) for _, ne in weight_shapes(self.config).values())

    @property
    def nbytes(self) -> int:
        """Bytes of the weights as stored (quantized types at their size)."""
        return sum(s.nbytes for _, s in self.weights.values())


SWA_PAD = 256       # llama_kv_cache_iswa pads the sliding layers' cache to this


@dataclass
class SwaSlot:
    """Where one step's tokens go in the sliding layers' cache, and what its cells hold
    then: `idxs`, each token's cell; `pos`, every cell's position after the step (-1: empty);
    `head`, where the next search starts; `n_kv`, the cells attention reads (the used ones
    rounded up to kv_pad, as in the global layers' cache; llama.cpp rounds both to 256)."""
    idxs: np.ndarray
    pos: np.ndarray
    head: int
    n_kv: int


class KVCache:
    """Per-layer K and V cache tensors in the layer's backend (llama_kv_cache, one
    sequence). K: ne [n_embd_gqa, cells], a row per cell; V: ne [cells, n_embd_gqa],
    stored transposed (a row per channel), as llama.cpp does without flash attention, or
    with it (config.flash_attn) a row per cell as K.

    A model with a sliding window has llama_kv_cache_iswa's two caches: the global layers'
    of n_ctx cells, where a token's cell is its position, and the sliding layers' of
    `cells_swa` (the window and a ubatch of `n_ubatch` tokens, padded to 256; n_ctx with
    `swa_full`), whose cells are taken again once no later token can see them
    (swa_slot)."""

    def __init__(self, model: Model, n_ubatch: int = 512, swa_full: bool = False):
        if not instance_arg(model, Model, "model").tensors:
            raise ModelError("the model's weights are not placed (Model.place)")
        cfg = model.config
        self.config = cfg
        self.n_ubatch = int_arg(n_ubatch, "n_ubatch", 1, 2**31 - 1)
        self.cells = cfg.n_ctx
        self.cells_swa = swa_cells(cfg, n_ubatch, bool(swa_full))
        self.ctx = Context(f"{cfg.name}.kv")
        self.k, self.v = [], []
        groups = {}
        for il in range(cfg.n_layer):
            cells = self.cells_swa if cfg.is_swa(il) else self.cells
            k = ops.new_tensor_2d(self.ctx, cfg.cache_type, cfg.n_embd_gqa, cells,
                                  name=f"cache_k_l{il}")
            v_ne = (cfg.n_embd_gqa, cells) if cfg.flash_attn else (cells, cfg.n_embd_gqa)
            v = ops.new_tensor_2d(self.ctx, cfg.cache_type, *v_ne, name=f"cache_v_l{il}")
            self.k.append(k)
            self.v.append(v)
            be = model.layer_backend[il]
            groups.setdefault((cfg.is_swa(il), id(be)), (be, []))[1].extend([k, v])
        # llama.cpp leaves the cache buffer's usage at 'any': the scheduler places
        # its views by the buffer's backend, not as weights; each cache has its buffers
        self.buffers = [buf for be, ts in groups.values() for buf in
                        alloc_ctx_tensors_from_buft(ts, be.get_default_buffer_type(), "any")]
        self.backends = list({id(be): be for be, _ in groups.values()}.values())
        self.clear()

    @property
    def nbytes(self) -> int:
        """The bytes of the cache's buffers."""
        return sum(buf.size for buf in self.buffers)

    def clear(self) -> None:
        """Empty the cache: n_past 0 and every cell zeroed (ggml_backend_buffer_clear), since
        masked cells still enter the V product with weight 0, and 0 * NaN is NaN."""
        self.n_past = 0
        self.swa = SwaSlot(np.zeros(0, dtype=np.int64), np.full(self.cells_swa, -1, np.int64),
                           0, 0)
        for buf in self.buffers:
            buf.clear(0)

    def swa_slot(self, n_past: int, n_tokens: int) -> SwaSlot:
        """The sliding layers' cells for `n_tokens` tokens at positions n_past.., as
        llama_kv_cache::find_slot and apply_ubatch place them (the cache itself unchanged
        until `advance`): from the head on, wrapping around, each cell that is empty or
        whose position the first new token no longer sees; the cells of positions up to the
        latest one taken are emptied, so that the positions kept stay contiguous."""
        cfg = self.config
        n_past = int_arg(n_past, "n_past", 0, cfg.n_ctx)
        n_tokens = int_arg(n_tokens, "n_tokens", 1, cfg.n_ctx)
        pos, head = self.swa.pos.copy(), self.swa.head
        gone = np.flatnonzero(pos >= n_past)    # a rewound cache: llama.cpp's seq_rm
        if gone.size:
            pos[gone] = -1
            head = min(head, int(gone[0]))
        used = pos >= 0
        if head > int(np.count_nonzero(used)) + 2 * n_tokens:   # (room before: from the start)
            head = 0
        first = int(pos.max()) + 1              # (no cell used: every cell free anyway)
        free = np.flatnonzero(~used | (first - pos >= cfg.n_swa))
        k = int(np.searchsorted(free, head))    # from the head on, then from the start
        free = np.concatenate((free[k:], free[:k]))
        if free.size < n_tokens:
            raise ModelError(f"model {cfg.name}: the sliding layers' cache of {self.cells_swa} "
                             f"cells has no room for {n_tokens} tokens (its window is "
                             f"{cfg.n_swa}; a batch of at most {self.n_ubatch} tokens fits)")
        idxs = free[:n_tokens]
        taken = pos[idxs]
        if (taken >= 0).any():
            pos[(pos >= 0) & (pos <= taken.max())] = -1
        pos[idxs] = np.arange(n_past, n_past + n_tokens)
        used_max_p1 = int(np.flatnonzero(pos >= 0)[-1]) + 1
        pad = cfg.kv_pad
        n_kv = min(self.cells_swa, max(pad, -(-used_max_p1 // pad) * pad))
        return SwaSlot(idxs, pos, int(idxs[-1]) + 1, n_kv)

    def advance(self, n_tokens: int, swa: SwaSlot | None) -> None:
        """A step of `n_tokens` is in the cache: the sliding layers' cells as `swa` placed
        them (None: a model without a window)."""
        self.n_past += int_arg(n_tokens, "n_tokens", 0, self.config.n_ctx - self.n_past)
        if instance_arg(swa, SwaSlot, "swa", optional=True) is not None:
            self.swa = swa


def swa_cells(cfg: ModelConfig, n_ubatch: int, swa_full: bool = False) -> int:
    """The cells of the sliding layers' cache (llama_kv_cache_iswa): the window and a
    ubatch, at most n_ctx, padded to 256 (so never below 256 cells); n_ctx with swa_full
    or without a window."""
    n_ubatch = int_arg(n_ubatch, "n_ubatch", 1, 2**31 - 1)
    if not instance_arg(cfg, ModelConfig, "config").iswa or swa_full:
        return cfg.n_ctx
    return -(-min(cfg.n_ctx, cfg.n_swa + n_ubatch) // SWA_PAD) * SWA_PAD
