"""GGUF files in and out, through the `gguf` package (pip install "ggml-py-sched[gguf]").

`load_gguf(path)` reads a file of an architecture ARCHS lists (llama dense, or
Mixtral-style MoE when it has experts; qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3) into a
`Model`: its metadata becomes the ModelConfig (the keys and tensor names those of the
`gguf` package's Keys and TENSOR_NAMES), its tensors the weights (f32, f16, bf16 and
every block type ggml_py computes with: q4_0 ... q8_0, q2_K ... q6_K, iq4_nl, iq4_xs,
mxfp4; any other type is an error naming the tensor).
`save_gguf(model, path)` writes such a file, which is how the tests make one.

A llama file's attention.sliding_window (Mistral 7B's files carry one) is not read:
llama.cpp's llama graph does not read it either, every layer attending over the whole
context.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ggml_py._core import instance_arg, row_size
from ggml_py.errors import ArgumentTypeError, ModelError
from ggml_py.models.config import (ARCH_DEFAULTS, ARCH_FFNS, ARCH_ROPE, FUSED_ARCHS,
                                   GRAPH_KINDS, QK_NORM_ARCHS, SWA_ARCHS, swa_pattern)
from ggml_py.models.config import WEIGHT_TYPES, ModelConfig, weight_shapes
from ggml_py.models.model import Model

ARCH = "llama"
ARCHS = tuple(ARCH_ROPE)        # the architectures a file may have

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


@dataclass(frozen=True)
class TensorInfo:
    """A weight as the file describes it: ggml type, ne, and where its bytes lie."""
    type: str
    ne: tuple[int, ...]
    offset: int             # from the file's start
    nbytes: int


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


def _tensor_name(gguf, tensor, bid=None, suffix="weight"):
    """The GGUF name of a MODEL_TENSOR (gguf.TENSOR_NAMES), e.g. blk.0.attn_q.bias."""
    base = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, tensor)]
    return (base.format(bid=bid) if bid is not None else base) + "." + suffix


def config_from_gguf(reader, n_ctx: int | None = None, wtype: str | None = None,
                     graph: str | None = None, flash_attn: bool = False) -> ModelConfig:
    """A file's metadata (an architecture of ARCHS) -> ModelConfig. n_ctx: KV cache cells
    (default: the file's context_length); graph: ModelConfig.graph (llama's default is its
    own graph, 'llama.cpp' builds llama.cpp's); flash_attn: ModelConfig.flash_attn."""
    gguf = _gguf()
    K = gguf.Keys
    path = _path(reader)
    arch = _field(reader, K.General.ARCHITECTURE, required=True)
    if arch not in ARCHS:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (only "
                        f"{', '.join(repr(a) for a in ARCHS)})")

    def key(k, default=None, required=False):
        return _field(reader, k.format(arch=arch), default, required)

    n_head = int(key(K.Attention.HEAD_COUNT, required=True))
    n_embd = int(key(K.LLM.EMBEDDING_LENGTH, required=True))
    if n_head < 1:
        raise GGUFError(f"{path}: {K.Attention.HEAD_COUNT.format(arch=arch)} is {n_head}")
    n_ff = int(key(K.LLM.FEED_FORWARD_LENGTH, required=True))
    n_expert, n_expert_used, n_ff_exp = _experts(reader, arch, graph, n_ff)
    freq_scale = 1.0
    if key(K.Rope.SCALING_TYPE) == "linear":
        freq_scale = 1.0 / float(key(K.Rope.SCALING_FACTOR, 1.0))
    tensors = {t.name: t for t in reader.tensors}
    # the head size: attention.key_length (= value_length), by default n_embd / n_head
    d_k = key(K.Attention.KEY_LENGTH)
    d_v = key(K.Attention.VALUE_LENGTH)
    if d_k is not None and d_v is not None and int(d_k) != int(d_v):
        raise GGUFError(f"{path}: {K.Attention.KEY_LENGTH.format(arch=arch)} {d_k} != "
                        f"{K.Attention.VALUE_LENGTH.format(arch=arch)} {d_v} (llama.cpp's "
                        f"{arch} needs equal K and V heads)")
    head = int(d_k if d_k is not None else d_v if d_v is not None else n_embd // n_head)
    n_rot = int(key(K.Rope.DIMENSION_COUNT, head))
    n_vocab = key(K.LLM.VOCAB_SIZE)
    embd = _tensor_name(gguf, "TOKEN_EMBD")
    if n_vocab is None:
        if embd not in tensors:
            raise GGUFError(f"{path}: no {K.LLM.VOCAB_SIZE.format(arch=arch)} and no {embd}")
        n_vocab = int(tensors[embd].shape[1])
    fused_qkv = arch in FUSED_ARCHS and _tensor_name(gguf, "ATTN_QKV", 0) in tensors
    if wtype is None:
        q = tensors.get(_tensor_name(gguf, "ATTN_QKV" if fused_qkv else "ATTN_Q", 0))
        wtype = _type_name(q) if q is not None else "f32"
    if arch != "llama" or graph == "llama.cpp":
        if n_rot != head and arch not in FUSED_ARCHS:   # (llama.cpp asserts it there)
            raise GGUFError(f"{path}: {K.Rope.DIMENSION_COUNT.format(arch=arch)} {n_rot} is "
                            f"not the head size {head}; llama.cpp's {arch} rotates whole heads")
        _check_tensors_known(gguf, tensors, arch, path)
    biases = [_tensor_name(gguf, t, 0, "bias") in tensors for t in ("ATTN_Q", "ATTN_K", "ATTN_V")]
    if any(biases) and not all(biases):
        raise GGUFError(f"{path}: has {' and '.join(n for n, b in zip('QKV', biases) if b)} "
                        f"biases but not all three of Q, K and V")
    n_layer = int(key(K.LLM.BLOCK_COUNT, required=True))
    swa = _swa_fields(key, K, arch, n_layer, path) if arch in SWA_ARCHS else {}
    factors = [_tensor_name(gguf, t) in tensors
               for t in ("ROPE_FACTORS_LONG", "ROPE_FACTORS_SHORT")]
    if any(factors) and not (all(factors) and arch in FUSED_ARCHS):
        raise GGUFError(f"{path}: rope factors ({arch}) are read for phi3 files with both the "
                        f"long and the short ones only")
    n_ctx_train = int(key(K.LLM.CONTEXT_LENGTH, required=True))
    return ModelConfig(
        name=str(_field(reader, K.General.NAME, "gguf")),
        arch=arch,
        graph=graph,
        rope_mode=ARCH_ROPE[arch],
        attn_bias=all(biases),
        qk_norm=arch in QK_NORM_ARCHS,
        n_embd_head=None if head * n_head == n_embd else head,
        n_vocab=int(n_vocab),
        n_ctx=int(n_ctx or n_ctx_train),
        n_embd=n_embd, n_head=n_head,
        n_head_kv=int(key(K.Attention.HEAD_COUNT_KV, n_head)),
        n_layer=n_layer,
        n_ff=n_ff,
        n_rot=None if n_rot == head else n_rot,
        rope_freq_base=_f32_decimal(key(K.Rope.FREQ_BASE, 10000.0)),
        rope_freq_scale=freq_scale,
        eps=_f32_decimal(key(K.Attention.LAYERNORM_RMS_EPS, 1e-5,
                                required=arch != "llama" or graph == "llama.cpp")),
        wtype=wtype,
        ffn="moe_topk" if n_expert else "dense",
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        fused_qkv=fused_qkv,
        rope_factors=all(factors),
        n_ctx_orig=int(key(K.Rope.SCALING_ORIG_CTX_LEN, n_ctx_train)) if all(factors) else None,
        rope_attn_factor=_f32_decimal(key(K.Rope.SCALING_ATTN_FACTOR, 1.0)),
        flash_attn=flash_attn,
        **swa,
    )


def _swa_fields(key, K, arch, n_layer, path) -> dict:
    """gemma's window, its sliding layers, their rope and the soft-caps, with llama.cpp's
    defaults for the keys a file leaves out (config.ARCH_DEFAULTS). The pattern is every
    how many layers one is global (a number), or a flag per layer (an array)."""
    d = ARCH_DEFAULTS[arch]
    n_swa = int(key(K.Attention.SLIDING_WINDOW, d["n_swa"]))
    pattern = key(K.Attention.SLIDING_WINDOW_PATTERN, d["swa_pattern"])
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise GGUFError(f"{path}: {K.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)} "
                            f"has {len(pattern)} flags for {n_layer} layers")
        layers = tuple(il for il, f in enumerate(pattern) if f)
    else:
        layers = swa_pattern(n_layer, int(pattern))
    out = dict(n_swa=n_swa, swa_layers=layers if n_swa else (),
               attn_softcap=_f32_decimal(key(K.LLM.ATTN_LOGIT_SOFTCAPPING, d["attn_softcap"]))
               if d["attn_softcap"] else 0.0,
               final_softcap=_f32_decimal(key(K.LLM.FINAL_LOGIT_SOFTCAPPING, d["final_softcap"])))
    base_swa = key(K.Rope.FREQ_BASE_SWA, d.get("rope_freq_base_swa"))
    if base_swa is not None:
        out["rope_freq_base_swa"] = _f32_decimal(base_swa)
    if "rope_freq_scale_swa" in d:
        out["rope_freq_scale_swa"] = d["rope_freq_scale_swa"]
    return out


def _experts(reader, arch, graph, n_ff):
    """(n_expert, n_expert_used, n_ff_exp) of a file: none for a dense one. qwen3moe must
    have experts, and its experts' width is expert_feed_forward_length (by default
    n_ff / n_expert_used); llama.cpp's llama ignores that key (its experts are n_ff wide),
    so a llama file built as llama.cpp builds it must not contradict that."""
    K = _gguf().Keys
    path = _path(reader)

    def key(k, default=None):
        return _field(reader, k.format(arch=arch), default)

    n_expert = int(key(K.LLM.EXPERT_COUNT, 0) or 0)
    n_used = int(key(K.LLM.EXPERT_USED_COUNT, 0) or 0)
    if "dense" not in ARCH_FFNS[arch]:
        for k, v in ((K.LLM.EXPERT_COUNT, n_expert), (K.LLM.EXPERT_USED_COUNT, n_used)):
            if v < 1:
                raise GGUFError(f"{path}: {arch} needs experts: {k.format(arch=arch)} is "
                                f"{'missing' if key(k) is None else v}")
    if not n_expert:
        if n_used:      # (llama.cpp asserts it)
            raise GGUFError(f"{path}: {K.LLM.EXPERT_USED_COUNT.format(arch=arch)} {n_used} "
                            f"without experts ({K.LLM.EXPERT_COUNT.format(arch=arch)})")
        return 0, 0, None
    if not 0 < n_used <= n_expert:
        raise GGUFError(f"{path}: {K.LLM.EXPERT_USED_COUNT.format(arch=arch)} {n_used} is not "
                        f"in 1..{K.LLM.EXPERT_COUNT.format(arch=arch)} {n_expert}")
    n_ff_exp = key(K.LLM.EXPERT_FEED_FORWARD_LENGTH)
    if arch == "qwen3moe":
        return n_expert, n_used, int(n_ff_exp) if n_ff_exp is not None else n_ff // n_used
    if graph == "llama.cpp" and n_ff_exp is not None and int(n_ff_exp) != n_ff:
        ff = K.LLM.FEED_FORWARD_LENGTH.format(arch=arch)
        raise GGUFError(f"{path}: {K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch)} "
                        f"{n_ff_exp} != {ff} {n_ff}; llama.cpp's llama experts are {ff} wide")
    return n_expert, n_used, int(n_ff_exp if n_ff_exp is not None else n_ff)


# tensors llama.cpp's graphs of these architectures would use that ggml_py's do not model yet:
# a file with one is refused rather than computed without it
_UNSUPPORTED = (("ATTN_QKV", "weight"), ("ATTN_OUT", "bias"), ("FFN_GATE", "bias"),
                ("FFN_UP", "bias"), ("FFN_DOWN", "bias"), ("ROPE_FREQS", "weight"),
                ("OUTPUT", "bias"), ("FFN_UP_SHEXP", "weight"))


def _check_tensors_known(gguf, tensors, arch, path):
    """GGUFError for the first tensor (of any block) that _UNSUPPORTED names."""
    patterns = [re.escape(gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, t)] + "." + suffix)
                .replace(re.escape("{bid}"), r"\d+") for t, suffix in _UNSUPPORTED
                if not (arch in FUSED_ARCHS and t == "ATTN_QKV")]
    unsupported = re.compile("|".join(patterns))
    for n in tensors:
        if unsupported.fullmatch(n):
            raise GGUFError(f"{path}: tensor {n!r} ({arch}) is not supported yet")
    head = _tensor_name(gguf, "OUTPUT")
    if arch == "gemma2" and head in tensors:      # (llama.cpp refuses the file too)
        raise GGUFError(f"{path}: tensor {head!r}: gemma2's output head is "
                        f"{_tensor_name(gguf, 'TOKEN_EMBD')}, it has no other")


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


