"""What the GPU device kinds (cuda, metal, vulkan, opencl) share: a simulated backend of
ggml's GPU backend shape, with the kind's supports_op rule (ggml_py._supports, by name),
its buffer type (alignment, max size; device memory, not host) and its offload_op (ggml's
GPU backends take an op whose weights stay in host memory when its batch is at least 32:
GGML_OP_OFFLOAD_MIN_BATCH's default)."""

from __future__ import annotations

from typing import Sequence

from ggml_py.backends.sim import SimBackend, SimBufferType

OFFLOAD_MIN_BATCH = 32


def backend(name: str, buffer_type: str, alignment: int, max_size: int | None, rule: str,
            offload_ops: str | Sequence[str], *,
            buffer_type_class: type[SimBufferType] = SimBufferType,
            backend_class: type[SimBackend] = SimBackend) -> SimBackend:
    """A simulated GPU device named `name` with buffer type `buffer_type`, answering
    supports_op with rule `rule` and offloading `offload_ops` ('*': every op); a kind
    whose buffers size tensors their own way, or whose device takes other buffer types,
    gives its classes."""
    buft = buffer_type_class(buffer_type, alignment, max_size, False, device=name)
    return backend_class(name, buft, "gpu", rule, offload_ops=offload_ops,
                         offload_min_batch=OFFLOAD_MIN_BATCH if offload_ops else 0,
                         supported_buffer_types=[buft])
