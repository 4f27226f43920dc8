"""ggml's RPC protocol, versions 4.0.0 (ggml-rpc.cpp of ggml 0.10.1) and 7.0.0 (the
llama.cpp of llama-cpp-python 0.3.36, today's rpc-server): the client side.

  * the protocols: one table of the commands (COMMAND_TABLE: id, request and reply
    layout per version) and the op numbering of each version, from which every command
    is packed and every reply read; the version is the server's, chosen at HELLO;
  * the wire structs: rpc_tensor, packed as ggml packs it, with ggml's own type numbers
    and the server's op numbers (ggml_py's enums are ggml 0.10.1's);
  * serialisation of tensors and graphs into rpc_tensor arrays, in C, with the checks
    that keep a server alive: ggml's server asserts that every tensor lies inside its
    buffer and aborts on a kernel for types it lacks, taking all its clients down;
  * Connection: one TCP connection per server, shared by every backend on it (the
    server serves one client at a time and frees a client's buffers when it leaves).
    Request: 1-byte command, uint64 size, payload; response: uint64 size, payload. Every
    command has one deadline (its send and its whole reply); nothing read is trusted: a
    reply of the wrong size, bytes waiting before a command, an absurd count, size,
    alignment, address or handle close the connection (the stream is out of step, or
    the server is not what it claims) and raise RPCError naming the endpoint and the
    command;
  * RPCBufferType / RPCBuffer: a server device's memory. A buffer's base is the server's
    own address (BUFFER_GET_BASE), so a tensor's data pointer is what goes on the wire;
  * what a ggml CPU server can run: the `rpc-cpu-server` rule of ggml_py._supports, which
    the scheduler calls while splitting (ggml's own client answers "yes" to every op).
"""

cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, UINT32_MAX, INT64_MAX
from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcpy, strncpy

from ggml_py._ggml cimport *
from ggml_py._core cimport (Tensor, Graph, TYPE_TRAITS, ggml_nbytes,
                            ggml_hash_set_init, ggml_hash_set_free, ggml_hash_insert,
                            ggml_hash_contains, safe_realloc, int_arg)
from ggml_py._backend cimport Backend, BufferType, Buffer, backend_supports_op

import _socket
import socket
import struct
import threading
import time
import weakref

import numpy as np

from ggml_py._core import (OP_IDS as _OP_IDS, OP_NAMES_LIST as _OP_NAMES_LIST,
                           TYPE_NAMES as _TYPE_NAMES)
from ggml_py._backend import byte_value
from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, BackendError,
                            RPCError)

# ---------------------------------------------------------------------------
# the wire format

HASH_THRESHOLD = 10 * 1024 * 1024       # SET_TENSOR_HASH first above this many bytes
CONN_CAPS_SIZE = 24                     # HELLO's transport capabilities (zeros: plain TCP)
DEFAULT_TIMEOUT = 60.0                  # seconds per command, a graph compute included
DEFAULT_CONNECT_TIMEOUT = 5.0
MAX_TIMEOUT = 1e9                       # (31 years: a socket's limit is not far above)
# bounds on what a server may report (ggml's backends are far inside them: a CPU server
# has 1 device and aligns to 32 bytes, CUDA to 128, Vulkan to at most 64 KiB)
MAX_DEVICES = 256
MAX_ALIGNMENT = 1 << 20

# The protocol versions spoken (RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION), oldest first;
# a server announces its own at HELLO and the connection speaks it.
PROTO_VERSIONS = ((4, 0, 0), (7, 0, 0))
PROTO_VERSION = (7, 0, 0)               # the newest

# Every command of every version, once. A layout is a space-separated list of
# name:code fields: a struct code (little-endian, packed), T (one rpc_tensor), T<n> (n of
# them, as one bytes value), * (bytes of any length: a graph, the data of SET_TENSOR
# sent after the rest, GET_TENSOR's reply of the size asked). A reply is a layout, ""
# (an empty reply the client waits for), None (no reply at all) or "-" (the command is
# not in that version). A request given as a pair is (version 4's, version 7's).
#   name               id  request                                     v4 reply   v7 reply
COMMAND_TABLE = (
    ("ALLOC_BUFFER",      0, "device:I size:Q",                         "remote:Q size:Q", "remote:Q size:Q"),
    ("GET_ALIGNMENT",     1, "device:I",                                "alignment:Q", "alignment:Q"),
    ("GET_MAX_SIZE",      2, "device:I",                                "max_size:Q", "max_size:Q"),
    ("BUFFER_GET_BASE",   3, "remote:Q",                                "base:Q", "base:Q"),
    ("FREE_BUFFER",       4, "remote:Q",                                "", None),
    ("BUFFER_CLEAR",      5, "remote:Q value:B",                        "", None),
    ("SET_TENSOR",        6, ("tensor:T offset:Q data:*",
                              "tensor:T cache_flag:B offset:Q data:*"), None, None),
    ("SET_TENSOR_HASH",   7, "tensor:T offset:Q hash:Q",                "result:B", "result:B"),
    ("GET_TENSOR",        8, "tensor:T offset:Q size:Q",                "data:*", "data:*"),
    ("COPY_TENSOR",       9, "src:T dst:T",                             "result:B", "result:B"),
    ("GRAPH_COMPUTE",    10, "graph:*",                                 None, None),
    ("GET_DEVICE_MEMORY", 11, "device:I",                               "free:Q total:Q", "free:Q total:Q"),
    ("INIT_TENSOR",      12, "tensor:T",                                "", None),
    ("GET_ALLOC_SIZE",   13, "device:I tensor:T srcs:T10",              "size:Q", "size:Q"),
    ("HELLO",            14, "conn_caps:24s",
     "major:B minor:B patch:B pad:x conn_caps:24s", "major:B minor:B patch:B pad:x conn_caps:24s"),
    ("DEVICE_COUNT",     15, "",                                        "count:I", "count:I"),
    ("GRAPH_RECOMPUTE",  16, "device:I",                                None, None),
    ("MEMSET_TENSOR",    17, "tensor:T offset:Q size:Q value:B",        "-", None),
)
# the op enums: version 7's is version 4's (ggml 0.10.1's, ggml_py's own) with these
# ops inserted before the one named
OP_INSERTIONS = {7: (("CONV_2D", ("COL2IM_1D",)),
                     ("UNARY", ("LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE",
                                "DSV4_HC_POST")))}

# the ops whose size ggml's client asks a server for (GET_ALLOC_SIZE; a CUDA server pads
# them), besides quantized tensors with rows not a multiple of 512
ALLOC_SIZE_OPS = {4: ("FLASH_ATTN_EXT", "MUL_MAT_ID"),
                  7: ("FLASH_ATTN_EXT", "MUL_MAT", "MUL_MAT_ID", "CUMSUM", "ARGSORT", "TOP_K")}

def _command_ids():
    """(names by id, {name: id}) of every version's commands."""
    names, ids = [], {}
    for row in COMMAND_TABLE:
        assert row[1] == len(names), row
        names.append(row[0])
        ids[row[0]] = row[1]
    return tuple(names), ids


