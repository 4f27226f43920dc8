"""The exceptions of ggml_py. Each also derives from the matching builtin, so
callers may catch either (pyarrow's pattern)."""


class GgmlPyError(Exception):
    """Base of every ggml_py error."""


class GraphError(GgmlPyError, ValueError):
    """A malformed tensor or graph (bad view, graph full, tensor listed twice, ...)."""


class CaseFormatError(GgmlPyError, ValueError):
    """A case or plan file that does not follow SCHED_CASES.md; names the tensor or field."""


class BackendError(GgmlPyError, RuntimeError):
    """A backend that cannot do what was asked, or a backend list ggml would reject."""


class SchedulerError(GgmlPyError, RuntimeError):
    """A graph the scheduler cannot split (ggml would abort); the scheduler stays usable.

    `kind` is one of the abort classes of SCHED_CASES.md ('unsupported-preallocated',
    'no-backend-supports-op', 'too-many-graph-inputs', ...)."""

    def __init__(self, message, kind=None):
        super().__init__(message)
        self.kind = kind


class AllocationError(GgmlPyError, MemoryError):
    """A buffer that could not be allocated; names the backend or buffer type and the size."""


class RPCError(BackendError):
    """An RPC server that is down, refuses, breaks off or answers wrongly; names the
    endpoint and the command (`.endpoint`, `.command`)."""