def _check_path(path) -> None:
    """ArgumentTypeError unless `path` is a path (an int would be taken for a descriptor)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"a GGUF file is given by its path, got {type(path).__name__}")


def _reader(path):
    """A GGUFReader of `path`; GGUFError, naming the file, when it cannot be read as GGUF."""
    _check_path(path)
    gguf = _gguf()
    try:
        with np.errstate(all="raise"):      # sizes that overflow: damage, not a warning
            return gguf.GGUFReader(os.fspath(path))
    except OSError as e:
        raise GGUFError(f"{path}: cannot read it: {e.strerror or e}") from None
    except Exception as e:          # the gguf package's parser reports damage in many ways
        raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _config(reader, path, n_ctx, graph=None, flash_attn=False):
    if graph is not None and graph not in GRAPH_KINDS:
        raise GGUFError(f"graph must be one of {GRAPH_KINDS} or None, got {graph!r}")
    try:
        return config_from_gguf(reader, n_ctx, graph=graph, flash_attn=flash_attn)
    except GGUFError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:   # metadata the config refuses
        raise GGUFError(f"{path}: {e}") from None


def read_config(path, n_ctx: int | None = None, graph: str | None = None,
                flash_attn: bool = False) -> ModelConfig:
    """The ModelConfig of a GGUF file (an architecture of ARCHS), from its metadata alone (no
    tensor is read); graph and flash_attn: ModelConfig's."""
    return _config(_reader(path), path, n_ctx, graph, flash_attn)


