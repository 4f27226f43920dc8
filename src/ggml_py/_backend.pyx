"""Backend interface of ggml_py: buffer types, buffers and backends.

The same roles as ggml's vtables (ggml-backend-impl.h): BUFFER_TYPE_SLOTS,
BUFFER_SLOTS and BACKEND_SLOTS declare every slot, what it does and the base's
default (a method, NULL as ggml's optional slots, or a SlotDefault), so a backend
written in Python fills only the slots it has. The three calls the split makes per node (supports_op, supports_buft,
offload_op) are answered in C from the struct: tables the backend fills once,
and for supports_op a C rule where a table entry says GGML_PY_OP_FN (the
OpenCL and RPC backends: _supports). Every backend of ggml_py answers
so; a method in Python is the slow path for a user's backend, asked (through
GGML_PY_OP_ASK entries) only about the ops its table allows.

Buffers carry ggml's memory slots; tensor_set / tensor_get / tensor_memset /
tensor_copy are the one place that checks a tensor's bytes and calls them.
"""

from libc.string cimport memcpy, memset, strncpy
from libc.stdint cimport SIZE_MAX, INT64_MIN, INT64_MAX, int64_t, uint8_t
from libc.stdlib cimport free
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBuffer_IsContiguous,
                             PyBUF_STRIDES, PyBUF_WRITABLE)

from ggml_py._ggml cimport *
from ggml_py._core cimport (Tensor, Graph, tensor_handle, tensor_name, ggml_nbytes, size_arg,
                            int_arg, index_arg, name_arg, items_arg, safe_realloc,
                            tensor_changed, world_changed, buffer_changed)

cdef extern from "Python.h":
    object PyMethod_New(object function, object instance)     # a bound method

from collections import namedtuple

import numpy as np

from ggml_py._core import (OP_IDS, OP_NAMES_LIST, TYPE_NAMES as _TYPE_NAMES,
                           MAX_BYTES as _MAX_BYTES, check_memory_available)
from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, BackendError,
                            GraphError, NotSupportedError, ReleasedMemoryError, UnknownNameError)

DEVICE_TYPES = {"cpu": GGML_BACKEND_DEVICE_TYPE_CPU, "gpu": GGML_BACKEND_DEVICE_TYPE_GPU,
                "igpu": GGML_BACKEND_DEVICE_TYPE_IGPU, "accel": GGML_BACKEND_DEVICE_TYPE_ACCEL}
DEVICE_TYPE_NAMES = {v: k for k, v in DEVICE_TYPES.items()}
BUFFER_USAGES = {"any": GGML_BACKEND_BUFFER_USAGE_ANY, "weights": GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                 "compute": GGML_BACKEND_BUFFER_USAGE_COMPUTE}
BUFFER_USAGE_NAMES = {v: k for k, v in BUFFER_USAGES.items()}


cdef _set_name(char * dst, name, what):
    strncpy(dst, name_arg(name, what), GGML_MAX_NAME - 1)
    dst[GGML_MAX_NAME - 1] = 0


def _choice(value, choices, what):
    """value, which must be one of the string keys of `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise UnknownNameError(f"{what} is one of {', '.join(choices)}, got {value!r}")
    return value


def _op_ids(ops, what):
    """'*' or an iterable of op names -> a set of op ids (UnknownNameError names a bad op)."""
    if isinstance(ops, str):
        if ops == "*":
            return set(range(len(OP_NAMES_LIST)))
        raise ArgumentError(f"{what}: '*' or a list of op names, got {ops!r}")
    names = items_arg(ops, f"{what} ('*' or op names)")
    return {OP_IDS[_choice(name, OP_IDS, f"{what}: op")] for name in names}


# ---------------------------------------------------------------------------
# the slot tables: ggml's vtables (ggml-backend-impl.h) as these classes have them.
# Each slot is (name here, ggml's slot, the base class's default). The base fills a slot
# in one of three ways:
#   a method        the default written below it (a subclass may replace it);
#   NULL            None, as ggml leaves an optional slot empty: callers test for it;
#   a SlotDefault   a default that callers must tell from a subclass's method: the
#                   split-time slots answered from the backend's C tables, a buffer's
#                   set_tensor on host memory, a buffer type's get_alloc_size in C.
# filled_slots(cls) reads a class's table once: the slots its own code fills.

Slot = namedtuple("Slot", "name ggml does default")

BUFFER_TYPE_SLOTS = (
    Slot("name", "get_name", "the type's name", "the name given (a property)"),
    Slot("alloc_buffer", "alloc_buffer", "a new Buffer of `size` bytes",
         "host types: aligned host memory (host_buffer); others refuse (AllocationError)"),
    Slot("get_alignment", "get_alignment", "alignment of every tensor in its buffers",
         "the alignment given (32)"),
    Slot("get_max_size", "get_max_size", "largest single buffer",
         "the max_size given (SIZE_MAX: unbounded)"),
    Slot("get_alloc_size", "get_alloc_size", "bytes a tensor takes in its buffers",
         "ggml_nbytes(tensor) (a SlotDefault: the allocators answer it in C)"),
    Slot("is_host", "is_host", "can the host address its memory?",
         "the is_host given (a property)"),
)

BUFFER_SLOTS = (
    Slot("release", "free_buffer", "give the memory back", "forget the host memory"),
    Slot("get_base", "get_base", "address of the first byte", "the base address given"),
    Slot("init_tensor", "init_tensor", "prepare a tensor just placed here",
         "NULL: nothing to prepare"),
    Slot("set_tensor", "set_tensor", "write bytes of a tensor",
         "write host memory (a SlotDefault: a buffer with neither memory nor its own "
         "set_tensor is simulated and refuses byte access)"),
    Slot("get_tensor", "get_tensor", "read bytes of a tensor", "read host memory"),
    Slot("memset_tensor", "memset_tensor", "set bytes of a tensor to a value",
         "fill host memory"),
    Slot("cpy_tensor", "cpy_tensor", "dst (here) = src without the caller; False: cannot",
         "host memory to host memory; False elsewhere (tensor_copy then goes through the host)"),
    Slot("clear", "clear", "set every byte to a value",
         "fill all of host memory (a simulated buffer has none)"),
    Slot("reset", "reset", "forget per-tensor state when the allocator starts over",
         "NULL: none kept"),
)

BACKEND_SLOTS = (
    # ggml_backend_i
    Slot("name", "get_name", "the backend's name", "the name given (a property)"),
    Slot("close", "free", "release threads, queues, connections", "nothing to release"),
    Slot("set_tensor_async", "set_tensor_async", "write a tensor's bytes without waiting",
         "NULL: the runtime's copies write with set_tensor, blocking"),
    Slot("cpy_tensor_async", "cpy_tensor_async",
         "copy src (on another backend) to dst (here) without waiting; False: cannot",
         "False (the runtime copies blocking)"),
    Slot("synchronize", "synchronize", "wait for the work queued", "nothing is queued"),
    Slot("graph_compute", "graph_compute", "compute the nodes of a graph, in order",
         "refuse: the backend cannot compute (BackendError)"),
    Slot("graph_compute_range", None, "compute nodes [i0, i1) of a graph (a split)",
         "graph_compute of a GraphView of those nodes"),
    Slot("event_record", "event_record", "mark an event reached when queued work is done",
         "nothing is queued"),
    Slot("event_wait", "event_wait", "make later work wait for an event",
         "nothing to wait for"),
    # ggml_backend_device_i (a Backend is its device too)
    Slot("get_default_buffer_type", "get_buffer_type", "where its tensors are allocated",
         "the buffer_type given"),
    Slot("supports_op", "supports_op", "can it compute this node?",
         "the C table from supports_ops / unsupported_ops, or its C rule (supports_op_fn); "
         "a method in a subclass is asked about the ops the table allows"),
    Slot("supports_buft", "supports_buft", "can it use memory of this buffer type directly?",
         "the supported_buffer_types given (and host types where supports_host_buffer_types); "
         "a method in a subclass is asked about the others"),
    Slot("offload_op", "offload_op", "should a node whose weights are in host memory run here?",
         "the C table from offload_ops and offload_min_batch; a method in a subclass is "
         "asked instead"),
    Slot("event_new", "event_new", "a new event", "None: no events"),
    Slot("event_synchronize", "event_synchronize", "block until an event is reached",
         "it is reached"),
)


cdef class SlotDefault:
    """A base class's default of a slot that callers tell apart from a subclass's
    method (see the slot tables): read through a class it is the function, through an
    instance the bound method, as a method would be."""
    cdef readonly object function

    def __init__(self, function):
        self.function = function

    def __get__(self, instance, owner):
        return self.function if instance is None else PyMethod_New(self.function, instance)


cdef dict _filled_slots = {}


def filled_slots(cls):
    """The slots of `cls` (a Backend, Buffer or BufferType class) that hold a method: not
    NULL and not the base's SlotDefault (see the slot tables). Read once per class."""
    filled = _filled_slots.get(cls)
    if filled is None:
        if not isinstance(cls, type) or not issubclass(cls, (Backend, Buffer, BufferType)):
            raise ArgumentTypeError(f"filled_slots: a Backend, Buffer or BufferType class, "
                                    f"got {cls!r}")
        table = (BACKEND_SLOTS if issubclass(cls, Backend) else
                 BUFFER_SLOTS if issubclass(cls, Buffer) else BUFFER_TYPE_SLOTS)
        filled = frozenset(s.name for s in table if _fills(cls, s.name))
        _filled_slots[cls] = filled
    return filled


