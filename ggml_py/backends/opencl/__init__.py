"""An OpenCL backend: device buffers, copies, events and a kernel per graph node.

The OpenCL library is opened at run time by a small C shim (ggml_py.backends.opencl._shim), so the
backend is simply unavailable -- OpenCLUnavailable, with the reason -- where there is
no library, platform or device. Layout follows ggml's OpenCL backend:

  * buffer type 'OpenCL' (not host): each buffer is one cl_mem; its `base` is a fake,
    aligned, non-null address, and a tensor's place in the cl_mem is
    data_address - base, so ggml's allocators work on it unchanged;
  * one context and one in-order queue per device, shared by every backend object on
    that device; graph_compute queues a kernel per node in graph order (views need
    none) and returns without waiting: synchronize(), get_tensor or an event wait;
  * the kernels (kernels.py) compute in f32; supports_op says yes exactly for
    the types, shapes and layouts they handle, so the scheduler sends the rest to the CPU.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from ggml_py._backend import (Backend, Buffer, BufferType, allocated_buffer, byte_value,
                              fake_address, get_buffer, graph_nodes, host_bytes, tensor_span,
                              OTHER_MEMORY_HINT)
from ggml_py._core import (EMPTY_OPS, ROPE_TYPES, Tensor, acc_region_end, instance_arg, size_arg,
                           type_id, type_size)
from ggml_py.errors import ArgumentTypeError, BackendError
from ggml_py.numerics import alibi_bases, bits_f32, rope_theta_scale, rope_yarn_corr_dims
from ggml_py.backends.opencl import kernels as K
from ggml_py._supports import acc_offsets, use_rule

if TYPE_CHECKING:
    from ggml_py._core import Tensor

_IMPORT_ERROR = ""
if TYPE_CHECKING:
    from ggml_py.backends.opencl import _shim
    from ggml_py.backends.opencl._shim import OpenCLUnavailable, OpenCLError, BuildError
else:
    try:
        from ggml_py.backends.opencl import _shim
        from ggml_py.backends.opencl._shim import OpenCLUnavailable, OpenCLError, BuildError
    except ImportError as _e:                      # a build without the extension
        _shim = None
        _IMPORT_ERROR = str(_e)

        class OpenCLUnavailable(BackendError):
            pass

        class OpenCLError(BackendError):
            pass

        class BuildError(OpenCLError):
            pass

__all__ = ["OpenCLBackend", "OpenCLBufferType", "OpenCLBuffer", "OpenCLEvent", "list_devices",
           "device_info", "is_cpu_device", "auto_backend", "available", "memory_in_use", "set_memory_limit", "OpenCLUnavailable",
           "OpenCLError", "BuildError"]


# kernel-side element type codes: ggml's type ids, handed to the program as -D options
TYPE_CODES = {name: type_id(name) for name in ("f32", "f16", "q8_0", "i32", "i64")}
BUILD_OPTIONS = " ".join(["-cl-std=CL1.2"] + [f"-DT_{n.upper()}={c}" for n, c in TYPE_CODES.items()])

BINARY_CODES, MAP_CODES = K.BINARY_CODES, K.MAP_CODES
_CL_DEVICE_TYPE_CPU = 1 << 1      # CL_DEVICE_TYPE_CPU (also without the extension built)


def _require_module():
    if _shim is None:
        raise OpenCLUnavailable(f"the OpenCL extension module is not built ({_IMPORT_ERROR})")


def available() -> tuple[bool, str]:
    """(True, library path) when an OpenCL device can be used, else (False, reason)."""
    try:
        _require_module()
        path = _shim.load()
        n = _shim.device_count()
    except OpenCLUnavailable as e:
        return False, str(e)
    if n == 0:
        return False, f"no OpenCL device found (library {path})"
    return True, path


def list_devices() -> list[dict[str, Any]]:
    """Info dicts of every OpenCL device (empty when OpenCL is unavailable)."""
    ok, _ = available()
    if not ok:
        return []
    return [_shim.device_info(i) for i in range(_shim.device_count())]


def is_cpu_device(info: dict[str, Any]) -> bool:
    """Whether a device (its info dict) is the host CPU under OpenCL (CL_DEVICE_TYPE_CPU,
    as PoCL's 'pthread' device): kernels emulated on the cores the CPU backend uses."""
    return bool(info["device_type"] & _CL_DEVICE_TYPE_CPU)


def auto_backend() -> OpenCLBackend:
    """`--device auto`'s OpenCL backend: on the first device that is not the host CPU
    (is_cpu_device). OpenCLUnavailable says why not: no OpenCL, or only CPU-emulated
    devices, which run the graph far slower than the numpy device on the same cores."""
    ok, why = available()
    if not ok:
        raise OpenCLUnavailable(why)
    infos = list_devices()
    for info in infos:
        if not is_cpu_device(info):
            return OpenCLBackend(info["index"])
    raise OpenCLUnavailable(
        "only CPU-emulated OpenCL here (" + ", ".join(f"'{i['name']}' of {i['platform']}"
                                                      for i in infos)
        + ": CL_DEVICE_TYPE_CPU), slower than the numpy device; --device opencl uses it")


def device_info(device: int | str = 0) -> dict[str, Any]:
    """What OpenCL says of a device (an index or a name): its name, platform, vendor,
    versions, memory sizes, compute units and work-group size."""
    return _shim.device_info(_device_index(device))


def memory_in_use(device=0):
    """Bytes of device memory ggml_py holds on an OpenCL device (index or name)."""
    return _shim.memory_in_use(_device_index(device))


def set_memory_limit(device, limit):
    """Let ggml_py allocate at most `limit` bytes on the device (None: its global memory,
    the default); buffers past it raise AllocationError, as past the device's memory."""
    _shim.set_memory_limit(_device_index(device), limit)


def _device_index(device):
    """A device index from an int or a substring of the device (or platform) name."""
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise ArgumentTypeError(f"an OpenCL device is given by index or name, got "
                                f"{type(device).__name__}")
    _require_module()
    n = _shim.device_count()
    if n == 0:
        raise OpenCLUnavailable(f"no OpenCL device found (library {_shim.load()})")
    if isinstance(device, int):
        if not 0 <= device < n:
            raise OpenCLUnavailable(f"no OpenCL device {device} (there are {n})")
        return device
    infos = [_shim.device_info(i) for i in range(n)]
    for info in infos:
        if device.lower() in (info["name"] + " " + info["platform"]).lower():
            return info["index"]
    raise OpenCLUnavailable(f"no OpenCL device matches {device!r}; devices: "
                            + ", ".join(i["name"] for i in infos))


# ---------------------------------------------------------------------------
# devices, buffer types and buffers

class _Device:
    """Per-device state shared by all backends on it: context + queue, buffer type and
    (built on first use) the program and its kernels."""

    _cache: dict[int, _Device] = {}

    def __init__(self, index):
        self.index = index
        self.info = _shim.device_info(index)
        self.ctx = _shim.DeviceContext(index)
        self.name = "OpenCL" if index == 0 else f"OpenCL{index}"
        self.buffer_type = OpenCLBufferType(self)
        self.program = None
        self.kernels = None

    @classmethod
    def get(cls, index):
        if index not in cls._cache:
            cls._cache[index] = cls(index)
        return cls._cache[index]

    def kernel(self, name):
        if self.kernels is None:
            self.program = self.ctx.build(K.SOURCE, BUILD_OPTIONS)
            self.kernels = {k: self.program.kernel(k) for k in K.KERNELS}
        return self.kernels[name]


class OpenCLBuffer(Buffer):
    """A Buffer whose memory is a cl_mem (`mem`); `memory` stays None: not host memory.
    Its byte slots are blocking reads and writes on the device's in-order queue."""

    def __init__(self, buffer_type, size, base, mem):
        super().__init__(buffer_type, size, base)
        self.mem = mem

    def release(self):
        super().release()
        self.mem = None             # the device memory goes back once queued work is done

    def place(self, tensor, offset=0, size=None):
        """(cl_mem, byte offset, size) of the bytes [offset, offset + size) of `tensor`,
        which must be in this buffer."""
        if get_buffer(tensor) is not self:
            raise BackendError(f"tensor '{tensor.name}' is not in this {self.buffer_type.name} "
                               "buffer")
        if self.mem is None:
            raise BackendError(f"the {self.buffer_type.name} buffer of tensor '{tensor.name}' "
                               "was released")
        start, n = tensor_span(tensor, offset, size)
        return self.mem, start, n

    @property
    def _ctx(self):
        return self.buffer_type._dev.ctx

    def set_tensor(self, tensor, data, offset=0):
        mem, off, _ = self.place(tensor, offset, memoryview(data).nbytes)
        self._ctx.write(mem, off, data)

    def get_tensor(self, tensor, offset=0, size=None):
        mem, off, n = self.place(tensor, offset, size)
        return self._ctx.read(mem, off, n)

    def memset_tensor(self, tensor, value, offset=0, size=None):
        mem, off, n = self.place(tensor, offset, size)
        self._ctx.write(mem, off, np.full(n, byte_value(value), np.uint8))

    def cpy_tensor(self, src, dst):
        """dst (here) = src on the device when src is in this device's memory too."""
        sbuf = get_buffer(src)
        if not isinstance(sbuf, OpenCLBuffer) or sbuf.buffer_type._dev is not self.buffer_type._dev:
            return False
        smem, soff, n = sbuf.place(src)
        dmem, doff, _ = self.place(dst)
        self._ctx.copy(smem, soff, dmem, doff, n)
        return True

    def clear(self, value=0):
        if self.mem is not None and self.size:
            self._ctx.write(self.mem, 0, np.full(self.size, byte_value(value), np.uint8))


class OpenCLBufferType(BufferType):
    """Device memory of one OpenCL device (ggml's 'OpenCL' buffer type)."""

    def __init__(self, device):
        instance_arg(device, _Device, "device")
        info = device.info
        align = max(info["base_addr_align_bits"] // 8, 1) if info["base_addr_align_bits"] else 128
        super().__init__(device.name, alignment=align, max_size=info["max_alloc"] or None,
                         is_host=False, device=device.name)
        self._dev = device

    def alloc_buffer(self, size):
        """A zeroed buffer of `size` bytes; AllocationError past the device's largest
        allocation or its memory (see set_memory_limit), or when the driver refuses."""
        size = size_arg(size, f"buffer type '{self.name}': size")
        mem = self._dev.ctx.alloc(size)
        return OpenCLBuffer(self, size, fake_address(size, self.alignment), mem)


# ---------------------------------------------------------------------------
# kernel arguments

def _i32(v):
    return struct.pack("<i", int(v))


def _f32(v):
    return struct.pack("<f", float(v))


def _u64(v):
    return struct.pack("<Q", int(v))


def _code(t):
    return _i32(TYPE_CODES[t.type])


def _round_up(n, m):
    return (n + m - 1) // m * m


def _f(t, i):
    return bits_f32(t.op_params[i])


def _alibi_args(n_head, max_bias):
    """m0, m1 and n_head_log2 of ggml's ALiBi slopes; the bases in f32, as the CPU."""
    m0, m1, n_head_log2 = alibi_bases(n_head, max_bias)
    return [_f32(m0), _f32(m1), _i32(n_head_log2)]


# ---------------------------------------------------------------------------
# the backend

class OpenCLEvent:
    """A backend event: the marker of the last event_record (None before)."""

    def __init__(self, backend):
        self.backend = backend
        self.marker = None


def _refused(t: Tensor) -> str:
    """What graph_compute was asked to run: the node and the types, shapes and layouts
    of its sources, which the OpenCL rule (_supports.pyx) refused."""
    def one(x):
        return f"{x.type} {list(x.ne)}" + ("" if x.is_contiguous else " (not contiguous)")
    srcs = ", ".join(f"src{j} '{x.name}' {one(x)}" for j, x in enumerate(t.src) if x is not None)
    why = ""
    if t.op == "ACC" and t.src[1] is not None and acc_offsets(t) is None:
        end = acc_region_end(t)
        why = (f"; src1 lands on bytes up to {end}, past the {t.nbytes} of src0" if end > t.nbytes
               else "; its offset and strides are not whole f32 elements")
    return f"op {t.op} '{t.name}' ({one(t)}) from {srcs or 'no sources'}{why}"


class OpenCLBackend(Backend):
    """ggml's OpenCL backend on one device: OpenCLBackend(0) or OpenCLBackend('pthread')."""

    def __init__(self, device: int | str = 0) -> None:
        _require_module()
        dev = _Device.get(_device_index(device))
        super().__init__(dev.name, dev.buffer_type, device_type="gpu")
        use_rule(self, "opencl")        # supports_op: the kernels' rule, in C
        self._dev = dev

    @property
    def device(self) -> dict[str, Any]:
        """The device's info dict (name, vendor, version, global_mem, max_alloc, ...)."""
        return dict(self._dev.info)

    def build(self):
        """Compile the kernels now (otherwise the first graph_compute does)."""
        self._dev.kernel(K.KERNELS[0])

    # --- tensors in device memory ---

    def _place(self, t):
        """(cl_mem, byte offset) of tensor t, which must live in this device's memory."""
        buf = allocated_buffer(t)
        if not isinstance(buf, OpenCLBuffer) or buf.buffer_type._dev is not self._dev:
            raise BackendError(f"{self.name}: tensor '{t.name}' lives in buffer type "
                               f"'{buf.buffer_type.name}', not in this device's memory"
                               f"{OTHER_MEMORY_HINT}")
        mem, off, _ = buf.place(t)
        return mem, off

    def _targs(self, t):
        """The four kernel arguments of TENSOR(x). The span is checked against the cl_mem
        here because a kernel reading past it could bring the process down."""
        mem, off = self._place(t)
        if off + t.nbytes > mem.size:
            raise BackendError(f"{self.name}: tensor '{t.name}' ({t.nbytes} bytes at offset "
                               f"{off}) reaches past its {mem.size}-byte buffer")
        return [mem, _u64(off), struct.pack("<4q", *t.ne), struct.pack("<4Q", *t.nb)]

    def cpy_tensor_async(self, backend_src, src, dst):
        """dst (here) = src: device-to-device on this context, or from/to host memory.
        False for layouts or memories it cannot copy (the caller then copies itself)."""
        instance_arg(backend_src, Backend, "backend_src")
        instance_arg(src, Tensor, "src")
        instance_arg(dst, Tensor, "dst")
        if src.nbytes != dst.nbytes or not (src.is_contiguous and dst.is_contiguous):
            return False
        sbuf, dbuf = get_buffer(src), get_buffer(dst)
        if sbuf is None or dbuf is None:
            return False
        d_dev = isinstance(dbuf, OpenCLBuffer) and dbuf.buffer_type._dev is self._dev
        if d_dev:
            if dbuf.cpy_tensor(src, dst):
                return True
            src_bytes = host_bytes(src)
            if src_bytes is None:
                return False
            dbuf.set_tensor(dst, src_bytes)
            return True
        s_dev = isinstance(sbuf, OpenCLBuffer) and sbuf.buffer_type._dev is self._dev
        dst_bytes = host_bytes(dst)
        if s_dev and dst_bytes is not None:
            smem, soff = self._place(src)
            self._dev.ctx.read_into(smem, soff, dst_bytes)
            return True
        return False

    # --- synchronisation ---

    def synchronize(self):
        self._dev.ctx.finish()

    def event_new(self):
        return OpenCLEvent(self)

    def event_record(self, event):
        """Mark `event` as reached when the work queued here so far is done (a marker)."""
        instance_arg(event, OpenCLEvent, "event").marker = self._dev.ctx.marker()

    def event_wait(self, event):
        """Work queued here from now on waits for `event` (recorded on any backend)."""
        if instance_arg(event, OpenCLEvent, "event").marker is None:
            return
        if event.marker.ctx is self._dev.ctx:
            self._dev.ctx.wait_event(event.marker)
        else:                                      # another context: wait on the host
            event.marker.synchronize()

    def event_synchronize(self, event):
        """Block until `event`'s last record is reached (none: return at once)."""
        if instance_arg(event, OpenCLEvent, "event").marker is not None:
            event.marker.synchronize()

    # --- compute ---

    def graph_compute(self, graph):
        """Queue a kernel for every node of `graph` (a Graph or a list of nodes), in order.
        Returns without waiting for the device."""
        nodes = graph_nodes(graph)
        for t in nodes:
            if t.op in EMPTY_OPS:
                continue
            if not self.supports_op(t):
                raise BackendError(f"{self.name}: no kernel here runs {_refused(t)} "
                                   "(supports_op is False: run it on a CPU backend, or through "
                                   "a Scheduler, which sends it to one)")
            self._compute_node(t)
        return True

    def _launch(self, name, args, n):
        """A 1-D launch over n items in groups of WG."""
        if n == 0:
            return
        k = self._dev.kernel(name)
        k.set_args(args)
        self._dev.ctx.enqueue(k, (_round_up(n, K.WG),), (K.WG,))

    def _launch_rows(self, name, args, nrows):
        """One work-group of WG items per row."""
        if nrows == 0:
            return
        k = self._dev.kernel(name)
        k.set_args(args)
        self._dev.ctx.enqueue(k, (nrows * K.WG,), (K.WG,))

    def _compute_node(self, t):
        o = t.op
        srcs = t.src
        a = srcs[0] if srcs else None               # ARANGE has no source
        n = t.nelements
        T = self._targs
        if o in ("DUP", "CONT", "CPY"):
            if t.type == "q8_0":
                self._launch("k_cpy_q8_0", T(a) + [_code(a)] + T(t) + [_u64(n // 32)], n // 32)
            else:
                self._launch("k_cpy", T(a) + [_code(a)] + T(t) + [_code(t), _i32(type_size(t.type)),
                                                                  _i32(0), _u64(n)], n)
        elif o == "REPEAT":
            self._launch("k_cpy", T(a) + [_code(a)] + T(t) + [_code(t), _i32(type_size(t.type)),
                                                              _i32(1), _u64(n)], n)
        elif o == "CONCAT":
            self._launch("k_concat", [_i32(t.op_params[0])] + T(a) + T(srcs[1]) + T(t)
                         + [_i32(type_size(t.type)), _u64(n)], n)
        elif o == "DIAG_MASK_INF":
            self._launch("k_diag_mask_inf", [_i32(t.op_params[0])] + T(a) + T(t) + [_u64(n)], n)
        elif o in ("SUM_ROWS", "MEAN"):
            self._launch_rows("k_sum_rows", [_i32(o == "MEAN")] + T(a) + T(t),
                              a.ne[1] * a.ne[2] * a.ne[3])
        elif o == "SET_ROWS":
            c = srcs[1]
            if t.type == "q8_0":
                nblocks = a.nelements // 32
                self._launch("k_set_rows_q8_0", T(a) + T(c) + [_code(c)] + T(t) + [_u64(nblocks)],
                             nblocks)
            else:
                self._launch("k_set_rows", T(a) + T(c) + [_code(c)] + T(t)
                             + [_code(t), _u64(a.nelements)], a.nelements)
        elif o in ("ARGSORT", "TOP_K"):
            desc = o == "TOP_K" or t.op_params[0] == 1
            swap01 = o == "TOP_K" and t.ne[0] > 1
            self._launch_rows("k_argsort", [_i32(desc), _i32(swap01)] + T(a) + T(t),
                              a.ne[1] * a.ne[2] * a.ne[3])
        elif o == "SUM":
            self._launch_rows("k_sum", T(a) + T(t) + [_u64(a.nelements)], 1)
        elif o == "ACC":
            b = srcs[1]
            self._launch("k_cpy", T(a) + [_code(a)] + T(t) + [_code(t), _i32(4), _i32(0), _u64(n)],
                         n)
            self._launch("k_acc", [struct.pack("<4q", *acc_offsets(t))] + T(a) + T(b) + T(t)
                         + [_u64(b.nelements)], b.nelements)
        elif o == "PAD":
            p = t.op_params
            self._launch("k_pad", [_i32(p[8]), struct.pack("<4q", p[0], p[2], p[4], p[6])] + T(a)
                         + [_code(a)] + T(t) + [_code(t), _u64(n)], n)
        elif o == "ARANGE":
            self._launch("k_arange", [_f32(_f(t, 0)), _f32(_f(t, 2))] + T(t) + [_u64(n)], n)
        elif o == "TIMESTEP_EMBEDDING":
            dim, max_period = t.op_params[0], t.op_params[1]
            neg_log = -np.log(np.float32(max_period))       # in f32, as the CPU
            self._launch("k_timestep_embedding", [_f32(neg_log), _i32(dim // 2)] + T(a) + T(t)
                         + [_u64(n)], n)
        elif o == "FLASH_ATTN_EXT":
            self._flash_attn(t, srcs)
        elif o in BINARY_CODES:
            b = srcs[1]
            self._launch("k_binary", [_i32(BINARY_CODES[o])] + T(a) + [_code(a)] + T(b) + [_code(b)]
                         + T(t) + [_code(t), _u64(n)], n)
        elif o in MAP_CODES or o == "UNARY":
            code = t.op_params[0] if o == "UNARY" else MAP_CODES[o]
            p0 = p1 = 0.0
            if o in ("SCALE", "CLAMP"):
                p0, p1 = _f(t, 0), _f(t, 1)
            self._launch("k_map1", [_i32(code), _f32(p0), _f32(p1)] + T(a) + [_code(a)] + T(t)
                         + [_code(t), _u64(n)], n)
        elif o == "GLU":
            b = srcs[1] if len(srcs) > 1 and srcs[1] is not None else None
            p = t.op_params
            self._launch("k_glu", [_i32(p[0]), _i32(p[1]), _i32(b is not None), _f32(_f(t, 2)),
                                   _f32(_f(t, 3))] + T(a) + [_code(a)] + T(b if b is not None else a)
                         + [_code(b if b is not None else a)] + T(t) + [_code(t), _u64(n)], n)
        elif o in ("NORM", "RMS_NORM"):
            self._launch_rows("k_norm", [_i32(o == "RMS_NORM"), _f32(_f(t, 0))] + T(a) + T(t),
                              n // max(t.ne[0], 1))
        elif o == "SOFT_MAX":
            self._soft_max(t, a, srcs)
        elif o == "ROPE":
            self._rope(t, a, srcs)
        elif o == "GET_ROWS":
            self._launch("k_get_rows", T(a) + [_code(a)] + T(srcs[1]) + T(t) + [_code(t), _u64(n)], n)
        elif o == "MUL_MAT":
            self._mul_mat(t, a, srcs[1])
        elif o == "MUL_MAT_ID":
            self._launch("k_mul_mat_id", T(a) + [_code(a)] + T(srcs[1]) + [_code(srcs[1]), _i32(a.type == "f16")]
                         + T(srcs[2]) + T(t) + [_u64(n)], n)
        else:                                      # supports_op and this list disagree
            raise BackendError(f"{self.name}: no kernel for {o} ('{t.name}')")

    def _optional(self, x, stand_in):
        """TENSOR(x) and a has-x flag; an absent x passes stand_in (never read)."""
        return self._targs(x if x is not None else stand_in), _i32(x is not None)

    def _soft_max(self, t, a, srcs):
        mask = srcs[1] if len(srcs) > 1 else None
        sinks = srcs[2] if len(srcs) > 2 else None
        scale, max_bias = _f(t, 0), _f(t, 1)
        m_args, has_m = self._optional(mask, a)
        s_args, has_s = self._optional(sinks, a)
        args = (self._targs(a) + m_args + [_code(mask if mask is not None else a), has_m]
                + s_args + [has_s] + self._targs(t)
                + [_f32(scale), _f32(max_bias)] + _alibi_args(a.ne[2], max_bias))
        self._launch_rows("k_soft_max", args, a.ne[1] * a.ne[2] * a.ne[3])

    def _flash_attn(self, t, srcs):
        q, k, v = srcs[0], srcs[1], srcs[2]
        mask = srcs[3] if len(srcs) > 3 else None
        sinks = srcs[4] if len(srcs) > 4 else None
        scale, max_bias, softcap = _f(t, 0), _f(t, 1), _f(t, 2)
        if softcap != 0.0:                          # tanh(x * scale / softcap) * softcap
            scale = np.float32(scale) / np.float32(softcap)
        m_args, has_m = self._optional(mask, q)
        s_args, has_s = self._optional(sinks, q)
        T = self._targs
        args = (T(q) + T(k) + T(v) + m_args + [_code(mask if mask is not None else q), has_m]
                + s_args + [has_s] + T(t) + [_f32(scale), _f32(softcap), _f32(max_bias)]
                + _alibi_args(q.ne[2], max_bias))
        self._launch_rows("k_flash_attn", args, q.ne[1] * q.ne[2] * q.ne[3])

    def _rope(self, t, a, srcs):
        p = t.op_params
        n_dims, mode, n_ctx_orig = p[1], p[2], p[4]
        fb, fs, ef, af, bf, bs = (bits_f32(p[i]) for i in range(5, 11))
        F = np.float32
        theta_scale = rope_theta_scale(fb, n_dims)
        lo, hi = rope_yarn_corr_dims(n_dims, n_ctx_orig, fb, bf, bs)
        mscale = F(af)
        if ef != 0.0:
            mscale = F(mscale * (F(1.0) + F(0.1) * np.log(F(1.0) / F(fs))))
        ff = srcs[2] if len(srcs) > 2 else None
        T = self._targs
        n = a.ne[0] // 2 * a.ne[1] * a.ne[2] * a.ne[3]
        args = (T(a) + [_code(a)] + T(srcs[1]) + T(ff if ff is not None else a)
                + [_i32(ff is not None)] + T(t) + [_code(t), _i32(n_dims),
                                                    _i32(mode == ROPE_TYPES["NEOX"]),
                                                    _f32(theta_scale), _f32(fs), _f32(ef),
                                                    _f32(mscale), _f32(lo), _f32(hi), _u64(n)])
        self._launch("k_rope", args, n)

    def _mul_mat(self, t, a, b):
        M, N = a.ne[1], b.ne[1]
        batches = b.ne[2] * b.ne[3]
        if M == 0 or N == 0 or batches == 0:
            return
        k = self._dev.kernel("k_mul_mat")
        T = self._targs
        k.set_args(T(a) + [_code(a)] + T(b) + [_code(b), _i32(a.type == "f16")] + T(t))
        self._dev.ctx.enqueue(k, (_round_up(M, K.TS), _round_up(N, K.TS), batches),
                              (K.TS, K.TS, 1))
