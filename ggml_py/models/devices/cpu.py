"""The `cpu` device kind: ggml-cpu's backend (llama.cpp's `CPU`).

Its supports_op is ggml-cpu's rule (a MUL_MAT whose src1 is neither f32 nor the weight
type's vec_dot type is not for it: ggml_py._rpc's CPU server rules, which are that rule);
its buffers are host memory at ggml's TENSOR_ALIGNMENT (32), unbounded."""

from __future__ import annotations

from ggml_py.backends.sim import RPC_SERVER_OPS, SimBackend, SimBufferType

KIND = "cpu"
PREFIX = "CPU"
NUMBERED = False
ALIGNMENT = 32


def backend(name: str) -> SimBackend:
    """A simulated ggml-cpu backend named `name`, with its host buffer type `CPU`."""
    buft = SimBufferType("CPU", ALIGNMENT, None, True, device=name)
    return SimBackend(name, buft, "cpu", RPC_SERVER_OPS, supported_buffer_types=[buft])