cdef bint _fills(type cls, str name):
    """Does the class's entry for slot `name` hold its own code (not NULL, no SlotDefault)?"""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            entry = klass.__dict__[name]
            return entry is not None and not isinstance(entry, SlotDefault)
    return False


# ---------------------------------------------------------------------------
# buffer types and buffers

cdef size_t _FAKE_START = 0x100000000000
cdef size_t _fake_base = _FAKE_START


def _nbytes_alloc_size(BufferType self not None, Tensor tensor not None):
    """Bytes the tensor needs in a buffer of this type (default: ggml_nbytes)."""
    return ggml_nbytes(tensor.ptr)


cdef class BufferType:
    """A kind of memory (ggml_backend_buffer_type): its name, alignment, largest
    single buffer and whether the host can address it. Its slots, with their
    defaults, are BUFFER_TYPE_SLOTS; a subclass fills the ones it has."""

    def __init__(self, name, alignment=32, max_size=None, bint is_host=False, device=None):
        cdef size_t align = size_arg(alignment, f"buffer type {name!r}: alignment")
        if align == 0 or align & (align - 1):
            raise ArgumentError(f"buffer type {name!r}: alignment must be a power of two, "
                                f"got {align}")
        _set_name(self.c.name, name, "buffer type name")
        self.c.alignment = align
        self.c.max_size = SIZE_MAX if max_size is None else \
            size_arg(max_size, f"buffer type {name!r}: max_size")
        if self.c.max_size == 0:
            raise ArgumentError(f"buffer type {name!r}: max_size must be positive")
        self.c.is_host = is_host
        self.c.pyobj = <void *>self
        self.device = device

    @property
    def name(self):
        """The buffer type's name."""
        return self.c.name.decode()

    @property
    def alignment(self):
        """Alignment in bytes of every tensor placed in its buffers (a power of two)."""
        return self.c.alignment

    @property
    def max_size(self):
        """Largest single buffer, None when unbounded (ggml: SIZE_MAX)."""
        return None if self.c.max_size == SIZE_MAX else self.c.max_size

    @property
    def is_host(self):
        """Can the host read and write its memory directly?"""
        return bool(self.c.is_host)

    # --- ggml's buffer type slots (get_name is `name`, is_host the property) ---

    def get_alignment(self):
        """ggml's get_alignment slot: the alignment in bytes."""
        return self.c.alignment

    def get_max_size(self):
        """Largest single buffer in bytes (ggml's default: SIZE_MAX)."""
        return self.c.max_size

    get_alloc_size = SlotDefault(_nbytes_alloc_size)

    def alloc_buffer(self, size):
        """A new buffer of `size` bytes. The default gives host types real,
        aligned memory; other types must override it."""
        if not self.c.is_host:
            raise AllocationError(f"buffer type '{self.name}' cannot allocate memory "
                                  f"({size} bytes): it has no allocator")
        return host_buffer(self, size)

    def __repr__(self):
        return (f"BufferType({self.name!r}, alignment={self.alignment}, "
                f"max_size={self.max_size}, is_host={self.is_host})")


cdef BufferType _buffer_type(BufferType buft):
    """buft, which must have been initialised (BufferType.__new__ alone gives a name-less
    type with alignment 0)."""
    if buft.c.alignment == 0:
        raise ArgumentError("the buffer type was never initialised (BufferType.__init__)")
    return buft


