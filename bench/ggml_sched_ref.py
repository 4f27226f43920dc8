"""ggml 0.10.1's own scheduler on a ggml_py graph, timed in the same run as ggml_py's.

A graph of simulated backends [GPU0, GPU1, ..., CPU] (e.g. ggml_py.models.synthetic) is
mirrored tensor for tensor into a no_alloc ggml context; ggml's scheduler gets [RPC
client, ..., CPU] -- an RPC client to a ggml RPC server on 127.0.0.1 (ggml_py.rpc_server)
stands in for each GPU: its buffer type is not the host's, and no other device's, so
ggml splits the graph exactly as for a GPU. Pre-allocated tensors (weights) go to one
buffer per (buffer type, usage), usage kept. Timing follows SCHED_CASES.md "Timing":
before each repetition, untimed, the whole context (every tensor struct: sources, flags,
data and buffer pointers) is restored from a snapshot and the scheduler reset; then
`ggml_backend_sched_split_graph` alone, or `ggml_backend_sched_alloc_graph` (the steady
state: no buffer changes, no RPC traffic), or `ggml_backend_sched_reserve`, is timed.

Beside the timings it reads back what ggml decided (`expansion`, `alloc`, `n_copies`,
`backend_index`, `location`, `buffer_size`): tests/test_sched_vs_ggml.py holds ggml_py's
graphs, plans and allocations to these on random graphs.
"""

from __future__ import annotations

import ctypes
import os
import time

from bench_vs_ggml import GgmlTensor, InitParams, find_ggml, mirror_order

from ggml_py._backend import get_buffer
from ggml_py._core import op_id, type_id

FLAG_BITS = {"INPUT": 1, "OUTPUT": 2, "PARAM": 4, "LOSS": 8}
USAGE_WEIGHTS = 1


class GgmlCgraph(ctypes.Structure):
    """The head of struct ggml_cgraph of ggml 0.10.1 (src/ggml-impl.h): what a graph lists."""
    _fields_ = [("size", ctypes.c_int), ("n_nodes", ctypes.c_int), ("n_leafs", ctypes.c_int),
                ("nodes", ctypes.POINTER(ctypes.POINTER(GgmlTensor))),
                ("grads", ctypes.c_void_p), ("grad_accs", ctypes.c_void_p),
                ("leafs", ctypes.POINTER(ctypes.POINTER(GgmlTensor)))]


