"""Backend interface of ggml_py: buffer types, buffers and backends.

The same roles as ggml's vtables (ggml-backend-impl.h). Every slot is a Python
method with a default, so a backend written in Python overrides only what it
has. The three calls the split makes per node (supports_op, supports_buft,
offload_op) are answered from C tables kept on the struct; a backend that
overrides one of these methods in Python is asked through the table's
GGML_PY_OP_ASK entries, so table-driven backends never call into Python
while a graph is split.
"""

from libc.string cimport memset, strncpy
from libc.stdint cimport SIZE_MAX, uint8_t
from libc.stdlib cimport realloc, free

from ggml_py._ggml cimport *
from ggml_py._core cimport Tensor, tensor_handle, ggml_nbytes

import numpy as np

from ggml_py._core import OP_IDS, OP_NAMES_LIST
from ggml_py.errors import AllocationError, BackendError

DEVICE_TYPES = {"cpu": GGML_BACKEND_DEVICE_TYPE_CPU, "gpu": GGML_BACKEND_DEVICE_TYPE_GPU,
                "igpu": GGML_BACKEND_DEVICE_TYPE_IGPU, "accel": GGML_BACKEND_DEVICE_TYPE_ACCEL}
DEVICE_TYPE_NAMES = {v: k for k, v in DEVICE_TYPES.items()}
BUFFER_USAGES = {"any": GGML_BACKEND_BUFFER_USAGE_ANY, "weights": GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                 "compute": GGML_BACKEND_BUFFER_USAGE_COMPUTE}
BUFFER_USAGE_NAMES = {v: k for k, v in BUFFER_USAGES.items()}


cdef _set_name(char * dst, name):
    b = str(name).encode()
    if not b or len(b) >= GGML_MAX_NAME:
        raise ValueError(f"names have 1 to {GGML_MAX_NAME - 1} bytes: {name!r}")
    strncpy(dst, b, GGML_MAX_NAME - 1)
    dst[GGML_MAX_NAME - 1] = 0


def _op_ids(ops, what):
    """'*' or an iterable of op names -> a set of op ids (KeyError names a bad op)."""
    if ops == "*":
        return set(range(len(OP_NAMES_LIST)))
    if isinstance(ops, str):
        raise ValueError(f"{what}: '*' or a list of op names, got {ops!r}")
    out = set()
    for name in ops:
        if name not in OP_IDS:
            raise ValueError(f"{what}: unknown op {name!r}")
        out.add(OP_IDS[name])
    return out


# ---------------------------------------------------------------------------
# buffer types and buffers

cdef size_t _fake_base = 0x100000000000


cdef class BufferType:
    """A kind of memory (ggml_backend_buffer_type): its name, alignment, largest
    single buffer and whether the host can address it."""

    def __init__(self, name, size_t alignment=32, max_size=None, bint is_host=False, device=None):
        if alignment == 0 or alignment & (alignment - 1):
            raise ValueError(f"buffer type {name!r}: alignment must be a power of two, got {alignment}")
        _set_name(self.c.name, name)
        self.c.alignment = alignment
        self.c.max_size = SIZE_MAX if max_size is None else max_size
        if self.c.max_size == 0:
            raise ValueError(f"buffer type {name!r}: max_size must be positive")
        self.c.is_host = is_host
        self.c.pyobj = <void *>self
        self.device = device

    @property
    def name(self):
        return self.c.name.decode()

    @property
    def alignment(self):
        return self.c.alignment

    @property
    def max_size(self):
        """Largest single buffer, None when unbounded (ggml: SIZE_MAX)."""
        return None if self.c.max_size == SIZE_MAX else self.c.max_size

    @property
    def is_host(self):
        return bool(self.c.is_host)

    def get_alloc_size(self, Tensor tensor):
        """Bytes the tensor needs in a buffer of this type (default: ggml_nbytes)."""
        return ggml_nbytes(tensor.ptr)

    def alloc_buffer(self, size_t size):
        """A new buffer of `size` bytes. The default gives host types real,
        aligned memory; other types must override it."""
        if not self.c.is_host:
            raise AllocationError(f"buffer type '{self.name}' cannot allocate memory "
                                  f"({size} bytes): it has no allocator")
        return host_buffer(self, size)

    def __repr__(self):
        return (f"BufferType({self.name!r}, alignment={self.alignment}, "
                f"max_size={self.max_size}, is_host={self.is_host})")