def host_buffer(BufferType buft not None, size):
    """A buffer of real host memory: a numpy byte array, aligned to the type."""
    cdef size_t n = size_arg(size, f"host_buffer({_buffer_type(buft).name!r}): size")
    mem, addr = host_memory(n, buft.c.alignment, f"buffer type '{buft.name}': a buffer")
    return Buffer(buft, n, addr, memory=mem)


cdef void touch_pages(char * p, size_t n) noexcept nogil:
    """Write every page of [p, p + n) once, with the zero it holds."""
    cdef size_t i
    for i in range(0, n, 4096):
        p[i] = 0


def host_memory(size, alignment, what):
    """size zeroed bytes of host memory at an address aligned to alignment: (a numpy
    uint8 array, its address). Linux gives memory lazily and kills the process that
    fills more than there is, so these bytes are checked against the memory available
    and written once now: too large a buffer is an AllocationError naming what it is
    for, here, and not the out-of-memory killer when a kernel writes it."""
    cdef size_t n = size_arg(size, f"{what}: size")
    cdef size_t align = size_arg(alignment, f"{what}: alignment")
    if n > _MAX_BYTES or align > _MAX_BYTES or align == 0:
        raise AllocationError(f"{what}: cannot allocate {n} bytes (alignment {align})")
    check_memory_available(n + align, what)
    try:
        raw = np.zeros(n + align, dtype=np.uint8)
    except (MemoryError, ValueError):
        raise AllocationError(f"{what}: cannot allocate {n} bytes") from None
    cdef size_t addr = raw.ctypes.data
    cdef size_t pad = (-addr) % align
    with nogil:
        touch_pages(<char *>addr, n + align)
    return raw[pad:pad + n], addr + pad


def fake_address(size, alignment):
    """An aligned, non-null address for `size` bytes that nothing is behind: the base of
    a buffer whose memory is elsewhere (a simulated device, a cl_mem), so that ggml's
    allocators place tensors in it unchanged. Addresses are handed out upwards and start
    again at the bottom when the address space is used up."""
    global _fake_base
    cdef size_t n = size_arg(size, "fake_address: size")
    align = max(size_arg(alignment, "fake_address: alignment"), 4096)
    for start in (_fake_base, _FAKE_START):
        base = (start + align - 1) // align * align
        if base + max(n, 1) <= SIZE_MAX:
            _fake_base = base + max(n, 1)
            return base
    raise AllocationError(f"{n} bytes at alignment {align} do not fit in the address space")


def fake_buffer(BufferType buft not None, size):
    """A simulated buffer: an aligned, non-null fake base (fake_address) and no memory.
    Its byte slots refuse with NotSupportedError; clear() has nothing to do."""
    cdef size_t n = size_arg(size, f"fake_buffer({_buffer_type(buft).name!r}): size")
    return Buffer(buft, n, fake_address(n, buft.c.alignment))


def fake_buffers(list buffer_types not None, list sizes not None, list usages not None):
    """[fake_buffer(buffer_types[i], sizes[i]) with usage usages[i] for every i], made in
    one call, in order (a case's dummy buffers: one per pre-allocated tensor)."""
    cdef Py_ssize_t i, n = len(sizes)
    cdef BufferType buft
    cdef Buffer buf
    cdef size_t size
    if len(buffer_types) != n or len(usages) != n:
        raise ArgumentError(f"fake_buffers: {len(buffer_types)} buffer types, {n} sizes and "
                            f"{len(usages)} usages")
    out = []
    for i in range(n):
        buft = _buffer_type(buffer_types[i])
        size = size_arg(sizes[i], f"fake_buffers({buft.name!r}): size")
        buf = Buffer.__new__(Buffer)
        buf.setup(buft, size, fake_address(size, buft.c.alignment), None)
        buf.c.usage = BUFFER_USAGES[_choice(usages[i], BUFFER_USAGES, "buffer usage")]
        out.append(buf)
    return out


def _host_set_tensor(Buffer self not None, Tensor tensor not None, data, offset=0):
    """Write `data` (bytes-like) at `offset` bytes into the tensor."""
    view = _contiguous_bytes(data, tensor, "set_tensor")
    start, n = self._host_span(tensor, offset, view.nbytes)
    if n:
        _host_write(self._memory, start, view)


