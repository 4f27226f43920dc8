"""numpy arrays in and out of tensors: the one conversion between a tensor's values and a
numpy array, wherever the tensor lives (host memory, the numpy device, OpenCL, RPC: the
bytes go through the buffer's slots, `tensor_set` / `tensor_get`).

`write(t, array)` checks the array's shape against the tensor's, in numpy order (leading
dimensions of 1 aside: ggml has four dimensions, numpy as many as were written), and its
dtype against the tensor's type, then stores it in the tensor's type:

  * f32, f64: any float, integer or bool array, cast by numpy (float64 -> float32 rounds
    to nearest);
  * f16, bf16 and the block types (q8_0, q4_K, ...): float, integer or bool values,
    through float32 and ggml's rounding (`quants.from_f32`: f16 and bf16 round to nearest
    even; block types go through ggml's reference quantiser, as `ggml_quantize_chunk`).
    A float16 array into an f16 tensor is stored as it is; a uint8 array shaped
    (..., row bytes) into a block type is taken as the stored rows;
  * i8 ... i64: integer or bool arrays whose values fit the type.

Anything else is an error naming the tensor, its type and shape and the array's dtype
and shape. `read(t)` gives the values as a numpy array of the tensor's numpy shape:
float32, float16, float64 or the integer type as stored, float32 for bf16 and the block
types (ggml's to_float); a copy, or with `copy=False` a read-only view of host memory
where no conversion is needed (valid until the memory is written again: the next compute).
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from ggml_py import quants
from ggml_py._backend import (allocated_buffer, mark_written, tensor_get, tensor_ndarray,
                              tensor_set)
from ggml_py._core import Tensor, ggml_type, instance_arg
from ggml_py.errors import ArgumentError, ArgumentTypeError, NotSupportedError

# the numpy dtype a value of each plain type is read as (bf16 has none: float32)
_READ_DTYPES: dict[str, np.dtype] = {k: v for k, v in quants.PLAIN_DTYPES.items() if k != "bf16"}
_FLOAT_TYPES = ("f32", "f64", "f16", "bf16")


def describe(t: Tensor) -> str:
    """'x' (f32, shape (8, 64)): how errors name a tensor, its shape in numpy order."""
    instance_arg(t, Tensor, "tensor")
    return f"'{t.name}' ({t.type}, shape {t.shape})"


def numpy_dtype(type: Any) -> np.dtype:
    """The numpy dtype `read` gives for tensors of `type` (a ggml name or a numpy dtype):
    the stored one for f32, f16, f64 and the integer types, float32 for bf16 and the
    block types."""
    return _READ_DTYPES.get(ggml_type(type), np.dtype(np.float32))


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without its leading 1s (what numpy order adds or drops: ggml has 4 dims)."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return tuple(shape[k:])


def _stored_layout(t: Tensor) -> tuple[np.dtype, int]:
    """(numpy dtype of the stored elements, row bytes for block types else 0)."""
    if quants.is_quantized(t.type):
        return np.dtype(np.uint8), quants.row_bytes(t.type, t.ne[0])
    dtype = quants.PLAIN_DTYPES.get(t.type)
    if dtype is None:
        raise NotSupportedError(f"tensor {describe(t)}: ggml_py has no numpy form of {t.type}")
    return dtype, 0


def _strided(t: Tensor, raw: Any, dtype: np.dtype, row_bytes: int) -> np.ndarray:
    """The tensor's stored elements inside `raw`, its bytes from the first (tensor_get's),
    as a 4-d array (ne3, ne2, ne1, ne0 or row bytes) with its strides."""
    ne, nb = t.ne, t.nb
    last = row_bytes or ne[0]
    shape = (ne[3], ne[2], ne[1], last)
    if 0 in shape:
        return np.zeros(shape, dtype)
    strides = (nb[3], nb[2], nb[1], 1 if row_bytes else nb[0])
    return np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)


def _stored_view(t: Tensor) -> tuple[np.ndarray, bool]:
    """(the stored elements as a 4-d array, whether it is a view of host memory)."""
    buf = allocated_buffer(t)
    dtype, row_bytes = _stored_layout(t)
    memory = buf.memory
    if memory is not None:
        return tensor_ndarray(t, memory, dtype, row_bytes), True
    return _strided(t, tensor_get(t), dtype, row_bytes), False


def read(t: Tensor, dtype: Any = None, copy: bool = True) -> np.ndarray:
    """The tensor's values as a numpy array of its numpy-order shape (see the module).
    `dtype` (anything numpy takes) converts them; `copy=False` gives a read-only view of
    host memory where the values need no conversion, else a new array."""
    instance_arg(t, Tensor, "tensor")
    stored, is_view = _stored_view(t)
    fresh = False               # a new array of ours (else a view: of host memory or bytes)
    out = stored
    if t.type not in _READ_DTYPES:
        out, fresh = quants.to_f32(t.type, np.ascontiguousarray(stored)), True
    if dtype is not None and np.dtype(dtype) != out.dtype:
        out, fresh = out.astype(np.dtype(dtype)), True
    if is_view and not fresh and not copy:
        out = out.reshape(t.shape)
        out.flags.writeable = False
        return out
    if not fresh:
        out = np.array(out)
    return out.reshape(t.shape)


def _refuse(t: Tensor, arr: np.ndarray, why: str, cls: type = ArgumentTypeError) -> NoReturn:
    raise cls(f"tensor {describe(t)}: cannot take a {arr.dtype} array of shape {arr.shape}: "
              f"{why}")


def to_stored(t: Tensor, array: Any) -> np.ndarray:
    """`array` checked against the tensor and converted to its stored form: a C-contiguous
    4-d array (ne3, ne2, ne1, ne0), or (ne3, ne2, ne1, row bytes) of uint8 for block types."""
    instance_arg(t, Tensor, "tensor")
    arr = np.asarray(array)
    type_name = t.type
    ne = t.ne
    full = (ne[3], ne[2], ne[1], ne[0])
    block = quants.is_quantized(type_name)
    if block and arr.dtype == np.uint8:
        rb = quants.row_bytes(type_name, ne[0])
        if _dims(arr.shape) != _dims(full[:3] + (rb,)):
            _refuse(t, arr, f"a uint8 array into a {type_name} tensor is its stored rows, "
                            f"shape {t.shape[:-1] + (rb,)} "
                            f"({rb} bytes a row); pass float values to have them quantised",
                    ArgumentError)
        return np.ascontiguousarray(arr).reshape(full[:3] + (rb,))
    if _dims(arr.shape) != _dims(full):
        _refuse(t, arr, "the shapes differ (numpy order; leading 1s aside)", ArgumentError)
    kind = arr.dtype.kind
    if type_name in _FLOAT_TYPES or block:
        if kind not in "fiub":
            _refuse(t, arr, f"{type_name} holds real numbers")
        if type_name in ("f32", "f64"):
            return np.ascontiguousarray(arr, dtype=quants.PLAIN_DTYPES[type_name]).reshape(full)
        if type_name == "f16" and arr.dtype == np.float16:
            return np.ascontiguousarray(arr).reshape(full)
        x = np.ascontiguousarray(arr, dtype=np.float32).reshape(full)
        y = np.ascontiguousarray(quants.from_f32(type_name, x, cpu=False))
        return y.view(np.uint8).reshape(full[:3] + (-1,)) if block else y
    want = quants.PLAIN_DTYPES.get(type_name)
    if want is None or want.kind not in "iu":
        _refuse(t, arr, f"ggml_py has no numpy form of {type_name}", ArgumentError)
    if kind not in "iub":
        _refuse(t, arr, f"{type_name} holds integers; round the values first "
                        f"(np.rint(a).astype(np.{want.name}))")
    if arr.size and not np.can_cast(arr.dtype, want, "safe"):
        info = np.iinfo(want)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            _refuse(t, arr, f"values from {lo} to {hi} do not fit {type_name} "
                            f"[{info.min}, {info.max}]", ArgumentError)
    return np.ascontiguousarray(arr, dtype=want).reshape(full)


def write(t: Tensor, array: Any) -> None:
    """Store `array` (checked and converted: see the module) as the tensor's values, where
    it lives. A tensor with gaps between its elements (a strided view) has only its
    elements written."""
    stored = to_stored(t, array)
    if t.is_contiguous:
        tensor_set(t, stored)
        return
    buf = allocated_buffer(t)
    dtype, row_bytes = _stored_layout(t)
    if buf.memory is not None:
        tensor_ndarray(t, buf.memory, dtype, row_bytes)[...] = stored
        mark_written(t)
        return
    raw = bytearray(tensor_get(t))
    _strided(t, raw, dtype, row_bytes)[...] = stored
    tensor_set(t, raw)