def host_buffer(BufferType buft, size_t size):
    """A buffer of real host memory: a numpy byte array, aligned to the type."""
    try:
        raw = np.zeros(size + buft.c.alignment, dtype=np.uint8)
    except MemoryError:
        raise AllocationError(f"buffer type '{buft.name}': cannot allocate {size} bytes") from None
    cdef size_t addr = raw.ctypes.data
    cdef size_t pad = (-addr) % buft.c.alignment
    mem = raw[pad:pad + size]
    return Buffer(buft, size, addr + pad, memory=mem)


def fake_buffer(BufferType buft, size_t size):
    """A buffer with an aligned, non-null fake base and no memory (simulated devices)."""
    global _fake_base
    cdef size_t align = max(buft.c.alignment, 4096)
    base = (_fake_base + align - 1) // align * align
    _fake_base = base + max(size, 1)
    return Buffer(buft, size, base)


cdef class Buffer:
    """A block of memory of one buffer type (ggml_backend_buffer)."""

    def __init__(self, BufferType buffer_type, size_t size, size_t base, usage="any", memory=None):
        if base == 0:
            raise ValueError("a buffer needs a non-null base")
        self.buffer_type = buffer_type
        self.c.buft = &buffer_type.c
        self.c.base = <char *>base
        self.c.size = size
        self.c.pyobj = <void *>self
        self.memory = memory
        self.usage = usage

    @property
    def size(self):
        return self.c.size

    @property
    def base(self):
        return <size_t>self.c.base

    @property
    def usage(self):
        return BUFFER_USAGE_NAMES[self.c.usage]

    @usage.setter
    def usage(self, value):
        try:
            self.c.usage = BUFFER_USAGES[value]
        except KeyError:
            raise ValueError(f"buffer usage is one of {', '.join(BUFFER_USAGES)}, got {value!r}") from None

    @property
    def is_host(self):
        return bool(self.c.buft.is_host)

    def tensor_alloc(self, Tensor tensor, size_t offset):
        """Place `tensor` at `offset` (ggml_backend_tensor_alloc)."""
        cdef ggml_tensor * t = tensor.ptr
        cdef size_t size = self.buffer_type.get_alloc_size(tensor)
        if t.buffer != NULL or t.data != NULL:
            raise AllocationError(f"tensor '{tensor.name}' is already allocated")
        if t.view_src != NULL:
            raise AllocationError(f"tensor '{tensor.name}' is a view: use view_init")
        if offset + size > self.c.size:
            raise AllocationError(f"tensor '{tensor.name}' ({size} bytes at offset {offset}) "
                                  f"does not fit in buffer '{self.buffer_type.name}' of {self.c.size} bytes")
        tensor.owner.keep(self)
        t.buffer = &self.c
        t.data = self.c.base + offset
        return self

    def __repr__(self):
        return f"<Buffer {self.buffer_type.name} {self.c.size} bytes usage={self.usage}>"


def view_init(Tensor tensor):
    """Give a view the buffer and address of its view_src (ggml_backend_view_init)."""
    cdef ggml_tensor * t = tensor.ptr
    if t.view_src == NULL or t.view_src.buffer == NULL or t.view_src.data == NULL:
        raise AllocationError(f"view '{tensor.name}': its view_src is not allocated")
    t.buffer = t.view_src.buffer
    t.data = t.view_src.data + t.view_offs


def set_buffer(Tensor tensor, Buffer buffer, size_t offset=0):
    """Mark a tensor as living in `buffer` (pre-allocated) at `offset`; its views
    follow it through view_src. Used for weights and placed inputs. The tensor's
    context keeps the buffer alive."""
    tensor.owner.keep(buffer)
    tensor.ptr.buffer = &buffer.c
    tensor.ptr.data = buffer.c.base + offset


