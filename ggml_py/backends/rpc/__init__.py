"""A backend on a ggml RPC server: ggml's own engine on another machine, driven from
ggml_py's scheduler like any device. Both protocols in use are spoken, the server's
chosen at the handshake: 4.0.0 (ggml 0.10.1) and 7.0.0 (today's llama.cpp rpc-server,
and the server in llama-cpp-python 0.3.36); another version is an RPCError naming it
and both of ggml_py's.

    rpc0 = RPCBackend("192.168.1.10:50052")        # device 0 of that server
    sched = Scheduler([rpc0, rpc1, CPUBackend()])

Start servers with `python -m ggml_py.rpc_server [--protocol 7]` (ggml_py.rpc_server) or
llama.cpp's `rpc-server`. The wire protocol is in ggml_py.backends.rpc._protocol; this module is the
backend:

  * memory: the server device's buffer type (alignment and largest buffer from the
    server); buffers are allocated, written, read, cleared and freed on the server;
  * copies: a split input coming from host memory is sent (SET_TENSOR, no reply to wait
    for); from the same server it is copied there (COPY_TENSOR); from another server it
    is read there and sent here;
  * compute: graph_compute sends the split's graph (GRAPH_COMPUTE; the same graph again:
    GRAPH_RECOMPUTE) and returns without waiting, like ggml's client; synchronize (and
    any read) waits for the server;
  * supports_op: what a ggml CPU server runs, answered in C during the split (ggml's own
    client says yes to everything), minus `unsupported_ops`;
  * faults: RPCError names the endpoint and the command; every command has a deadline,
    and what the server answers is checked (sizes, counts, addresses, unread bytes).
    A connection that failed is closed for good (the server frees the client's buffers
    when it leaves), so the backend is then unusable; the scheduler, the other backends
    and a new RPCBackend on the same server are not affected.

Helpers for several servers: `parse_endpoints`, `rpc_backends` (llama.cpp's --rpc); a
model's layers are spread over them by ggml_py.models.placement (-ngl, --tensor-split).
"""

from __future__ import annotations

from typing import Any, Iterable

from ggml_py.backends.rpc import _protocol
from ggml_py._backend import Backend, get_buffer, host_bytes
from ggml_py._core import Graph
from ggml_py.backends.rpc._protocol import (RPCBuffer, RPCBufferType, DEFAULT_TIMEOUT,
                                            DEFAULT_CONNECT_TIMEOUT, PROTO_VERSION,
                                            PROTO_VERSIONS, format_endpoint, parse_endpoint)
from ggml_py._supports import CPU_OPS as CPU_SERVER_OPS, use_rule
from ggml_py.errors import ArgumentError, RPCError

__all__ = ["RPCBackend", "RPCBuffer", "RPCBufferType", "RPCError", "PROTO_VERSION",
           "PROTO_VERSIONS", "CPU_SERVER_OPS", "parse_endpoint", "parse_endpoints",
           "rpc_backends"]


