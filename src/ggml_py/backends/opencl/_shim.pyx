# Thin Python objects over the OpenCL shim (ggml-py-opencl.c, beside this file): library
# loading, device listing, a device context with its queue, memory objects, programs,
# kernels and events. No ggml knowledge here: ggml_py/backends/opencl/ builds
# the backend on top. Every failure becomes a Python exception; nothing aborts.

from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from ggml_py._core cimport size_arg, int_arg

from ggml_py.errors import AllocationError, ArgumentError, ArgumentTypeError, BackendError


cdef extern from "ggml_py/backends/opencl/ggml-py-opencl.h":
    enum:
        GPO_OK
        GPO_ENOLIB
        GPO_ENOSYM
        GPO_ENOPLATFORM
        GPO_ENODEVICE
        GPO_ENOMEM
        GPO_STR_LEN
    ctypedef struct gpo_device_info:
        char name[256]
        char vendor[256]
        char version[256]
        char driver_version[256]
        char c_version[256]
        char platform[256]
        uint64_t device_type
        uint64_t global_mem
        uint64_t max_alloc
        uint64_t local_mem
        uint32_t compute_units
        uint32_t base_addr_align_bits
        uint64_t max_work_group
    ctypedef struct gpo_ctx:
        pass
    int gpo_load(const char * path)
    const char * gpo_library_path()
    const char * gpo_last_error()
    const char * gpo_error_name(int status)
    int gpo_device_count(int * n)
    int gpo_device_info_get(int index, gpo_device_info * info)
    int gpo_ctx_create(int index, gpo_ctx ** out)
    void gpo_ctx_release(gpo_ctx * ctx)
    int gpo_mem_create(gpo_ctx * ctx, size_t size, void ** mem)
    void gpo_mem_release(void * mem)
    int gpo_write(gpo_ctx * ctx, void * mem, size_t offset, size_t size, const void * src)
    int gpo_read(gpo_ctx * ctx, void * mem, size_t offset, size_t size, void * dst)
    int gpo_copy(gpo_ctx * ctx, void * src, size_t src_offset, void * dst, size_t dst_offset,
                 size_t size)
    int gpo_program_build(gpo_ctx * ctx, const char * source, const char * options,
                          void ** program, char ** log)
    void gpo_program_release(void * program)
    int gpo_kernel_create(void * program, const char * name, void ** kernel)
    void gpo_kernel_release(void * kernel)
    int gpo_kernel_arg(void * kernel, unsigned index, size_t size, const void * value)
    int gpo_kernel_arg_mem(void * kernel, unsigned index, void * mem)
    int gpo_enqueue(gpo_ctx * ctx, void * kernel, unsigned dims, const size_t * glob,
                    const size_t * local)
    int gpo_finish(gpo_ctx * ctx)
    int gpo_marker(gpo_ctx * ctx, void ** event)
    int gpo_wait_event(gpo_ctx * ctx, void * event)
    int gpo_event_sync(void * event)
    void gpo_event_release(void * event)
    void gpo_free(void * p)

# CL_DEVICE_TYPE bits
DEVICE_TYPE_CPU = 1 << 1
DEVICE_TYPE_GPU = 1 << 2
DEVICE_TYPE_ACCELERATOR = 1 << 3

# statuses that mean "no usable OpenCL here" rather than "something broke"
_UNAVAILABLE = (GPO_ENOLIB, GPO_ENOSYM, GPO_ENOPLATFORM, GPO_ENODEVICE)


class OpenCLUnavailable(BackendError):
    """No OpenCL library, platform or device: the backend cannot be used here."""


class OpenCLError(BackendError):
    """An OpenCL call failed; `status` is the OpenCL (or shim) error code."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = status


class BuildError(OpenCLError):
    """A program did not compile; `log` is the compiler's build log."""

    def __init__(self, message, log, status=0):
        super().__init__(f"{message}\n--- build log ---\n{log}", status)
        self.log = log


MAX_WORK_ITEMS = 1 << 32


def _work_sizes(value, what):
    try:
        sizes = [size_arg(x, what) for x in value]
    except TypeError:
        raise ArgumentTypeError(f"{what} must be a sequence of sizes, got "
                                f"{type(value).__name__}") from None
    if not 1 <= len(sizes) <= 3:
        raise ArgumentError(f"{what}: 1 to 3 work dimensions, got {len(sizes)}")
    return sizes