cdef class Buffer:
    """A block of memory of one buffer type (ggml_backend_buffer).

    `release()` gives the memory back (the graph allocator does so when it replaces
    a compute buffer); a released buffer keeps its identity, but reading its
    memory raises ReleasedMemoryError. Its slots, with their defaults, are
    BUFFER_SLOTS; a subclass fills the ones it has."""

    def __cinit__(self, *args, **kwargs):
        memset(&self.c, 0, sizeof(ggml_backend_buffer))
        self.c.pyobj = <void *>self

    def __init__(self, BufferType buffer_type not None, size, base, usage="any", memory=None):
        cdef size_t n = size_arg(size, "Buffer size")
        cdef size_t b = size_arg(base, "Buffer base")
        if b == 0:
            raise ArgumentError("a buffer needs a non-null base")
        if n > SIZE_MAX - b:
            raise ArgumentError(f"a buffer of {n} bytes at {b:#x} wraps the address space")
        if memory is not None and memoryview(memory).nbytes < n:
            raise ArgumentError(f"a buffer of {n} bytes needs at least as many bytes of "
                                f"memory, got {memoryview(memory).nbytes}")
        self.setup(_buffer_type(buffer_type), n, b, memory)
        self.usage = usage

    cdef void setup(self, BufferType buffer_type, size_t size, size_t base, object memory):
        """The fields __init__ sets from its checked arguments (usage aside)."""
        self.buffer_type = buffer_type
        filled = filled_slots(type(self))
        self._has_init_tensor = "init_tensor" in filled
        self._has_reset = "reset" in filled
        self._host_bytes_only = "set_tensor" not in filled
        self.c.buft = &buffer_type.c
        self.c.base = <char *>base
        self.c.size = size
        self._memory = memory

    @property
    def memory(self):
        """The numpy bytes behind a host buffer (None for device or simulated memory)."""
        if self.c.released:
            raise ReleasedMemoryError(f"the {self.buffer_type.name} buffer of {self.c.size} "
                                      f"bytes was released")
        return self._memory

    @property
    def released(self):
        """Has the memory been given back (release())?"""
        return bool(self.c.released)

    @property
    def is_simulated(self):
        """True for a buffer without bytes (fake_buffer, simulated devices): its byte
        slots refuse. Plans and allocations work on it; tensor data does not."""
        return self._memory is None and self._host_bytes_only

    def release(self):
        """Give the memory back; tensors placed here can no longer be read or written.
        Device buffers override this to free their memory too."""
        self.c.released = True
        self._memory = None
        buffer_changed(&self.c)

    @property
    def size(self):
        """Size in bytes."""
        return self.c.size

    @property
    def base(self):
        """Address of the first byte (a stand-in address for simulated memory)."""
        return <size_t>self.c.base

    @property
    def usage(self):
        """What the buffer holds, 'any', 'weights' or 'compute' (settable; the
        scheduler runs ops where their weights are)."""
        return BUFFER_USAGE_NAMES[self.c.usage]

    @usage.setter
    def usage(self, value):
        self.c.usage = BUFFER_USAGES[_choice(value, BUFFER_USAGES, "buffer usage")]
        buffer_changed(&self.c)

    @property
    def is_host(self):
        """Can the host read and write its memory directly (its buffer type's)?"""
        return bool(self.c.buft.is_host)

    # --- ggml's buffer slots (BUFFER_SLOTS). Called through tensor_set, tensor_get,
    # tensor_memset and tensor_copy, which check the tensor and the byte range first.
    # This base implements them on host memory (`memory`); a buffer without memory is
    # simulated and refuses byte access. Device buffers fill them with their own. ---

    def get_base(self):
        """ggml's get_base slot: the address of the first byte."""
        return <size_t>self.c.base

    # init_tensor(tensor): prepare a tensor just placed here. NULL: nothing to prepare
    init_tensor = None

    set_tensor = SlotDefault(_host_set_tensor)

    def get_tensor(self, Tensor tensor not None, offset=0, size=None):
        """The tensor's bytes [offset, offset + size) (size None: to its end)."""
        return self._host_region(tensor, offset, size).tobytes()

    def memset_tensor(self, Tensor tensor not None, value, offset=0, size=None):
        """Set the tensor's bytes [offset, offset + size) to `value`."""
        self._host_region(tensor, offset, size)[...] = byte_value(value)

    def cpy_tensor(self, Tensor src not None, Tensor dst not None):
        """dst (here) = src without going through the caller, where this buffer can;
        False where it cannot (ggml's default). Host memory copies from host memory."""
        src_bytes = host_bytes(src)
        if src_bytes is None or self._memory is None:
            return False
        self._host_region(dst, 0, None)[...] = src_bytes
        return True

    def clear(self, value=0):
        """Set every byte of the buffer to `value` (a simulated buffer has none to set)."""
        cdef int v = byte_value(value)
        _live(self)
        if self._memory is not None:
            self._memory[...] = v

    # reset(): forget per-tensor state after the allocator starts over. NULL: none kept
    reset = None

    def _host_region(self, Tensor tensor, offset, size):
        start, n = self._host_span(tensor, offset, size)
        return self._memory[start:start + n]

    def _host_span(self, Tensor tensor, offset, size):
        """(start, n) of the tensor's bytes in this buffer's host memory, checked."""
        _live(self)
        if self._memory is None:
            raise NotSupportedError(
                f"tensor '{tensor.name}' is in a simulated {self.buffer_type.name} buffer: "
                f"it has no bytes to read or write")
        if tensor.ptr.buffer != &self.c:
            raise BackendError(f"tensor '{tensor.name}' is not in this "
                               f"{self.buffer_type.name} buffer")
        return tensor_span(tensor, offset, size)

    def tensor_alloc(self, Tensor tensor not None, offset):
        """Place `tensor` at `offset` (ggml_backend_tensor_alloc); its context keeps
        this buffer alive."""
        cdef size_t offs = size_arg(offset, "tensor_alloc: offset")
        _live(self)
        cdef size_t size = size_arg(self.buffer_type.get_alloc_size(tensor),
                                    f"{type(self.buffer_type).__name__}.get_alloc_size")
        if offs > self.c.size:
            raise AllocationError(f"tensor '{tensor.name}': offset {offs} is past the end "
                                  f"of its {self.buffer_type.name} buffer of {self.c.size} bytes")
        tensor_alloc_at(&self.c, tensor.ptr, self.c.base + offs, size)
        tensor.owner.keep(self)
        return self

    def __repr__(self):
        state = " released" if self.c.released else ""
        name = self.buffer_type.name if self.buffer_type is not None else "?"
        return f"<Buffer {name} {self.c.size} bytes usage={self.usage}{state}>"


cdef Buffer _live(Buffer buffer):
    """buffer, which must be initialised and not released."""
    if buffer.c.buft == NULL:
        raise ArgumentError("the buffer was never initialised (Buffer.__init__)")
    if buffer.c.released:
        raise ReleasedMemoryError(f"the {buffer.buffer_type.name} buffer of {buffer.c.size} "
                                  f"bytes was released")
    return buffer


# ---------------------------------------------------------------------------
# placing tensors (ggml-backend.cpp: ggml_backend_tensor_alloc, ggml_backend_view_init).
# ggml asserts these conditions; here they raise.

cdef int tensor_alloc_at(ggml_backend_buffer * buffer, ggml_tensor * tensor, char * addr,
                         size_t size) except -1:
    """Give `tensor` the address `addr` in `buffer`; `size` is its alloc size. Then the
    buffer's optional init_tensor slot, where its class has one."""
    if tensor.buffer != NULL or tensor.data != NULL:
        raise AllocationError(f"tensor '{tensor_name(tensor)}' is already allocated")
    if tensor.view_src != NULL:
        raise AllocationError(f"tensor '{tensor_name(tensor)}' is a view; views take their "
                              f"view_src's memory (view_init)")
    # a zero-sized buffer has a NULL base (ggml_backend_buffer_get_base); only a
    # zero-sized tensor at offset 0 fits there, and it ends up with data NULL
    if (addr < buffer.base or size > buffer.size
            or <size_t>(addr - buffer.base) > buffer.size - size):
        raise AllocationError(f"tensor '{tensor_name(tensor)}' ({size} bytes at offset "
                              f"{<size_t>(addr - buffer.base)}) does not fit in its "
                              f"{buffer.buft.name.decode('utf-8', 'replace')} buffer of "
                              f"{buffer.size} bytes")
    tensor.buffer = buffer
    tensor.data = addr
    tensor_changed(tensor)
    if buffer.pyobj != NULL and (<Buffer>buffer.pyobj)._has_init_tensor:
        (<Buffer>buffer.pyobj).init_tensor(tensor_handle(tensor))
    return 0


