"""GGUF files in and out, through the `gguf` package (pip install "ggml-py-sched[gguf]").

`load_gguf(path)` reads a llama-architecture file (dense, or Mixtral-style MoE when it
has experts) into a `Model`: its metadata becomes the ModelConfig, its tensors the
weights (f32, f16, bf16 and every block type ggml_py computes with: q4_0 ... q8_0,
q2_K ... q6_K, iq4_nl, iq4_xs, mxfp4; any other type is an error naming the tensor).
`save_gguf(model, path)` writes such a file, which is how the tests make one.
"""

from __future__ import annotations

import os

import numpy as np

from ggml_py._core import instance_arg
from ggml_py.errors import ArgumentTypeError, ModelError
from ggml_py import quants
from ggml_py.models.transformer import WEIGHT_TYPES, Model, ModelConfig, weight_shapes

ARCH = "llama"

# GGMLQuantizationType names -> ggml_py type names, for the types the models compute
_TYPES = {t.upper(): t for t in WEIGHT_TYPES}


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("reading or writing GGUF files needs the `gguf` package: "
                          "pip install gguf (or the package's [gguf] extra)") from None
    return gguf


class GGUFError(ModelError):
    """A GGUF file this loader cannot turn into a model (or cannot read at all)."""


def _path(reader):
    """The file a reader reads (the gguf package keeps it on its memmap)."""
    return getattr(getattr(reader, "data", None), "filename", None) or "GGUF file"


def _field(reader, key, default=None, required=False):
    get_field = getattr(reader, "get_field", None)
    if get_field is None:
        raise GGUFError(f"expected a gguf.GGUFReader, got {type(reader).__name__}")
    f = get_field(key)
    if f is None:
        if required:
            raise GGUFError(f"{_path(reader)}: metadata key {key!r} is missing")
        return default
    return f.contents()


