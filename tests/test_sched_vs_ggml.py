"""ggml_py's scheduler against ggml 0.10.1's own, live, on random graphs (hypothesis).

Each example builds a random graph over one or two GPUs and the CPU: weights and caches in
either memory, inputs, plain leafs, views (whole, offset, transposed), compute nodes of
thirteen ops, f32 and f16 (so that some MUL_MATs are not for ggml's CPU), outputs, user
assignments, a parallel scheduler or not. ggml's scheduler gets a mirror of it, tensor for
tensor (bench/ggml_sched_ref.py), over [an RPC client per GPU, the CPU]: an RPC device
runs every op and reads only its own buffers, as ggml_py's simulated GPUs here do.
ggml_build_forward_expand must list the nodes and leafs of the graph as ggml_py's does;
both schedulers split and allocate it, and everything ggml says of its plan through its
public calls must be ggml_py's: the number of splits and copies, every tensor's backend,
and after alloc_graph every computed tensor's buffer and offset and the size of each
compute buffer. Where ggml aborts (in a forked child), ggml_py must raise.

A view the user assigns away from its memory is planned as ggml plans it (graph_compute
refuses it where that computes wrong: tests/test_robust_cases.py). One difference is
deliberate and left out: only a graph's first allocation is compared, since ggml leaves the
graph's sources rewired to the split's copies and its tensors at their addresses, so that
another split of the same graph object plans something else, where ggml_py gives the
sources back and takes its kept plan.

The golden cases of tests/data hold ggml's plans for fixed graphs; this holds them for
graphs no one wrote down. Needs ggml 0.10.1's libraries with RPC (.ci/install-ggml-rpc);
skipped without them, unless GGML_PY_REQUIRE_RPC=1 (CI).
"""

import faulthandler
import json
import os
import signal
import sys
import warnings
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_ggml_rpc
from ggml_py import Backend, Context, Graph
from ggml_py._backend import get_buffer
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.backends.sim import SimBufferType
from ggml_py.errors import GgmlPyError
from ggml_py.sched import Scheduler

require_ggml_rpc()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from ggml_sched_ref import GgmlSched  # noqa: E402

# each op with the numbers of sources ggml's builders give it
OP_SOURCES = {"ADD": (2,), "MUL": (2,), "MUL_MAT": (2,), "RMS_NORM": (1,), "SCALE": (1,),
              "CONT": (1,), "UNARY": (1,), "SOFT_MAX": (1, 2), "ROPE": (2,), "GLU": (1, 2),
              "CPY": (2,), "CONCAT": (2,), "GET_ROWS": (2,)}
SHAPES = [(4, 8), (8, 8), (2, 16), (4, 4)]
LEAF_KINDS = ["gpu weight", "cpu weight", "cpu weight", "gpu cache", "cpu cache", "input",
              "input", "plain"]
TYPES = ["f32", "f32", "f16"]


class GgmlCPU(Backend):
    """The CPU as ggml-cpu's supports_op answers (ggml-cpu.cpp): everything but a MUL_MAT
    whose src1 is neither f32 nor src0's vec_dot type (of f32: f32, of f16: f16), so that
    the test also meets nodes the CPU cannot run. (The RPC device runs every op.)"""

    def supports_op(self, op):
        if op.op == "MUL_MAT":
            return op.src[1].type in ("f32", op.src[0].type)
        return True


@pytest.fixture(scope="module")
def endpoints():
    """Two ggml RPC servers of this module's own, one per GPU: each serves one client at a
    time, here the child of each example in turn."""
    from ggml_py.rpc_server import start_server
    servers = []
    try:
        for _ in range(2):
            servers.append(start_server(threads=1))
        yield [s.endpoint for s in servers]
    finally:
        for s in servers:
            s.stop()


@dataclass
class Problem:
    backends: list          # one or two simulated GPUs, then the CPU
    graph: Graph
    roots: list             # the tensors build_forward_expand made the graph from, in turn
    assignments: list       # (node, backend index) the user assigns
    parallel: bool
    keep: list              # the buffers of the pre-allocated tensors


@st.composite
def graphs(draw):
    """A random Problem: a graph over one or two GPUs and the CPU."""
    host = SimBufferType("CPU", 32, None, True)
    vrams = [SimBufferType(f"GPU{i}", 32, None, False) for i in range(draw(st.integers(1, 2)))]
    backends = [Backend(b.name, b, "gpu") for b in vrams] + [GgmlCPU("CPU", host, "cpu")]
    ctx = Context("vs-ggml")
    tensors, placed = [], {}
    for i in range(draw(st.integers(1, 8))):
        t = ctx.new_tensor(draw(st.sampled_from(TYPES)), draw(st.sampled_from(SHAPES)),
                           name=f"leaf{i}")
        kind = draw(st.sampled_from(LEAF_KINDS))
        if kind == "input":
            t.set_input()
        elif kind != "plain":
            where, usage = kind.split()
            placed.setdefault((draw(st.sampled_from(vrams)) if where == "gpu" else host,
                               "weights" if usage == "weight" else "any"), []).append(t)
        tensors.append(t)
    keep = [buf for (buft, usage), ts in placed.items()
            for buf in alloc_ctx_tensors_from_buft(ts, buft, usage=usage)]
    g = Graph(512)
    roots = []
    n_nodes = draw(st.integers(1, 40))
    for i in range(n_nodes):
        op = draw(st.sampled_from(sorted(OP_SOURCES) + ["VIEW", "RESHAPE", "TRANSPOSE"]))
        if op in ("VIEW", "RESHAPE", "TRANSPOSE"):
            src = draw(st.sampled_from(tensors))
            ne0, ne1 = src.ne[:2]
            if op == "TRANSPOSE":       # strides swapped: not contiguous
                t = ctx.new_op(op, [src], src.type, (ne0, ne1), view_of=src, name=f"n{i}",
                               nb=(src.nb[1], src.nb[0], *src.nb[2:]))
            else:                       # the whole of src, or its rows after the first
                skip = draw(st.integers(0, 1)) if op == "VIEW" and ne1 > 1 else 0
                t = ctx.new_op(op, [src], src.type, (ne1 - skip, ne0), view_of=src,
                               view_offs=skip * src.nb[1], name=f"n{i}")
        else:
            srcs = [draw(st.sampled_from(tensors))
                    for _ in range(draw(st.sampled_from(OP_SOURCES[op])))]
            t = ctx.new_op(op, srcs, draw(st.sampled_from(TYPES)),
                           draw(st.sampled_from(SHAPES)), name=f"n{i}")
        if draw(st.integers(0, 5)) == 0:
            t.set_output()
        tensors.append(t)
        # about one node in three is expanded at once: the rest reach the graph only as
        # sources of later nodes, or not at all
        if draw(st.integers(0, 2)) == 0 or i == n_nodes - 1:
            roots.append(t)
            g.build_forward_expand(t)
    assignments = draw(st.lists(st.tuples(st.sampled_from(g.nodes),
                                          st.integers(0, len(backends) - 1)), max_size=3))
    return Problem(backends, g, roots, assignments, draw(st.booleans()), keep)