cdef int view_init_c(ggml_tensor * tensor) except -1:
    """Port of ggml_backend_view_init: a view takes its view_src's buffer and address."""
    if tensor.buffer != NULL or tensor.view_src == NULL:
        raise AllocationError(f"tensor '{tensor_name(tensor)}' is not an uninitialised view")
    if tensor.view_src.buffer == NULL or tensor.view_src.data == NULL:
        # ggml asserts here; it happens when the view_src got no memory (a zero-sized
        # tensor in a zero-sized chunk)
        raise AllocationError(f"view '{tensor_name(tensor)}': its view_src "
                              f"'{tensor_name(tensor.view_src)}' has no data")
    tensor.buffer = tensor.view_src.buffer
    tensor.data = tensor.view_src.data + tensor.view_offs
    tensor_changed(tensor)
    return 0


cdef int buffer_reset(ggml_backend_buffer * buffer) except -1:
    """ggml_backend_buffer_reset: the buffer's optional reset slot, where its class has one."""
    if buffer != NULL and buffer.pyobj != NULL and (<Buffer>buffer.pyobj)._has_reset:
        (<Buffer>buffer.pyobj).reset()
    return 0


def view_init(Tensor tensor not None):
    """Give a view the buffer and address of its view_src (ggml_backend_view_init).
    The view's context keeps that buffer alive."""
    cdef ggml_tensor * t = tensor.ptr
    if t.view_src != NULL and t.view_src.buffer != NULL:
        _live(<Buffer>t.view_src.buffer.pyobj)
    view_init_c(t)
    tensor.owner.keep(<Buffer>t.buffer.pyobj)


def set_buffer(Tensor tensor not None, Buffer buffer not None, offset=0):
    """Mark a tensor as living in `buffer` (pre-allocated) at `offset`; its views
    follow it through view_src. Used for weights and placed inputs. The tensor's
    context keeps the buffer alive.

    A view's memory is its view_src's: a view may be given a buffer only once its
    view_src has one."""
    cdef ggml_tensor * t = tensor.ptr
    cdef size_t offs = size_arg(offset, "set_buffer: offset")
    cdef size_t nbytes = ggml_nbytes(t)
    _live(buffer)
    if nbytes > buffer.c.size or offs > buffer.c.size - nbytes:
        raise AllocationError(f"tensor '{tensor.name}' ({nbytes} bytes at offset {offs}) does "
                              f"not fit in the {buffer.buffer_type.name} buffer of "
                              f"{buffer.c.size} bytes")
    if t.view_src != NULL and t.view_src.buffer == NULL:
        raise GraphError(f"view '{tensor.name}' cannot have a buffer while its view_src "
                         f"'{tensor_name(t.view_src)}' has none: place the view_src")
    tensor.owner.keep(buffer)
    t.buffer = &buffer.c
    t.data = buffer.c.base + offs
    tensor_changed(t)


def tensor_span(Tensor tensor not None, offset=0, size=None):
    """(start, n): the bytes [offset, offset + size) of an allocated tensor (size None: to
    its end), start counted from its buffer's base. Every backend's byte access
    (set_tensor, get_tensor, copies) is checked here: a negative or too large offset or
    size is an ArgumentError naming the tensor."""
    cdef ggml_tensor * t = tensor.ptr
    allocated_buffer(tensor)
    cdef size_t nbytes = ggml_nbytes(t)
    cdef size_t offs = _byte_count(offset, tensor, "offset")
    cdef size_t n = 0
    if offs <= nbytes:
        n = nbytes - offs if size is None else _byte_count(size, tensor, "size")
    if offs > nbytes or n > nbytes - offs:
        raise ArgumentError(f"tensor '{tensor.name}': {n} bytes at offset {offs} exceed "
                            f"its {nbytes} bytes")
    return <size_t>(t.data - t.buffer.base) + offs, n


cdef inline size_t _byte_count(value, Tensor tensor, str which) except? 0:
    """A byte offset or size: plain non-negative ints pass as they are (the hot path
    builds no message), anything else goes through size_arg's checks."""
    if type(value) is int and 0 <= value <= _MAX_BYTES:
        return value
    return size_arg(value, f"tensor '{tensor.name}': {which}")


# ---------------------------------------------------------------------------
# tensor memory (ggml_backend_tensor_set / _get / _memset / _copy): the one place
# that checks a tensor's byte range and calls its buffer's slots

cdef object _contiguous_bytes(data, Tensor tensor, str op):
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
    try:
        view = memoryview(data)
    except TypeError:
        raise ArgumentTypeError(f"{op}('{tensor.name}'): data must be bytes-like, got "
                                f"{type(data).__name__}") from None
    if not view.c_contiguous:
        raise ArgumentError(f"{op}('{tensor.name}'): data must be contiguous")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


# the numpy dtype of each plain type's stored elements (bf16: its bits)
_STORED_DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "f64": np.dtype("<f8"),
                  "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
                  "i64": np.dtype("<i8"), "bf16": np.dtype("<u2")}


cdef _check_array(data, Tensor tensor, offset):
    """A numpy array given as bytes must be bytes of the tensor's type: an array of
    typed numbers (float, or integers wider than a byte) of another dtype would be
    reinterpreted bit for bit, and one of too many bytes names its dtype."""
    dt = data.dtype
    cdef size_t nbytes = ggml_nbytes(tensor.ptr)
    stored = _STORED_DTYPES.get(tensor.type)
    what = (f"tensor '{tensor.name}' ({tensor.type}, shape {tensor.shape}) was given a "
            f"{dt} array of shape {data.shape}")
    hint = ("sched.set_input(tensor, array) and tensor.write(array) check the shape and "
            "convert the values to the tensor's type")
    if (dt.kind in "fc" or (dt.kind in "iu" and dt.itemsize > 1)) and dt != stored:
        raise ArgumentTypeError(f"{what}: its bytes are not {tensor.type} values and would "
                                f"be reinterpreted bit for bit. {hint}; bytes as they are "
                                f"go as array.tobytes()")
    if type(offset) is int and offset == 0 and <size_t>data.nbytes > nbytes:
        raise ArgumentError(f"{what}: {data.nbytes} bytes at offset 0 exceed its {nbytes} "
                            f"bytes. {hint}")


# the same by type id (None: no numpy dtype holds the type's values), for _set_whole
cdef list _STORED_BY_ID = [_STORED_DTYPES.get(name) for name in _TYPE_NAMES]


