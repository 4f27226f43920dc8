"""The exceptions of ggml_py. Each also derives from the matching builtin, so
callers may catch either (pyarrow's pattern).

Everything ggml_py raises on purpose is a GgmlPyError. The one exception is
the TypeError Cython's argument checks raise for None or an object of the
wrong class in a typed parameter (Python's convention for a programming error).
"""

from __future__ import annotations

from typing import Any


class GgmlPyError(Exception):
    """Base of every ggml_py error."""

    # KeyError and IndexError subclasses below keep the plain message
    __str__ = Exception.__str__


class ArgumentError(GgmlPyError, ValueError):
    """An argument outside what the call accepts: a negative size, a count past a C
    limit, an unknown name. Names the argument and the call."""


class ArgumentTypeError(GgmlPyError, TypeError):
    """An argument of the wrong type (a float where a size is needed, ...)."""


class UnknownNameError(ArgumentError, KeyError):
    """A type, op, backend or flag name that does not exist; lists the known ones."""


class OutOfRangeError(ArgumentError, IndexError):
    """An index past the end of a graph, a context, a split list, ..."""


class NotSupportedError(GgmlPyError, NotImplementedError):
    """Something ggml has that ggml_py does not implement (a quantisation type, ...)."""


class GraphError(GgmlPyError, ValueError):
    """A malformed tensor or graph (bad view, graph full, tensor listed twice, ...)."""


class CaseFormatError(GgmlPyError, ValueError):
    """A case or plan file that does not follow SCHED_CASES.md; names the tensor or field."""


class BackendError(GgmlPyError, RuntimeError):
    """A backend that cannot do what was asked, or a backend list ggml would reject."""


class ReleasedMemoryError(BackendError):
    """A tensor whose memory was given back: the compute buffer it was placed in was
    released (its scheduler was closed or reallocated the buffer). Allocate the
    tensor's graph again before reading or writing it."""


class ModelError(GgmlPyError, ValueError):
    """A model configuration, weights, tokens or model file that do not fit together."""


class SchedulerError(GgmlPyError, RuntimeError):
    """A graph the scheduler cannot split (ggml would abort); the scheduler stays usable.

    `kind` is one of the abort classes of SCHED_CASES.md ('unsupported-preallocated',
    'no-backend-supports-op', 'too-many-graph-inputs', ...)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class ComputeError(BackendError):
    """A kernel failed. `node` and `backend` name where (the Tensor and the Backend)."""

    def __init__(self, message: str, node: Any = None, backend: Any = None) -> None:
        super().__init__(message)
        self.node = node
        self.backend = backend


class AllocationError(GgmlPyError, MemoryError):
    """A buffer that could not be allocated; names the backend or buffer type and the size."""


class RPCError(BackendError):
    """An RPC server that is down, refuses, breaks off or answers wrongly; names the
    endpoint and the command (`.endpoint`, `.command`)."""