# (this module is compiled with wraparound and boundscheck off: no negative or unchecked
# indexes, not even at module level)
COMMANDS, CMD = _command_ids()

cdef enum:
    NO_REPLY = -1                       # a command without a reply (SET_TENSOR, ...)
    ANY_SIZE = -2                       # a reply of the size asked (GET_TENSOR)


# ggml's struct rpc_tensor (#pragma pack(1)): ne and nb travel as uint32
cdef packed struct rpc_tensor:
    uint64_t id                         # the client's tensor address
    uint32_t type
    uint64_t buffer                     # the server's buffer handle, 0 = none
    uint32_t ne[GGML_MAX_DIMS]
    uint32_t nb[GGML_MAX_DIMS]
    uint32_t op                         # in the server's op numbering
    int32_t op_params[GGML_MAX_OP_PARAMS]
    int32_t flags
    uint64_t src[GGML_MAX_SRC]
    uint64_t view_src
    uint64_t view_offs
    uint64_t data                       # the server's address, 0 = none
    char name[GGML_MAX_NAME]
    int32_t use_count                   # version 7 (4: padding); 0: unknown, no fusion

RPC_TENSOR_SIZE = sizeof(rpc_tensor)
assert RPC_TENSOR_SIZE == 296, "rpc_tensor must match ggml's packed layout"

# the same layout as a numpy dtype, to read payloads back (decode_graph)
RPC_TENSOR_DTYPE = np.dtype([
    ("id", "<u8"), ("type", "<u4"), ("buffer", "<u8"), ("ne", "<u4", 4), ("nb", "<u4", 4),
    ("op", "<u4"), ("op_params", "<i4", 16), ("flags", "<i4"), ("src", "<u8", 10),
    ("view_src", "<u8"), ("view_offs", "<u8"), ("data", "<u8"), ("name", "S64"),
    ("use_count", "<i4")])
assert RPC_TENSOR_DTYPE.itemsize == RPC_TENSOR_SIZE


def decode_graph(payload):
    """A GRAPH_COMPUTE payload read back: (device, node ids, rpc_tensor records as a
    numpy structured array of RPC_TENSOR_DTYPE)."""
    device, n_nodes = struct.unpack_from("<II", payload, 0)
    ids = np.frombuffer(payload, "<u8", n_nodes, 8)
    n_tensors = struct.unpack_from("<I", payload, 8 + 8 * n_nodes)[0]
    tensors = np.frombuffer(payload, RPC_TENSOR_DTYPE, n_tensors, 12 + 8 * n_nodes)
    return device, ids, tensors


class Protocol:
    """One protocol version, read from COMMAND_TABLE and OP_INSERTIONS: the commands it
    has (ids, requests, replies), how to pack a request and read a reply, and its op
    numbers (op_ids[ggml_py's op id] = the server's)."""

    def __init__(self, version):
        if not isinstance(version, tuple) or version not in PROTO_VERSIONS:
            raise ArgumentError(f"RPC protocol version must be one of {PROTO_VERSIONS}, got "
                                f"{version!r}")
        self.version = version
        column = PROTO_VERSIONS.index(version)
        self.ids, self.requests, self.replies = {}, {}, {}
        for name, cid, request, *replies in COMMAND_TABLE:
            reply = replies[column]
            if reply == "-":
                continue
            self.ids[name] = cid
            self.requests[name] = self._layout(request[column] if isinstance(request, tuple)
                                               else request)
            self.replies[name] = None if reply is None else self._layout(reply)
        self.no_reply = frozenset(n for n, r in self.replies.items() if r is None)
        ops = list(_OP_NAMES_LIST)
        for before, names in OP_INSERTIONS.get(self.version[0], ()):
            i = ops.index(before)
            ops[i:i] = names
        self.op_names = tuple(ops)
        self.op_ids = tuple(ops.index(n) for n in _OP_NAMES_LIST)
        self.alloc_size_ops = frozenset(_OP_IDS[n] for n in ALLOC_SIZE_OPS[self.version[0]])

    @staticmethod
    def _layout(text):
        """[(field, code), ...] of a layout string, with each field's struct (None for
        T and *: bytes)."""
        out = []
        for item in text.split():
            field, code = item.split(":")
            if code.startswith("T"):
                out.append((field, code, None, int(code[1:] or 1) * sizeof(rpc_tensor)))
            elif code == "*":
                out.append((field, code, None, -1))
            else:
                st = struct.Struct("<" + code)
                out.append((field, code, st, st.size))
        return tuple(out)

    @property
    def name(self):
        return ".".join(map(str, self.version))

    def has(self, command):
        """Is `command` (a name) in this version?"""
        return isinstance(command, str) and command in self.ids

    def _command(self, command):
        if not self.has(command):
            raise ArgumentError(f"RPC protocol {self.name} has no command {command!r}")
        return command

    def pack(self, command, fields):
        """A command's request from {field: value} (T fields: rpc_tensor bytes; a trailing
        `data` field is sent apart, unpacked); fields other versions have are ignored."""
        parts = []
        for field, code, st, size in self.requests[self._command(command)]:
            if field == "data":
                continue
            try:
                v = fields[field]
                if st is not None:
                    parts.append(st.pack(v))
                    continue
                v = bytes(v)
            except (KeyError, TypeError, ValueError, struct.error) as e:
                raise ArgumentError(f"RPC {command}: field {field} ({code}): {e}") from None
            if size >= 0 and len(v) != size:
                raise ArgumentError(f"RPC {command}: field {field} is {len(v)} bytes, not "
                                    f"{size}")
            parts.append(v)
        return b"".join(parts)

    def reply_size(self, command, asked=0):
        """The exact size of a command's reply (`asked` for a * reply), or NO_REPLY."""
        layout = self.replies[self._command(command)]
        asked = int_arg(asked, "asked", 0, INT64_MAX)
        if layout is None:
            return NO_REPLY
        return sum(asked if size < 0 else size for _, _, _, size in layout)

    def unpack(self, command, reply):
        """A reply's fields as a tuple (pad bytes left out; a * field: the bytes)."""
        layout = self.replies[self._command(command)]
        if layout is None:
            return None
        if len(layout) == 1 and layout[0][1] == "*":
            return (reply,)
        out, off = [], 0
        try:
            for field, code, st, size in layout:
                if code != "x":
                    out.extend(st.unpack_from(reply, off))
                off += size
        except (TypeError, struct.error) as e:
            raise ArgumentError(f"RPC {command}: not a reply of its layout: {e}") from None
        return tuple(out)

    def __repr__(self):
        return f"<RPC protocol {self.name}>"


def _protocols():
    out = {}
    for v in PROTO_VERSIONS:
        out[v[0]] = Protocol(v)
    assert PROTO_VERSION == max(PROTO_VERSIONS)
    assert len(out[7].op_names) == 101          # ggml's GGML_OP_COUNT there
    return out


PROTOCOLS = _protocols()


