"""Model configurations (llama and MoE forms) and the weights they name: shapes, which
layer a weight belongs to, and how large a forward graph can get."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ggml_py import quants
from ggml_py._core import ROPE_TYPES, ggml_type, instance_arg, int_arg
from ggml_py.errors import GraphError, ModelError, UnknownNameError
from ggml_py.ops import rope_mode_id

FFN_KINDS = ("dense", "moe_dense", "moe_topk", "moe_shared")
# the types a weight may have: those MUL_MAT reads as src0 (the vec_dot types q8_1 and
# q8_K only ever hold activations)
WEIGHT_TYPES = ("f32", "f16", "bf16") + tuple(t for t in quants.BLOCKS if t not in ("q8_1", "q8_K"))
CACHE_TYPES = ("f16", "f32")
ROPE_MODES = ("NORMAL", "NEOX")     # (GGML_ROPE_TYPE_ spellings and any case too)
MAX_LAYERS = 512                    # llama.cpp's LLAMA_MAX_LAYERS
_INT32_MAX = (1 << 31) - 1

# the integer fields: (smallest, largest); n_rot and n_ff_exp may also be None
_INT_FIELDS = {
    "n_vocab": (1, _INT32_MAX), "n_ctx": (1, _INT32_MAX), "n_embd": (1, _INT32_MAX),
    "n_head": (1, _INT32_MAX), "n_head_kv": (1, _INT32_MAX), "n_layer": (1, MAX_LAYERS),
    "n_ff": (1, _INT32_MAX), "n_rot": (2, _INT32_MAX), "n_expert": (0, _INT32_MAX),
    "n_expert_used": (0, _INT32_MAX), "n_ff_exp": (1, _INT32_MAX),
    "n_expert_shared": (0, _INT32_MAX), "kv_pad": (1, _INT32_MAX),
    "n_embd_head": (1, _INT32_MAX), "n_swa": (0, _INT32_MAX), "n_ctx_orig": (1, _INT32_MAX),
}
# the architectures (llama.cpp's general.architecture names; models.arch builds them) and
# the rope each one implies (llama.cpp's llama_model_rope_type)
ARCH_ROPE = {"llama": "NORMAL", "qwen2": "NEOX", "qwen3": "NEOX", "qwen3moe": "NEOX",
             "gemma2": "NEOX", "gemma3": "NEOX", "phi3": "NEOX"}
QK_NORM_ARCHS = ("qwen3", "qwen3moe", "gemma3")     # RMS norms of each Q and K head
POST_NORM_ARCHS = ("gemma2", "gemma3")      # RMS norms after attention and after the FFN
SWA_ARCHS = ("gemma2", "gemma3")            # sliding-window layers among global ones
FUSED_ARCHS = ("phi3",)     # fused QKV (optional) and gate/up (always) weights, partial
                            # rotary, rope factors
# the FFNs llama.cpp's graphs build: dense, or experts with softmax gating, top-k and
# normalised weights (Mixtral's routing, in llama.cpp's build_moe_ffn form)
ARCH_FFNS = {"llama": ("dense", "moe_topk"), "qwen2": ("dense",), "qwen3": ("dense",),
             "qwen3moe": ("moe_topk",), "gemma2": ("dense",), "gemma3": ("dense",),
             "phi3": ("dense",)}
GRAPH_KINDS = ("ggml_py", "llama.cpp")
# the float fields: whether 0 is allowed (they are finite and not negative)
_FLOAT_FIELDS = {"rope_freq_base": False, "rope_freq_scale": False, "eps": True,
                 "attn_softcap": True, "final_softcap": True, "rope_attn_factor": False}
# the float fields that may also be None (then they take another field's value)
_OPTIONAL_FLOAT_FIELDS = ("rope_freq_base_swa", "rope_freq_scale_swa")


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
    arch: str = "llama"           # general.architecture (ARCH_ROPE's keys)
    attn_bias: bool = False       # Q, K and V biases (qwen2)
    qk_norm: bool = False         # RMS norms of each Q and K head (qwen3)
    n_embd_head: int | None = None    # channels per head (default n_embd / n_head)
    graph: str | None = None      # 'ggml_py' (llama's own graph, the default for llama) or
                                  # 'llama.cpp' (models.arch: llama.cpp's graph, node for node)
    n_swa: int = 0                # sliding window: a token sees the n_swa last positions
    swa_layers: tuple = ()        # the layers with the sliding window (the others see all)
    rope_freq_base_swa: float | None = None     # the sliding layers' rope (default: the
    rope_freq_scale_swa: float | None = None    # global layers')
    attn_softcap: float = 0.0     # attention scores soft-capped: c * tanh(kq / c) (0: not)
    final_softcap: float = 0.0    # the logits soft-capped likewise (0: not)
    rope_attn_factor: float = 1.0     # rope's attn_factor (rope.scaling.attn_factor)
    fused_qkv: bool = False       # Q, K and V as one matrix, attn_qkv (phi3)
    rope_factors: bool = False    # rope frequency factors, long and short (phi3)
    n_ctx_orig: int | None = None     # the training context: past it, the long factors
    flash_attn: bool = False      # llama.cpp's -fa on: V cached by rows, one FLASH_ATTN_EXT
                                  # per layer (llama.cpp's graph only)

    def __post_init__(self):
        for f in ("wtype", "cache_type"):       # numpy dtypes and their names are types too
            try:
                object.__setattr__(self, f, ggml_type(getattr(self, f)))
            except UnknownNameError:
                pass                            # (the checks below name the field)
        self._check_fields()
        if self.ffn not in FFN_KINDS:
            raise ModelError(f"ffn must be one of {FFN_KINDS}, got {self.ffn!r}")
        if self.wtype not in WEIGHT_TYPES:
            raise ModelError(f"wtype must be one of {WEIGHT_TYPES}, got {self.wtype!r}")
        if self.n_head % self.n_head_kv or (self.n_embd_head is None and self.n_embd % self.n_head):
            raise ModelError("n_embd must divide into n_head heads, n_head into n_head_kv groups")
        self._check_arch()
        if self.ffn != "dense":
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ModelError(f"{self.ffn} needs 0 < n_expert_used <= n_expert")
            if self.ffn == "moe_shared" and self.n_expert_shared < 1:
                raise ModelError("moe_shared needs n_expert_shared >= 1")
        if self.n_rot_ % 2 or self.n_rot_ > self.head_dim:
            raise ModelError(f"n_rot must be even and at most the head size {self.head_dim}")
        if quants.is_quantized(self.wtype):
            qk = quants.BLOCKS[self.wtype][0]
            widths = {self.n_embd, self.n_ff, self.ff_exp, self.n_embd_q}
            if any(w % qk for w in widths):
                raise ModelError(f"{self.wtype} weights need row lengths that are multiples of {qk}")

    def _check_arch(self) -> None:
        """The architecture's own rules: its rope, and what its llama.cpp graph supports."""
        if self.arch not in ARCH_ROPE:
            raise ModelError(f"ModelConfig.arch must be one of {tuple(ARCH_ROPE)}, got "
                             f"{self.arch!r}")
        if self.graph is not None and self.graph not in GRAPH_KINDS:
            raise ModelError(f"ModelConfig.graph must be one of {GRAPH_KINDS} or None, got "
                             f"{self.graph!r}")
        for flag in ("attn_bias", "qk_norm", "fused_qkv", "rope_factors", "flash_attn"):
            if not isinstance(getattr(self, flag), bool):
                raise ModelError(f"ModelConfig.{flag} must be a bool, got "
                                 f"{getattr(self, flag)!r}")
        want = ARCH_ROPE[self.arch]
        if self.graph_kind == "llama.cpp" and rope_mode_id(self.rope_mode) != ROPE_TYPES[want]:
            raise ModelError(f"{self.arch} models use {want} rope (llama.cpp fixes it by "
                             f"architecture), got rope_mode {self.rope_mode!r}")
        if self.graph_kind == "ggml_py":
            if (self.attn_bias or self.qk_norm or self.post_norms
                    or self.n_embd_head not in (None, self.n_embd // self.n_head)
                    or self.rope_attn_factor != 1.0 or self.flash_attn):
                raise ModelError("QKV biases, Q/K norms, post-norms, a head size other "
                                 "than n_embd / n_head, a rope attn_factor and flash "
                                 "attention need graph='llama.cpp'")
        else:
            if self.ffn not in ARCH_FFNS[self.arch]:
                raise ModelError(f"llama.cpp's {self.arch} graph has ffn "
                                 f"{' or '.join(ARCH_FFNS[self.arch])}, got {self.ffn!r}")
            if self.arch == "llama" and self.is_moe and self.ff_exp != self.n_ff:
                raise ModelError(f"llama.cpp's llama experts are n_ff wide: n_ff_exp "
                                 f"{self.ff_exp} != n_ff {self.n_ff}")
            if self.n_rot_ != self.head_dim and self.arch not in FUSED_ARCHS:
                raise ModelError(f"llama.cpp's {self.arch} graph rotates whole heads: n_rot "
                                 f"{self.n_rot_} != head size {self.head_dim}")
        if self.arch in QK_NORM_ARCHS and not self.qk_norm:
            raise ModelError(f"{self.arch} models have Q/K norms (qk_norm=True)")
        if self.arch not in QK_NORM_ARCHS and self.qk_norm:
            raise ModelError(f"{self.arch} models have no Q/K norms")
        self._check_swa()
        if self.arch not in FUSED_ARCHS and (self.fused_qkv or self.rope_factors):
            raise ModelError(f"{self.arch} models have no fused QKV or rope factors here")

    def _check_swa(self) -> None:
        """The sliding window: layer indices within the model, a window when any layer
        slides (gemma2 always has one), and only where llama.cpp's graph has it."""
        layers = self.swa_layers
        if (not isinstance(layers, tuple) or
                any(isinstance(i, bool) or not isinstance(i, int) for i in layers) or
                list(layers) != sorted(set(layers)) or
                any(not 0 <= i < self.n_layer for i in layers)):
            raise ModelError(f"ModelConfig.swa_layers must be a sorted tuple of distinct layer "
                             f"indices in [0, {self.n_layer}), got {layers!r}")
        if self.arch not in SWA_ARCHS and (self.n_swa or layers or self.attn_softcap):
            raise ModelError(f"{self.arch} models have no sliding window or attention "
                             f"soft-capping here (n_swa, swa_layers, attn_softcap)")
        if self.arch not in SWA_ARCHS and self.final_softcap:
            raise ModelError(f"{self.arch} models have no final logit soft-capping")
        if layers and not self.n_swa:
            raise ModelError(f"swa_layers {layers} need a window (n_swa > 0)")
        if self.arch == "gemma2" and not self.n_swa:
            raise ModelError("gemma2 models have a sliding window (n_swa > 0)")

    @property
    def graph_kind(self) -> str:
        """The graph the model builds: 'ggml_py' (llama's own, models.graph) or 'llama.cpp'
        (models.arch); llama defaults to its own, every other architecture is llama.cpp's."""
        if self.graph is not None:
            return self.graph
        return "ggml_py" if self.arch == "llama" else "llama.cpp"

    def _check_fields(self) -> None:
        """Each field's type and range on its own (before the rules that combine them):
        a ModelError naming the field, never a model that computes garbage or a loop
        over billions of layers."""
        for field, (lo, hi) in _INT_FIELDS.items():
            v = getattr(self, field)
            if v is None and field in ("n_rot", "n_ff_exp", "n_embd_head", "n_ctx_orig"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ModelError(f"ModelConfig.{field} must be an integer in [{lo}, {hi}], "
                                 f"got {v!r}")
        for field, zero_ok in _FLOAT_FIELDS.items():
            v = getattr(self, field)
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                    or v < 0 or (v == 0 and not zero_ok)):
                raise ModelError(f"ModelConfig.{field} must be a finite number "
                                 f"{'>= 0' if zero_ok else '> 0'}, got {v!r}")
        if self.cache_type not in CACHE_TYPES:
            raise ModelError(f"ModelConfig.cache_type must be one of {CACHE_TYPES}, got "
                             f"{self.cache_type!r}")
        try:        # (ops.rope_mode_id reads the spellings rope_ext takes)
            mode = rope_mode_id(self.rope_mode) if isinstance(self.rope_mode, str) else None
        except GraphError:
            mode = None
        if mode not in (ROPE_TYPES[m] for m in ROPE_MODES):
            raise ModelError(f"ModelConfig.rope_mode must be one of {ROPE_MODES} (the rope "
                             f"of llama models), got {self.rope_mode!r}")
        for field in _OPTIONAL_FLOAT_FIELDS:
            v = getattr(self, field)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise ModelError(f"ModelConfig.{field} must be None or a finite number > 0, "
                                 f"got {v!r}")
        if not isinstance(self.name, str):
            raise ModelError(f"ModelConfig.name must be a string, got {self.name!r}")

    @property
    def rope_neox(self) -> bool:
        """NEOX rope (rotating the halves of each head) rather than NORMAL (adjacent pairs)."""
        return rope_mode_id(self.rope_mode) == ROPE_TYPES["NEOX"]

    @property
    def head_dim(self) -> int:
        """Channels per attention head (n_embd_head, or n_embd / n_head)."""
        return self.n_embd // self.n_head if self.n_embd_head is None else self.n_embd_head

    @property
    def n_embd_q(self) -> int:
        """Channels of Q per token (head_dim * n_head; the attention output's width)."""
        return self.head_dim * self.n_head

    @property
    def n_embd_gqa(self) -> int:
        """Channels of K and V per token (head_dim * n_head_kv)."""
        return self.head_dim * self.n_head_kv

    @property
    def n_rot_(self) -> int:
        """Channels of each head that rope rotates (n_rot, or the whole head)."""
        return self.head_dim if self.n_rot is None else self.n_rot

    @property
    def ff_exp(self) -> int:
        """The hidden width of each expert's feed-forward (n_ff_exp, or n_ff)."""
        return self.n_ff if self.n_ff_exp is None else self.n_ff_exp

    @property
    def iswa(self) -> bool:
        """Does the graph take llama.cpp's two attention inputs (global and sliding)?"""
        return self.n_swa > 0

    def is_swa(self, il: int) -> bool:
        """Does layer il attend over the sliding window only?"""
        return il in self.swa_layers

    def rope_base_scale(self, il: int) -> tuple[float, float]:
        """(rope frequency base, frequency scale) of layer il: the sliding layers' own
        (llama_model::get_rope_freq_base / _scale)."""
        if not self.is_swa(il):
            return self.rope_freq_base, self.rope_freq_scale
        base, scale = self.rope_freq_base_swa, self.rope_freq_scale_swa
        return (self.rope_freq_base if base is None else base,
                self.rope_freq_scale if scale is None else scale)

    @property
    def fused_up(self) -> bool:
        """Is the FFN's gate the first half of ffn_up (phi3's gate/up matrix)?"""
        return self.arch in FUSED_ARCHS

    @property
    def rope_factors_name(self) -> str | None:
        """The rope factors layers use (llama_model::get_rope_factors): the long ones for a
        context past the training one, else the short ones; None without factors."""
        if not self.rope_factors:
            return None
        long = self.n_ctx > (self.n_ctx if self.n_ctx_orig is None else self.n_ctx_orig)
        return "rope_factors_long.weight" if long else "rope_factors_short.weight"

    @property
    def post_norms(self) -> bool:
        """RMS norms of the attention and FFN outputs before their residuals (gemma)?"""
        return self.arch in POST_NORM_ARCHS

    @property
    def tied_output(self) -> bool:
        """Is the output head always the token embedding (gemma2's files have no
        output.weight; llama.cpp duplicates token_embd as the head, to place it with the
        output layer)?"""
        return self.arch == "gemma2"

    @property
    def is_moe(self) -> bool:
        """Is the feed-forward a mixture of experts?"""
        return self.ffn != "dense"


def swa_pattern(n_layer: int, n_pattern: int) -> tuple:
    """The sliding layers of llama.cpp's set_swa_pattern: of every n_pattern layers, all
    but the last slide (n_pattern 2: the even layers; 0: all layers)."""
    n_layer = int_arg(n_layer, "n_layer", 0, MAX_LAYERS)
    n_pattern = int_arg(n_pattern, "n_pattern", 0, _INT32_MAX)
    return tuple(il for il in range(n_layer) if n_pattern == 0 or il % n_pattern < n_pattern - 1)


# what a file of these architectures means when it leaves a key out (llama.cpp's
# load_arch_hparams): the window, every how many layers one is global, the soft-caps
ARCH_DEFAULTS = {
    "gemma2": dict(n_swa=4096, swa_pattern=2, attn_softcap=50.0, final_softcap=30.0),
    "gemma3": dict(n_swa=0, swa_pattern=6, attn_softcap=0.0, final_softcap=0.0,
                   rope_freq_base_swa=10000.0, rope_freq_scale_swa=1.0),
    "phi3": dict(fused_qkv=True),
}


def arch_config(arch: str, **kw: Any) -> ModelConfig:
    """A small model of architecture `arch` (llama_config's sizes) with what the
    architecture implies: its rope, qwen2's QKV biases, the Q/K norms of qwen3, qwen3moe
    and gemma3, qwen3moe's experts (MOE_DEFAULTS' moe_topk), gemma's window pattern and
    soft-caps (kw may set n_swa; the sliding layers follow the architecture's pattern, or
    kw's swa_pattern (see swa_pattern), unless swa_layers is given)."""
    if not isinstance(arch, str) or arch not in ARCH_ROPE:
        raise UnknownNameError(f"unknown architecture {arch!r}; known: {', '.join(ARCH_ROPE)}")
    base: dict[str, Any] = dict(name=arch, arch=arch, rope_mode=ARCH_ROPE[arch],
                                attn_bias=arch == "qwen2", qk_norm=arch in QK_NORM_ARCHS)
    if ARCH_FFNS[arch] == ("moe_topk",):
        base.update(ffn="moe_topk", **MOE_DEFAULTS["moe_topk"])
    if arch == "llama":
        base["graph"] = "llama.cpp"
    defaults = dict(ARCH_DEFAULTS.get(arch, {}))
    kw = dict(kw)
    n_pattern = kw.pop("swa_pattern", defaults.pop("swa_pattern", None))
    defaults.pop("swa_pattern", None)
    base.update(defaults)
    base.update(kw)
    if n_pattern is not None and "swa_layers" not in kw and base["n_swa"]:
        base["swa_layers"] = swa_pattern(base.get("n_layer", 4), n_pattern)
    return llama_config(**base)


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
    Q, D = cfg.n_embd_q, cfg.head_dim
    w = cfg.wtype
    shapes = {"token_embd.weight": (w, (E, V))}
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = ("f32", (E,))
        if cfg.fused_qkv:
            shapes[p + "attn_qkv.weight"] = (w, (E, Q + 2 * G))
        else:
            shapes.update({p + "attn_q.weight": (w, (E, Q)), p + "attn_k.weight": (w, (E, G)),
                           p + "attn_v.weight": (w, (E, G))})
        if cfg.attn_bias:
            shapes.update({p + "attn_q.bias": ("f32", (Q,)), p + "attn_k.bias": ("f32", (G,)),
                           p + "attn_v.bias": ("f32", (G,))})
        if cfg.qk_norm:
            shapes.update({p + "attn_q_norm.weight": ("f32", (D,)),
                           p + "attn_k_norm.weight": ("f32", (D,))})
        shapes[p + "attn_output.weight"] = (w, (Q, E))
        if cfg.post_norms:
            shapes[p + "post_attention_norm.weight"] = ("f32", (E,))
        shapes[p + "ffn_norm.weight"] = ("f32", (E,))
        if cfg.fused_up:
            shapes.update({p + "ffn_up.weight": (w, (E, 2 * F)),
                           p + "ffn_down.weight": (w, (F, E))})
        elif cfg.ffn == "dense":
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
        if cfg.post_norms:
            shapes[p + "post_ffw_norm.weight"] = ("f32", (E,))
    if cfg.rope_factors:
        for n in ("rope_factors_long.weight", "rope_factors_short.weight"):
            shapes[n] = ("f32", (cfg.n_rot_ // 2,))
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


def graph_size(cfg: ModelConfig) -> int:
    """Nodes plus leafs a forward graph can have, with room to spare (llama.cpp's
    graph_max_nodes is generous too)."""
    instance_arg(cfg, ModelConfig, "config")
    return 128 + cfg.n_layer * (96 + 8 * cfg.n_expert_used)
