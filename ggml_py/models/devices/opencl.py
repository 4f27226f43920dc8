"""The `opencl` device kind: ggml 0.10.1's OpenCL backend (llama.cpp's `GPUOpenCL`, one
device: ggml-opencl drives a single GPU and names it so).

supports_op: ggml-opencl's rule (ggml_py._supports' `ggml-opencl`, not ggml_py's own
OpenCL backend's, for an Adreno 7xx-class GPU with the default build); buffers: `OpenCL`,
aligned to CL_DEVICE_MEM_BASE_ADDR_ALIGN (1024 bits: 128 bytes) and at most
CL_DEVICE_MAX_MEM_ALLOC_SIZE, taken here as 1 GiB (an assumption: OpenCL promises a
quarter of the device memory; Adreno drivers report about 1 GiB); offload_op: none
(ggml-opencl has no offload_op)."""

from __future__ import annotations

from ggml_py.backends.sim import SimBackend
from ggml_py.models.devices import gpu

KIND = "opencl"
PREFIX = "GPUOpenCL"
NUMBERED = False
ALIGNMENT = 128
MAX_SIZE = 1 << 30


def backend(name: str) -> SimBackend:
    """The simulated ggml-opencl device (named `name`, its buffer type `OpenCL`)."""
    return gpu.backend(name, "OpenCL", ALIGNMENT, MAX_SIZE, "ggml-opencl", ())