cdef uint64_t fnv1a(const uint8_t * data, size_t n) noexcept nogil:
    """ggml-rpc's fnv_hash: FNV-1a, 64 bits."""
    cdef uint64_t h = 0xcbf29ce484222325ULL
    cdef size_t i
    for i in range(n):
        h = (h ^ data[i]) * 0x100000001b3ULL
    return h


def fnv_hash(data):
    """FNV-1a of a bytes-like object, as SET_TENSOR_HASH sends it."""
    cdef const uint8_t[::1] v = memoryview(data).cast("B")
    cdef uint64_t h
    if v.shape[0] == 0:
        return fnv1a(NULL, 0)
    with nogil:
        h = fnv1a(&v[0], v.shape[0])
    return h


def _error(endpoint, command, reason):
    e = RPCError(f"RPC server {endpoint}: {command}: {reason}")
    e.endpoint = endpoint
    e.command = command
    return e


# ---------------------------------------------------------------------------
# tensors on the wire

cdef inline uint64_t _remote_buffer(const ggml_tensor * t, Connection conn):
    """The server's handle of t's buffer when it is a live RPCBuffer of `conn`, else 0."""
    if t.buffer == NULL or t.buffer.pyobj == NULL:
        return 0
    obj = <object>t.buffer.pyobj
    if isinstance(obj, RPCBuffer) and (<RPCBuffer>obj).conn is conn and not (<RPCBuffer>obj).freed:
        return (<RPCBuffer>obj).remote
    return 0


cdef void _fill(rpc_tensor * r, const ggml_tensor * t, uint64_t remote_buffer,
               const uint32_t * op_wire) noexcept nogil:
    """serialize_tensor of ggml-rpc.cpp: data and buffer only for the server's memory;
    the op in the server's numbering (op_wire, the connection's); use_count 0."""
    cdef int i
    memset(r, 0, sizeof(rpc_tensor))
    r.id = <uint64_t>t
    r.type = t.type
    if remote_buffer != 0:
        r.buffer = remote_buffer
        r.data = <uint64_t>t.data
    for i in range(GGML_MAX_DIMS):
        r.ne[i] = <uint32_t>t.ne[i]
        r.nb[i] = <uint32_t>t.nb[i]
    r.op = op_wire[t.op]
    for i in range(GGML_MAX_OP_PARAMS):
        r.op_params[i] = t.op_params[i]
    r.flags = t.flags
    for i in range(GGML_MAX_SRC):
        r.src[i] = <uint64_t>t.src[i]
    r.view_src = <uint64_t>t.view_src
    r.view_offs = t.view_offs
    strncpy(r.name, t.name, GGML_MAX_NAME - 1)


cdef str _tname(const ggml_tensor * t):
    return t.name.decode("utf-8", errors="replace")


cdef int _check_wire(const ggml_tensor * t, uint64_t remote, str where) except -1:
    """What the server asserts or refuses when it rebuilds a tensor: a type it knows,
    ne/nb that fit uint32, and (in its memory) data inside the buffer."""
    cdef int i
    cdef size_t n, lo, hi
    if t.type < 0 or t.type >= 64 or TYPE_TRAITS[t.type].blck_size == 0 \
            or t.ne[0] % TYPE_TRAITS[t.type].blck_size:
        raise BackendError(f"{where}: tensor '{_tname(t)}' has a type or row length a ggml "
                           f"server cannot rebuild")
    for i in range(GGML_MAX_DIMS):
        if t.ne[i] < 0 or t.ne[i] > UINT32_MAX or t.nb[i] > UINT32_MAX:
            raise BackendError(f"{where}: tensor '{_tname(t)}' has ne {[t.ne[j] for j in range(4)]}"
                               f" / nb {[t.nb[j] for j in range(4)]}; RPC sends them as 32-bit"
                               f" numbers")
    if remote != 0:
        n = ggml_nbytes(t)
        lo = <size_t>t.buffer.base
        hi = lo + t.buffer.size
        if <size_t>t.data < lo or <size_t>t.data + n > hi:
            raise BackendError(f"{where}: tensor '{_tname(t)}' ({n} bytes) lies outside its "
                               f"buffer")
    return 0


cdef bytes _tensor_wire(Tensor tensor, Connection conn):
    """One rpc_tensor for a single-tensor command; the tensor must be in `conn`'s memory."""
    cdef const ggml_tensor * t = tensor.ptr
    cdef uint64_t remote = _remote_buffer(t, conn)
    if remote == 0:
        raise BackendError(f"RPC server {conn.endpoint}: tensor '{tensor.name}' is not in its "
                           f"memory (or its buffer was freed)")
    _check_wire(t, remote, f"RPC server {conn.endpoint}")
    out = PyBytes_FromStringAndSize(NULL, sizeof(rpc_tensor))
    _fill(<rpc_tensor *>PyBytes_AS_STRING(out), t, remote, conn.op_wire)
    return out


cdef class _TensorList:
    """A growable C array of tensor pointers."""
    cdef ggml_tensor ** items
    cdef size_t n, cap

    def __dealloc__(self):
        free(self.items)

    cdef int push(self, ggml_tensor * t) except -1:
        cdef size_t cap
        if self.n == self.cap:
            cap = max(64, 2 * self.cap)
            safe_realloc(<void **>&self.items, cap, sizeof(ggml_tensor *),
                         "the RPC graph serialisation")
            self.cap = cap
        self.items[self.n] = t
        self.n += 1
        return 0


cdef struct _visit:
    ggml_tensor * t
    int next_child              # 0..9: src[i], GGML_MAX_SRC: view_src, then done


cdef int _collect(ggml_tensor ** nodes, int n_nodes, _TensorList out, size_t hash_min) except -1:
    """ggml-rpc's add_tensor over every node: each tensor once, its sources (src[0..9],
    then view_src) before it. Iterative (deep chains) with a hash set of visited
    tensors; returns 1 when the set is full (the caller retries with a larger one)."""
    cdef ggml_hash_set seen
    cdef _visit * stack = NULL
    cdef _visit * top
    cdef int sp, cap = 256, i, c
    cdef ggml_tensor * child
    cdef size_t pos
    ggml_hash_set_init(&seen, hash_min)
    try:
        stack = <_visit *>malloc(cap * sizeof(_visit))
        if stack == NULL:
            raise MemoryError("RPC graph serialisation")
        for i in range(n_nodes):
            pos = ggml_hash_insert(&seen, nodes[i])
            if pos == GGML_HASHSET_FULL:
                return 1
            if pos == GGML_HASHSET_ALREADY_EXISTS:
                continue
            stack[0].t = nodes[i]
            stack[0].next_child = 0
            sp = 1
            while sp > 0:
                top = &stack[sp - 1]
                c = top.next_child
                if c > GGML_MAX_SRC:
                    out.push(top.t)
                    sp -= 1
                    continue
                top.next_child = c + 1
                child = top.t.view_src if c == GGML_MAX_SRC else top.t.src[c]
                if child == NULL:
                    continue
                pos = ggml_hash_insert(&seen, child)
                if pos == GGML_HASHSET_FULL:
                    return 1
                if pos == GGML_HASHSET_ALREADY_EXISTS:
                    continue
                if sp == cap:
                    cap *= 2
                    safe_realloc(<void **>&stack, cap, sizeof(_visit),
                                 "the RPC graph serialisation")
                stack[sp].t = child
                stack[sp].next_child = 0
                sp += 1
    finally:
        free(stack)
        ggml_hash_set_free(&seen)
    return 0