def _model_tensors(reader, cfg: ModelConfig, path) -> dict:
    """{weight name: the reader's tensor} of every weight cfg's graph uses, shapes checked
    (no weight byte is read); a tied output is the token embeddings."""
    want = weight_shapes(cfg)
    found = {}
    for t in reader.tensors:
        if t.name not in want:
            continue            # tensors the graph does not use (rope_freqs, ...)
        ne = tuple(int(x) for x in t.shape)
        if ne != tuple(want[t.name][1]) + (1,) * (len(ne) - len(want[t.name][1])):
            raise GGUFError(f"tensor {t.name!r} has ne {list(ne)}, the config implies "
                            f"{list(want[t.name][1])}")
        found[t.name] = t
    if "output.weight" not in found and "token_embd.weight" in found:
        found["output.weight"] = found["token_embd.weight"]     # tied embeddings
    missing = [name for name in want if name not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GGUFError(f"{path}: has no tensor {missing[0]!r}{more}, which its metadata "
                        "implies")
    return {name: found[name] for name in want}


def read_tensor_infos(path, n_ctx: int | None = None) -> tuple[ModelConfig, dict]:
    """(the file's ModelConfig with llama.cpp's graph, {weight name: TensorInfo}) from the
    metadata and tensor infos alone: what planning needs, without a weight byte."""
    reader = _reader(path)
    cfg = _config(reader, path, n_ctx, "llama.cpp")
    return cfg, {name: TensorInfo(_type_name(t), tuple(int(x) for x in t.shape),
                                  int(t.data_offset), int(t.n_bytes))
                 for name, t in _model_tensors(reader, cfg, path).items()}


def load_gguf(path, n_ctx: int | None = None, graph: str | None = None,
              flash_attn: bool = False) -> Model:
    """A Model from a GGUF file of an architecture of ARCHS (weights copied out of the file;
    not yet placed). graph: 'llama.cpp' builds llama.cpp's graph for a llama file too (the
    other architectures always have it); flash_attn: with flash attention, as llama.cpp's
    -fa on (llama.cpp's graph only)."""
    reader = _reader(path)
    cfg = _config(reader, path, n_ctx, graph, flash_attn)
    copied: dict = {}           # by the file's name: a tied output is its token_embd
    weights = {}
    for name, t in _model_tensors(reader, cfg, path).items():
        if t.name not in copied:
            copied[t.name] = (_type_name(t), np.array(t.data))
        weights[name] = copied[t.name]
    return Model(cfg, weights)


def _add_swa_keys(gguf, w, cfg, path) -> None:
    """gemma's window, its pattern (as every how many layers one is global: llama.cpp reads
    no other form it writes), the sliding layers' rope base and the soft-caps."""
    K = gguf.Keys
    if cfg.n_swa:
        w.add_sliding_window(cfg.n_swa)
        n = next((n for n in range(cfg.n_layer + 1)
                  if swa_pattern(cfg.n_layer, n) == cfg.swa_layers), None)
        if n is None:
            raise GGUFError(f"{path}: sliding layers {cfg.swa_layers} are no 'all but every "
                            f"n-th layer' pattern, which is all a GGUF file can say")
        w.add_uint32(K.Attention.SLIDING_WINDOW_PATTERN.format(arch=cfg.arch), n)
    if cfg.rope_freq_base_swa is not None:
        w.add_float32(K.Rope.FREQ_BASE_SWA.format(arch=cfg.arch), cfg.rope_freq_base_swa)
    if cfg.arch == "gemma2":
        w.add_float32(K.LLM.ATTN_LOGIT_SOFTCAPPING.format(arch=cfg.arch), cfg.attn_softcap)
    w.add_float32(K.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch=cfg.arch), cfg.final_softcap)