def config_from_gguf(reader, n_ctx: int | None = None, wtype: str | None = None) -> ModelConfig:
    """llama metadata -> ModelConfig. n_ctx: KV cache cells (default: the file's
    context_length)."""
    arch = _field(reader, "general.architecture", required=True)
    if arch != ARCH:
        raise GGUFError(f"{_path(reader)}: architecture {arch!r} is not supported (only {ARCH!r})")

    def key(k, default=None, required=False):
        return _field(reader, f"{ARCH}.{k}", default, required)

    n_head = int(key("attention.head_count", required=True))
    n_embd = int(key("embedding_length", required=True))
    n_expert = int(key("expert_count", 0) or 0)
    n_ff = int(key("feed_forward_length", required=True))
    freq_scale = 1.0
    if key("rope.scaling.type") == "linear":
        freq_scale = 1.0 / float(key("rope.scaling.factor", 1.0))
    tensors = {t.name: t for t in reader.tensors}
    n_rot = int(key("rope.dimension_count", n_embd // n_head))
    n_vocab = key("vocab_size")
    if n_vocab is None:
        if "token_embd.weight" not in tensors:
            raise GGUFError(f"{_path(reader)}: no vocab_size and no token_embd.weight")
        n_vocab = int(tensors["token_embd.weight"].shape[1])
    if wtype is None:
        q = tensors.get("blk.0.attn_q.weight")
        wtype = _type_name(q) if q is not None else "f32"
    return ModelConfig(
        name=str(_field(reader, "general.name", "gguf")),
        n_vocab=int(n_vocab),
        n_ctx=int(n_ctx or key("context_length", required=True)),
        n_embd=n_embd, n_head=n_head,
        n_head_kv=int(key("attention.head_count_kv", n_head)),
        n_layer=int(key("block_count", required=True)),
        n_ff=n_ff,
        n_rot=None if n_rot == n_embd // n_head else n_rot,
        rope_freq_base=_f32_decimal(key("rope.freq_base", 10000.0)),
        rope_freq_scale=freq_scale,
        eps=_f32_decimal(key("attention.layer_norm_rms_epsilon", 1e-5)),
        wtype=wtype,
        ffn="moe_topk" if n_expert else "dense",
        n_expert=n_expert,
        n_expert_used=int(key("expert_used_count", 0) or 0),
        n_ff_exp=int(key("expert_feed_forward_length", n_ff)) if n_expert else None,
    )


def _f32_decimal(x) -> float:
    """The shortest decimal that a float32 metadata value was written from (1e-05, not
    9.99999974e-06); ggml stores such parameters as float32 again."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _type_name(t) -> str:
    name = t.tensor_type.name
    if name not in _TYPES:
        raise GGUFError(f"tensor {t.name!r} has type {name}; supported: "
                        f"{', '.join(_TYPES)}")
    return _TYPES[name]


def _reader(path):
    """A GGUFReader of `path`; GGUFError, naming the file, when it cannot be read as GGUF."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"a GGUF file is given by its path, got {type(path).__name__}")
    gguf = _gguf()
    try:
        with np.errstate(all="raise"):      # sizes that overflow: damage, not a warning
            return gguf.GGUFReader(os.fspath(path))
    except OSError as e:
        raise GGUFError(f"{path}: cannot read it: {e.strerror or e}") from None
    except Exception as e:          # the gguf package's parser reports damage in many ways
        raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _config(reader, path, n_ctx):
    try:
        return config_from_gguf(reader, n_ctx)
    except GGUFError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:   # metadata the config refuses
        raise GGUFError(f"{path}: {e}") from None


def read_config(path, n_ctx: int | None = None) -> ModelConfig:
    """The ModelConfig of a llama GGUF file, from its metadata alone (no tensor is read)."""
    return _config(_reader(path), path, n_ctx)


def load_gguf(path, n_ctx: int | None = None) -> Model:
    """A Model from a llama GGUF file (weights copied out of the file; not yet placed)."""
    reader = _reader(path)
    cfg = _config(reader, path, n_ctx)
    want = weight_shapes(cfg)
    weights = {}
    for t in reader.tensors:
        if t.name not in want:
            continue            # tensors the graph does not use (rope_freqs, ...)
        ne = tuple(int(x) for x in t.shape)
        if ne != tuple(want[t.name][1]) + (1,) * (len(ne) - len(want[t.name][1])):
            raise GGUFError(f"tensor {t.name!r} has ne {list(ne)}, the config implies "
                            f"{list(want[t.name][1])}")
        weights[t.name] = (_type_name(t), np.array(t.data))
    if "output.weight" not in weights and "token_embd.weight" in weights:
        weights["output.weight"] = weights["token_embd.weight"]     # tied embeddings
    missing = [name for name in want if name not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GGUFError(f"{path}: has no tensor {missing[0]!r}{more}, which its metadata "
                        "implies")
    return Model(cfg, weights)


def save_gguf(model: Model, path) -> None:
    """Write `model` as a llama GGUF file (dense or Mixtral-style top-k MoE)."""
    gguf = _gguf()
    cfg = instance_arg(model, Model, "model").config
    if cfg.ffn not in ("dense", "moe_topk"):
        raise GGUFError(f"the {ARCH} architecture has no {cfg.ffn} FFN; only dense and "
                        "moe_topk models can be written")
    if cfg.rope_neox:
        raise GGUFError("llama GGUF files imply NORMAL rope")
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(cfg.name)
    w.add_vocab_size(cfg.n_vocab)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_rope_dimension_count(cfg.n_rot_)
    w.add_rope_freq_base(cfg.rope_freq_base)
    if cfg.rope_freq_scale != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0 / cfg.rope_freq_scale)
    w.add_layer_norm_rms_eps(cfg.eps)
    if cfg.is_moe:
        w.add_expert_count(cfg.n_expert)
        w.add_expert_used_count(cfg.n_expert_used)
        w.add_expert_feed_forward_length(cfg.ff_exp)
    qtypes = {v: getattr(gguf.GGMLQuantizationType, k) for k, v in _TYPES.items()}
    for name in weight_shapes(cfg):
        t, stored = model.weights[name]
        if quants.is_quantized(t) or t == "bf16":
            w.add_tensor(name, np.ascontiguousarray(stored, dtype=np.uint8), raw_dtype=qtypes[t])
        else:
            w.add_tensor(name, np.ascontiguousarray(stored))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
