"""The `cuda` device kind: ggml 0.10.1's CUDA backend (llama.cpp's `CUDA0`, `CUDA1`, ...).

supports_op: ggml-cuda's rule (ggml_py._supports' `cuda`, for a compute capability 8.x
device); buffers: `CUDA0`, ... aligned to 128 bytes, unbounded (get_max_size unset), a
quantized tensor taking the padding get_alloc_size adds after its last row; offload_op:
every op of a batch of 32 or more.

--split-mode row: ggml-cuda's split buffer type `CUDA<i>_Split` (its main device CUDA<i>,
which alone uses it and computes the MUL_MATs reading it) cuts each tensor's rows between
all the CUDA devices by the tensor split, and reports as a tensor's size the sum of its
slices, each padded as a quantized row is."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ggml_py._backend import BufferType
from ggml_py._core import Tensor, row_size
from ggml_py.backends.sim import SimBackend, SimBufferType
from ggml_py.models.devices import gpu
from ggml_py.quants import BLOCKS

KIND = "cuda"
PREFIX = "CUDA"
NUMBERED = True
ALIGNMENT = 128
MAX_SIZE = None
# ggml-cuda's MATRIX_ROW_PADDING: a row is padded to a multiple of this many elements
ROW_PADDING = 512
# get_row_rounding: a split's rows start at a multiple of the matrix kernels' tile height
# (get_mmq_y_host: 128 on an NVIDIA GPU of compute capability >= 7.0)
ROW_ROUNDING = 128


def _padding(type_name: str, ne0: int) -> int:
    """The bytes that pad a row of ne0 elements to a multiple of ROW_PADDING."""
    return row_size(type_name, ROW_PADDING - ne0 % ROW_PADDING) if ne0 % ROW_PADDING else 0


class CudaBufferType(SimBufferType):
    """A CUDA device's buffer type: a quantized tensor takes its row padding too."""

    def get_alloc_size(self, tensor: Tensor) -> int:
        pad = _padding(tensor.type, tensor.ne[0]) if tensor.type in BLOCKS else 0   # quantized
        return int(tensor.nbytes) + pad


def split_points(shares: Sequence[float], by_memory: bool) -> tuple[float, ...]:
    """ggml_backend_cuda_split_buffer_type's tensor split: the fraction of the rows before
    each device's (float32, as ggml computes it). `by_memory`: the shares are the devices'
    memories (its default, summed exactly, then divided), else --tensor-split's (summed in
    float32)."""
    f32 = np.float32
    if by_memory:
        starts = np.cumsum([0, *(int(s) for s in shares)])
        return tuple(float(f32(f32(s) / f32(starts[-1]))) for s in starts[:-1])
    acc, out = f32(0), []
    for s in shares:
        out.append(acc)
        acc = f32(acc + f32(s))
    return tuple(float(f32(x / acc)) for x in out)


def row_range(nrows: int, points: Sequence[float], device: int) -> tuple[int, int]:
    """get_row_split: the rows [low, high) of a tensor of `nrows` rows that `device` holds:
    its start (a float32 product, truncated) rounded down to ROW_ROUNDING, to the next
    device's start (the last device: to the end)."""
    def start(i: int) -> int:
        row = int(np.float32(nrows) * np.float32(points[i]))
        return row - row % ROW_ROUNDING
    low = 0 if device == 0 else start(device)
    return low, nrows if device == len(points) - 1 else start(device + 1)


class CudaSplitBufferType(SimBufferType):
    """`CUDA<i>_Split` (ggml_backend_cuda_split_buffer_type(i, tensor_split)) of the CUDA
    devices whose rows start at `points` (split_points): not host memory, 128-aligned; a
    tensor's size is the sum over the devices of its slice of rows, each followed by the
    padding of a row to ROW_PADDING elements."""

    def __init__(self, main_device: str, main_index: int, points: Sequence[float]) -> None:
        super().__init__(f"{main_device}_Split", ALIGNMENT, MAX_SIZE, False, device=main_device)
        self.main_index = main_index
        self.points = tuple(points)

    def slices(self, type_name: str, ne: Sequence[int]) -> list[int]:
        """The bytes of a tensor of this type and shape on each CUDA device (0 where it
        holds no row)."""
        nrows = int(np.prod(ne[1:]))
        out = []
        for device in range(len(self.points)):
            low, high = row_range(nrows, self.points, device)
            out.append(0 if low == high else
                       (high - low) * row_size(type_name, ne[0]) + _padding(type_name, ne[0]))
        return out

    def holds_rows(self, type_name: str, ne: Sequence[int]) -> bool:
        """Whether the main device holds some of the tensor's rows: ggml-cuda's
        supports_op runs a MUL_MAT of a split weight on it only then."""
        return self.slices(type_name, ne)[self.main_index] > 0

    def get_alloc_size(self, tensor: Tensor) -> int:
        return sum(self.slices(tensor.type, tensor.ne))


class CudaBackend(SimBackend):
    """A simulated CUDA device: it uses its own buffer type and its own split buffer type
    (ggml_backend_cuda_device_supports_buft). The weights llama.cpp puts in a split
    buffer are matrices read by a MUL_MAT alone, each there only where the main device
    holds some of its rows, so the `cuda` rule's answer for them is ggml-cuda's."""

    def supports_buft(self, buft: BufferType) -> bool:
        return bool(super().supports_buft(buft)) or (isinstance(buft, CudaSplitBufferType)
                                                     and buft.device == self.name)


def backend(name: str) -> SimBackend:
    """A simulated CUDA device named `name` (its buffer type has the same name)."""
    return gpu.backend(name, name, ALIGNMENT, MAX_SIZE, KIND, "*",
                       buffer_type_class=CudaBufferType, backend_class=CudaBackend)
