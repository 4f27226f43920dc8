"""Tensor memory of the CPU backend: which buffers a thread may read and write, and
numpy views of tensors inside them.

Tensors live in host buffers (Buffer.memory, a numpy byte array). Device buffers
(ggml_py.backends.numpy_device) keep their bytes off Buffer.memory so that host code
cannot read them; a device's worker thread opens its own buffer type here so that the
CPU kernels may run on device memory there.
"""

import threading

import numpy as np

from ggml_py._backend import Buffer, get_buffer, tensor_ndarray
from ggml_py._core import instance_arg
from ggml_py.errors import BackendError
from ggml_py import quants

_thread = threading.local()


def open_device_memory(buffer_type):
    """Let the calling thread's kernels use buffers of the non-host `buffer_type`."""
    _thread.device_buft = buffer_type


def memory_of(buf):
    """The numpy bytes behind `buf` that the calling thread may use, or None."""
    instance_arg(buf, Buffer, "buffer")
    if buf.memory is not None:
        return buf.memory
    if getattr(_thread, "device_buft", None) is buf.buffer_type:
        return buf.device_memory
    return None


def tensor_array(t):
    """A numpy view of t's memory, numpy order (ne3, ne2, ne1, ne0) with t's strides.

    Block types (q8_0, ...) give uint8 rows: (ne3, ne2, ne1, row bytes)."""
    buf = get_buffer(t)
    if buf is None:
        raise BackendError(f"tensor '{t.name}' ({t.op}) is not allocated")
    mem = memory_of(buf)
    if mem is None:
        raise BackendError(f"tensor '{t.name}' lives in buffer type '{buf.buffer_type.name}', "
                           "which has no host memory")
    type_name = t.type
    dtype = quants.PLAIN_DTYPES.get(type_name)
    if dtype is not None:
        return tensor_ndarray(t, mem, dtype)
    if quants.is_quantized(type_name):
        return tensor_ndarray(t, mem, np.uint8, quants.row_bytes(type_name, t.ne[0]))
    raise BackendError(f"tensor '{t.name}': type {type_name} is not supported by the CPU backend")
