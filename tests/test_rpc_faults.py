"""RPC faults: servers that are down, refuse, break off, answer with the wrong size, speak
another protocol version or hang. Fake servers (a few lines of Python on 127.0.0.1) play
them; no ggml library is needed. Each fault is an RPCError naming the endpoint and the
command, within the timeout, and leaves the process, the scheduler and the other backends
usable. (test_rpc.py kills a real ggml server in the middle of a compute.)
"""

import socket
import struct
import threading
import time

import numpy as np
import pytest

from ggml_py import ops
from ggml_py.backends.rpc import _protocol
from ggml_py._core import Context, Graph
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.rpc import RPCBackend
from ggml_py.errors import BackendError, GgmlPyError, RPCError
from ggml_py.rpc_server import free_port
from ggml_py.sched import Scheduler
from rpc_fuzz import recv_exactly

# (block size, bytes per block) of the types the fakes size
LAYOUT = {0: (1, 4), 1: (1, 2), 2: (32, 18), 26: (1, 4)}


class Hangup(Exception):
    """A fake handler's way to close the connection."""


def hello(version=(4, 0, 0)):
    return bytes(version) + bytes(1 + _protocol.CONN_CAPS_SIZE)


def nbytes(rec):
    """ggml_nbytes of an rpc_tensor record."""
    blck, size = LAYOUT[int(rec["type"])]
    ne, nb = rec["ne"].astype(int), rec["nb"].astype(int)
    n = ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))
    return n if blck > 1 else n - nb[0] + size


class FakeServer:
    """Speaks just enough of protocol 4 (or 7: `version`) to be a server with one device
    and buffers at made-up addresses; `handlers` (command name -> f(payload) -> reply
    bytes, None for no reply, or HANG / HANGUP) replace its answers."""

    BASE = 0x7000_0000

    def __init__(self, version=(4, 0, 0), **handlers):
        empty = (lambda p: b"") if version[0] == 4 else (lambda p: None)   # 7: no reply
        self.handlers = {"HELLO": lambda p: hello(version),
                         "DEVICE_COUNT": lambda p: struct.pack("<I", 1),
                         "GET_ALIGNMENT": lambda p: struct.pack("<Q", 32),
                         "GET_MAX_SIZE": lambda p: struct.pack("<Q", 2**64 - 1),
                         "GET_ALLOC_SIZE": self.alloc_size, "ALLOC_BUFFER": self.alloc,
                         "BUFFER_GET_BASE": self.base,
                         "FREE_BUFFER": empty, "BUFFER_CLEAR": empty, "INIT_TENSOR": empty,
                         "MEMSET_TENSOR": lambda p: None,
                         "SET_TENSOR": lambda p: None, "GRAPH_COMPUTE": lambda p: None,
                         "GRAPH_RECOMPUTE": lambda p: None,
                         "GET_DEVICE_MEMORY": lambda p: struct.pack("<QQ", 1 << 30, 1 << 30),
                         "GET_TENSOR": lambda p: bytes(struct.unpack_from("<Q", p, 304)[0])}
        self.handlers.update(handlers)
        self.seen = []
        self.clients = []
        self.sent_stale = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def alloc_size(p):
        rec = np.frombuffer(p, _protocol.RPC_TENSOR_DTYPE, 1, 4)[0]
        return struct.pack("<Q", nbytes(rec))

    def alloc(self, p):
        """A new handle each time; buffers 16 MiB apart (as long as they are smaller)."""
        size = struct.unpack_from("<Q", p, 4)[0]
        self.n_alloc = getattr(self, "n_alloc", 0) + 1
        return struct.pack("<QQ", 0xB00 + self.n_alloc, size)

    def base(self, p):
        return struct.pack("<Q", self.BASE + ((struct.unpack("<Q", p)[0] - 0xB00) << 24))

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.clients.append(conn)
            with conn:
                try:
                    self._session(conn)
                except (OSError, Hangup, EOFError):
                    pass

    _recv = staticmethod(recv_exactly)

    def _session(self, conn):
        while True:
            cmd = _protocol.COMMANDS[self._recv(conn, 1)[0]]
            payload = self._recv(conn, struct.unpack("<Q", self._recv(conn, 8))[0])
            self.seen.append(cmd)
            handler = self.handlers[cmd]
            if handler == HANG:
                self.stop.wait(10)          # until the test is over
                raise Hangup
            if handler == HANGUP:
                raise Hangup
            out = handler(payload)
            if out is not None and not isinstance(out, (Stale, Trickle)):
                conn.sendall(out if isinstance(out, Cut) else struct.pack("<Q", len(out)) + out)
            if isinstance(out, Cut):
                raise Hangup
            if isinstance(out, Stale):          # a reply nobody asked for, then wait
                conn.sendall(struct.pack("<Q", len(out)) + out)
                self.sent_stale.set()
            if isinstance(out, Trickle):
                for k in range(len(out.frame)):
                    if self.stop.wait(out.interval):
                        raise Hangup
                    conn.sendall(out.frame[k:k + 1])

    def close(self):
        self.stop.set()
        for c in [self.sock] + self.clients:    # wakes the thread out of accept / recv
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()
        self.thread.join(2)
        assert not self.thread.is_alive()


