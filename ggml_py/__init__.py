"""ggml_py: a Cython port of ggml's backend scheduler, graph allocator and backends."""

from ggml_py._core import Context, Graph, Tensor, HashSet, hash_size, type_id, op_id
from ggml_py._backend import (Backend, BufferType, Buffer, fake_buffer, host_buffer, set_buffer,
                              get_buffer, view_init)
from ggml_py.errors import (GgmlPyError, GraphError, CaseFormatError, BackendError,
                            SchedulerError, AllocationError)

from ggml_py import ops, quants

__version__ = "0.1.0"
