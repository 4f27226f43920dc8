"""The CPU backend: host buffers, and graphs computed by the compiled executor.

`CPUBackend.graph_compute` hands the nodes to ggml_py.backends.cpu._executor.Executor,
which makes a compiled execution plan (cplan) once per (graph, node range) and reuses it
while the graph does not change. Each node runs its C kernel (src/ggml_py/backends/cpu/kernels)
unless the kernel policy below gives it a Python one:
  * an entry of KERNELS the user replaced (KERNELS[op] = fn) runs instead of the C
    kernel, for every node of that op (tests use this to inject failures);
  * a MUL_MAT with a large batch goes to BLAS (blas.py);
  * nodes the C kernels do not take (ops, types or layouts) run the numpy kernels.
With compiled=False every node runs its numpy kernel (the reference numerics).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Mapping
from typing import Any

from ggml_py._backend import Backend, BufferType, graph_nodes, node_range
from ggml_py._core import (EMPTY_OPS, OP_IDS, Graph, Tensor, instance_arg, int_arg,
                           note_world_change)
from ggml_py.errors import ArgumentTypeError, UnknownNameError
from ggml_py.backends.cpu._executor import Executor, C_KERNEL_OPS, default_threads
from ggml_py.backends.cpu import blas
from ggml_py.backends.cpu.memory import memory_of
from ggml_py.backends.cpu.numpy_kernels import NUMPY_KERNELS

CPU_ALIGNMENT = 32          # ggml-impl.h TENSOR_ALIGNMENT, the CPU buffer type's alignment
INT64_MAX = (1 << 63) - 1

# ops with a kernel (plus the empty ops, which need none)
SUPPORTED_OPS = EMPTY_OPS + tuple(NUMPY_KERNELS)
assert C_KERNEL_OPS <= set(SUPPORTED_OPS)


class KernelTable(dict):
    """op name -> Python kernel (a function of the node's Tensor). It starts as the
    numpy kernels; an entry set to anything else replaces the C kernel of that op.
    A change is a world change (mutation epochs): cplans and split plans made before it
    are made again."""

    def __init__(self, defaults):
        super().__init__(defaults)
        self.defaults = dict(defaults)

    def _changed(self):
        note_world_change()

    def __setitem__(self, op, fn):
        super().__setitem__(op, fn)
        self._changed()

    def __delitem__(self, op):
        super().__delitem__(op)
        self._changed()

    def update(self, *args, **kw):
        super().update(*args, **kw)
        self._changed()

    def pop(self, *args):
        r = super().pop(*args)
        self._changed()
        return r

    def popitem(self):
        r = super().popitem()
        self._changed()
        return r

    def setdefault(self, op, fn=None):
        r = super().setdefault(op, fn)
        self._changed()
        return r

    def clear(self):
        super().clear()
        self._changed()

    def replaced(self):
        """Ops whose entry is not the numpy default (a kernel of the user's, or removed)."""
        return {op for op in set(self) | set(self.defaults)
                if self.get(op) is not self.defaults.get(op)}


KERNELS = KernelTable(NUMPY_KERNELS)


class KernelPolicy:
    """Which kernel runs a node (the Executor asks while it makes a cplan). Fixed for a
    backend, except through KERNELS, whose edits are world changes."""

    def __init__(self, compiled=True, blas_min_batch=None):
        self.compiled = bool(compiled)
        table = blas.BLAS_MIN_BATCH if blas_min_batch is None else blas_min_batch
        if not isinstance(table, Mapping):
            raise ArgumentTypeError(f"blas_min_batch must be a dict {{weight type: src1 rows}}, "
                                    f"got {type(table).__name__}")
        checked = {}
        for type_name, rows in table.items():
            if type_name not in blas.BLAS_MIN_BATCH:
                raise UnknownNameError(f"blas_min_batch: {type_name!r} is no weight type BLAS "
                                       f"takes ({', '.join(blas.BLAS_MIN_BATCH)})")
            checked[type_name] = int_arg(rows, f"blas_min_batch[{type_name!r}]", 1, INT64_MAX)
        self.blas_min_batch = types.MappingProxyType(checked)

    @property
    def ask_ops(self):
        """Op ids whose nodes are asked about even when a C kernel takes them."""
        if not self.compiled:
            return frozenset(range(len(OP_IDS)))
        return frozenset(OP_IDS[op] for op in KERNELS.replaced() if op in OP_IDS)

    @property
    def blas(self):
        """The kernel of large-batch MUL_MATs (the executor checks blas_min_batch)."""
        return blas.mul_mat if self.compiled and self.blas_min_batch else None

    def kernel_for(self, t, compiled):
        """The Python kernel of node t (None: its C kernel runs, or none is left)."""
        op = instance_arg(t, Tensor, "tensor").op
        fn = KERNELS.get(op)
        if fn is not NUMPY_KERNELS.get(op) or not self.compiled:
            return fn                           # the user's kernel (None: removed)
        return None if compiled else fn

    memory_of = staticmethod(memory_of)


class CPUBackend(Backend):
    """The CPU backend: host buffer type 'CPU' (alignment 32), device type 'cpu'.

    n_threads: threads sharing each node's work (default: the cores this process may
    use); 1 runs everything on the caller's thread. Results do not depend on it.
    compiled: False runs every node's numpy kernel (ggml's numerics, slowly).
    blas_min_batch: {weight type: src1 rows} from which MUL_MAT uses BLAS (blas.py's
    measured defaults; {} never)."""

    def __init__(self, name: str = "CPU", buffer_type: BufferType | None = None,
                 n_threads: int | None = None, compiled: bool = True,
                 blas_min_batch: dict[str, int] | None = None) -> None:
        if buffer_type is None:
            buffer_type = BufferType("CPU", alignment=CPU_ALIGNMENT, is_host=True, device=name)
        super().__init__(name, buffer_type, device_type="cpu", supports_ops=SUPPORTED_OPS)
        # any host buffer type (ggml_backend_cpu_device_supports_buft: buft is host)
        self.supports_host_buffer_types = True
        self.policy = KernelPolicy(compiled, blas_min_batch)
        self.executor = Executor(name, self.policy, default_threads() if n_threads is None
                                 else n_threads)

    @property
    def n_threads(self) -> int:
        """Threads the executor computes with (settable; ggml_backend_cpu_set_n_threads)."""
        return self.executor.n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        self.executor.set_threads(n)

    def graph_compute(self, graph: Any) -> bool:
        """Compute every node of `graph` in order (ggml_backend_graph_compute): a Graph,
        a GraphView or a list of nodes."""
        if isinstance(graph, Graph):
            self.executor.compute_graph(graph)
        else:
            self.executor.compute_nodes(graph_nodes(graph))
        return True

    def graph_compute_range(self, graph: Graph, i0: int, i1: int) -> bool:
        """Compute nodes [i0, i1) of `graph` (the scheduler's splits: no node handles)."""
        a, b = node_range(graph, i0, i1)
        self.executor.compute_graph(graph, a, b)
        return True


# ---------------------------------------------------------------------------
# graph views for other backends (the numpy device's worker runs CPU kernels)

_VIEW_POLICY = KernelPolicy()
_views = threading.local()          # per thread: backend name -> Executor (1 thread)


def compute_nodes(nodes, backend_name):
    """Run the kernels of `nodes` (Tensors, in order) on the calling thread; a failing
    kernel raises ComputeError naming the node and the backend."""
    executors = getattr(_views, "executors", None)
    if executors is None:
        executors = _views.executors = {}
    ex = executors.get(backend_name)
    if ex is None:
        ex = executors[backend_name] = Executor(backend_name, _VIEW_POLICY, 1, max_cplans=4)
    ex.compute_nodes(nodes)


def compute_node(t):
    """Run one node's kernel on the calling thread (view ops need none)."""
    compute_nodes([t], "CPU")