class GgmlSched:
    """ggml's scheduler over [an RPC client per endpoint, the CPU] on a mirror of `graph`
    (from a ggml_py scheduler's point of view: backends [GPU0, GPU1, ..., CPU], buffer
    types named so)."""

    def __init__(self, graph, endpoint: str | list[str], lib_dir: str | None = None,
                 parallel: bool = False, op_offload: bool = True, init_views: bool = True,
                 graph_size: int | None = None):
        lib_dir = find_ggml(lib_dir)
        if lib_dir is None:
            raise RuntimeError("ggml 0.10.1 not found ($GGML_PY_GGML_LIB)")
        load = lambda name: ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)  # noqa: E731
        base, _, cpu, rpc = (load(n) for n in ("libggml-base.so", "libggml.so",
                                                "libggml-cpu.so", "libggml-rpc.so"))
        P, T, S, B = ctypes.c_void_p, ctypes.POINTER(GgmlTensor), ctypes.c_size_t, ctypes.c_bool
        for lib, name, res, args in [
                (base, "ggml_init", P, [InitParams]), (base, "ggml_free", None, [P]),
                (base, "ggml_new_tensor", T, [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
                (base, "ggml_view_tensor", T, [P, T]),
                (base, "ggml_new_graph_custom", P, [P, S, B]),
                (base, "ggml_build_forward_expand", None, [P, T]),
                (base, "ggml_tensor_overhead", S, []),
                (base, "ggml_graph_overhead_custom", S, [S, B]),
                (base, "ggml_get_mem_buffer", P, [P]), (base, "ggml_get_mem_size", S, [P]),
                (base, "ggml_backend_buft_alloc_buffer", P, [P, S]),
                (base, "ggml_backend_buft_get_alignment", S, [P]),
                (base, "ggml_backend_buffer_get_base", P, [P]),
                (base, "ggml_backend_buffer_set_usage", None, [P, ctypes.c_int]),
                (base, "ggml_backend_buffer_free", None, [P]),
                (base, "ggml_backend_tensor_alloc", ctypes.c_int, [P, T, P]),
                (base, "ggml_backend_view_init", ctypes.c_int, [T]),
                (base, "ggml_backend_sched_new", P, [ctypes.POINTER(P), P, ctypes.c_int, S, B, B]),
                (base, "ggml_backend_sched_free", None, [P]),
                (base, "ggml_backend_sched_reset", None, [P]),
                (base, "ggml_backend_sched_split_graph", None, [P, P]),
                (base, "ggml_backend_sched_alloc_graph", B, [P, P]),
                (base, "ggml_backend_sched_reserve", B, [P, P]),
                (base, "ggml_backend_sched_get_n_splits", ctypes.c_int, [P]),
                (base, "ggml_backend_sched_get_n_copies", ctypes.c_int, [P]),
                (base, "ggml_backend_sched_get_tensor_backend", P, [P, T]),
                (base, "ggml_backend_sched_set_tensor_backend", None, [P, T, P]),
                (base, "ggml_backend_sched_get_buffer_size", S, [P, P]),
                (base, "ggml_backend_buffer_get_type", P, [P]),
                (base, "ggml_backend_free", None, [P]),
                (base, "ggml_backend_get_default_buffer_type", P, [P]),
                (cpu, "ggml_backend_cpu_init", P, []),
                (rpc, "ggml_backend_rpc_init", P, [ctypes.c_char_p, ctypes.c_uint32])]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)
        self.buffers = []
        # user assignments (ggml_py tensor, backend index), made again after each reset, as
        # SCHED_CASES.md's timing does
        self.assignments = []
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        self._mirror(graph, endpoints, parallel, op_offload, init_views,
                     graph.size if graph_size is None else graph_size)

    def _mirror(self, graph, endpoints, parallel, op_offload, init_views, graph_size):
        tensors = mirror_order(graph)
        size = len(tensors) * self.ggml_tensor_overhead() + \
            self.ggml_graph_overhead_custom(graph_size, False) + (1 << 20)
        self.ctx = self.ggml_init(InitParams(size, None, True))
        m = {}
        for t in tensors:
            if t.view_src is not None:
                x = self.ggml_view_tensor(self.ctx, m[t.view_src])
                x.contents.view_offs = t.view_offs
            else:
                x = self.ggml_new_tensor(self.ctx, type_id(t.type), 4, (ctypes.c_int64 * 4)(*t.ne))
            c = x.contents
            c.ne[:] = t.ne
            c.nb[:] = t.nb
            c.op = op_id(t.op)
            c.op_params[:] = t.op_params
            c.flags = sum(FLAG_BITS.get(f, 0) for f in t.flags)
            for i, s in enumerate(t.src):
                c.src[i] = ctypes.cast(m[s], ctypes.c_void_p) if s is not None else None
            c.name = t.name.encode()[:63]
            m[t] = x
        self.mirror = m         # ggml_py tensor -> its ggml twin
        # pre-allocated tensors: one ggml buffer per (buffer type, usage)
        self.backends = []
        for e in endpoints:
            self.backends.append(self.ggml_backend_rpc_init(e.encode(), 0))
            if not self.backends[-1]:
                raise RuntimeError(f"no ggml RPC server at {e}")
        self.backends.append(self.ggml_backend_cpu_init())
        self.names = [f"GPU{i}" for i in range(len(endpoints))] + ["CPU"]
        self.bufts = [self.ggml_backend_get_default_buffer_type(b) for b in self.backends]
        groups = {}
        for t in tensors:
            buf = get_buffer(t)
            if buf is not None and t.view_src is None:
                buft = self.bufts[self.names.index(buf.buffer_type.name)]
                groups.setdefault((buft, buf.usage), []).append(t)
        for (buft, usage), ts in groups.items():
            align = self.ggml_backend_buft_get_alignment(buft)
            sizes = [-(-t.nbytes // align) * align for t in ts]
            buffer = self.ggml_backend_buft_alloc_buffer(buft, max(sum(sizes), 1))
            self.buffers.append(buffer)
            if usage == "weights":
                self.ggml_backend_buffer_set_usage(buffer, USAGE_WEIGHTS)
            addr = self.ggml_backend_buffer_get_base(buffer)
            for t, n in zip(ts, sizes):
                if self.ggml_backend_tensor_alloc(buffer, m[t], addr) != 0:
                    raise RuntimeError(f"ggml_backend_tensor_alloc of {t.name} failed")
                addr += n
        # the views of pre-allocated tensors as an allocation leaves them (with buffers:
        # the steady state the benchmark times), or as a graph is built (init_views=False)
        for t in tensors:
            if init_views and t.view_src is not None and m[t.view_src].contents.buffer:
                self.ggml_backend_view_init(m[t])
        self.graph = self.ggml_new_graph_custom(self.ctx, graph_size, False)
        # the leafs first, then the nodes, each in ggml_py's order (expanding only the
        # nodes would list the leafs in the order the nodes first reach them)
        for t in graph.leafs + graph.nodes:
            self.ggml_build_forward_expand(self.graph, m[t])
        n = len(self.backends)
        self.sched = self.ggml_backend_sched_new((ctypes.c_void_p * n)(*self.backends), None,
                                                 n, graph_size, parallel, op_offload)
        # the snapshot every repetition starts from
        self.mem = self.ggml_get_mem_buffer(self.ctx)
        self.mem_size = self.ggml_get_mem_size(self.ctx)
        self.snapshot = ctypes.create_string_buffer(ctypes.string_at(self.mem, self.mem_size))

    def _restore(self):
        ctypes.memmove(self.mem, self.snapshot, self.mem_size)
        self.ggml_backend_sched_reset(self.sched)
        for t, b in self.assignments:
            self.ggml_backend_sched_set_tensor_backend(self.sched, self.mirror[t],
                                                       self.backends[b])

    def _time(self, call, reps):
        """µs of `reps` calls of call(sched, graph), each after a restore; one call first,
        untimed (the steady state: buffers allocated)."""
        self._restore()
        if call(self.sched, self.graph) is False:
            raise RuntimeError(f"{call.__name__} failed")
        out = []
        for _ in range(reps):
            self._restore()
            t0 = time.perf_counter()
            call(self.sched, self.graph)
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    def time_split(self, reps: int) -> list[float]:
        """µs of `reps` ggml_backend_sched_split_graph calls."""
        return self._time(self.ggml_backend_sched_split_graph, reps)

    def time_alloc(self, reps: int) -> list[float]:
        """µs of `reps` ggml_backend_sched_alloc_graph calls in the steady state."""
        return self._time(self.ggml_backend_sched_alloc_graph, reps)

    def time_reserve(self, reps: int) -> list[float]:
        """µs of `reps` ggml_backend_sched_reserve calls (split + ggml_gallocr_reserve_n,
        in the steady state: the buffers are large enough, no RPC traffic). The reserve
        path of SCHED_CASES.md (split + reserve_n + ggml_gallocr_alloc_graph) is this
        plus alloc_graph minus split."""
        return self._time(self.ggml_backend_sched_reserve, reps)

    # what ggml decided, read back through its public calls

    def alloc(self) -> bool:
        """One ggml_backend_sched_alloc_graph (split + allocation), from the snapshot."""
        self._restore()
        return bool(self.ggml_backend_sched_alloc_graph(self.sched, self.graph))

    def expansion(self, roots, size: int) -> tuple[list[str], list[str]]:
        """The names of the nodes and of the leafs, in order, of a new ggml graph (of
        `size`) that ggml_build_forward_expand makes from the twins of `roots`, in turn."""
        graph = self.ggml_new_graph_custom(self.ctx, size, False)
        for t in roots:
            self.ggml_build_forward_expand(graph, self.mirror[t])
        g = ctypes.cast(graph, ctypes.POINTER(GgmlCgraph)).contents
        return ([g.nodes[i].contents.name.decode() for i in range(g.n_nodes)],
                [g.leafs[i].contents.name.decode() for i in range(g.n_leafs)])

    @property
    def n_splits(self) -> int:
        return self.ggml_backend_sched_get_n_splits(self.sched)

    @property
    def n_copies(self) -> int:
        return self.ggml_backend_sched_get_n_copies(self.sched)

    def backend_index(self, t) -> int:
        """The index of the backend ggml gave ggml_py tensor t (the CPU last), -1 none."""
        b = self.ggml_backend_sched_get_tensor_backend(self.sched, self.mirror[t])
        return self.backends.index(b) if b in self.backends else -1

    def location(self, t) -> tuple[str, int] | None:
        """(its buffer type's name, "GPU0"... or "CPU"; offset in its buffer) of t's data
        after alloc(); None without memory."""
        c = self.mirror[t].contents
        if not c.buffer:
            return None
        name = self.names[self.bufts.index(self.ggml_backend_buffer_get_type(c.buffer))]
        return name, c.data - self.ggml_backend_buffer_get_base(c.buffer)

    def buffer_size(self, index: int) -> int:
        """The size of ggml's compute buffer of backend `index` (the CPU last)."""
        return self.ggml_backend_sched_get_buffer_size(self.sched, self.backends[index])

    def close(self):
        self._restore()
        self.ggml_backend_sched_free(self.sched)
        for b in self.buffers:
            self.ggml_backend_buffer_free(b)
        for b in self.backends:
            self.ggml_backend_free(b)
        self.ggml_free(self.ctx)
