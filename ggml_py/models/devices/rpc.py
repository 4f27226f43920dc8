"""The `rpc` device kind: ggml-rpc's client of a server on a CPU (llama.cpp's `RPC0`, ...).

It reports the remote backend's support, here ggml-cpu's (the servers of the tests run on a
CPU), takes the remote buffer type's alignment (the CPU's 32, unbounded), holds only its own
buffers (not host memory) and offloads nothing (ggml-rpc has no offload_op). A live
server (`rpc:HOST:PORT`) is asked for the free memory of each of its devices."""

from __future__ import annotations

from ggml_py.backends.rpc import _protocol
from ggml_py.backends.sim import RPC_SERVER_OPS, SimBackend, SimBufferType
from ggml_py.errors import RPCError

KIND = "rpc"
PREFIX = "RPC"
NUMBERED = True
ALIGNMENT = 32
TIMEOUT = 10.0          # seconds to connect to a live server, and for each of its answers


def backend(name: str) -> SimBackend:
    """A simulated RPC device named `name` with its own (device) buffer type."""
    buft = SimBufferType(name, ALIGNMENT, None, False, device=name)
    return SimBackend(name, buft, "gpu", RPC_SERVER_OPS, supported_buffer_types=[buft])


def buffer_type_name(endpoint: str, device: int) -> str:
    """ggml-rpc's name of the buffer type of a server's device (its index on the server)."""
    return f"{PREFIX}{device}[{endpoint}]"


def free_memory(endpoint: str) -> list[int]:
    """The free bytes of each device of the live ggml RPC server at `endpoint` (protocol 4
    or 7: GET_DEVICE_MEMORY); RPCError naming the endpoint when it cannot be asked."""
    try:
        conn = _protocol.connect(endpoint, TIMEOUT, TIMEOUT)
    except RPCError as e:
        raise RPCError(f"--device rpc:{endpoint}: {e}") from None
    try:
        return [conn.get_device_memory(d, TIMEOUT)[0] for d in range(conn.n_devices)]
    except RPCError as e:
        raise RPCError(f"--device rpc:{endpoint}: {e}") from None
    finally:
        conn.close()
