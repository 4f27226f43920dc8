"""The CPU backend's executor: compiled execution plans (cplans) over the C kernels of
src/ggml_py/backends/cpu/kernels, a thread pool, and the instruction-set switch.

A cplan is made once per run of graph nodes (a split, or a whole graph): every node's
C kernel (or the Python kernel that replaces it), its thread count and work-buffer
share go into a C array, and every tensor the nodes touch is checked to lie inside
host memory of its buffer. A cplan is current while the mutation epochs say so (the
one source of staleness, _core's: every write of a node's or a source's op, type,
shape, strides, op_params, sources or placement stamps the tensor): an O(1) check
when nothing changed since it was made, one sweep of the nodes' and their sources'
stamps otherwise; any stamp newer than the cplan builds a new one.
Computing walks the array in C with the GIL released; Python is entered only for the
nodes whose kernel is written in Python, between C segments.

The cplans of an Executor are kept in a small LRU keyed by (graph, node range): a
repeated compute of an unchanged, allocated graph does no Python work per node.
"""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint64_t, uintptr_t, INT64_MAX
from libc.stdlib cimport malloc, free
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE

from ggml_py._ggml cimport ggml_tensor, ggml_backend_buffer, GGML_MAX_SRC
from ggml_py._core cimport (Graph, Tensor, tensor_handle, tensor_ptr, int_arg, mutation_epoch,
                            nodes_unchanged_since)

import collections
import os
import threading
from time import perf_counter_ns

from ggml_py._core import (EMPTY_OPS as _EMPTY_OPS,
                           OP_NAMES_LIST as _OP_NAMES_LIST, type_id)
from ggml_py.errors import BackendError, OutOfRangeError

MAX_THREADS = 512               # ggml's GGML_MAX_N_THREADS
_INT32_MAX = (1 << 31) - 1