def tensor_set(Tensor tensor not None, data, offset=0):
    """Write the bytes of `data` into the tensor at `offset` (ggml_backend_tensor_set).
    A numpy array must hold the tensor's type (ArgumentTypeError otherwise: its bytes
    would be reinterpreted); bytes-like data is written as it is."""
    if type(offset) is int and offset == 0 and _set_whole(tensor.ptr, data):
        return
    if isinstance(data, np.ndarray):
        _check_array(data, tensor, offset)
    view = _contiguous_bytes(data, tensor, "tensor_set")
    cdef Buffer buf = allocated_buffer(tensor)
    start, n = tensor_span(tensor, offset, view.nbytes)
    if not n:
        return
    if buf._host_bytes_only and buf._memory is not None:
        _host_write(buf._memory, start, view)       # the base set_tensor, without the call
    else:
        buf.set_tensor(tensor, view, offset)
    tensor_written(tensor.ptr)


def tensor_set_all(pairs):
    """tensor_set(tensor, data) for each (tensor, data) pair of `pairs`, in order, each
    checked as tensor_set checks it: a graph's inputs in one call a step (Session's)."""
    if type(pairs) is not list:
        pairs = items_arg(pairs, "tensor_set_all: pairs")
    for i, pair in enumerate(pairs):
        if type(pair) is not tuple or len(<tuple>pair) != 2:
            raise ArgumentTypeError(f"tensor_set_all: pairs[{i}] must be a (tensor, data) "
                                    f"pair, got {type(pair).__name__}")
        tensor, data = <tuple>pair
        if not (type(tensor) is Tensor and _set_whole((<Tensor>tensor).ptr, data)):
            tensor_set(tensor, data)


cdef bint _set_whole(ggml_tensor * t, data) except -1:
    """tensor_set's common case (a graph's inputs, every step) by one memcpy and no Python
    object: a C-contiguous ndarray of the tensor's stored dtype and exactly its bytes,
    written whole into a live host buffer of the base class. Anything else returns
    False, having written nothing, and takes the general path with its checks."""
    if (type(data) is not np.ndarray or t.buffer == NULL or t.data == NULL
            or t.buffer.buft == NULL or t.buffer.released
            or <size_t>t.type >= <size_t>len(_STORED_BY_ID)
            or (<object>data).dtype is not _STORED_BY_ID[t.type]):
        return False
    cdef Buffer buf = <Buffer>t.buffer.pyobj
    if not buf._host_bytes_only or type(buf._memory) is not np.ndarray:
        return False
    cdef size_t nbytes = ggml_nbytes(t)
    cdef size_t start = <size_t>(t.data - t.buffer.base)
    cdef Py_buffer src, dst
    cdef bint done = False
    PyObject_GetBuffer(data, &src, PyBUF_STRIDES)
    try:
        if nbytes and <size_t>src.len == nbytes and PyBuffer_IsContiguous(&src, b'C'):
            try:
                PyObject_GetBuffer(buf._memory, &dst, PyBUF_WRITABLE)
            except (BufferError, ValueError):       # read-only memory: the general path says so
                return False
            try:
                done = start <= <size_t>dst.len and nbytes <= <size_t>dst.len - start
                if done:
                    memcpy(<char *>dst.buf + start, src.buf, nbytes)
            finally:
                PyBuffer_Release(&dst)
    finally:
        PyBuffer_Release(&src)
    if done:
        tensor_written(t)
    return done


cdef int _host_write(unsigned char[::1] memory, size_t start, const unsigned char[::1] src) except -1:
    memcpy(&memory[start], &src[0], src.shape[0])
    return 0


def tensor_get(Tensor tensor not None, offset=0, size=None):
    """The tensor's bytes [offset, offset + size), size None: to its end
    (ggml_backend_tensor_get)."""
    buf = allocated_buffer(tensor)
    _, n = tensor_span(tensor, offset, size)
    return buf.get_tensor(tensor, offset, n) if n else b""


def byte_value(value, what="byte value"):
    """value, an integer in [0, 255] (what memset and clear write)."""
    return int_arg(value, what, 0, 255)


def tensor_memset(Tensor tensor not None, value, offset=0, size=None):
    """Set the tensor's bytes [offset, offset + size) to `value` (ggml_backend_tensor_memset)."""
    cdef int v = byte_value(value, f"tensor_memset('{tensor.name}'): value")
    buf = allocated_buffer(tensor)
    _, n = tensor_span(tensor, offset, size)
    if n:
        buf.memset_tensor(tensor, v, offset, n)
        tensor_written(tensor.ptr)


def host_bytes(Tensor tensor not None):
    """The tensor's bytes as a numpy uint8 view of host memory, or None where its buffer
    has no host memory (ggml_backend_buffer_is_host)."""
    cdef Buffer buf = allocated_buffer(tensor)
    mem = buf._memory
    if mem is None:
        return None
    start, n = tensor_span(tensor)
    return mem[start:start + n]


def tensor_copy(Tensor src not None, Tensor dst not None):
    """dst = src, blocking (ggml_backend_tensor_copy): from host memory a set, into host
    memory a get, otherwise the destination buffer's cpy_tensor or, where it cannot,
    a get and a set."""
    if (src.ptr.type != dst.ptr.type or list(src.ne) != list(dst.ne)
            or list(src.nb) != list(dst.nb)):
        raise BackendError(f"cannot copy '{src.name}' to '{dst.name}': different layouts")
    sbuf, dbuf = allocated_buffer(src), allocated_buffer(dst)
    if src.ptr.data == dst.ptr.data and sbuf is dbuf:
        return
    src_host = host_bytes(src)
    if src_host is not None:
        tensor_set(dst, src_host)
        return
    dst_host = host_bytes(dst)
    if dst_host is not None:
        dst_host[...] = np.frombuffer(tensor_get(src), dtype=np.uint8)
    elif not dbuf.cpy_tensor(src, dst):
        tensor_set(dst, tensor_get(src))
    tensor_written(dst.ptr)


def mark_written(Tensor tensor not None):
    """Mark the tensor (and its view source) as written where it lies now: for writes
    that do not go through tensor_set / tensor_memset / tensor_copy (a backend's
    asynchronous set, a numpy view of host memory). The Scheduler's check_inputs
    refuses to compute a graph input that was not written since it was placed."""
    tensor_written(tensor.ptr)


def is_written(Tensor tensor not None):
    """Were the tensor's bytes (a view's: its view source's) written since it was
    placed where it lies now (tensor_set, tensor_memset, tensor_copy, mark_written)?"""
    return tensor_is_written(tensor.ptr)