def save_gguf(model: Model, path) -> None:
    """Write `model` as a GGUF file of its architecture (llama dense or Mixtral-style top-k
    MoE, qwen2, qwen3, gemma2, gemma3, phi3), with tokenizer.ggml.model 'none' so that
    llama.cpp loads it."""
    cfg = instance_arg(model, Model, "model").config
    _write_gguf(cfg, {name: model.weights[name] for name in _file_weights(cfg)}, path)


def _write_gguf(cfg: ModelConfig, weights: dict, path) -> None:
    """Write cfg's metadata and `weights` ({name: (ggml type, stored array)}, in order, of
    any type the gguf package names) as a GGUF file, as they are: save_gguf's writer, and
    the tests' for files that hold less or other than their metadata says."""
    gguf = _gguf()
    w = _metadata_writer(gguf, cfg, path)
    for name, (t, stored) in weights.items():
        if t in ("f32", "f16"):
            w.add_tensor(name, np.ascontiguousarray(stored))
        else:                               # blocks and bf16: their bytes
            w.add_tensor(name, np.ascontiguousarray(stored, dtype=np.uint8),
                         raw_dtype=getattr(gguf.GGMLQuantizationType, t.upper()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def save_gguf_layout(cfg: ModelConfig, path, types: dict[str, str] | None = None) -> None:
    """Write the GGUF file of a model of `cfg` without its weights: the metadata and tensor
    infos, the data section left a hole of the right size (a sparse file where the file
    system allows), which is all that planning reads. types: {weight name: ggml type}
    over weight_shapes(cfg)'s (cfg.wtype for matrices, f32 for norms)."""
    gguf = _gguf()
    shapes = weight_shapes(instance_arg(cfg, ModelConfig, "config"))
    _check_path(path)
    types = {} if types is None else instance_arg(types, dict, "types")
    for name, t in types.items():
        if name not in shapes or t not in _TYPES.values():
            raise GGUFError(f"types: {name!r}: {t!r} is not a weight of this config and one of "
                            f"{', '.join(_TYPES.values())}")
    w = _metadata_writer(gguf, cfg, path)
    qtypes = {v: getattr(gguf.GGMLQuantizationType, k) for k, v in _TYPES.items()}
    for name in _file_weights(cfg):
        t, ne = shapes[name]
        t = types.get(name, t)
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32),
                          row_size(t, ne[0]) * math.prod(ne[1:]), raw_dtype=qtypes[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    data = -(-os.path.getsize(path) // w.data_alignment) * w.data_alignment
    os.truncate(path, data + sum(-(-ti.nbytes // w.data_alignment) * w.data_alignment
                                 for ti in w.tensors[0].values()))


def _file_weights(cfg: ModelConfig) -> list:
    """The weights a file of cfg holds: weight_shapes' less a tied output (the file's head
    is its token_embd)."""
    return [name for name in weight_shapes(cfg)
            if not (name == "output.weight" and cfg.tied_output)]


def _metadata_writer(gguf, cfg: ModelConfig, path):
    """A GGUFWriter of `path` with cfg's metadata added."""
    if cfg.ffn not in ARCH_FFNS[cfg.arch]:
        raise GGUFError(f"the {cfg.arch} architecture has no {cfg.ffn} FFN here; only "
                        f"{' or '.join(ARCH_FFNS[cfg.arch])} {cfg.arch} models can be written")
    w = gguf.GGUFWriter(str(path), cfg.arch)
    w.add_name(cfg.name)
    w.add_tokenizer_model("none")
    w.add_vocab_size(cfg.n_vocab)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    if cfg.n_embd_head is not None:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.n_rot_)
    w.add_rope_freq_base(cfg.rope_freq_base)
    if cfg.rope_attn_factor != 1.0:
        w.add_float32(gguf.Keys.Rope.SCALING_ATTN_FACTOR.format(arch=cfg.arch),
                      cfg.rope_attn_factor)
    if cfg.n_ctx_orig is not None:
        w.add_uint32(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=cfg.arch), cfg.n_ctx_orig)
    if cfg.rope_freq_scale != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0 / cfg.rope_freq_scale)
    w.add_layer_norm_rms_eps(cfg.eps)
    if cfg.arch in SWA_ARCHS:
        _add_swa_keys(gguf, w, cfg, path)
    if cfg.is_moe:
        w.add_expert_count(cfg.n_expert)
        w.add_expert_used_count(cfg.n_expert_used)
        w.add_expert_feed_forward_length(cfg.ff_exp)
    return w