def tensor_ndarray(Tensor tensor, memory, dtype, Py_ssize_t row_bytes=0):
    """A numpy view of an allocated tensor inside `memory`, the numpy bytes behind its
    buffer: numpy order (ne3, ne2, ne1, ne0) with the tensor's byte strides, or with
    `row_bytes` the uint8 rows of a block type (ne3, ne2, ne1, row_bytes). Built from
    the struct directly: kernels ask for one per source and result of every node."""
    cdef ggml_tensor * t = tensor.ptr
    if t.buffer == NULL or t.data == NULL:
        raise BackendError(f"tensor '{tensor.name}' ({tensor.op}) is not allocated")
    cdef size_t offset = <size_t>(t.data - t.buffer.base)
    if row_bytes:
        shape = (t.ne[3], t.ne[2], t.ne[1], row_bytes)
        strides = (t.nb[3], t.nb[2], t.nb[1], 1)
    else:
        shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
        strides = (t.nb[3], t.nb[2], t.nb[1], t.nb[0])
    if t.ne[0] == 0 or t.ne[1] == 0 or t.ne[2] == 0 or t.ne[3] == 0 or row_bytes < 0:
        return np.zeros(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=memory, offset=offset, strides=strides)


def get_buffer(Tensor tensor):
    """The buffer holding the tensor's data (None if not allocated)."""
    cdef ggml_backend_buffer * b = tensor.ptr.buffer
    return None if b == NULL else <object>b.pyobj


def clear_buffer(Tensor tensor):
    tensor.ptr.buffer = NULL
    tensor.ptr.data = NULL


# ---------------------------------------------------------------------------
# backends

