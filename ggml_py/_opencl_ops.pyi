# Stub of the Cython module ggml_py._opencl_ops (src/ggml_py/_opencl_ops.pyx); checked
# against the built module by `python -m mypy.stubtest` (.ci/stubtest).
from ggml_py._backend import Backend
from ggml_py._core import Tensor

OPENCL_OPS: tuple[str, ...]
OPENCL_SORT_MAX: int
OPENCL_FA_D: int

def acc_offsets(t: Tensor) -> list[int] | None: ...
def use_opencl_rules(backend: Backend) -> None: ...
