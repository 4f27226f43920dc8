"""A hostile ggml RPC server for the tests: a session of a real ggml server recorded once
per protocol version (tests/data/rpc/v4_session.json: ggml 0.10.1's; v7_session.json:
llama.cpp's, whose FREE_BUFFER, BUFFER_CLEAR and INIT_TENSOR have no reply), replayed
to a client with one reply mutated. test_rpc_fuzz.py drives it; each client runs in its
own process:

    python tests/rpc_fuzz.py client PORT TIMEOUT     # prints one JSON outcome line

record(endpoint, protocol) re-records a session through a proxy in front of a real
server (python tests/rpc_fuzz.py record HOST:PORT [PROTOCOL]).
"""

import json
import os
import socket
import struct
import sys
import threading
import time

from ggml_py.backends.rpc._protocol import COMMANDS, PROTOCOLS

HERE = os.path.dirname(os.path.abspath(__file__))


def session_file(protocol=4):
    return os.path.join(HERE, "data", "rpc", f"v{protocol}_session.json")
# values a lying server likes: zero, one, sign and width edges, a low page address
EDGES = (0, 1, 3, 0x1000, 0x7FFF_FFFF, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1)


def recv_exactly(sock, n):
    """n bytes from a socket; EOFError when it closes first."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _read_frame(sock):
    """A client's request: (command name, payload)."""
    cmd = recv_exactly(sock, 1)[0]
    size = struct.unpack("<Q", recv_exactly(sock, 8))[0]
    return COMMANDS[cmd], recv_exactly(sock, size)


# ---------------------------------------------------------------------------
# the client's session, the same in recording and in every round

def scenario(endpoint, timeout):
    """Connect, ask the device's memory, place a weight in a buffer of its own, clear and
    free a scratch buffer, compute y = 0.5 * w @ x twice (the second: GRAPH_RECOMPUTE),
    read y back each time.
    Returns y's bytes of both computes."""
    import numpy as np
    from ggml_py import ops
    from ggml_py._core import Context, Graph
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.backends.rpc import RPCBackend
    from ggml_py.sched import Scheduler

    r = RPCBackend(endpoint, timeout=timeout, connect_timeout=timeout)
    cpu = CPUBackend()
    r.device_memory()
    ctx = Context()
    w = ops.new_tensor(ctx, "f32", (8, 8), name="w")
    r.buffer_type.alloc_buffer(w.nbytes).tensor_alloc(w, 0)
    r.set_tensor(w, np.arange(64, dtype=np.float32) / 8)
    scratch = r.buffer_type.alloc_buffer(64)    # commands without a reply in protocol 7
    scratch.clear(7)
    scratch.free()
    x = ops.new_tensor(ctx, "f32", (8,), name="x").set_input()
    y = ops.scale(ctx, ops.mul_mat(ctx, w, x), 0.5)
    g = Graph(16).build_forward_expand(y)
    sched = Scheduler([r, cpu], graph_size=32)
    sched.set_tensor_backend(y, r)
    sched.alloc_graph(g)
    out = b""
    for step in range(2):
        cpu.set_tensor(x, np.arange(8, dtype=np.float32) - step)
        sched.graph_compute(g)
        out += bytes(r.get_tensor(y))
    return out


def client_main(port, timeout):
    """One round's client: the scenario against 127.0.0.1:port, its outcome as JSON."""
    from ggml_py.errors import AllocationError, RPCError
    t0 = time.monotonic()
    try:
        out = {"kind": "ok", "result": scenario(f"127.0.0.1:{port}", timeout).hex()}
    except RPCError as e:
        out = {"kind": "rpc", "message": str(e), "endpoint": e.endpoint, "command": e.command}
    except AllocationError as e:
        cause = e.__cause__
        out = {"kind": "alloc", "message": str(e),
               "cause": type(cause).__name__ if cause is not None else None,
               "endpoint": getattr(cause, "endpoint", None)}
    except BaseException as e:           # what the fuzzer looks for
        out = {"kind": "other", "type": type(e).__name__, "message": str(e)}
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------
# recording a real server

def record(endpoint, protocol=4, timeout=10.0):
    """Run the scenario through a proxy in front of the server (of `protocol`) at
    `endpoint`: the list of (command, reply hex or None) it answered, and the scenario's
    result."""
    no_reply = PROTOCOLS[protocol].no_reply
    host, port = endpoint.rsplit(":", 1)
    lsock = socket.create_server(("127.0.0.1", 0))
    log = []

    def proxy():
        cli, _ = lsock.accept()
        srv = socket.create_connection((host, int(port)))
        with cli, srv:
            try:
                while True:
                    cmd, payload = _read_frame(cli)
                    srv.sendall(struct.pack("<BQ", COMMANDS.index(cmd), len(payload)) + payload)
                    if cmd in no_reply:
                        log.append([cmd, None])
                        continue
                    reply = recv_exactly(srv, struct.unpack("<Q", recv_exactly(srv, 8))[0])
                    log.append([cmd, reply.hex()])
                    cli.sendall(struct.pack("<Q", len(reply)) + reply)
            except (EOFError, OSError):
                pass

    th = threading.Thread(target=proxy, daemon=True)
    th.start()
    try:
        result = scenario(f"127.0.0.1:{lsock.getsockname()[1]}", timeout)
    finally:
        import gc
        gc.collect()                        # the client's connection closes
        lsock.close()
    th.join(5)
    return {"exchanges": log, "result": result.hex()}