cdef bytes _c_string(value, what):
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a string, got {type(value).__name__}")
    b = (<str>value).encode("utf-8", "surrogateescape")
    if b"\0" in b:
        raise ArgumentError(f"{what} contains a NUL byte")
    return b


cdef str _last():
    return gpo_last_error().decode("utf-8", "replace")


cdef int _check(int status, what=None) except -1:
    """Raise for a failed shim call (unavailability gets its own class)."""
    if status == GPO_OK:
        return 0
    msg = _last()
    if what:
        msg = f"{what}: {msg}"
    if status in _UNAVAILABLE:
        raise OpenCLUnavailable(msg)
    raise OpenCLError(msg, status)


def load(path=None):
    """Open the OpenCL library (see gpo_load); returns its path. Raises
    OpenCLUnavailable with the reason when it cannot be opened."""
    if path is not None and not isinstance(path, str):
        raise ArgumentTypeError(f"the OpenCL library path must be a string, got "
                                f"{type(path).__name__}")
    cdef bytes p = path.encode("utf-8", "surrogateescape") if path else b""
    if b"\0" in p:
        raise ArgumentError(f"the OpenCL library path contains a NUL byte: {path!r}")
    cdef const char * cp = NULL
    if path:
        cp = p
    _check(gpo_load(cp))
    return gpo_library_path().decode()


def error_name(status):
    return gpo_error_name(int_arg(status, "status", -(1 << 31), (1 << 31) - 1)).decode()


def device_count():
    cdef int n = 0
    load()
    _check(gpo_device_count(&n))
    return n


def device_info(index):
    """A dict describing device `index` (over all platforms)."""
    cdef gpo_device_info info
    load()
    _check(gpo_device_info_get(int_arg(index, "device index", 0, (1 << 31) - 1), &info))
    return {
        "index": index,
        "name": info.name.decode("utf-8", "replace").strip(),
        "vendor": info.vendor.decode("utf-8", "replace").strip(),
        "version": info.version.decode("utf-8", "replace").strip(),
        "driver_version": info.driver_version.decode("utf-8", "replace").strip(),
        "opencl_c_version": info.c_version.decode("utf-8", "replace").strip(),
        "platform": info.platform.decode("utf-8", "replace").strip(),
        "device_type": info.device_type,
        "global_mem": info.global_mem,
        "max_alloc": info.max_alloc,
        "local_mem": info.local_mem,
        "compute_units": info.compute_units,
        "base_addr_align_bits": info.base_addr_align_bits,
        "max_work_group": info.max_work_group,
    }


# What ggml_py has allocated on each device (by device index), and the most it may:
# devices report their memory but some allocate lazily and fail late (see
# gpo_mem_create), so every allocation is checked against these first.
cdef enum:
    MAX_DEVICES = 1024
cdef size_t _handed_out[MAX_DEVICES]
cdef size_t _limit[MAX_DEVICES]          # 0: the device's global memory


def memory_in_use(index):
    """Bytes of device memory ggml_py holds on OpenCL device `index`."""
    return _handed_out[_tracked(index)]


def set_memory_limit(index, limit):
    """Let ggml_py allocate at most `limit` bytes on device `index` (None: its global
    memory, the default). Allocations past it raise AllocationError."""
    cdef int i = _tracked(index)
    _limit[i] = 0 if limit is None else size_arg(limit, "memory limit")


cdef int _tracked(index) except -1:
    return int_arg(index, "device index", 0, MAX_DEVICES - 1)