cdef int _check_operand(const ggml_tensor * t, const ggml_tensor * node, Connection conn,
                        const ggml_backend_buffer_type * buft, str where) except -1:
    """A node and what it reads must be in this device's memory (a server computing on a
    tensor it does not hold dereferences NULL); empty tensors need no memory."""
    if ggml_nbytes(t) == 0:
        return 0
    if t.buffer != NULL and t.buffer.buft == buft and t.data != NULL and _remote_buffer(t, conn):
        return 0
    what = "node" if t == node else f"input of node '{_tname(node)}'"
    if t.buffer == NULL:
        place = "is not allocated"
    elif t.buffer.buft == buft:
        place = "is in a freed buffer"
    else:
        place = f"is in buffer type '{t.buffer.buft.name.decode()}'"
    raise BackendError(f"{where}: tensor '{_tname(t)}' ({what}) {place}, not in this "
                       f"device's memory")


def serialize_graph(Backend backend, device, nodes, Connection conn):
    """GRAPH_COMPUTE's payload for `nodes` (a Graph or a sequence of Tensors), checked
    first: every node supported by `backend` and in its memory with what it reads, every
    tensor rebuildable by the server. Format (ggml-rpc.cpp serialize_graph):
    | device u32 | n_nodes u32 | node ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |"""
    cdef ggml_tensor ** node_ptrs
    cdef ggml_tensor * t
    cdef ggml_tensor * node
    cdef _TensorList keep_nodes = None
    cdef _TensorList tensors
    cdef int n_nodes, i, j
    cdef size_t hash_min, k
    cdef uint32_t n32
    cdef uint32_t device32 = _device(device)
    cdef uint64_t id64, remote
    cdef char * p
    cdef rpc_tensor * r
    cdef const ggml_backend_buffer_type * buft = backend.c.default_buft
    where = f"backend {backend.name}"
    if isinstance(nodes, Graph):
        node_ptrs = (<Graph>nodes).graph.nodes
        n_nodes = (<Graph>nodes).graph.n_nodes
    else:
        keep_nodes = _TensorList()
        for x in nodes:
            if not isinstance(x, Tensor):
                raise TypeError(f"expected ggml_py Tensors, got {type(x).__name__}")
            keep_nodes.push((<Tensor>x).ptr)
        node_ptrs = keep_nodes.items
        n_nodes = <int>keep_nodes.n

    for i in range(n_nodes):
        node = node_ptrs[i]
        if not backend_supports_op(&backend.c, node):
            srcs = ", ".join(_TYPE_NAMES[node.src[j].type] for j in range(GGML_MAX_SRC)
                             if node.src[j] != NULL)
            raise BackendError(f"{where}: op {_OP_NAMES_LIST[node.op]} ('{_tname(node)}', "
                               f"{_TYPE_NAMES[node.type]} from {srcs or 'nothing'}) is not one a "
                               f"ggml CPU server runs")
        _check_operand(node, node, conn, buft, where)
        for j in range(GGML_MAX_SRC):
            if node.src[j] != NULL:
                _check_operand(node.src[j], node, conn, buft, where)
        if node.view_src != NULL:
            _check_operand(node.view_src, node, conn, buft, where)

    hash_min = 4 * <size_t>n_nodes + 64
    while True:
        tensors = _TensorList()
        if _collect(node_ptrs, n_nodes, tensors, hash_min) == 0:
            break
        hash_min *= 4
    # the listed nodes, to mark them computed on the wire: ggml_py's backends compute
    # every node they are given, ggml's CPU skips nodes without the COMPUTE flag (which
    # ggml_build_forward_expand sets, and graphs made from lists may lack)
    cdef ggml_hash_set listed
    ggml_hash_set_init(&listed, 2 * <size_t>n_nodes + 1)
    try:
        for i in range(n_nodes):
            ggml_hash_insert(&listed, node_ptrs[i])
        out = PyBytes_FromStringAndSize(NULL, 12 + 8 * <size_t>n_nodes
                                        + tensors.n * sizeof(rpc_tensor))
        p = PyBytes_AS_STRING(out)
        memcpy(p, &device32, 4)
        n32 = n_nodes
        memcpy(p + 4, &n32, 4)
        p += 8
        for i in range(n_nodes):
            id64 = <uint64_t>node_ptrs[i]
            memcpy(p, &id64, 8)
            p += 8
        n32 = <uint32_t>tensors.n
        memcpy(p, &n32, 4)
        p += 4
        for k in range(tensors.n):
            t = tensors.items[k]
            remote = _remote_buffer(t, conn)
            _check_wire(t, remote, where)
            r = <rpc_tensor *>(p + k * sizeof(rpc_tensor))
            _fill(r, t, remote, conn.op_wire)
            if t.op != 0 and ggml_hash_contains(&listed, t):
                r.flags |= GGML_TENSOR_FLAG_COMPUTE
    finally:
        ggml_hash_set_free(&listed)
    return out


# ---------------------------------------------------------------------------
# the connection to one server

class _Closed(Exception):
    """The peer closed the connection (recv returned nothing)."""


def parse_endpoint(endpoint):
    """'host:port' (an IPv6 host in brackets) -> (host, port); ArgumentError (a
    ValueError) names the endpoint, the HOST:PORT form and what is wrong."""
    if not isinstance(endpoint, str):
        raise ArgumentTypeError(f"an RPC endpoint is a string 'HOST:PORT', got "
                                f"{type(endpoint).__name__}")
    host, sep, port = endpoint.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep:
        wrong = "no port"
    elif not host:
        wrong = "no host"
    elif not port.isdigit():
        wrong = f"the port {port!r} is not a number" if port else "no port"
    elif not 0 < int(port) < 65536:
        wrong = f"the port {port} is not in 1..65535"
    else:
        return host, int(port)
    raise ArgumentError(f"RPC endpoint {endpoint!r}: {wrong}; an RPC endpoint is HOST:PORT, "
                        "e.g. 127.0.0.1:50052")