def allocated_buffer(Tensor tensor not None):
    """The Buffer of an allocated tensor; BackendError naming the tensor when it has
    no memory (never allocated, or its placement was taken back), ReleasedMemoryError
    when its buffer was released."""
    cdef ggml_tensor * t = tensor.ptr
    if t.buffer == NULL or t.data == NULL:
        raise BackendError(f"tensor '{tensor.name}' ({tensor.op}) is not allocated (or its "
                           f"graph was allocated again elsewhere since): allocate its graph")
    return _live(<Buffer>t.buffer.pyobj)


cdef str tensor_buffer_name(const ggml_tensor * t):
    return t.buffer.buft.name.decode("utf-8", "replace")


def tensor_ndarray(Tensor tensor not None, memory, dtype, row_bytes=0):
    """A numpy view of an allocated tensor inside `memory`, the numpy bytes behind its
    buffer: numpy order (ne3, ne2, ne1, ne0) with the tensor's byte strides, or with
    `row_bytes` the uint8 rows of a block type (ne3, ne2, ne1, row_bytes). Built from
    the struct directly: kernels ask for one per source and result of every node."""
    cdef ggml_tensor * t = tensor.ptr
    cdef Py_ssize_t rb
    try:
        rb = row_bytes
    except (OverflowError, TypeError):
        raise ArgumentError(f"row_bytes must be a small integer, got {row_bytes!r}") from None
    if t.buffer == NULL or t.data == NULL:
        raise BackendError(f"tensor '{tensor.name}' ({tensor.op}) is not allocated")
    if t.buffer.released:
        _live(<Buffer>t.buffer.pyobj)
    cdef size_t offset = <size_t>(t.data - t.buffer.base)
    if rb:
        shape = (t.ne[3], t.ne[2], t.ne[1], rb)
        strides = (t.nb[3], t.nb[2], t.nb[1], 1)
    else:
        shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
        strides = (t.nb[3], t.nb[2], t.nb[1], t.nb[0])
    if t.ne[0] == 0 or t.ne[1] == 0 or t.ne[2] == 0 or t.ne[3] == 0 or rb < 0:
        return np.zeros(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=memory, offset=offset, strides=strides)


class GraphView:
    """Nodes [i0, i1) of a graph, as a backend's graph_compute sees a graph
    (ggml_graph_view: the nodes only, no leafs)."""

    __slots__ = ("nodes",)

    def __init__(self, nodes):
        self.nodes = nodes

    @property
    def n_nodes(self):
        return len(self.nodes)

    def __len__(self):
        return len(self.nodes)


def graph_nodes(graph):
    """The nodes a backend's graph_compute runs, from a Graph, a GraphView (nodes [i0,
    i1) of one) or a list of tensors; ArgumentTypeError for anything else."""
    return items_arg(getattr(graph, "nodes", graph), "graph_compute's graph (or its nodes)",
                     Tensor)


def node_range(Graph graph not None, i0, i1):
    """graph_compute_range's [i0, i1) as positions (i0, i1) with i0 <= i1: indexes into
    the graph's n_nodes + 1 boundaries, negative ones counting from the end as in Python
    (-1: the end); OutOfRangeError past them."""
    cdef Py_ssize_t a = index_arg(i0, "i0", graph.n_nodes + 1)
    cdef Py_ssize_t b = index_arg(i1, "i1", graph.n_nodes + 1)
    return a, max(a, b)


def get_buffer(Tensor tensor not None):
    """The buffer holding the tensor's data (None if not allocated)."""
    cdef ggml_backend_buffer * b = tensor.ptr.buffer
    return None if b == NULL else <object>b.pyobj


def clear_buffer(Tensor tensor not None):
    tensor.ptr.buffer = NULL
    tensor.ptr.data = NULL
    tensor.ptr.written = 0
    tensor_changed(tensor.ptr)


# ---------------------------------------------------------------------------
# backends

# what a backend's byte slots say of a tensor in another device's memory
OTHER_MEMORY_HINT = (" (a backend's get_tensor / set_tensor reach its own memory; "
                     "sched.get_output(t) / sched.set_input(t, array), t.numpy() and "
                     "t.write(array) read and write wherever t lives)")

def _table_supports_op(Backend self not None, Tensor op not None):
    """Can this backend compute `op`? The table's answer (or its C rule's); a method in
    a subclass that calls this (super()) gets what the table allows."""
    cdef uint8_t a = self.c.supports_op_table[op.ptr.op]
    if a == GGML_PY_OP_FN:
        return self.c.supports_op_fn(&self.c, op.ptr) != 0
    return a == GGML_PY_OP_YES or a == GGML_PY_OP_ASK


def _table_supports_buft(Backend self not None, BufferType buft not None):
    """Can this backend use memory of `buft` directly?"""
    return bool(self.c.supports_host_bufts and buft.c.is_host) or \
        any(b is buft for b in self._bufts)


def _table_offload_op(Backend self not None, Tensor op not None):
    """Should `op`, whose weights are in host memory, run here anyway?"""
    return (self.c.offload_op_table[op.ptr.op] == GGML_PY_OP_YES
            and op_batch(op.ptr) >= self.c.offload_min_batch)


