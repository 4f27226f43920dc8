"""Numerics every backend shares, as ggml.c computes them: float32 words in op_params
(ggml_set_op_params_f32) and the f32 formulas of rope and ALiBi that the numpy, OpenCL
and simulated backends must all reproduce bit for bit. The op builders (ops.py) write
op_params with these; kernels read them back."""

from __future__ import annotations

import math
import struct
from typing import SupportsFloat

import numpy as np

from ggml_py._core import int_arg

# ---------------------------------------------------------------------------
# float32 words in op_params

def f32_bits(x: float) -> int:
    """The int32 word holding float32 x bit-wise (ggml_set_op_params_f32; like C's cast,
    a value past float32's range becomes an infinity)."""
    x = float(x)
    if math.isfinite(x) and math.fabs(x) > _F32_MAX:
        x = math.copysign(math.inf, x)
    word: int = struct.unpack("<i", struct.pack("<f", x))[0]
    return word


_F32_MAX: float = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def bits_f32(w: int) -> float:
    """Inverse of f32_bits (an unsigned 32-bit word is read as its int32 bits)."""
    if type(w) is not int or not -(1 << 31) <= w < (1 << 32):     # kernels call this a lot
        w = int_arg(w, "op param", -(1 << 31), (1 << 32) - 1)
    x: float = struct.unpack("<f", struct.pack("<i", w - (1 << 32) if w >= (1 << 31) else w))[0]
    return x


# ---------------------------------------------------------------------------
# rope and ALiBi (ggml.c), in f32 as ggml computes them

def powf(x: SupportsFloat, y: SupportsFloat) -> np.float32:
    """C's powf on float32 arguments, as ggml computes it. numpy's float32 scalar power is
    libm's powf; its power ufunc is a SIMD kernel (numpy 2.4) that is one unit in the last
    place off for one pair in five, and rope's theta_scale, raised to the pair index, spreads
    that over a whole row."""
    with np.errstate(all="ignore"):       # NaN and inf as powf gives them
        return np.float32(float(x)) ** np.float32(float(y))


def rope_theta_scale(freq_base: SupportsFloat, n_dims: int) -> np.float32:
    """ggml's theta_scale, powf(freq_base, -2.0f / n_dims): each rope pair's rotation
    rate is the previous pair's times this."""
    return powf(freq_base, np.float32(-2.0) / np.float32(n_dims))


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[np.float32, np.float32]:
    """ggml_rope_yarn_corr_dims: the first and last dimension of YaRN's ramp (f32)."""
    f32 = np.float32

    def corr_dim(n_rot: float) -> np.float32:
        with np.errstate(divide="ignore"):
            turns = f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(math.pi))
            dim: np.float32 = f32(n_dims) * np.log(turns) / (f32(2) * np.log(f32(freq_base)))
        return dim
    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return f32(max(0.0, start)), f32(min(n_dims - 1, end))


def alibi_bases(n_head: int, max_bias: float) -> tuple[np.float32, np.float32, int]:
    """(m0, m1, n_head_log2) of ggml's ALiBi slopes (soft_max, flash_attn_ext): head h
    gets m0 ** (h + 1) below n_head_log2, m1 ** (2 (h - n_head_log2) + 1) above."""
    f32 = np.float32
    n_head_log2 = 1 << int(math.floor(math.log2(n_head))) if n_head > 0 else 1
    m0 = powf(2.0, f32(-max_bias) / f32(n_head_log2))
    m1 = powf(2.0, f32(-max_bias / 2.0) / f32(n_head_log2))
    return m0, m1, n_head_log2
