"""The `metal` device kind: ggml 0.10.1's Metal backend (llama.cpp's `MTL0`).

supports_op: ggml-metal's rule (ggml_py._supports' `metal`, for an Apple M2 or later);
buffers: `MTL0` (shared, not host), aligned to 32 bytes, at most the device's
maxBufferLength, taken here as 32 GiB (an assumption: Apple silicon reports about half of
its unified memory; a 64 GiB Mac); offload_op: MUL_MAT and MUL_MAT_ID of a batch of 32 or
more, as ggml-metal offloads only those."""

from __future__ import annotations

from ggml_py.backends.sim import SimBackend
from ggml_py.models.devices import gpu

KIND = "metal"
PREFIX = "MTL"
NUMBERED = True
ALIGNMENT = 32
MAX_SIZE = 32 << 30


def backend(name: str) -> SimBackend:
    """A simulated Metal device named `name` (its buffer type has the same name)."""
    return gpu.backend(name, name, ALIGNMENT, MAX_SIZE, KIND, ["MUL_MAT", "MUL_MAT_ID"])