def _index(backends, backend):
    return -1 if backend is None else backends.index(backend)


def ggml_decides(p, endpoints):
    """What ggml decides for Problem p, through its public calls: (the nodes and leafs,
    by name, that its build_forward_expand makes of p's roots; its scheduler's plan and
    allocation, or None where it aborts). ggml runs in a forked child, on the graph as
    built (the parent's split rewires it), so that its aborts end the child, not the
    tests; the child sends each answer as a line as soon as it has it."""
    g = p.graph
    tensors = list(g.leafs) + list(g.nodes)
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # (3.12: fork with threads)
        pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(r)
            faulthandler.disable()                              # and quiet, ggml's abort
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"
            ref = GgmlSched(g, endpoints, parallel=p.parallel, init_views=False)
            os.write(w, json.dumps(ref.expansion(p.roots, g.size)).encode() + b"\n")
            ref.assignments = p.assignments
            plan = {"allocated": ref.alloc(),
                    "splits": [ref.n_splits, ref.n_copies],
                    "backends": [ref.backend_index(t) for t in tensors],
                    "buffer_sizes": [ref.buffer_size(i) for i in range(len(endpoints) + 1)],
                    "locations": [ref.location(t) for t in tensors]}
            os.write(w, json.dumps(plan).encode() + b"\n")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    _, status = os.waitpid(pid, 0)
    aborted = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT
    assert (aborted and len(lines) == 1) or (status == 0 and len(lines) == 2), \
        f"the child running ggml ended with status {status}"
    return json.loads(lines[0]), None if aborted else json.loads(lines[1])


def describe(p):
    """Problem p, tensor by tensor, for a failure's message."""
    lines = [f"backends {[b.name for b in p.backends]}, parallel={p.parallel}, roots "
             f"{[t.name for t in p.roots]}, user assignments "
             f"{[(t.name, p.backends[b].name) for t, b in p.assignments]}"]
    for t in list(p.graph.leafs) + list(p.graph.nodes):
        buf = get_buffer(t if t.view_src is None else t.view_src)
        lines.append(f"  {t.name} = {t.op}({', '.join(x.name for x in t.src if x is not None)})"
                     f" ne={list(t.ne)} flags={t.flags}"
                     + (f" view of {t.view_src.name}" if t.view_src is not None else "")
                     + (f" in {buf.buffer_type.name} {buf.usage}" if buf is not None else ""))
    return "\n".join(lines)


@settings(max_examples=int(os.environ.get("GGML_PY_VS_GGML_EXAMPLES", "150")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(graphs())
def test_graph_plan_and_allocation_are_ggmls(endpoints, problem):
    backends, g, assignments = problem.backends, problem.graph, problem.assignments
    tensors = list(g.leafs) + list(g.nodes)
    # where weights and caches lie is the loader's choice, not the allocator's: each side
    # placed them its own way
    preallocated = [get_buffer(t if t.view_src is None else t.view_src) is not None
                    for t in tensors]
    graph = describe(problem)
    expansion, theirs = ggml_decides(problem, endpoints[:len(backends) - 1])
    assert [[t.name for t in g.nodes], [t.name for t in g.leafs]] == expansion, graph
    sched = Scheduler(backends, graph_size=g.size, parallel=problem.parallel, op_offload=True)
    try:
        try:
            for t, b in assignments:
                sched.set_tensor_backend(t, b)
            ours = {"allocated": sched.alloc_graph(g),
                    "splits": [sched.n_splits, sched.n_copies],
                    "backends": [_index(backends, sched.get_tensor_backend(t)) for t in tensors],
                    "buffer_sizes": [sched.get_buffer_size(b) for b in backends],
                    "locations": [list(sched.tensor_location(t)[:2]) for t in tensors]}
        except GgmlPyError as e:
            # ggml_py refuses where ggml aborts
            assert theirs is None, \
                f"ggml_py raised where ggml does not abort: {e!r}\n{graph}"
            return
        assert theirs is not None, f"ggml aborts where ggml_py plans the graph\n{graph}"
        for decided in (ours, theirs):
            decided["backends"] = dict(zip([t.name for t in tensors], decided["backends"]))
            decided["locations"] = {t.name: where for t, where, pre
                                    in zip(tensors, decided["locations"], preallocated)
                                    if not pre}
        assert ours == theirs, f"{graph}\nggml_py: {ours}\nggml:    {theirs}"
    finally:
        sched.close()