cdef class Backend:
    """A device that can run ops (ggml_backend + its device).

    Its slots, with their defaults, are BACKEND_SLOTS; a subclass fills the ones it
    has. supports_op / offload_op / supports_buft are answered in C from tables set
    from the constructor arguments; a subclass that fills them with Python methods is
    asked per tensor instead (the tables still decide where it is asked).
    """

    def __cinit__(self, *args, **kwargs):
        memset(&self.c, 0, sizeof(ggml_backend))
        self.c.pyobj = <void *>self
        self._bufts = []

    def __dealloc__(self):
        free(self.c.supported_bufts)

    def __init__(self, name, BufferType buffer_type not None, device_type="cpu",
                 supports_ops="*", unsupported_ops=(), offload_ops=(), offload_min_batch=0,
                 supported_buffer_types=None):
        _set_name(self.c.name, name, "backend name")
        self.c.device_type = DEVICE_TYPES[_choice(device_type, DEVICE_TYPES,
                                                  f"backend {name!r}: device_type")]
        self.buffer_type = _buffer_type(buffer_type)
        self.c.default_buft = &buffer_type.c
        self.set_supported_ops(supports_ops, unsupported_ops)
        self.set_offload_ops(offload_ops, offload_min_batch)
        self.set_supported_buffer_types([buffer_type] if supported_buffer_types is None
                                        else supported_buffer_types)
        filled = filled_slots(type(self))
        # Python methods in the split-time slots are asked through the tables
        if "offload_op" in filled:
            for i in range(GGML_OP_COUNT_MAX):
                self.c.offload_op_table[i] = GGML_PY_OP_ASK
        self.c.supports_buft_ask = "supports_buft" in filled

    # --- tables ---

    def set_supported_ops(self, supports="*", unsupported=()):
        """Fill the supports_op table: ops in `supports` ('*' = all) minus `unsupported`."""
        yes = _op_ids(supports, f"backend {self.name}: supports_ops") - \
            _op_ids(unsupported, f"backend {self.name}: unsupported_ops")
        # a Python override of supports_op is asked about the ops the table allows (a
        # slow path: backends answer in C through supports_op_fn, see _supports)
        cdef uint8_t allowed = (GGML_PY_OP_ASK if "supports_op" in filled_slots(type(self))
                                else GGML_PY_OP_YES)
        for i in range(GGML_OP_COUNT_MAX):
            self.c.supports_op_table[i] = allowed if i in yes else GGML_PY_OP_NO
        world_changed()

    def set_offload_ops(self, ops=(), min_batch=0):
        """Fill the offload_op table: ops in `ops` offload when batch >= min_batch."""
        yes = _op_ids(ops, f"backend {self.name}: offload_ops")
        cdef int64_t batch = int_arg(min_batch, f"backend {self.name}: offload_min_batch",
                                     INT64_MIN, INT64_MAX)
        for i in range(GGML_OP_COUNT_MAX):
            self.c.offload_op_table[i] = GGML_PY_OP_YES if i in yes else GGML_PY_OP_NO
        self.c.offload_min_batch = batch
        world_changed()

    def set_supported_buffer_types(self, bufts):
        """The buffer types whose memory the backend uses directly (the first is its
        default); the scheduler copies tensors in others."""
        bufts = items_arg(bufts, f"backend {self.name}: supported buffer types", BufferType)
        for b in bufts:
            _buffer_type(b)
        safe_realloc(<void **>&self.c.supported_bufts, len(bufts),
                     sizeof(ggml_backend_buffer_type *), "a backend's buffer type table")
        for i, b in enumerate(bufts):
            self.c.supported_bufts[i] = &(<BufferType>b).c
        self.c.n_supported_bufts = len(bufts)
        self._bufts = bufts
        world_changed()

    # --- identity ---

    @property
    def name(self):
        """The backend's name."""
        return self.c.name.decode()

    @property
    def device_type(self):
        """'cpu', 'gpu', 'igpu' or 'accel' (ggml's device types)."""
        return DEVICE_TYPE_NAMES[self.c.device_type]

    @property
    def supported_buffer_types(self):
        """The buffer types whose memory the backend uses directly (a new list)."""
        return list(self._bufts)

    @property
    def supports_host_buffer_types(self):
        """Does the backend use every host buffer type too (ggml's CPU backend does)?"""
        return bool(self.c.supports_host_bufts)

    @supports_host_buffer_types.setter
    def supports_host_buffer_types(self, bint value):
        self.c.supports_host_bufts = value

    def get_default_buffer_type(self):
        """The buffer type its tensors are allocated in (buffer_type)."""
        return self.buffer_type

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} ({self.device_type})>"

    # --- lifetime ---

    def close(self):
        """Release what the backend holds (worker threads, queues); the base holds
        nothing. A dropped backend is released too; `with` closes it on exit."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- split-time slots (answered from the tables unless a subclass fills them) ---

    supports_op = SlotDefault(_table_supports_op)
    supports_buft = SlotDefault(_table_supports_buft)
    offload_op = SlotDefault(_table_offload_op)

    # --- compute slots (defaults for backends that cannot compute) ---

    def graph_compute(self, graph):
        """Compute every node of `graph` (a Graph or a GraphView), in order; a backend
        may return before its work is done (synchronize waits). The base cannot compute."""
        raise BackendError(f"backend {self.name} cannot compute graphs")

    def graph_compute_range(self, Graph graph not None, i0, i1):
        """Compute nodes [i0, i1) of `graph` (the scheduler's splits). The default hands
        graph_compute a GraphView of those nodes; a backend that computes in C takes the
        range itself (node_range) and makes no node handles."""
        a, b = node_range(graph, i0, i1)
        return self.graph_compute(GraphView([graph.node(i) for i in range(a, b)]))

    def synchronize(self):
        """Wait for queued work (default: nothing is queued)."""

    def set_tensor(self, Tensor tensor not None, data, offset=0):
        """Write bytes into a tensor in this backend's memory, blocking (tensor_set)."""
        self._own(tensor)
        tensor_set(tensor, data, offset)

    def get_tensor(self, Tensor tensor not None, offset=0, size=None):
        """Read the bytes of a tensor in this backend's memory, blocking (tensor_get)."""
        self._own(tensor)
        return tensor_get(tensor, offset, size)

    cdef _own(self, Tensor tensor):
        """BackendError unless the tensor's buffer is one this backend uses."""
        cdef Buffer buf = allocated_buffer(tensor)
        if not backend_supports_buft(&self.c, buf.c.buft):
            raise BackendError(f"backend {self.name}: tensor '{tensor.name}' is in buffer type "
                               f"'{buf.buffer_type.name}', not in this device's memory"
                               f"{OTHER_MEMORY_HINT}")

    # set_tensor_async(tensor, data, offset): write without waiting (the runtime's input
    # copies). NULL: they write with set_tensor, blocking
    set_tensor_async = None

    def cpy_tensor_async(self, Backend backend_src not None, Tensor src not None,
                         Tensor dst not None):
        """Copy src (on backend_src) to dst (here) without waiting; False = not supported."""
        return False

    def event_new(self):
        """A new event, or None when the backend has no events."""
        return None

    def event_record(self, event):
        """Mark `event` as reached when the work queued so far is done (default: nothing
        is queued)."""
        pass

    def event_wait(self, event):
        """Make work queued here from now on wait for `event` (default: nothing to wait
        for)."""
        pass

    def event_synchronize(self, event):
        """Block until `event` is reached (default: it is)."""
        pass


cdef int ask_supports_op(ggml_backend * b, ggml_tensor * t) except -1:
    return 1 if (<object>b.pyobj).supports_op(tensor_handle(t)) else 0


cdef int ask_offload_op(ggml_backend * b, ggml_tensor * t) except -1:
    return 1 if (<object>b.pyobj).offload_op(tensor_handle(t)) else 0


cdef int ask_supports_buft(ggml_backend * b, ggml_backend_buffer_type * buft) except -1:
    return 1 if (<object>b.pyobj).supports_buft(<object>buft.pyobj) else 0
