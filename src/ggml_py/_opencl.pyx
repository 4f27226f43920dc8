# Thin Python objects over the OpenCL shim (src/ggml-py-opencl.c): library loading,
# device listing, a device context with its queue, memory objects, programs,
# kernels and events. No ggml knowledge here: ggml_py/backends/opencl.py builds
# the backend on top. Every failure becomes a Python exception; nothing aborts.

from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from ggml_py.errors import AllocationError, BackendError


cdef extern from "ggml-py-opencl.h":
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
    cdef bytes p = path.encode() if path else b""
    cdef const char * cp = NULL
    if path:
        cp = p
    _check(gpo_load(cp))
    return gpo_library_path().decode()


def error_name(int status):
    return gpo_error_name(status).decode()


def device_count():
    cdef int n = 0
    load()
    _check(gpo_device_count(&n))
    return n


def device_info(int index):
    """A dict describing device `index` (over all platforms)."""
    cdef gpo_device_info info
    load()
    _check(gpo_device_info_get(index, &info))
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


cdef class DeviceContext:
    """An OpenCL context and in-order command queue on one device."""
    cdef gpo_ctx * c
    cdef readonly int index

    def __cinit__(self, int index):
        self.c = NULL
        load()
        _check(gpo_ctx_create(index, &self.c), f"OpenCL device {index}")
        self.index = index

    def __dealloc__(self):
        if self.c != NULL:
            gpo_ctx_release(self.c)

    def alloc(self, size_t size):
        """A new device memory object of `size` bytes."""
        cdef void * m = NULL
        cdef int s = gpo_mem_create(self.c, size, &m)
        if s != GPO_OK:
            raise AllocationError(f"OpenCL device {self.index}: cannot allocate {size} bytes "
                                  f"({_last()})")
        cdef Mem mem = Mem.__new__(Mem)
        mem.m = m
        mem.size = size
        mem.ctx = self
        return mem

    def write(self, Mem mem, size_t offset, data):
        """Copy bytes-like `data` into mem at offset (blocking)."""
        cdef const unsigned char[::1] view = memoryview(data).cast("B")
        cdef size_t n = view.shape[0]
        if offset + n > mem.size:
            raise OpenCLError(f"write of {n} bytes at {offset} exceeds a {mem.size}-byte buffer")
        if n:
            _check(gpo_write(self.c, mem.m, offset, n, &view[0]))

    def read_into(self, Mem mem, size_t offset, out):
        """Copy len(out) bytes from mem at offset into writable buffer `out` (blocking)."""
        cdef unsigned char[::1] view = memoryview(out).cast("B")
        cdef size_t n = view.shape[0]
        if offset + n > mem.size:
            raise OpenCLError(f"read of {n} bytes at {offset} exceeds a {mem.size}-byte buffer")
        if n:
            _check(gpo_read(self.c, mem.m, offset, n, &view[0]))

    def read(self, Mem mem, size_t offset, size_t size):
        out = bytearray(size)
        self.read_into(mem, offset, out)
        return bytes(out)

    def copy(self, Mem src, size_t src_offset, Mem dst, size_t dst_offset, size_t size):
        """Queue a device-to-device copy."""
        if src_offset + size > src.size or dst_offset + size > dst.size:
            raise OpenCLError(f"copy of {size} bytes exceeds a buffer")
        _check(gpo_copy(self.c, src.m, src_offset, dst.m, dst_offset, size))

    def build(self, source, options=""):
        """Compile OpenCL C `source`; BuildError carries the log on failure."""
        cdef void * p = NULL
        cdef char * log = NULL
        cdef bytes src = source.encode()
        cdef bytes opt = options.encode()
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

    def enqueue(self, Kernel kernel, global_size, local_size=None):
        """Queue `kernel` over an NDRange of 1 to 3 dimensions."""
        cdef size_t g[3]
        cdef size_t l[3]
        cdef unsigned dims = len(global_size)
        if not 1 <= dims <= 3:
            raise ValueError("1 to 3 work dimensions")
        for i in range(dims):
            g[i] = global_size[i]
            if local_size is not None:
                l[i] = local_size[i]
        _check(gpo_enqueue(self.c, kernel.k, dims, g, NULL if local_size is None else l),
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

    def wait_event(self, Event ev):
        """Make work queued from now on wait for `ev` (it may come from another queue
        of the same context)."""
        if ev.e != NULL:
            _check(gpo_wait_event(self.c, ev.e))


cdef class Mem:
    """A device memory object; released when the last reference goes."""
    cdef void * m
    cdef readonly size_t size
    cdef readonly DeviceContext ctx      # keeps the context alive past the buffer

    def __dealloc__(self):
        gpo_mem_release(self.m)

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
        _check(gpo_kernel_create(self.p, name.encode(), &k))
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
        for a in args:
            if isinstance(a, Mem):
                _check(gpo_kernel_arg_mem(self.k, i, (<Mem>a).m), f"kernel {self.name}")
            else:
                view = memoryview(a).cast("B")
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