def load_session(protocol=4):
    """The stored recording of a server of `protocol`: {'exchanges': [[command, reply hex
    or None], ...], 'result'}."""
    with open(session_file(protocol)) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# mutations and the replaying server

def mutate(rng, exchanges):
    """One mutation of a recorded session, as a dict: `at` (the exchange), `how`, and
    what it needs. Replies that carry tensor data are plain data to the client (any
    bytes are a valid answer), so `data` marks mutations of them."""
    answered = [i for i, (_, rep) in enumerate(exchanges) if rep is not None]
    at = rng.choice(answered)
    cmd, rep = exchanges[at]
    reply = bytes.fromhex(rep)
    how = rng.choices(["field", "flip", "size", "short", "extra", "earlier", "close", "hang",
                       "trickle"], [30, 15, 6, 6, 10, 10, 4, 2, 2])[0]
    if how == "earlier":
        same = [j for j in answered if j < at and exchanges[j][0] == cmd]
        if not same:
            how = "field"
        else:
            reply = bytes.fromhex(exchanges[rng.choice(same)][1])
    if how == "field" and len(reply) >= 4:
        width = 8 if len(reply) >= 8 and rng.random() < 0.6 else 4
        off = rng.randrange(0, len(reply) - width + 1, width)
        value = rng.choice(EDGES) % (1 << (8 * width))
        if rng.random() < 0.3:                  # near the genuine value instead
            genuine = int.from_bytes(reply[off:off + width], "little")
            value = (genuine + rng.choice((-1, 1, 2, -32, 4096))) % (1 << (8 * width))
        reply = reply[:off] + value.to_bytes(width, "little") + reply[off + width:]
    elif how in ("field", "flip") and reply:
        how = "flip"
        k = rng.randrange(len(reply))
        reply = reply[:k] + bytes([reply[k] ^ rng.randrange(1, 256)]) + reply[k + 1:]
    out = {"at": at, "how": how, "reply": reply, "data": cmd == "GET_TENSOR",
           "command": cmd}
    if how == "size":
        out["header"] = max(0, len(reply) + rng.choice((-8, -1, 1, 8, 2**20)))
    elif how == "short":
        out["keep"] = rng.randrange(0, 8 + len(reply))
    elif how == "extra":                    # sent with the reply: already waiting after it
        out["extra"] = bytes.fromhex(exchanges[rng.choice(answered)][1])
    return out


class ReplayServer:
    """Answers one client with the recorded replies, in order, one of them mutated
    (`mutation` from mutate; None: the genuine session). A command out of the recorded
    order closes the connection."""

    def __init__(self, exchanges, mutation, trickle_interval=0.3, hang=5.0):
        self.exchanges = exchanges
        self.mutation = mutation
        self.trickle_interval = trickle_interval
        self.hang = hang
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                self._session(conn)
            except (EOFError, OSError):
                pass

    def _session(self, conn):
        m = self.mutation
        for i, (cmd, rep) in enumerate(self.exchanges):
            got, _ = _read_frame(conn)
            if got != cmd:
                return
            if rep is None:
                continue
            reply = bytes.fromhex(rep)
            frame = struct.pack("<Q", len(reply)) + reply
            if m is not None and m["at"] == i:
                how = m["how"]
                reply = m["reply"]
                frame = struct.pack("<Q", m.get("header", len(reply))) + reply
                if how == "close":
                    return
                if how == "hang":
                    self.stop.wait(self.hang)
                    return
                if how == "short":
                    conn.sendall(frame[:m["keep"]])
                    return
                if how == "trickle":
                    for k in range(len(frame)):
                        if self.stop.wait(self.trickle_interval):
                            return
                        conn.sendall(frame[k:k + 1])
                    continue
                if how == "extra":
                    frame += struct.pack("<Q", len(m["extra"])) + m["extra"]
            conn.sendall(frame)
        while not self.stop.is_set():       # past the recording: only a close is expected
            _read_frame(conn)
            return

    def close(self):
        """Stop serving (wakes a hang or a trickle) and wait for the thread."""
        self.stop.set()
        self.sock.close()
        self.thread.join(5)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client_main(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "record":             # python tests/rpc_fuzz.py record HOST:PORT [4|7]
        protocol = int(sys.argv[3]) if len(sys.argv) > 3 else 4
        rec = record(sys.argv[2], protocol)
        path = session_file(protocol)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(rec, f, indent=0)
        print(f"{len(rec['exchanges'])} exchanges -> {path}")