cdef class DeviceContext:
    """An OpenCL context and in-order command queue on one device."""
    cdef gpo_ctx * c
    cdef readonly int index
    cdef readonly object name
    cdef size_t global_mem
    cdef size_t max_alloc

    def __cinit__(self, index):
        self.c = NULL
        self.index = _tracked(index)
        info = device_info(self.index)
        self.name = info["name"]
        self.global_mem = info["global_mem"]
        self.max_alloc = info["max_alloc"]
        _check(gpo_ctx_create(self.index, &self.c), f"OpenCL device {self.index}")

    def __dealloc__(self):
        if self.c != NULL:
            gpo_ctx_release(self.c)

    def alloc(self, size):
        """A new device memory object of `size` bytes, zeroed. AllocationError when it
        is larger than the device's largest allocation, when the device's memory (or
        set_memory_limit) would be exceeded, or when the driver cannot provide it."""
        cdef void * m = NULL
        cdef size_t n = size_arg(size, "OpenCL allocation size")
        cdef size_t limit = _limit[self.index] or self.global_mem
        where = f"OpenCL device {self.index} ({self.name})"
        if self.max_alloc and n > self.max_alloc:
            raise AllocationError(f"{where}: cannot allocate {n} bytes, the largest single "
                                  f"allocation is {self.max_alloc} bytes")
        if limit and n > limit - min(_handed_out[self.index], limit):
            raise AllocationError(f"{where}: cannot allocate {n} bytes, {_handed_out[self.index]} "
                                  f"of its {limit} bytes of memory are in use")
        cdef int s = gpo_mem_create(self.c, max(n, 1), &m)
        if s != GPO_OK:
            raise AllocationError(f"{where}: cannot allocate {n} bytes ({_last()})")
        cdef Mem mem = Mem.__new__(Mem)
        mem.m = m
        mem.size = n
        mem.ctx = self
        mem.device = self.index
        _handed_out[self.index] += n
        return mem

    @property
    def memory_in_use(self):
        return _handed_out[self.index]

    cdef size_t _span(self, Mem mem, offset, size_t n, what) except? 0:
        """offset, checked so that [offset, offset + n) lies in mem (of this context)."""
        cdef size_t offs = size_arg(offset, f"{what} offset")
        if mem.ctx is not self:
            raise ArgumentError(f"{what}: the memory object belongs to another OpenCL context")
        if mem.m == NULL:
            raise ArgumentError(f"{what}: the memory object was released")
        if n > mem.size or offs > mem.size - n:
            raise OpenCLError(f"{what} of {n} bytes at {offs} exceeds a {mem.size}-byte buffer")
        return offs

    def write(self, Mem mem not None, offset, data):
        """Copy bytes-like `data` into mem at offset (blocking)."""
        cdef const unsigned char[::1] view = memoryview(data).cast("B")
        cdef size_t n = view.shape[0]
        cdef size_t offs = self._span(mem, offset, n, "write")
        if n:
            _check(gpo_write(self.c, mem.m, offs, n, &view[0]))

    def read_into(self, Mem mem not None, offset, out):
        """Copy len(out) bytes from mem at offset into writable buffer `out` (blocking)."""
        cdef unsigned char[::1] view = memoryview(out).cast("B")
        cdef size_t n = view.shape[0]
        cdef size_t offs = self._span(mem, offset, n, "read")
        if n:
            _check(gpo_read(self.c, mem.m, offs, n, &view[0]))

    def read(self, Mem mem not None, offset, size):
        cdef size_t n = size_arg(size, "read size")
        self._span(mem, offset, n, "read")
        out = bytearray(n)
        self.read_into(mem, offset, out)
        return bytes(out)

    def copy(self, Mem src not None, src_offset, Mem dst not None, dst_offset, size):
        """Queue a device-to-device copy."""
        cdef size_t n = size_arg(size, "copy size")
        cdef size_t s_offs = self._span(src, src_offset, n, "copy source")
        cdef size_t d_offs = self._span(dst, dst_offset, n, "copy destination")
        _check(gpo_copy(self.c, src.m, s_offs, dst.m, d_offs, n))

    def build(self, source, options=""):
        """Compile OpenCL C `source`; BuildError carries the log on failure."""
        cdef void * p = NULL
        cdef char * log = NULL
        cdef bytes src = _c_string(source, "OpenCL source")
        cdef bytes opt = _c_string(options, "OpenCL build options")
        cdef int s = gpo_program_build(self.c, src, opt, &p, &log)
        text = ""
        if log != NULL:
            text = log.decode("utf-8", "replace")
            gpo_free(log)
        if s != GPO_OK:
            raise BuildError(f"OpenCL device {self.index}: {_last()}", text, s)
        cdef Program prog = Program.__new__(Program)
        prog.p = p
        prog.ctx = self
        prog.log = text
        return prog

    def enqueue(self, Kernel kernel not None, global_size, local_size=None):
        """Queue `kernel` over an NDRange of 1 to 3 dimensions (at most MAX_WORK_ITEMS
        work items: more would keep a CPU device busy for hours)."""
        cdef size_t g[3]
        cdef size_t l[3]
        if kernel.k == NULL:
            raise ArgumentError("the kernel was not made by Program.kernel")
        sizes = _work_sizes(global_size, "global size")
        locals_ = None if local_size is None else _work_sizes(local_size, "local size")
        if locals_ is not None and len(locals_) != len(sizes):
            raise ArgumentError(f"local size {local_size!r} and global size {global_size!r} "
                                f"have different dimensions")
        total = 1
        for x in sizes:
            total *= x
        if total > MAX_WORK_ITEMS:
            raise ArgumentError(f"kernel {kernel.name}: {total} work items, more than "
                                f"{MAX_WORK_ITEMS}")
        cdef unsigned dims = len(sizes)
        for i in range(dims):
            g[i] = sizes[i]
            if locals_ is not None:
                l[i] = locals_[i]
        _check(gpo_enqueue(self.c, kernel.k, dims, g, NULL if locals_ is None else l),
               f"kernel {kernel.name}")

    def finish(self):
        _check(gpo_finish(self.c))

    def marker(self):
        """An event that completes when everything queued so far has."""
        cdef void * e = NULL
        _check(gpo_marker(self.c, &e))
        cdef Event ev = Event.__new__(Event)
        ev.e = e
        ev.ctx = self
        return ev

    def wait_event(self, Event ev not None):
        """Make work queued from now on wait for `ev` (it may come from another queue
        of the same context)."""
        if ev.e != NULL:
            _check(gpo_wait_event(self.c, ev.e))