def default_threads():
    """The cores this process may run on (os.sched_getaffinity where there is one), at
    most MAX_THREADS: a CPU backend's threads, and an RPC server's, by default."""
    try:
        return min(MAX_THREADS, max(1, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return min(MAX_THREADS, max(1, os.cpu_count() or 1))

# ---------------------------------------------------------------------------
# the C library's view of ops (its structs and ids come from the headers Cython reads too)

cdef enum:
    GGML_TYPE_MAX = 64      # type ids are below this (ggml 0.10.1 has 40)
    GGML_TYPE_F32 = 0

cdef extern from "ggml_py/backends/cpu/kernels/ggml-py-cpu.h":
    enum:
        GP_OP_MUL_MAT
    int gp_op_has_kernel(int op)


# the ops that have a C kernel (for some types and layouts): supported_ops of the backend
C_KERNEL_OPS = frozenset(name for i, name in enumerate(_OP_NAMES_LIST) if gp_op_has_kernel(i))

# ---------------------------------------------------------------------------
# instruction sets

_ISAS = {"baseline": GP_ISA_BASELINE, "avx2": GP_ISA_AVX2, "avx512": GP_ISA_AVX512}


def isa():
    """The instruction set the hot loops use now: 'avx512', 'avx2' or 'baseline'."""
    return gp_isa_name(gp_isa_get()).decode()


def isa_supported(name):
    """Can this CPU (and build) run the loops of instruction set `name`?"""
    if name not in _ISAS:
        raise ValueError(f"instruction sets are {', '.join(_ISAS)}, got {name!r}")
    return bool(gp_isa_supported(_ISAS[name]))


def set_isa(name):
    """Use the loops of instruction set `name` ('avx512', 'avx2' or 'baseline') from now
    on, in every cplan and conversion of the process. Not while a compute runs. Raises
    BackendError where the CPU lacks it. 'avx512' is the AVX2 code with AVX-512's
    encodings: the same bits as 'avx2'. 'baseline' results differ from theirs only in
    float rounding inside dot products (FMA, ggml's generic summation order)."""
    if not isa_supported(name):
        raise BackendError(f"this CPU cannot run the {name} loops")
    gp_isa_set(_ISAS[name])


# ---------------------------------------------------------------------------
# conversions for ggml_py._quants

cdef void _quantize_q4_0(const float * x, uint8_t * y, int64_t nb, int cpu) noexcept nogil:
    gp_quantize_q4_0_blocks(x, y, nb)     # the CPU has no q4_0 quantiser of its own


cdef conversions _CONVERSIONS
_CONVERSIONS.f16_to_f32 = gp_f16_to_f32_row
_CONVERSIONS.f32_to_f16 = gp_f32_to_f16_row
_CONVERSIONS.bf16_to_f32 = gp_bf16_to_f32_row
_CONVERSIONS.f32_to_bf16 = gp_f32_to_bf16_row
_CONVERSIONS.round_f16 = gp_round_f16_row
_CONVERSIONS.round_bf16 = gp_round_bf16_row
_CONVERSIONS.quantize_q8_0 = gp_quantize_q8_0_blocks
_CONVERSIONS.dequantize_q8_0 = gp_dequantize_q8_0_blocks
_CONVERSIONS.round_q8_0 = gp_round_q8_0_blocks
_CONVERSIONS.quantize_q4_0 = _quantize_q4_0
_CONVERSIONS.dequantize_q4_0 = gp_dequantize_q4_0_blocks
_CONVERSIONS.type_traits = gp_get_type_traits
_CONVERSIONS.vec_dot_type = gp_vec_dot_type
_CONVERSIONS.vec_dot_of = gp_vec_dot_of


cdef const conversions * get_conversions() noexcept:
    return &_CONVERSIONS


# ---------------------------------------------------------------------------
# cplans

cdef class CPlan:
    """A compiled run of nodes. Made by Executor; read-only from Python (for tests and
    benchmarks: which nodes run in C, which in Python)."""
    cdef gp_cplan * c
    cdef readonly int n_nodes
    cdef readonly int n_threads
    cdef uint64_t epoch                 # the mutation epoch it is known current at
    cdef list steps                     # [(i0, i1, j)]: C nodes [i0, i1), then node j (-1: none)
    cdef dict python                    # node index -> (callable, Tensor)
    cdef list keep                      # the buffers it checked: their addresses stay valid
    cdef dict python_ns                 # node index -> ns spent in its Python kernel

    def __dealloc__(self):
        gp_cplan_free(self.c)

    def kinds(self):
        """Per node: 'noop', 'c', 'python' or 'error'."""
        names = ("noop", "c", "python", "error")
        return [names[gp_cplan_node_at(self.c, i).kind] for i in range(self.n_nodes)]

    def n_tasks(self):
        """Per node: the threads it is shared between."""
        return [gp_cplan_node_at(self.c, i).n_tasks for i in range(self.n_nodes)]

    @property
    def work_size(self):
        """Bytes of the cplan's work buffer."""
        return gp_cplan_work_size(self.c)

    def node_times(self):
        """Per node: microseconds spent in it over the computes since the executor's
        profiling was switched on (C kernels timed on thread 0; 0 for view ops)."""
        cdef const int64_t * ns = gp_cplan_node_ns(self.c)
        out = [0.0] * self.n_nodes
        for i in range(self.n_nodes):
            if ns != NULL:
                out[i] = ns[i] / 1e3
            out[i] += self.python_ns.get(i, 0) / 1e3
        return out


cdef inline bint _blas_takes(ggml_tensor * t, int64_t min_batch) noexcept:
    """Does a MUL_MAT the C kernels take go to BLAS? (src1 f32 rows, enough of them, and
    no GEMM of the instruction set's for them)"""
    cdef ggml_tensor * x = t.src[1]
    return x.type == GGML_TYPE_F32 and x.nb[0] == sizeof(float) and x.ne[1] >= min_batch and \
        not gp_mul_mat_gemm_takes(<gp_tensor *>t)


cdef str _describe(ggml_tensor * t):
    name = t.name.decode(errors="replace")
    op = _OP_NAMES_LIST[t.op] if 0 <= t.op < len(_OP_NAMES_LIST) else str(t.op)
    return f"'{name}' ({op})"


cdef tuple _node_range(Graph graph, i0, i1):
    """(i0, i1) checked against graph's nodes: 0 <= i0 <= i1 <= n_nodes, i1 -1 meaning
    n_nodes (OutOfRangeError otherwise: the cplan reads the node array there)."""
    cdef int n = graph.graph.n_nodes
    cdef int64_t a = int_arg(i0, "i0", -(1 << 62), 1 << 62)
    cdef int64_t b = int_arg(i1, "i1", -(1 << 62), 1 << 62)
    if b == -1:
        b = n
    if not 0 <= a <= b <= n:
        raise OutOfRangeError(f"node range [{i0}, {i1}) outside the graph's {n} nodes")
    return a, b


cdef class Executor:
    """Runs nodes of graphs on the CPU: cplans, their cache and the thread pool.

    name: the backend's name, for errors. n_threads: threads sharing a node (a pool
    of n_threads - 1 workers; 1 thread makes none). policy: the backend's kernel
    policy (its answers change only with a world change: _core.note_world_change), with
      ask_ops         op ids for which kernel_for is asked even where a C kernel exists;
      kernel_for(tensor, compiled) -> callable or None: the Python kernel that runs the
                      node, or None for the C kernel (compiled says there is one);
      blas            the Python kernel of a MUL_MAT with a large batch (None: never);
      blas_min_batch  {weight type name: src1 rows} from which `blas` takes a MUL_MAT
                      the C kernels could run (src1 f32 rows, weight rows packed);
      memory_of(buffer) -> numpy array or None: the buffer's memory this thread may
                      use (None: the node cannot run here).
    """
    cdef gp_threadpool * pool
    cdef readonly int n_threads
    cdef readonly str name
    cdef object policy
    cdef object cplans
    cdef readonly int max_cplans
    cdef object lock
    cdef readonly int n_builds          # cplans made (a cache miss each)
    cdef readonly int n_reuses          # computes that found their cplan valid
    cdef readonly bint profiling        # cplans time their nodes (CPlan.node_times)

    def __cinit__(self):
        self.pool = NULL

    def __init__(self, name, policy, n_threads=1, max_cplans=8):
        max_cplans = int_arg(max_cplans, "max_cplans", 1, _INT32_MAX)
        self.name = str(name)
        self.policy = policy
        self.cplans = collections.OrderedDict()
        self.max_cplans = max_cplans
        self.lock = threading.RLock()
        self.n_threads = 1
        self.set_threads(n_threads)

    def __dealloc__(self):
        gp_threadpool_free(self.pool)

    def set_threads(self, n_threads):
        """Share nodes between n_threads threads from the next compute on (at most ggml's
        GGML_MAX_N_THREADS, 512)."""
        cdef int n = int_arg(n_threads, "n_threads", 1, MAX_THREADS)
        cdef gp_threadpool * pool = NULL
        with self.lock:
            if n == self.n_threads and (n == 1 or self.pool != NULL):
                return
            if n > 1:
                pool = gp_threadpool_new(n)
                if pool == NULL:
                    raise BackendError(f"backend {self.name}: cannot start {n} threads")
            gp_threadpool_free(self.pool)
            self.pool = pool
            self.n_threads = n
            self.cplans.clear()

    def clear(self):
        """Forget every cplan (they are made again when needed)."""
        with self.lock:
            self.cplans.clear()

    def set_profiling(self, bint on):
        """Time every node of every cplan from now on (CPlan.node_times), or stop."""
        cdef CPlan cplan
        with self.lock:
            self.profiling = on
            for cplan in self.cplans.values():
                if gp_cplan_profile(cplan.c, on) != 0:
                    raise MemoryError()
                cplan.python_ns = {}

    @property
    def n_cplans(self):
        return len(self.cplans)

    def cached_cplans(self):
        """The cplans kept now, least recently used first."""
        with self.lock:
            return list(self.cplans.values())

    # --- entry points ---

    def compute_graph(self, Graph graph not None, i0=0, i1=-1):
        """Compute nodes [i0, i1) of `graph` (all of them by default: i1 -1 is the end)."""
        cdef int a, b
        a, b = _node_range(graph, i0, i1)
        with self.lock:
            self._run(self._cplan_for((id(graph), a, b), <gp_tensor **>(graph.graph.nodes + a),
                                      b - a, graph.generation))

    def compute_nodes(self, nodes):
        """Compute a list of Tensors in order (a graph view)."""
        nodes = list(nodes)
        cdef int n = len(nodes), i
        if n == 0:
            return
        cdef gp_tensor ** arr = <gp_tensor **>malloc(n * sizeof(gp_tensor *))
        if arr == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                arr[i] = <gp_tensor *>tensor_ptr(nodes[i])
            key = ("nodes", (<char *>arr)[:n * sizeof(gp_tensor *)])     # these very tensors
            with self.lock:
                self._run(self._cplan_for(key, arr, n, 0))
        finally:
            free(arr)

    def cplan_of(self, Graph graph not None, i0=0, i1=-1):
        """The cplan compute_graph would run (made now if needed)."""
        cdef int a, b
        a, b = _node_range(graph, i0, i1)
        with self.lock:
            return self._cplan_for((id(graph), a, b), <gp_tensor **>(graph.graph.nodes + a),
                                   b - a, graph.generation)

    # --- cplans ---

    cdef CPlan _cplan_for(self, key, gp_tensor ** nodes, int n, uint64_t made):
        """The kept cplan of `key` while it is current: no stamp since its epoch on the
        graph (made: its generation; 0 for a list of nodes, which the key names), the
        world (kernel table edits), the nodes, their sources and buffers; else a new one."""
        cdef uint64_t now = mutation_epoch()
        cdef CPlan cplan = self.cplans.get(key)
        if cplan is not None and cplan.n_threads == self.n_threads and made <= cplan.epoch \
                and nodes_unchanged_since(<ggml_tensor **>nodes, n, cplan.epoch):
            cplan.epoch = now               # unchanged since: O(1) again until a stamp
            self.cplans.move_to_end(key)
            self.n_reuses += 1
            return cplan
        cplan = self._build(nodes, n)
        cplan.epoch = now
        self.cplans[key] = cplan
        self.cplans.move_to_end(key)
        while len(self.cplans) > self.max_cplans:
            self.cplans.popitem(last=False)
        self.n_builds += 1
        return cplan

    cdef CPlan _build(self, gp_tensor ** nodes, int n):
        cdef CPlan cplan = CPlan.__new__(CPlan)
        cdef gp_cplan_node * pn
        cdef ggml_tensor * t
        cdef int i, s
        cplan.c = gp_cplan_new(nodes, n, self.n_threads)
        if cplan.c == NULL:
            raise MemoryError()
        cplan.n_nodes = n
        cplan.n_threads = self.n_threads
        cplan.python = {}
        cplan.python_ns = {}
        cplan.keep = []
        if self.profiling and gp_cplan_profile(cplan.c, 1) != 0:
            raise MemoryError()
        policy = self.policy
        ask_ops = policy.ask_ops
        blas = policy.blas
        cdef int64_t blas_min[GGML_TYPE_MAX]
        for i in range(GGML_TYPE_MAX):
            blas_min[i] = INT64_MAX
        if blas is not None:
            for type_name, rows in policy.blas_min_batch.items():
                blas_min[type_id(type_name)] = rows
        checked = {}
        for i in range(n):
            pn = gp_cplan_node_at(cplan.c, i)
            if pn.kind == GP_NODE_NOOP:
                continue
            t = <ggml_tensor *>nodes[i]
            problem = self._check_memory(t, checked, cplan.keep)
            for s in range(GGML_MAX_SRC):
                if problem is None and t.src[s] != NULL:
                    problem = self._check_memory(t.src[s], checked, cplan.keep)
            if problem is not None:
                gp_cplan_set_error(cplan.c, i, problem.encode())
                continue
            if t.op in ask_ops:
                pass
            elif pn.kind == GP_NODE_C and t.op == GP_OP_MUL_MAT and \
                    _blas_takes(t, blas_min[t.src[0].type]):
                pn.kind = GP_NODE_PYTHON
                cplan.python[i] = (blas, tensor_handle(t))
                continue
            elif pn.kind != GP_NODE_PYTHON:
                continue
            handle = tensor_handle(t)
            fn = policy.kernel_for(handle, pn.kind == GP_NODE_C)
            if fn is not None:
                pn.kind = GP_NODE_PYTHON
                cplan.python[i] = (fn, handle)
            elif pn.kind == GP_NODE_PYTHON:
                gp_cplan_set_error(cplan.c, i, f"op {handle.op} is not supported by the CPU "
                                             f"backend for these types and layouts".encode())
        if gp_cplan_finish(cplan.c) != 0:
            raise MemoryError()
        steps = []
        start = 0
        for i in range(n):
            if gp_cplan_node_at(cplan.c, i).kind in (GP_NODE_PYTHON, GP_NODE_ERROR):
                steps.append((start, i, i))
                start = i + 1
        if start < n or not steps:
            steps.append((start, n, -1))
        cplan.steps = steps
        return cplan

    cdef object _check_memory(self, ggml_tensor * t, dict checked, list keep):
        """None when t's bytes lie in memory this thread may use, else why not."""
        cdef ggml_backend_buffer * b = t.buffer
        cdef size_t lo, hi
        if b == NULL or t.data == NULL:
            return f"tensor {_describe(t)} is not allocated"
        cdef Py_buffer view
        key = <uintptr_t>b
        verdict = checked.get(key)
        if verdict is None:
            buf = <object>b.pyobj
            mem = self.policy.memory_of(buf)
            if mem is None:
                verdict = (f"lives in buffer type '{buf.buffer_type.name}', which has no "
                           "host memory")
            else:
                # the bytes the kernels will touch must be the memory's own, writable
                verdict = "lives in a buffer whose memory is not its own writable bytes"
                if PyObject_GetBuffer(mem, &view, PyBUF_SIMPLE | PyBUF_WRITABLE) == 0:
                    if view.buf == <void *>b.base and <size_t>view.len >= b.size:
                        verdict = ""
                    PyBuffer_Release(&view)
            checked[key] = verdict
            keep.append(buf)
        if verdict:
            return f"tensor {_describe(t)} {verdict}"
        if not gp_tensor_extent(<gp_tensor *>t, &lo, &hi):
            return f"tensor {_describe(t)} has a shape or strides its type cannot have"
        if t.data < b.base or <size_t>(t.data - b.base) + hi > b.size:
            return f"tensor {_describe(t)} reaches past the end of its buffer"
        return None

    # --- running ---

    cdef int _run(self, CPlan cplan) except -1:
        cdef int i0, i1, j, rc, node
        if self.pool != NULL and not gp_threadpool_alive(self.pool):
            # a child of fork(): the workers stayed in the parent; start new ones
            self.pool = gp_threadpool_new(self.n_threads)
        cdef gp_threadpool * pool = self.pool
        cdef gp_cplan * c = cplan.c
        for i0, i1, j in cplan.steps:
            if i1 > i0:
                with nogil:
                    rc = gp_cplan_run(c, i0, i1, pool)
                if rc != 0:
                    message = gp_cplan_failure(c, &node).decode(errors="replace")
                    self._raise(gp_cplan_node_at(c, node).t, BackendError(message))
            if j < 0:
                continue
            entry = cplan.python.get(j)
            if entry is None:
                message = gp_cplan_node_error(c, j).decode(errors="replace")
                self._raise(gp_cplan_node_at(c, j).t, BackendError(message))
            fn, handle = entry
            t0 = perf_counter_ns() if self.profiling else 0
            try:
                fn(handle)
            except Exception as e:
                self._raise(gp_cplan_node_at(c, j).t, e)
            if self.profiling:
                cplan.python_ns[j] = cplan.python_ns.get(j, 0) + perf_counter_ns() - t0
        return 0

    cdef _raise(self, gp_tensor * node, Exception cause):
        from ggml_py.errors import ComputeError
        cdef ggml_tensor * t = <ggml_tensor *>node
        name = t.name.decode(errors="replace")
        op = _OP_NAMES_LIST[t.op] if 0 <= t.op < len(_OP_NAMES_LIST) else str(t.op)
        raise ComputeError(f"backend {self.name}: node '{name}' ({op}) failed: "
                           f"{type(cause).__name__}: {cause}", node=name,
                           backend=self.name) from cause