class Cut(bytes):
    """A reply sent as it is (its own size header), after which the fake hangs up."""


class Stale(bytes):
    """Bytes sent, framed as a reply, to a command that has none (sets `sent_stale`)."""


class Trickle:
    """A genuine reply sent one byte every `interval` seconds."""

    def __init__(self, reply, interval):
        self.frame = struct.pack("<Q", len(reply)) + reply
        self.interval = interval


@pytest.fixture
def fake():
    servers = []

    def make(**handlers):
        servers.append(FakeServer(**handlers))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


HANG = "hang"          # a handler that never answers
HANGUP = "hangup"      # a handler that closes the connection


def raises_rpc(endpoint, command, match, within=2.0):
    """pytest.raises for an RPCError of `endpoint` and `command` (None: any) that comes
    in time."""
    class Check:
        def __enter__(self):
            self.t0 = time.monotonic()
            self.ctx = pytest.raises(RPCError, match=match)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.ctx.__exit__(*exc)
            e = self.info.value
            assert e.endpoint == endpoint and e.command == (command or e.command)
            assert f"RPC server {endpoint}: {e.command}:" in str(e)
            assert isinstance(e, BackendError) and isinstance(e, GgmlPyError)
            assert time.monotonic() - self.t0 < within
            return out
    return Check()


# ---------------------------------------------------------------------------
# connecting

def test_server_down():
    ep = f"127.0.0.1:{free_port()}"
    with raises_rpc(ep, "connect", "cannot connect .*is a ggml RPC server running there"):
        RPCBackend(ep)


def test_server_refuses(fake):
    s = fake(HELLO=HANGUP)
    with raises_rpc(s.endpoint, "HELLO", "closed the connection .*protocol 4 or 7"):
        RPCBackend(s.endpoint)


@pytest.mark.parametrize("version", [(3, 0, 0), (4, 1, 0), (5, 0, 0), (6, 0, 0), (7, 1, 0),
                                     (8, 0, 0), (255, 0, 0)])
def test_other_protocol_version(fake, version):
    """Older than 4, between the two, or newer than both: an error naming the server's
    version and both of ggml_py's (ggml's own client aborts the process here)."""
    s = fake(HELLO=lambda p: hello(version))
    with raises_rpc(s.endpoint, "HELLO", f"speaks RPC protocol {'.'.join(map(str, version))}; "
                    "ggml_py speaks 4.0.0 and 7.0.0"):
        RPCBackend(s.endpoint)


@pytest.mark.parametrize("version", [(4, 0, 7), (7, 0, 3)])
def test_newer_patch_version_is_accepted(fake, version):
    s = fake(HELLO=lambda p: hello(version))
    conn = RPCBackend(s.endpoint).conn
    assert conn.version == version                          # as ggml's client: patch ignored
    assert conn.protocol is _protocol.PROTOCOLS[version[0]]


