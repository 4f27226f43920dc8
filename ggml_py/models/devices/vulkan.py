"""The `vulkan` device kind: ggml 0.10.1's Vulkan backend (llama.cpp's `Vulkan0`, ...).

supports_op: ggml-vulkan's rule (ggml_py._supports' `vulkan`, for a typical discrete
GPU); buffers: `Vulkan0`, ... aligned to the device's minStorageBufferOffsetAlignment
(64 bytes, the largest common value: NVIDIA reports 16 to 64, AMD 4, Intel 64) and at most
ggml's suballocation block, 1 GiB; offload_op: every op of a batch of 32 or more."""

from __future__ import annotations

from ggml_py.backends.sim import SimBackend
from ggml_py.models.devices import gpu

KIND = "vulkan"
PREFIX = "Vulkan"
NUMBERED = True
ALIGNMENT = 64
MAX_SIZE = 1 << 30


def backend(name: str) -> SimBackend:
    """A simulated Vulkan device named `name` (its buffer type has the same name)."""
    return gpu.backend(name, name, ALIGNMENT, MAX_SIZE, KIND, "*")