cdef class Mem:
    """A device memory object; released when the last reference goes."""
    cdef void * m
    cdef readonly size_t size
    cdef readonly DeviceContext ctx      # keeps the context alive past the buffer
    cdef int device                      # its index, for the accounting

    def __dealloc__(self):
        if self.m != NULL:
            gpo_mem_release(self.m)
            _handed_out[self.device] -= self.size

    def __repr__(self):
        return f"<Mem {self.size} bytes on OpenCL device {self.ctx.index}>"


cdef class Program:
    cdef void * p
    cdef readonly DeviceContext ctx
    cdef readonly str log

    def __dealloc__(self):
        gpo_program_release(self.p)

    def kernel(self, name):
        cdef void * k = NULL
        if self.p == NULL:
            raise ArgumentError("the program was not made by DeviceContext.build")
        _check(gpo_kernel_create(self.p, _c_string(name, "kernel name"), &k))
        cdef Kernel kern = Kernel.__new__(Kernel)
        kern.k = k
        kern.program = self
        kern.name = name
        return kern


cdef class Kernel:
    """A kernel object. Arguments are set per launch: the values are captured when
    the launch is queued, so one kernel object serves every node."""
    cdef void * k
    cdef readonly Program program
    cdef readonly str name

    def __dealloc__(self):
        gpo_kernel_release(self.k)

    def set_args(self, args):
        """args: Mem objects (buffer arguments) or bytes-like values (by value)."""
        cdef unsigned i = 0
        cdef const unsigned char[::1] view
        if self.k == NULL:
            raise ArgumentError("the kernel was not made by Program.kernel")
        for a in args:
            if isinstance(a, Mem):
                if (<Mem>a).m == NULL:
                    raise ArgumentError(f"kernel {self.name}: argument {i} was released")
                _check(gpo_kernel_arg_mem(self.k, i, (<Mem>a).m), f"kernel {self.name}")
            else:
                try:
                    view = memoryview(a).cast("B")
                except TypeError:
                    raise ArgumentTypeError(f"kernel {self.name}: argument {i} must be a Mem "
                                            f"or bytes, got {type(a).__name__}") from None
                if view.shape[0] == 0:
                    raise ArgumentError(f"kernel {self.name}: argument {i} is empty")
                _check(gpo_kernel_arg(self.k, i, view.shape[0], &view[0]), f"kernel {self.name}")
            i += 1


cdef class Event:
    """A point in a queue (a marker)."""
    cdef void * e
    cdef readonly DeviceContext ctx

    def __dealloc__(self):
        gpo_event_release(self.e)

    def synchronize(self):
        if self.e != NULL:
            _check(gpo_event_sync(self.e))