cdef class Backend:
    """A device that can run ops (ggml_backend + its device).

    Subclasses override the slots they have. supports_op / offload_op /
    supports_buft default to tables set from the constructor arguments; a
    subclass that overrides them in Python is asked per tensor instead.
    """

    def __cinit__(self, *args, **kwargs):
        memset(&self.c, 0, sizeof(ggml_backend))
        self.c.pyobj = <void *>self
        self._bufts = []

    def __dealloc__(self):
        free(self.c.supported_bufts)

    def __init__(self, name, BufferType buffer_type, device_type="cpu", supports_ops="*",
                 unsupported_ops=(), offload_ops=(), offload_min_batch=0,
                 supported_buffer_types=None):
        _set_name(self.c.name, name)
        if device_type not in DEVICE_TYPES:
            raise ValueError(f"backend {name!r}: device_type is one of {', '.join(DEVICE_TYPES)}, "
                             f"got {device_type!r}")
        self.c.device_type = DEVICE_TYPES[device_type]
        self.buffer_type = buffer_type
        self.c.default_buft = &buffer_type.c
        self.set_supported_ops(supports_ops, unsupported_ops)
        self.set_offload_ops(offload_ops, offload_min_batch)
        self.set_supported_buffer_types([buffer_type] if supported_buffer_types is None
                                        else supported_buffer_types)
        cls = type(self)
        # Python overrides of the split-time slots are asked through the tables
        if cls.supports_op is not Backend.supports_op:
            for i in range(GGML_OP_COUNT_MAX):
                self.c.supports_op_table[i] = GGML_PY_OP_ASK
        if cls.offload_op is not Backend.offload_op:
            for i in range(GGML_OP_COUNT_MAX):
                self.c.offload_op_table[i] = GGML_PY_OP_ASK
        self.c.supports_buft_ask = cls.supports_buft is not Backend.supports_buft

    # --- tables ---

    def set_supported_ops(self, supports="*", unsupported=()):
        """Fill the supports_op table: ops in `supports` ('*' = all) minus `unsupported`."""
        yes = _op_ids(supports, f"backend {self.name}: supports_ops") - \
            _op_ids(unsupported, f"backend {self.name}: unsupported_ops")
        for i in range(GGML_OP_COUNT_MAX):
            self.c.supports_op_table[i] = GGML_PY_OP_YES if i in yes else GGML_PY_OP_NO

    def set_offload_ops(self, ops=(), min_batch=0):
        """Fill the offload_op table: ops in `ops` offload when batch >= min_batch."""
        yes = _op_ids(ops, f"backend {self.name}: offload_ops")
        for i in range(GGML_OP_COUNT_MAX):
            self.c.offload_op_table[i] = GGML_PY_OP_YES if i in yes else GGML_PY_OP_NO
        self.c.offload_min_batch = min_batch

    def set_supported_buffer_types(self, bufts):
        bufts = list(bufts)
        for b in bufts:
            if not isinstance(b, BufferType):
                raise TypeError(f"backend {self.name}: expected BufferType, got {type(b).__name__}")
        cdef ggml_backend_buffer_type ** arr = <ggml_backend_buffer_type **>realloc(
            self.c.supported_bufts, max(len(bufts), 1) * sizeof(ggml_backend_buffer_type *))
        if arr == NULL:
            raise MemoryError()
        self.c.supported_bufts = arr
        for i, b in enumerate(bufts):
            arr[i] = &(<BufferType>b).c
        self.c.n_supported_bufts = len(bufts)
        self._bufts = bufts

    # --- identity ---

    @property
    def name(self):
        return self.c.name.decode()

    @property
    def device_type(self):
        return DEVICE_TYPE_NAMES[self.c.device_type]

    @property
    def supported_buffer_types(self):
        return list(self._bufts)

    def get_default_buffer_type(self):
        return self.buffer_type

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} ({self.device_type})>"

    # --- split-time slots (answered from the tables unless overridden) ---

    def supports_op(self, Tensor op):
        """Can this backend compute `op`?"""
        cdef uint8_t a = self.c.supports_op_table[op.ptr.op]
        if a == GGML_PY_OP_FN:
            return self.c.supports_op_fn(&self.c, op.ptr) != 0
        return a == GGML_PY_OP_YES

    def supports_buft(self, BufferType buft):
        """Can this backend use memory of `buft` directly?"""
        return any(b is buft for b in self._bufts)

    def offload_op(self, Tensor op):
        """Should `op`, whose weights are in host memory, run here anyway?"""
        return (self.c.offload_op_table[op.ptr.op] == GGML_PY_OP_YES
                and op_batch(op.ptr) >= self.c.offload_min_batch)

    # --- compute slots (defaults for backends that cannot compute) ---

    def graph_compute(self, graph):
        raise BackendError(f"backend {self.name} cannot compute graphs")

    def synchronize(self):
        """Wait for queued work (default: nothing is queued)."""

    def set_tensor(self, Tensor tensor, data, size_t offset=0):
        raise BackendError(f"backend {self.name} cannot write tensor '{tensor.name}'")

    def get_tensor(self, Tensor tensor, size_t offset=0, size=None):
        raise BackendError(f"backend {self.name} cannot read tensor '{tensor.name}'")

    def cpy_tensor_async(self, Backend backend_src, Tensor src, Tensor dst):
        """Copy src (on backend_src) to dst (here) without waiting; False = not supported."""
        return False

    def event_new(self):
        """A new event, or None when the backend has no events."""
        return None

    def event_record(self, event):
        pass

    def event_wait(self, event):
        pass

    def event_synchronize(self, event):
        pass


cdef int ask_supports_op(ggml_backend * b, ggml_tensor * t) except -1:
    return 1 if (<object>b.pyobj).supports_op(tensor_handle(t)) else 0


cdef int ask_offload_op(ggml_backend * b, ggml_tensor * t) except -1:
    return 1 if (<object>b.pyobj).offload_op(tensor_handle(t)) else 0


cdef int ask_supports_buft(ggml_backend * b, ggml_backend_buffer_type * buft) except -1:
    return 1 if (<object>b.pyobj).supports_buft(<object>buft.pyobj) else 0