def test_hello_answer_of_protocol_3(fake):
    s = fake(HELLO=lambda p: bytes([3, 0, 0]))                  # v3's reply was 3 bytes
    with raises_rpc(s.endpoint, "HELLO", "answered 3 bytes, expected 28"):
        RPCBackend(s.endpoint)


def test_server_that_never_answers(fake):
    s = fake(HELLO=HANG)
    with raises_rpc(s.endpoint, "HELLO", r"no answer within 0.3 s"):
        RPCBackend(s.endpoint, connect_timeout=0.3)


def test_bad_endpoints():
    for bad in ("localhost", "host:", ":50052", "host:70000", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            RPCBackend(bad)


# ---------------------------------------------------------------------------
# in the middle of a session

def test_wrong_size_in_a_reply(fake):
    s = fake(GET_MAX_SIZE=lambda p: struct.pack("<I", 7))
    with raises_rpc(s.endpoint, "GET_MAX_SIZE", "answered 4 bytes, expected 8"):
        RPCBackend(s.endpoint)


def test_closed_in_the_middle_of_a_command(fake):
    s = fake(ALLOC_BUFFER=HANGUP)
    r = RPCBackend(s.endpoint)
    with raises_rpc(s.endpoint, "ALLOC_BUFFER", "the server closed the connection"):
        r.buffer_type.alloc_buffer(64)
    # the connection is closed for good: every later call says so at once
    with raises_rpc(s.endpoint, "DEVICE_COUNT", r"lost earlier \(ALLOC_BUFFER: .*make a new RPCBackend"):
        r.conn.device_count()
    assert RPCBackend(s.endpoint).conn is not r.conn            # a new backend connects anew


def test_reply_cut_short(fake):
    def cut(p):                        # announce the whole reply, send a part, hang up
        return Cut(struct.pack("<Q", struct.unpack_from("<Q", p, 304)[0]) + bytes(10))
    s = fake(GET_TENSOR=cut)
    r = RPCBackend(s.endpoint)
    ctx = Context()
    t = ops.new_tensor(ctx, "f32", (16,), name="t")
    r.buffer_type.alloc_buffer(64).tensor_alloc(t, 0)
    with raises_rpc(s.endpoint, "GET_TENSOR", "closed the connection"):
        r.get_tensor(t)


def test_padding_server_sizes_tensors_as_ggmls_client(fake):
    def padded(p):
        rec = np.frombuffer(p, _protocol.RPC_TENSOR_DTYPE, 1, 4)[0]
        return struct.pack("<Q", nbytes(rec) + (512 if rec["type"] == 2 else 0))
    s = fake(GET_ALLOC_SIZE=padded)
    bt = RPCBackend(s.endpoint).buffer_type
    assert type(bt) is _protocol.RPCPaddedBufferType
    ctx = Context()
    q = ops.new_tensor(ctx, "q4_0", (64, 3))
    assert bt.get_alloc_size(q) == q.nbytes + 512
    assert bt.get_alloc_size(ops.new_tensor(ctx, "f32", (64, 3))) == 64 * 3 * 4   # not asked


# ---------------------------------------------------------------------------
# a compute that fails: the scheduler and the other backends stay usable

def scaled_graph(r):
    ctx = Context()
    x = ops.new_tensor(ctx, "f32", (8,), name="x").set_input()
    y = ops.scale(ctx, x, 2.0)
    g = Graph(8).build_forward_expand(y)
    return ctx, x, y, g


@pytest.mark.parametrize("fault,match", [
    ("hang", r"no answer within 0.3 s"),
    ("close", r"closed the connection \(after GRAPH_COMPUTE, which it may have refused, or it crashed\)"),
])
def test_compute_fault_leaves_the_scheduler_usable(fake, fault, match):
    s = fake()
    r = RPCBackend(s.endpoint, timeout=0.3)
    cpu = CPUBackend()
    _ctx, x, y, g = scaled_graph(r)
    sched = Scheduler([r, cpu], graph_size=16)
    sched.set_tensor_backend(y, r)
    sched.alloc_graph(g)
    cpu.set_tensor(x, np.ones(8, np.float32))
    # the server takes the graph, then hangs or goes away before the next reply
    s.handlers["DEVICE_COUNT"] = HANG if fault == "hang" else HANGUP
    with raises_rpc(s.endpoint, "DEVICE_COUNT", match):
        sched.graph_compute(g)
    assert s.seen[-3:-1] == ["SET_TENSOR", "GRAPH_COMPUTE"]
    # the same scheduler, reset, answers at once; the CPU computes the graph alone
    sched.reset()
    with raises_rpc(s.endpoint, None, "lost earlier"):
        sched.graph_compute(g)
    _ctx2, x2, y2, g2 = scaled_graph(cpu)
    s2 = Scheduler([cpu], graph_size=16)
    s2.alloc_graph(g2)
    cpu.set_tensor(x2, np.arange(8, dtype=np.float32))
    s2.graph_compute(g2)
    assert np.array_equal(np.frombuffer(cpu.get_tensor(y2), np.float32), 2 * np.arange(8))


# ---------------------------------------------------------------------------
# a server that lies (issue 35's findings, each replayed): nothing from the wire is
# trusted; each is an RPCError naming the endpoint and the command, the connection closed

def test_a_trickled_reply_has_one_deadline(fake):
    # one byte every 0.25 s: each recv is in time, the command is not (it was 9 s)
    s = fake(HELLO=lambda p: Trickle(hello(), 0.25))
    with raises_rpc(s.endpoint, "HELLO", r"no answer within 0.6 s", within=1.2):
        RPCBackend(s.endpoint, timeout=0.6, connect_timeout=0.6)
    s2 = fake(GET_DEVICE_MEMORY=lambda p: Trickle(struct.pack("<QQ", 1, 2), 0.25))
    r = RPCBackend(s2.endpoint, timeout=0.6)
    with raises_rpc(s2.endpoint, "GET_DEVICE_MEMORY", r"no answer within 0.6 s", within=1.2):
        r.device_memory()


@pytest.mark.parametrize("count", [257, 0x7FFF_FFFF, 2**31, 2**32 - 1])
def test_device_count_is_bounded(fake, count):
    s = fake(DEVICE_COUNT=lambda p: struct.pack("<I", count))
    with raises_rpc(s.endpoint, "DEVICE_COUNT", f"reported {count} devices, more than the "
                    f"{_protocol.MAX_DEVICES}"):
        RPCBackend(s.endpoint)


def test_device_count_that_changes(fake):
    s = fake()
    r = RPCBackend(s.endpoint)
    s.handlers["DEVICE_COUNT"] = lambda p: struct.pack("<I", 2)
    with raises_rpc(s.endpoint, "DEVICE_COUNT", "reported 2 devices, 1 before"):
        r.conn.device_count()


def test_bytes_waiting_before_a_command_are_a_desync(fake):
    # after GRAPH_RECOMPUTE (no reply) the server sends GET_TENSOR's reply again: it
    # must not be read as the next GET_TENSOR's answer
    s = fake(GRAPH_RECOMPUTE=lambda p: Stale(np.float32([-19.25, 21]).tobytes() * 4))
    r = RPCBackend(s.endpoint)
    ctx = Context()
    t = ops.new_tensor(ctx, "f32", (8,), name="t")
    r.buffer_type.alloc_buffer(64).tensor_alloc(t, 0)
    payload = bytes(16)
    r.conn.graph_compute(0, payload)
    r.conn.graph_compute(0, payload)                    # the same: GRAPH_RECOMPUTE
    assert s.sent_stale.wait(2)
    n_seen = len(s.seen)
    with raises_rpc(s.endpoint, "GET_TENSOR", r"out of step: 40 bytes nobody asked for were "
                    r"waiting before it \(after GRAPH_RECOMPUTE"):
        r.get_tensor(t)
    time.sleep(0.05)
    assert len(s.seen) == n_seen                        # not even sent
    with raises_rpc(s.endpoint, "DEVICE_COUNT", "lost earlier"):
        r.synchronize()


def test_alloc_size_below_nbytes(fake):
    def short(p):
        rec = np.frombuffer(p, _protocol.RPC_TENSOR_DTYPE, 1, 4)[0]
        return struct.pack("<Q", nbytes(rec) - 1)
    s = fake(GET_ALLOC_SIZE=short)
    with raises_rpc(s.endpoint, "GET_ALLOC_SIZE", r"answered \d+ bytes for tensor .*less than "
                    r"its \d+ bytes"):
        RPCBackend(s.endpoint)


@pytest.mark.parametrize("lie,match,freed", [
    ("null", "gave a buffer at 0x0, not a 32-byte aligned address", True),
    ("low-unaligned", "gave a buffer at 0x1001, not a 32-byte aligned", True),
    ("overlap", "overlapping live buffer 0xb01", True),
    ("same-handle", "gave handle 0xb01 again, a live buffer's", False),
    ("short", "gave a buffer of 10 bytes at .* for 4096 bytes", True),
    ("past-2^64", "gave a buffer of 18446744073709551615 bytes", True),
])
def test_buffers_the_server_gives_are_checked(fake, lie, match, freed):
    s = fake()
    r = RPCBackend(s.endpoint)
    first = r.buffer_type.alloc_buffer(4096)
    good_alloc = s.handlers["ALLOC_BUFFER"]
    s.handlers.update({
        "null": {"BUFFER_GET_BASE": lambda p: struct.pack("<Q", 0)},
        "low-unaligned": {"BUFFER_GET_BASE": lambda p: struct.pack("<Q", 0x1001)},
        "overlap": {"BUFFER_GET_BASE": lambda p: struct.pack("<Q", first.base + 64)},
        "same-handle": {"ALLOC_BUFFER": lambda p: struct.pack("<QQ", first.remote, 4096)},
        "short": {"ALLOC_BUFFER": lambda p: good_alloc(p)[:8] + struct.pack("<Q", 10)},
        "past-2^64": {"ALLOC_BUFFER": lambda p: good_alloc(p)[:8] + struct.pack("<Q", 2**64 - 1)},
    }[lie])
    with raises_rpc(s.endpoint, "ALLOC_BUFFER", match):
        r.buffer_type.alloc_buffer(4096)
    # the buffer whose setup failed is freed first; a repeated handle is not (it is
    # the live buffer's), the closed connection frees it
    assert (s.seen[-1] == "FREE_BUFFER") == freed


@pytest.mark.parametrize("command,reply,match", [
    ("GET_DEVICE_MEMORY", struct.pack("<QQ", 2, 1), "reported 2 bytes free of 1"),
    ("GET_ALIGNMENT", struct.pack("<Q", 2**63), "reported alignment 9223372036854775808, not"),
    ("GET_ALIGNMENT", struct.pack("<Q", 48), "reported alignment 48, not a power of two"),
    ("GET_ALIGNMENT", struct.pack("<Q", 2 * _protocol.MAX_ALIGNMENT), "up to 1048576"),
    ("GET_MAX_SIZE", struct.pack("<Q", 16), "a largest buffer of 16 bytes, less than its "
     "alignment 32"),
    ("COPY_TENSOR", b"\x02", "answered 2, not 0 or 1"),
])
def test_absurd_values_are_refused(fake, command, reply, match):
    s = fake(**{command: lambda p: reply})
    with raises_rpc(s.endpoint, command, match):
        r = RPCBackend(s.endpoint)
        r.device_memory()
        ctx = Context()
        a, b = ops.new_tensor(ctx, "f32", (4,)), ops.new_tensor(ctx, "f32", (4,))
        buf = r.buffer_type.alloc_buffer(64)
        buf.tensor_alloc(a, 0)
        buf.tensor_alloc(b, 32)
        buf.cpy_tensor(a, b)


def test_no_free_memory_to_split_layers_by(fake):
    from ggml_py.models.placement import split_layers
    s = fake(GET_DEVICE_MEMORY=lambda p: struct.pack("<QQ", 0, 1 << 30))
    r = RPCBackend(s.endpoint)
    with pytest.raises(BackendError, match=r"no device reports free memory .*RPC0\[.*\]: 0 of "
                       r"1073741824 bytes free\); pass tensor_split"):
        split_layers(4, [r], CPUBackend())


def test_allocation_error_keeps_its_rpc_error(fake):
    s = fake()
    r = RPCBackend(s.endpoint, timeout=0.3)
    _ctx, x, y, g = scaled_graph(r)
    sched = Scheduler([r, CPUBackend()], graph_size=16)
    sched.set_tensor_backend(y, r)
    s.handlers["ALLOC_BUFFER"] = HANG
    with pytest.raises(Exception) as info:
        sched.alloc_graph(g)
    e = info.value
    assert type(e).__name__ == "AllocationError" and "no answer within 0.3 s" in str(e)
    assert isinstance(e.__cause__, RPCError)
    assert (e.__cause__.endpoint, e.__cause__.command) == (s.endpoint, "ALLOC_BUFFER")


def test_the_timeout_is_the_backends(fake):
    s = fake()
    slow = RPCBackend(s.endpoint, timeout=30)
    quick = RPCBackend(s.endpoint, timeout=0.3)
    assert quick.conn is slow.conn and slow.conn.timeout == 30     # not changed by `quick`
    assert (slow.timeout, quick.timeout) == (30, 0.3)
    s.handlers["GET_DEVICE_MEMORY"] = HANG
    with raises_rpc(s.endpoint, "GET_DEVICE_MEMORY", r"no answer within 0.3 s"):
        quick.device_memory()


# ---------------------------------------------------------------------------
# protocol 7's differences, on the wire

def test_protocol_7_commands_on_the_wire(fake):
    """A version 7 server gets version 7's requests: SET_TENSOR with the cache flag,
    MEMSET_TENSOR, op numbers of its enum; FREE_BUFFER and BUFFER_CLEAR expect no reply."""
    got = {}

    def keep(name, reply=None):
        def handler(p):
            got.setdefault(name, []).append(p)
            return reply
        return handler
    s = fake(version=(7, 0, 0), SET_TENSOR=keep("SET_TENSOR"), MEMSET_TENSOR=keep("MEMSET_TENSOR"),
             GRAPH_COMPUTE=keep("GRAPH_COMPUTE"))
    r = RPCBackend(s.endpoint)
    assert r.conn.version == (7, 0, 0)
    ctx = Context()
    a = ops.new_tensor(ctx, "f32", (8,), name="a")
    buf = r.buffer_type.alloc_buffer(64)
    buf.tensor_alloc(a, 0)
    r.set_tensor(a, np.ones(7, np.float32), 4)
    r.conn.device_count()                                   # a round trip: the fake has it
    head = got["SET_TENSOR"][0]
    assert len(head) == 296 + 1 + 8 + 28                    # tensor, cache flag, offset, data
    assert head[296] == 0 and struct.unpack_from("<Q", head, 297)[0] == 4
    buf.memset_tensor(a, 7, 8, 16)
    r.conn.device_count()                                   # a round trip: the fake has it
    assert struct.unpack_from("<QQB", got["MEMSET_TENSOR"][0], 296) == (8, 16, 7)
    y = ops.unary(ctx, a, "RELU")
    ybuf = r.buffer_type.alloc_buffer(64)
    ybuf.tensor_alloc(y, 0)
    r.graph_compute([y])
    r.conn.device_count()                                   # a round trip: the fake has it
    _, _, rec = _protocol.decode_graph(got["GRAPH_COMPUTE"][0])
    ops7 = _protocol.PROTOCOLS[7].op_names
    assert [ops7[o] for o in rec["op"]] == ["NONE", "UNARY"]
    assert rec["op"][1] == _protocol.PROTOCOLS[4].op_names.index("UNARY") + 5    # 5 ops before it
    n = len(s.seen)                                         # the round trip above: all seen
    buf.clear(0)                                            # no reply to wait for
    ybuf.free()                                             # nor here
    r.conn.device_count()                                   # in order behind them on the wire
    assert s.seen[n:] == ["BUFFER_CLEAR", "FREE_BUFFER", "DEVICE_COUNT"]
    assert r.conn.stats["FREE_BUFFER"][2] == r.conn.stats["BUFFER_CLEAR"][2] == 0  # nothing read
    assert r.conn.broken is None


def test_protocol_7_reply_to_a_command_without_one_is_a_desync(fake):
    """Version 7's FREE_BUFFER has no reply: a server that answers it anyway is out of
    step, and the next command says so instead of reading that answer."""
    s = fake(version=(7, 0, 0), FREE_BUFFER=lambda p: Stale(b""))
    r = RPCBackend(s.endpoint)
    r.buffer_type.alloc_buffer(64).free()
    assert s.sent_stale.wait(2)
    with raises_rpc(s.endpoint, "GET_DEVICE_MEMORY", "out of step.*after FREE_BUFFER, which has "
                    "no reply"):
        r.device_memory()


def test_protocol_table_is_one_description():
    """Both versions are read from the one table: the same ids, and the differences
    are the ones llama.cpp made (ggml-rpc.cpp of protocol 4 -> 7)."""
    p4, p7 = _protocol.PROTOCOLS[4], _protocol.PROTOCOLS[7]
    assert all(p4.ids[n] == p7.ids[n] == _protocol.CMD[n] for n in p4.ids)
    assert set(p7.ids) - set(p4.ids) == {"MEMSET_TENSOR"}
    assert p4.no_reply == {"SET_TENSOR", "GRAPH_COMPUTE", "GRAPH_RECOMPUTE"}
    assert p7.no_reply == p4.no_reply | {"FREE_BUFFER", "BUFFER_CLEAR", "INIT_TENSOR",
                                         "MEMSET_TENSOR"}
    assert p4.reply_size("FREE_BUFFER") == 0 and p4.reply_size("HELLO") == 28
    assert p7.reply_size("GET_TENSOR", 12) == 12
    assert p4.pack("SET_TENSOR", {"tensor": bytes(296), "offset": 5, "cache_flag": 1}) \
        == bytes(296) + struct.pack("<Q", 5)
    assert p7.pack("SET_TENSOR", {"tensor": bytes(296), "offset": 5, "cache_flag": 1}) \
        == bytes(296) + struct.pack("<BQ", 1, 5)
    assert len(p7.op_names) == 101 and len(p4.op_names) == 96
    assert p7.op_names[p7.op_ids[_protocol.PROTOCOLS[4].op_names.index("CONV_2D")]] == "CONV_2D"


def test_a_handle_above_int64_is_a_handle(fake):
    """A server's buffer handle is a u64 (its address of the buffer): one above INT64_MAX
    was an ArgumentError inside the allocator (the fuzzer's find), not a handle."""
    handle = 0xF100_0000_0000_0020
    s = fake(version=(7, 0, 0), ALLOC_BUFFER=lambda p: struct.pack("<QQ", handle,
                                                                  struct.unpack_from("<Q", p, 4)[0]),
             BUFFER_GET_BASE=lambda p: struct.pack("<Q", FakeServer.BASE))
    r = RPCBackend(s.endpoint)
    buf = r.buffer_type.alloc_buffer(64)
    assert buf.remote == handle
    buf.free()
    assert r.conn.device_count() == 1 and s.seen[-2:] == ["FREE_BUFFER", "DEVICE_COUNT"]