class RPCBackend(Backend):
    """Device `device` of the ggml RPC server at `endpoint` ('host:port').

    timeout: seconds each command this backend sends may take in all (graph compute,
    synchronize, device memory), the wait for a graph compute included; buffer reads and
    writes take the timeout of the connection, set by the backend that opened it.
    connect_timeout: for connecting and the HELLO handshake, when this backend opens the
    connection. Backends on the same server share one connection (the server serves one
    client at a time), each with its own timeout.
    unsupported_ops: op names never sent to this server (the scheduler runs them elsewhere).
    """

    def __init__(self, endpoint, device=0, *, timeout=DEFAULT_TIMEOUT,
                 connect_timeout=DEFAULT_CONNECT_TIMEOUT, unsupported_ops=()):
        self.timeout = _protocol.seconds_arg(timeout, "timeout")
        conn = _protocol.connect(endpoint, timeout, connect_timeout)
        buft = conn.buffer_type(device)
        # ggml's RPC devices report GPU: not the CPU fallback, weights offloaded to them
        super().__init__(buft.name, buft, device_type="gpu")
        use_rule(self, "rpc-cpu-server", unsupported_ops)
        self.conn = conn
        self.device = device

    @property
    def endpoint(self) -> str:
        """The server's 'host:port'."""
        return self.conn.endpoint

    def device_memory(self):
        """(free, total) bytes of the server device (GET_DEVICE_MEMORY)."""
        return self.conn.get_device_memory(self.device, self.timeout)

    def link_stats(self) -> dict[str, dict[str, float]]:
        """Per command on this server's connection: calls, bytes sent, bytes received,
        seconds (round trips; a command without a reply counts its send only)."""
        return {cmd: dict(zip(("calls", "bytes_sent", "bytes_received", "seconds"), s))
                for cmd, s in self.conn.stats.items()}

    def close(self):
        """Close the connection to the server (for every backend on it); the server frees
        this client's buffers."""
        self.conn.close()

    # --- copies into the server's memory (tensor_set / tensor_get go through RPCBuffer) ---

    def cpy_tensor_async(self, backend_src, src, dst):
        """dst (here) = src: on the server when src is there too, sent from host memory,
        or read from another server and sent here. False otherwise (the scheduler then
        copies through the backends)."""
        dbuf = get_buffer(dst)
        sbuf = get_buffer(src)
        if (not isinstance(dbuf, RPCBuffer) or dbuf.conn is not self.conn or sbuf is None
                or src.type != dst.type or src.ne != dst.ne or src.nb != dst.nb):
            return False
        if dbuf.cpy_tensor(src, dst):
            return True
        src_bytes = host_bytes(src) if sbuf.is_host else None
        if src_bytes is None and isinstance(sbuf, RPCBuffer):
            src_bytes = sbuf.get_tensor(src)
        if src_bytes is None:
            return False
        dbuf.set_tensor(dst, src_bytes)
        return True

    # --- compute ---

    def graph_compute(self, graph):
        """Send the graph's nodes (a Graph or a list of nodes) to the server and return
        without waiting (ggml_backend_rpc_graph_compute); BackendError before anything is
        sent when a node is not one a CPU server runs or is not in this device's memory."""
        nodes = graph if isinstance(graph, Graph) else getattr(graph, "nodes", graph)
        if len(nodes) == 0:
            return True
        payload = _protocol.serialize_graph(self, self.device, nodes, self.conn)
        self.conn.graph_compute(self.device, payload, self.timeout)
        return True

    def synchronize(self):
        """Wait until the server has run what was sent; raises RPCError if it failed."""
        self.conn.synchronize(self.timeout)


# ---------------------------------------------------------------------------
# several servers

def parse_endpoints(spec: str | Iterable[str]) -> list[str]:
    """'host:port,host:port' (or a list of such strings) -> ['host:port', ...], checked;
    ArgumentError (a ValueError) says what is wrong."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        item = item.strip()
        if item:
            ep = format_endpoint(*parse_endpoint(item))
            if ep in out:
                raise ArgumentError(f"RPC endpoint {ep} is listed twice in {spec!r}")
            out.append(ep)
    if not out:
        raise ArgumentError(f"no RPC endpoint in {spec!r}; give HOST:PORT[,HOST:PORT...]")
    return out


def rpc_backends(spec: str | Iterable[str], **kw: Any) -> list[RPCBackend]:
    """An RPCBackend for every device of every server in `spec` ('host:port,...'), in
    order (llama.cpp's --rpc); keyword arguments go to RPCBackend."""
    backends = []
    for ep in parse_endpoints(spec):
        first = RPCBackend(ep, 0, **kw)
        backends.append(first)
        backends.extend(RPCBackend(ep, d, **kw) for d in range(1, first.conn.n_devices))
    return backends
