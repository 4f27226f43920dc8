"""The `rpc` device kind: ggml-rpc's client of a server on a CPU (llama.cpp's `RPC0`, ...).

It reports the remote backend's support, here ggml-cpu's (the servers of the tests run on a
CPU), takes the remote buffer type's alignment (the CPU's 32, unbounded), holds only its own
buffers (not host memory) and offloads nothing (ggml-rpc has no offload_op)."""

from __future__ import annotations

from ggml_py.backends.sim import RPC_SERVER_OPS, SimBackend, SimBufferType

KIND = "rpc"
PREFIX = "RPC"
ALIGNMENT = 32


def backend(name: str) -> SimBackend:
    """A simulated RPC device named `name` with its own (device) buffer type."""
    buft = SimBufferType(name, ALIGNMENT, None, False, device=name)
    return SimBackend(name, buft, "gpu", RPC_SERVER_OPS, supported_buffer_types=[buft])