def format_endpoint(host, port):
    """(host, port) -> 'host:port' ('[host]:port' for IPv6), as connections are keyed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_connections = weakref.WeakValueDictionary()      # endpoint -> live Connection
_connections_lock = threading.Lock()


def connect(endpoint, timeout=DEFAULT_TIMEOUT, connect_timeout=DEFAULT_CONNECT_TIMEOUT):
    """The connection to `endpoint`, shared by every backend on that server (a ggml RPC
    server serves one client at a time); a new one when there is none or it broke.
    `timeout` and `connect_timeout` apply only to a new connection: an open one is
    returned as it is, with no round trip (its connect and HELLO are over), and keeps
    its own default timeout (a backend passes its own timeout to its commands)."""
    key = format_endpoint(*parse_endpoint(endpoint))
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None or conn.broken is not None:
            conn = Connection(key, timeout, connect_timeout)
            _connections[key] = conn
    return conn


cdef object _device(value):
    """A server device index (a u32 on the wire)."""
    return int_arg(value, "device", 0, UINT32_MAX)


cdef object _handle(value):
    """A server buffer handle (a u64 on the wire; the server's address of its buffer):
    the whole u64 range (int_arg stops at INT64_MAX, and a server's reply can be above)."""
    if type(value) is int and 0 <= value < 2**64:
        return value
    return int_arg(value, "remote", 0, 2**64 - 1)


def seconds_arg(value, what):
    """A timeout in seconds: positive, and at most MAX_TIMEOUT (a socket's limit is near)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"RPC {what} must be a number of seconds, got "
                                f"{type(value).__name__}")
    seconds = float(value) if -1e300 < value < 1e300 else float("inf")
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ArgumentError(f"RPC {what} must be a number of seconds in (0, {MAX_TIMEOUT:g}], "
                            f"got {value!r}")
    return seconds


@cython.final
@cython.no_gc_clear
cdef class Connection:
    """One TCP connection to a ggml RPC server: the HELLO handshake at connect, which
    chooses the protocol (the server's: 4 or 7, `protocol`), then one method per command,
    packed and read as that version's row of COMMAND_TABLE says. Thread-safe (one
    command at a time).

    timeout: the default deadline of a command in seconds, its send and whole reply (a
    reply after GRAPH_COMPUTE waits for the compute); a command may be given its own.
    connect_timeout: for the TCP connect and HELLO."""

    cdef readonly str endpoint
    cdef readonly str host
    cdef readonly int port
    cdef double _timeout
    cdef readonly tuple version
    cdef readonly object protocol       # the Protocol spoken (the server's version)
    cdef uint32_t op_wire[GGML_OP_COUNT_MAX]    # ggml_py's op id -> the server's
    cdef readonly int n_devices         # -1 until DEVICE_COUNT has answered
    cdef readonly object broken         # why the connection is unusable; None while usable
    cdef readonly dict stats            # command -> [calls, bytes sent, bytes received, seconds]
    cdef object sock
    cdef object lock
    cdef bint pending                   # a graph compute sent, nothing answered since
    cdef object unanswered              # the last command sent without an answer since one
    cdef list free_later                # buffers collected since the last command
    cdef dict last_graph                # device -> payload of its last GRAPH_COMPUTE
    cdef dict bufts                     # device -> RPCBufferType
    cdef dict live                      # server handle -> (base, end) of each live buffer
    cdef object __weakref__

    def __init__(self, str endpoint, timeout=DEFAULT_TIMEOUT,
                 connect_timeout=DEFAULT_CONNECT_TIMEOUT):
        self.host, self.port = parse_endpoint(endpoint)
        self.endpoint = format_endpoint(self.host, self.port)
        timeout = seconds_arg(timeout, "timeout")
        connect_timeout = seconds_arg(connect_timeout, "connect_timeout")
        self._timeout = timeout
        self.stats = {}
        self.lock = threading.RLock()
        self.free_later = []
        self.last_graph = {}
        self.bufts = {}
        self.live = {}
        self.broken = None
        self.n_devices = -1
        try:
            # the C socket object: outside the garbage collector's cycles, so __dealloc__
            # can still close it when a connection and its buffer types are collected
            self.sock = _socket.socket(fileno=socket.create_connection(
                (self.host, self.port), timeout=connect_timeout).detach())
        except OSError as e:
            self.broken = f"connect: {e}"
            raise _error(self.endpoint, "connect", f"cannot connect ({e.strerror or e}); is a "
                         f"ggml RPC server running there?") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # HELLO is the same in every version: asked in the newest's terms
        self._use(PROTOCOLS[PROTO_VERSION[0]])
        major, minor, patch, _ = self._cmd("HELLO", connect_timeout, conn_caps=bytes(CONN_CAPS_SIZE))
        self.version = (major, minor, patch)
        proto = PROTOCOLS.get(major)
        if proto is None or minor > proto.version[1]:
            self._break("HELLO", f"the server speaks RPC protocol "
                        f"{'.'.join(map(str, self.version))}; ggml_py speaks "
                        f"{' and '.join('.'.join(map(str, v)) for v in PROTO_VERSIONS)}")
        self._use(proto)
        self.n_devices = self.device_count()

    def _use(self, proto):
        cdef int i
        self.protocol = proto
        for i in range(GGML_OP_COUNT_MAX):
            self.op_wire[i] = proto.op_ids[i] if i < len(proto.op_ids) else 0xFFFFFFFF

    def __dealloc__(self):
        if self.sock is not None:
            self.sock.close()

    @property
    def timeout(self):
        """The default deadline of a command, in seconds (a reply after GRAPH_COMPUTE
        waits for the compute); commands a backend sends carry the backend's own."""
        return self._timeout

    @timeout.setter
    def timeout(self, value):
        self._timeout = seconds_arg(value, "timeout")

    def __repr__(self):
        state = "broken" if self.broken is not None else "open"
        return (f"<RPC connection {self.endpoint} {state}, protocol {self.protocol.name}, "
                f"{self.n_devices} device(s)>")

    # --- the wire ---

    def _close_broken(self, str command, str reason):
        """Close the connection for good: after a failed or cut command the stream is out
        of step (the next reply read would be this one's), and the server frees this
        client's buffers."""
        self.broken = f"{command}: {reason}"
        try:
            self.sock.close()
        except OSError:
            pass

    def _break(self, str command, str reason):
        """_close_broken, and raise RPCError."""
        self._close_broken(command, reason)
        raise _error(self.endpoint, command, reason)

    cdef _until(self, double deadline):
        """Give the next socket call what is left of the command's time: one deadline
        for the whole command, so a server that trickles bytes cannot stretch it."""
        cdef double left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        self.sock.settimeout(left)

    cdef bytearray _recv(self, size_t n, double deadline):
        cdef bytearray buf = bytearray(n)
        cdef size_t got = 0
        view = memoryview(buf)
        while got < n:
            self._until(deadline)
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise _Closed()
            got += k
        return buf

    cdef _check_nothing_unread(self, str command):
        """Every reply asked for has been read whole, so bytes waiting now answer nothing
        (a reply to a command without one, a repeated reply): the stream is out of step,
        and they must not be taken for the next reply."""
        self.sock.settimeout(0.0)
        try:
            waiting = self.sock.recv(64, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        if not waiting:
            raise _Closed()
        after = f" (after {self.unanswered}, which has no reply)" if self.unanswered else ""
        self._break(command, f"out of step: {len(waiting)}{'+' if len(waiting) == 64 else ''} "
                    f"bytes nobody asked for were waiting before it{after}; closed rather than "
                    f"read them as its reply")

    def _cmd(self, str command, timeout=None, data=None, Py_ssize_t asked=0, **fields):
        """Send `command` with its request packed from `fields` (+ `data`, sent without
        copying) as the connection's protocol lays it out, and return its reply's fields
        (a tuple; None for a command without a reply), within `timeout` seconds (None:
        the connection's). `asked`: the size of a reply of any size (GET_TENSOR)."""
        proto = self.protocol
        reply = self._call(command, proto.pack(command, fields),
                           proto.reply_size(command, asked), data, timeout)
        return proto.unpack(command, reply)

    def _call(self, str command, payload, Py_ssize_t reply, data=None, timeout=None):
        """Send `command` with `payload` (+ `data`, sent without copying) and return its
        reply of exactly `reply` bytes (None for commands without a reply), all within
        `timeout` seconds (None: the connection's)."""
        with self.lock:
            if self.broken is not None:
                raise _error(self.endpoint, command, f"the connection was lost earlier "
                             f"({self.broken}); the server has freed this client's buffers: "
                             f"make a new RPCBackend")
            if self.free_later and command != "FREE_BUFFER":
                self._flush_frees()
            return self._exchange(command, payload, reply, data,
                                  self._timeout if timeout is None else timeout)

    cdef object _exchange(self, str command, payload, Py_ssize_t reply, data, double timeout):
        cdef Py_ssize_t n_data = 0 if data is None else memoryview(data).nbytes
        cdef Py_ssize_t n_in = 0
        t0 = time.perf_counter()
        cdef double deadline = time.monotonic() + timeout
        try:
            self._check_nothing_unread(command)
            self._until(deadline)
            self.sock.sendall(struct.pack("<BQ", self.protocol.ids[command], len(payload) + n_data)
                              + payload)
            if n_data:
                self.sock.sendall(data)
            if reply == NO_REPLY:
                self.unanswered = command
                out = None
            else:
                size = struct.unpack("<Q", self._recv(8, deadline))[0]
                if size != <size_t>reply:
                    self._break(command, f"answered {size} bytes, expected {reply}")
                out = self._recv(reply, deadline) if reply else b""
                n_in = 8 + reply
                self.unanswered = None
                self.pending = False
        except _Closed:
            if command == "HELLO":
                after = (f" (is it a ggml RPC server of protocol "
                         f"{' or '.join(str(v[0]) for v in PROTO_VERSIONS)}?)")
            elif self.unanswered:
                after = f" (after {self.unanswered}, which it may have refused, or it crashed)"
            else:
                after = ""
            self._break(command, f"the server closed the connection{after}")
        except socket.timeout:
            self._break(command, f"no answer within {timeout:g} s")
        except OSError as e:
            self._break(command, f"connection failed: {e.strerror or e}")
        except RPCError:                # refused above, the connection already closed
            raise
        except BaseException as e:      # cut mid-command: a KeyboardInterrupt
            self._close_broken(command, f"interrupted ({type(e).__name__})")
            raise
        s = self.stats.get(command)
        if s is None:
            s = self.stats[command] = [0, 0, 0, 0.0]
        s[0] += 1
        s[1] += 9 + len(payload) + n_data
        s[2] += n_in
        s[3] += time.perf_counter() - t0
        return out

    def _flush_frees(self):
        pending, self.free_later = self.free_later, []
        self.last_graph.clear()
        proto = self.protocol
        for remote in pending:
            self.live.pop(remote, None)
            self._exchange("FREE_BUFFER", proto.pack("FREE_BUFFER", {"remote": remote}),
                           proto.reply_size("FREE_BUFFER"), None, self._timeout)

    def close(self):
        """Close the connection; the server frees every buffer of this client."""
        if self.broken is None:
            self.broken = "closed by the client"
            self.sock.close()

    # --- commands ---

    def device_count(self, timeout=None):
        """The server's number of devices: at most MAX_DEVICES, and the same every time."""
        n, = self._cmd("DEVICE_COUNT", timeout)
        if n > MAX_DEVICES:
            self._break("DEVICE_COUNT", f"reported {n} devices, more than the {MAX_DEVICES} "
                        f"ggml_py accepts")
        if self.n_devices >= 0 and n != self.n_devices:
            self._break("DEVICE_COUNT", f"reported {n} devices, {self.n_devices} before")
        return n

    def get_device_memory(self, device, timeout=None):
        """(free, total) bytes of a server device; free is at most total."""
        free_mem, total = self._cmd("GET_DEVICE_MEMORY", timeout, device=_device(device))
        if free_mem > total:
            self._break("GET_DEVICE_MEMORY", f"reported {free_mem} bytes free of {total}")
        return free_mem, total

    def get_alignment(self, device):
        """The device's alignment: a power of two, at most MAX_ALIGNMENT."""
        align, = self._cmd("GET_ALIGNMENT", device=_device(device))
        if align == 0 or align & (align - 1) or align > MAX_ALIGNMENT:
            self._break("GET_ALIGNMENT", f"reported alignment {align}, not a power of two "
                        f"up to {MAX_ALIGNMENT}")
        return align

    def get_max_size(self, device):
        """The device's largest buffer, in bytes."""
        return self._cmd("GET_MAX_SIZE", device=_device(device))[0]

    def get_alloc_size(self, device, Tensor tensor):
        """What the server's buffer type needs for `tensor` (its sources go along)."""
        cdef bytearray req = bytearray((1 + GGML_MAX_SRC) * sizeof(rpc_tensor))
        cdef char * p = req
        cdef const ggml_tensor * t = tensor.ptr
        cdef int i
        _fill(<rpc_tensor *>p, t, _remote_buffer(t, self), self.op_wire)
        for i in range(GGML_MAX_SRC):
            if t.src[i] != NULL:
                _fill(<rpc_tensor *>(p + (1 + i) * sizeof(rpc_tensor)), t.src[i],
                      _remote_buffer(t.src[i], self), self.op_wire)
        size, = self._cmd("GET_ALLOC_SIZE", device=_device(device),
                          tensor=bytes(req[:sizeof(rpc_tensor)]),
                          srcs=bytes(req[sizeof(rpc_tensor):]))
        if size < ggml_nbytes(t):      # ggml's client asserts this too
            self._break("GET_ALLOC_SIZE", f"answered {size} bytes for tensor '{_tname(t)}', "
                        f"less than its {ggml_nbytes(t)} bytes")
        return size

    def alloc_buffer(self, device, size):
        """(server handle, size) of a new buffer; handle 0 when the server has no memory."""
        return self._cmd("ALLOC_BUFFER", device=_device(device),
                         size=int_arg(size, "size", 0, INT64_MAX))

    def buffer_get_base(self, remote):
        """The server's address of the buffer's first byte."""
        return self._cmd("BUFFER_GET_BASE", remote=_handle(remote))[0]

    def free_buffer(self, remote):
        """Free a server buffer (version 7: without waiting for the server)."""
        self.live.pop(remote, None)
        self._cmd("FREE_BUFFER", remote=_handle(remote))
        self.last_graph.clear()

    def _adopt(self, remote, base, size, wanted, alignment):
        """Take a new buffer (ALLOC_BUFFER's handle and size, BUFFER_GET_BASE's base) into
        the live ones, or free it on the server and close the connection: a base that is
        null, unaligned or overlaps a live buffer, a handle already live, or less than
        asked for would have tensors written over each other, or the server abort."""
        end = base + size
        other = next((h for h, (b, e) in self.live.items() if base < e and b < end), None)
        if remote in self.live:
            reason = f"gave handle {remote:#x} again, a live buffer's"
        elif base == 0 or base % alignment:
            reason = f"gave a buffer at {base:#x}, not a {alignment}-byte aligned address"
        elif size < wanted or end > 2**64:
            reason = f"gave a buffer of {size} bytes at {base:#x} for {wanted} bytes"
        elif other is not None:
            reason = (f"gave a buffer at {base:#x}..{end:#x}, overlapping live buffer "
                      f"{other:#x} at {self.live[other][0]:#x}..{self.live[other][1]:#x}")
        else:
            self.live[remote] = (base, end)
            return
        if remote not in self.live:
            self._free_quietly(remote)
        self._break("ALLOC_BUFFER", reason)

    def _free_quietly(self, remote):
        """Free a buffer whose setup failed, before its error propagates (a connection
        already lost has had its buffers freed by the server)."""
        if self.broken is None:
            try:
                self.free_buffer(remote)
            except RPCError:
                pass

    def buffer_clear(self, remote, value):
        self._cmd("BUFFER_CLEAR", remote=_handle(remote), value=byte_value(value))

    def init_tensor(self, Tensor tensor):
        self._cmd("INIT_TENSOR", tensor=_tensor_wire(tensor, self))

    def set_tensor(self, Tensor tensor, offset, data):
        """Write `data` (bytes-like) at `offset` in the tensor; above HASH_THRESHOLD bytes
        the server is first asked whether its cache has them (SET_TENSOR_HASH; when it
        has not, version 7 asks it to keep them: the cache flag)."""
        offset = int_arg(offset, "offset", 0, INT64_MAX)
        head = _tensor_wire(tensor, self)
        view = memoryview(data).cast("B")
        cache_flag = 0
        if view.nbytes > HASH_THRESHOLD:
            if self._flag("SET_TENSOR_HASH", self._cmd("SET_TENSOR_HASH", tensor=head,
                                                       offset=offset, hash=fnv_hash(view))):
                return
            cache_flag = 1
        self._cmd("SET_TENSOR", None, view, tensor=head, cache_flag=cache_flag, offset=offset)

    def memset_tensor(self, Tensor tensor, offset, size, value):
        """Set `size` bytes at `offset` in the tensor to `value`: MEMSET_TENSOR where the
        protocol has it (7), else the bytes are sent (SET_TENSOR)."""
        offset = int_arg(offset, "offset", 0, INT64_MAX)
        size = int_arg(size, "size", 0, INT64_MAX)
        value = byte_value(value)
        if self.protocol.has("MEMSET_TENSOR"):
            self._cmd("MEMSET_TENSOR", tensor=_tensor_wire(tensor, self), offset=offset,
                      size=size, value=value)
        else:
            self.set_tensor(tensor, offset, memoryview(bytes([value]) * size))

    def get_tensor(self, Tensor tensor, offset, size):
        offset = int_arg(offset, "offset", 0, INT64_MAX)
        size = int_arg(size, "size", 0, INT64_MAX)
        return self._cmd("GET_TENSOR", asked=size, tensor=_tensor_wire(tensor, self),
                         offset=offset, size=size)[0]

    def copy_tensor(self, Tensor src, Tensor dst):
        """A copy on the server; False when its buffer cannot copy from src's."""
        return self._flag("COPY_TENSOR", self._cmd("COPY_TENSOR", src=_tensor_wire(src, self),
                                                   dst=_tensor_wire(dst, self)))

    def _flag(self, str command, reply):
        """A one-byte yes/no answer (a reply's one field): 0 or 1, nothing else."""
        if reply[0] > 1:
            self._break(command, f"answered {reply[0]}, not 0 or 1")
        return bool(reply[0])

    def graph_compute(self, device, bytes payload, timeout=None):
        """Run a serialised graph (serialize_graph) on a device, without waiting. The same
        payload as the device's last one only asks the server to run its stored graph
        again (GRAPH_RECOMPUTE); returns True then."""
        device = _device(device)
        with self.lock:
            again = self.last_graph.get(device) == payload
            if again:
                self._cmd("GRAPH_RECOMPUTE", timeout, device=device)
            else:
                self.last_graph.pop(device, None)
                self._cmd("GRAPH_COMPUTE", timeout, graph=payload)
                self.last_graph[device] = payload
            self.pending = True
        return again

    def synchronize(self, timeout=None):
        """Wait until the server has finished what was sent (a round trip, only when a
        graph compute has not been answered since); RPCError when it failed or the
        connection was lost."""
        with self.lock:
            if self.pending or self.broken is not None:
                self.device_count(timeout)

    @property
    def busy(self):
        """Was a graph compute sent with nothing answered since?"""
        return bool(self.pending)

    def buffer_type(self, device):
        """The buffer type of a server device (made once per connection and device)."""
        device = _device(device)
        with self.lock:
            buft = self.bufts.get(device)
            if buft is None:
                if device >= self.n_devices:
                    raise _error(self.endpoint, "DEVICE_COUNT", f"no device {device}: the server "
                                 f"has {self.n_devices}")
                cls = RPCBufferType if self._sizes_are_nbytes(device) else RPCPaddedBufferType
                buft = self.bufts[device] = cls(self, device)
            return buft

    def _sizes_are_nbytes(self, device):
        """Does the device's buffer type need just ggml_nbytes for the tensors ggml's client
        asks about (a short quantized row, FLASH_ATTN_EXT, MUL_MAT_ID)? A CPU server's does;
        a CUDA server pads. Decides whether the allocator may size tensors in C."""
        from ggml_py._core import Context
        ctx = Context("rpc-probe")
        q = ctx.new_tensor("q4_0", ne=(32, 2))
        x = ctx.new_tensor("f32", ne=(64, 1, 1))
        # (numpy-order shapes) attention of x over 32 keys, scale 1.0 as its f32 bits; x
        # through the first of two f16 experts
        fa = ctx.new_op("FLASH_ATTN_EXT", (x, ctx.new_tensor("f16", ne=(64, 32, 1)),
                                           ctx.new_tensor("f16", ne=(64, 32, 1))),
                        "f32", (1, 1, 1, 64), params=(0x3F800000, 0, 0))
        mmid = ctx.new_op("MUL_MAT_ID", (ctx.new_tensor("f16", ne=(64, 64, 2)), x,
                                         ctx.new_tensor("i32", ne=(1, 1))), "f32", (1, 1, 64))
        return all(self.get_alloc_size(device, t) == t.nbytes for t in (q, fa, mmid))

    @property
    def link(self):
        """Totals over every command: calls, bytes sent, bytes received, seconds."""
        tot = [0, 0, 0, 0.0]
        for s in self.stats.values():
            for i in range(4):
                tot[i] += s[i]
        return {"calls": tot[0], "bytes_sent": tot[1], "bytes_received": tot[2],
                "seconds": tot[3]}


# ---------------------------------------------------------------------------
# memory of a server device

cdef class RPCBufferType(BufferType):
    """The memory of one device of one server (ggml: RPC<device>[<endpoint>]): its
    alignment and largest buffer as the server reports them."""

    cdef readonly Connection conn
    cdef readonly uint32_t device

    def __init__(self, Connection conn, device):
        device = _device(device)
        align = conn.get_alignment(device)
        max_size = conn.get_max_size(device)
        if max_size < align:
            conn._break("GET_MAX_SIZE", f"reported a largest buffer of {max_size} bytes, less "
                        f"than its alignment {align}")
        super().__init__(f"RPC{device}[{conn.endpoint}]"[:GGML_MAX_NAME - 1], alignment=align,
                         max_size=max_size, is_host=False,
                         device=f"RPC{device}[{conn.endpoint}]")
        self.conn = conn
        self.device = device

    def alloc_buffer(self, size):
        """A new buffer on the server (ALLOC_BUFFER, then BUFFER_GET_BASE)."""
        size = max(int_arg(size, "size", 0, INT64_MAX), 1)     # (a 0-byte one has no base)
        remote, got = self.conn.alloc_buffer(self.device, size)
        if remote == 0:
            free_mem, total = self.conn.get_device_memory(self.device)
            raise AllocationError(f"RPC server {self.conn.endpoint} device {self.device}: cannot "
                                  f"allocate {size} bytes ({free_mem} of {total} bytes free)")
        base = self.conn.buffer_get_base(remote)
        self.conn._adopt(remote, base, got, size, self.alignment)
        try:
            return RPCBuffer(self, got, base, remote)
        except BaseException:
            self.conn._free_quietly(remote)
            raise


cdef class RPCPaddedBufferType(RPCBufferType):
    """A server buffer type that needs more than ggml_nbytes for some tensors (a CUDA
    server pads quantized rows): sizes are asked for as ggml's client of the server's
    protocol asks for them (ALLOC_SIZE_OPS)."""

    def get_alloc_size(self, Tensor tensor):
        cdef ggml_tensor * t = tensor.ptr
        if ((TYPE_TRAITS[t.type].is_quantized and t.ne[0] % 512 and t.view_src == NULL)
                or t.op in self.conn.protocol.alloc_size_ops):
            return self.conn.get_alloc_size(self.device, tensor)
        return ggml_nbytes(t)


@cython.no_gc_clear
cdef class RPCBuffer(Buffer):
    """A buffer in a server's memory. `base` is the server's address of its first byte,
    so tensors placed in it carry server addresses. ggml's buffer slots map onto
    commands: set_tensor, get_tensor, cpy_tensor, clear, init_tensor, memset_tensor
    (version 4 has no MEMSET_TENSOR: the bytes are sent). Freed on the server when
    collected (at the connection's next command) or by free()."""

    cdef readonly Connection conn
    cdef readonly uint64_t remote       # the server's handle
    cdef bint freed

    def __init__(self, RPCBufferType buffer_type, size_t size, size_t base, uint64_t remote):
        super().__init__(buffer_type, size, base)
        self.conn = buffer_type.conn
        self.remote = remote

    def __dealloc__(self):
        # no I/O here: a collection may happen in the middle of another command
        if (not self.freed and self.conn is not None and self.conn.free_later is not None
                and self.conn.broken is None):
            self.conn.free_later.append(self.remote)

    cdef Py_ssize_t _region(self, Tensor tensor, offset, size) except -1:
        """Bytes [offset, offset + size) of a tensor of this buffer; ggml asserts this."""
        offset = int_arg(offset, "offset", 0, INT64_MAX)
        if size is not None:
            size = int_arg(size, "size", 0, INT64_MAX)
        if tensor.ptr.buffer != &self.c:
            raise BackendError(f"tensor '{tensor.name}' is not in this {self.buffer_type.name} buffer")
        n = ggml_nbytes(tensor.ptr)
        want = n - offset if size is None else size
        if offset > n or want < 0 or want > n - offset:
            raise BackendError(f"tensor '{tensor.name}': {want} bytes at offset {offset} exceed "
                               f"its {n} bytes")
        return want

    def set_tensor(self, Tensor tensor, data, offset=0):
        view = memoryview(data)
        if not view.c_contiguous:
            raise BackendError(f"tensor '{tensor.name}': set_tensor needs contiguous data")
        view = view.cast("B")
        self._region(tensor, offset, view.nbytes)
        self.conn.set_tensor(tensor, offset, view)

    def get_tensor(self, Tensor tensor, offset=0, size=None):
        """The bytes [offset, offset + size) of the tensor (a bytearray)."""
        cdef Py_ssize_t n = self._region(tensor, offset, size)
        return self.conn.get_tensor(tensor, offset, n)

    def cpy_tensor(self, Tensor src, Tensor dst):
        """dst (in this buffer) = src, on the server when src is on the same server;
        False otherwise (ggml's buffer cpy_tensor)."""
        self._region(dst, 0, None)
        src_buf = <object>src.ptr.buffer.pyobj if src.ptr.buffer != NULL else None
        if not isinstance(src_buf, RPCBuffer) or (<RPCBuffer>src_buf).conn is not self.conn:
            return False
        if ggml_nbytes(src.ptr) != ggml_nbytes(dst.ptr):
            return False
        return self.conn.copy_tensor(src, dst)

    def memset_tensor(self, Tensor tensor, value, offset=0, size=None):
        """MEMSET_TENSOR on a version 7 server; version 4 has none: the bytes are sent
        (SET_TENSOR)."""
        cdef int v = byte_value(value)
        cdef Py_ssize_t n = self._region(tensor, offset, size)
        self.conn.memset_tensor(tensor, offset, n, v)

    def clear(self, value=0):
        """Set every byte of the buffer to `value` (BUFFER_CLEAR)."""
        self.conn.buffer_clear(self.remote, value)        # (which checks the byte)

    def init_tensor(self, Tensor tensor):
        """ggml's RPC init_tensor: quantized tensors with rows not a multiple of 512 are
        initialised on the server (a CUDA server zeroes their padding)."""
        cdef ggml_tensor * t = tensor.ptr
        self._region(tensor, 0, None)
        if TYPE_TRAITS[t.type].is_quantized and t.ne[0] % 512 and t.view_src == NULL:
            self.conn.init_tensor(tensor)

    def free(self):
        """Free the buffer on the server now (its tensors must not be used after)."""
        if not self.freed:
            self.freed = True
            self.conn.free_buffer(self.remote)
