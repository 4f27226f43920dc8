"""The `cuda` device kind: ggml 0.10.1's CUDA backend (llama.cpp's `CUDA0`, `CUDA1`, ...).

supports_op: ggml-cuda's rule (ggml_py._supports' `cuda`, for a compute capability 8.x
device); buffers: `CUDA0`, ... aligned to 128 bytes, unbounded (get_max_size unset);
offload_op: every op of a batch of 32 or more."""

from __future__ import annotations

from ggml_py.backends.sim import SimBackend
from ggml_py.models.devices import gpu

KIND = "cuda"
PREFIX = "CUDA"
NUMBERED = True
ALIGNMENT = 128
MAX_SIZE = None


def backend(name: str) -> SimBackend:
    """A simulated CUDA device named `name` (its buffer type has the same name)."""
    return gpu.backend(name, name, ALIGNMENT, MAX_SIZE, KIND, "*")
