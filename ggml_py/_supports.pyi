# Stub of the Cython module ggml_py._supports (src/ggml_py/_supports.pyx); checked
# against the built module by `python -m mypy.stubtest` (.ci/stubtest).
from typing import Iterable

from ggml_py._backend import Backend
from ggml_py._core import Tensor

CPU_OPS: tuple[str, ...]
OPENCL_OPS: tuple[str, ...]
OPENCL_SORT_MAX: int
OPENCL_FA_D: int
CUDA_ALWAYS: tuple[str, ...]
CUDA_DECIDED: tuple[str, ...]
METAL_ALWAYS: tuple[str, ...]
METAL_DECIDED: tuple[str, ...]
VULKAN_MAX_TENSOR: int
VULKAN_OPS: tuple[str, ...]
VULKAN_ALWAYS: tuple[str, ...]
VULKAN_DECIDED: tuple[str, ...]
GGML_OPENCL_ALWAYS: tuple[str, ...]
GGML_OPENCL_DECIDED: tuple[str, ...]
GGML_OPENCL_ARGSORT_WG: int
RULE_NAMES: tuple[str, ...]

def rule_ops(name: str) -> dict[str, str]: ...
def use_rule(backend: Backend, name: str, unsupported_ops: Iterable[str] = ()) -> None: ...
def acc_offsets(t: Tensor) -> list[int] | None: ...
