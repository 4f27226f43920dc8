"""ggml_py: a Cython port of ggml's backend scheduler, graph allocator and backends."""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

try:
    from ggml_py._core import (Context, Graph, Tensor, HashSet, hash_size, type_id, op_id,
                               memory_available, ggml_type)
except ModuleNotFoundError as _e:
    if _e.name != "ggml_py._core":
        raise
    import os as _os
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(_here, _os.pardir, "src", "ggml_py", "_core.pyx")):
        raise ImportError(
            f"ggml_py is being imported from its source tree ({_here}), which has no compiled "
            "modules. Build them in place with `pip install -e .`, or run from another "
            "folder (an installed ggml_py, and its `ggml-py` command, work anywhere else)."
        ) from None
    raise ImportError(
        f"ggml_py's compiled modules are missing from {_here}: the installation is "
        "incomplete; reinstall it (pip install --force-reinstall ggml-py-sched)") from None

from ggml_py._backend import (Backend, BufferType, Buffer, fake_buffer, host_buffer, set_buffer,
                              get_buffer, view_init)
from ggml_py.errors import (GgmlPyError, GraphError, CaseFormatError, BackendError,
                            SchedulerError, AllocationError)

from ggml_py import arrays, ops, quants

if TYPE_CHECKING:
    from ggml_py.alloc import tensors_from_arrays
    from ggml_py.sched import Scheduler

# loaded on first use, so that `import ggml_py` stays as light as tensors and ops need
# (the scheduler's modules add ~70 ms)
_LAZY = {"Scheduler": "ggml_py.sched", "tensors_from_arrays": "ggml_py.alloc"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ggml_py' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "__version__",
    # tensors and graphs
    "Context", "Graph", "Tensor", "HashSet", "hash_size", "type_id", "op_id", "ggml_type",
    # buffers and backends
    "Backend", "BufferType", "Buffer", "fake_buffer", "host_buffer", "set_buffer",
    "get_buffer", "view_init", "memory_available", "tensors_from_arrays",
    # splitting and computing graphs
    "Scheduler",
    # errors
    "GgmlPyError", "GraphError", "CaseFormatError", "BackendError", "SchedulerError",
    "AllocationError",
    # modules
    "arrays", "ops", "quants",
]
