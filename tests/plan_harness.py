"""Rebuild ggml's scheduler graph copy from a golden case + plan file and run the
graph allocator on it, the way ggml_backend_sched_alloc_graph does on a new
scheduler. Lets the allocator be compared with ggml's `alloc` block before the
scheduler port exists (the split itself is taken from the plan).

See /work/shared/SCHED_CASES.md for the formats.
"""

import json
import os

from ggml_py import Context, Graph, BufferType
from ggml_py._backend import fake_buffer, set_buffer, get_buffer
from ggml_py.alloc import GraphAllocator

CASES_DIR = os.environ.get("GGML_PY_CASES", "/work/shared/cases")
N_COPIES_PARALLEL = 4       # GGML_SCHED_MAX_COPIES


class SimBufferType(BufferType):
    """A simulated buffer type: fake, aligned, non-null base, no memory."""

    def alloc_buffer(self, size):
        return fake_buffer(self, size)


def _shape(ne):
    return list(reversed(ne))


def build(case, plan):
    """(allocator, graph, node_ids, leaf_ids, backend names); the graph's context keeps the
    dummy buffers of the pre-allocated tensors alive."""
    bufts = {}
    backend_bufts = []
    for b in case["backends"]:
        name = b["buffer_type"]
        if name not in bufts:
            bufts[name] = SimBufferType(name, alignment=b.get("buffer_type_alignment", 32),
                                        max_size=b.get("buffer_type_max_size"),
                                        is_host=b["buffer_type_is_host"])
        backend_bufts.append(bufts[name])
    backend_ids = {b["name"]: i for i, b in enumerate(case["backends"])}
    n_copies = N_COPIES_PARALLEL if case.get("parallel") else 1

    ctx = Context("case")
    keep = []               # the dummy buffers must outlive the graph
    tensors = []
    for t in case["tensors"]:
        view_of = tensors[t["view_src"]] if t["view_src"] is not None else None
        x = ctx.new_op(t["op"], [], t["type"], _shape(t["ne"]), view_of=view_of,
                       view_offs=t["view_offs"], nb=t["nb"], name=t["name"])
        x.flags = t["flags"]
        tensors.append(x)
    for t, x in zip(case["tensors"], tensors):
        for j, s in enumerate(t["src"]):
            x.set_src(j, None if s is None else tensors[s])
    # pre-allocated tensors: a dummy buffer each, views at their view_offs
    for t, x in zip(case["tensors"], tensors):
        if t["buffer"] is not None and t["view_src"] is None:
            name = t["buffer"]["buffer_type"]
            bt = bufts.setdefault(name, SimBufferType(name))
            buf = fake_buffer(bt, max(x.nbytes, 1))
            buf.usage = t["buffer"]["usage"]
            keep.append(buf)
            set_buffer(x, buf, 0)
    for t, x in zip(case["tensors"], tensors):
        if t["buffer"] is not None and t["view_src"] is not None:
            vs = tensors[t["view_src"]]
            set_buffer(x, get_buffer(vs), vs.data_address - get_buffer(vs).base + t["view_offs"])

    tokens = {}

    def tok(v):
        if isinstance(v, int):
            return tensors[v]
        if v in tokens:
            return tokens[v]
        if v.startswith("dep:"):
            # a new dependency view for every split input, never shared
            src = tensors[int(v[4:])]
            x = ctx.new_op("NONE", [src], src.type, _shape(src.ne), view_of=src, nb=src.nb,
                           name=f"{src.name} (view)")
            return x
        else:
            tid, rest = v.split("@")
            backend, c = rest.split("#")
            src = tensors[int(tid)]
            x = ctx.new_tensor(src.type, _shape(src.ne), name=f"{backend}#{src.name}#{c}")
            x.nb = src.nb
            if n_copies > 1:
                x.flags = ["INPUT", "OUTPUT"]
        tokens[v] = x
        return x

    # the split's source rewiring (node_srcs: each node's src[] after the split)
    for i, srcs in zip(case["nodes"], plan["node_srcs"]):
        node = tensors[i]
        for j in range(10):
            node.set_src(j, None)
        for j, s in enumerate(srcs):
            node.set_src(j, None if s is None else tok(s))
    for g in plan.get("graph_inputs", []):
        if n_copies > 1:
            tensors[g].flags = sorted(set(tensors[g].flags) | {"INPUT", "OUTPUT"})

    gc = plan["graph_copy"]
    nodes = [tok(v) for v in gc["nodes"]]
    leafs = [tok(v) for v in gc["leafs"]]
    graph = Graph.from_lists(nodes, leafs, size=max(case["graph_size"], len(nodes), len(leafs)),
                             context=ctx, allow_duplicates=True)
    node_ids = [backend_ids[b] for b in gc["node_backends"]]
    leaf_ids = [-1 if b is None else backend_ids[b] for b in gc["leaf_backends"]]
    galloc = GraphAllocator(backend_bufts)
    ctx.keep(keep)          # the graph's context keeps the dummy buffers alive
    return galloc, graph, node_ids, leaf_ids, [b["name"] for b in case["backends"]]


def alloc_like_sched(galloc, graph, node_ids, leaf_ids):
    """ggml_backend_sched_alloc_splits on a new scheduler (previous ids all 0)."""
    bufts = galloc.buffer_types
    changed = any(i != 0 and bufts[i] is not bufts[0] for i in node_ids) or \
        any(i < 0 or (i != 0 and bufts[i] is not bufts[0]) for i in leaf_ids)
    if changed or not galloc.alloc_graph(graph):
        galloc.reserve_n(graph, node_ids, leaf_ids)
        assert galloc.alloc_graph(graph)


def alloc_block(galloc, graph, backend_names):
    """The plan file's `alloc` block, from this allocator."""
    return {
        "buffer_sizes": {n: galloc.get_buffer_size(i) for i, n in enumerate(backend_names)},
        "chunk_sizes": {n: galloc.chunk_sizes(i) for i, n in enumerate(backend_names)},
        "graph_copy_nodes": galloc.locations(graph.nodes),
        "graph_copy_leafs": galloc.locations(graph.leafs),
    }


def run_case(name):
    """(ours, ggml's) alloc blocks for a case name relative to CASES_DIR."""
    base = os.path.join(CASES_DIR, name)
    with open(base + ".case.json") as f:
        case = json.load(f)
    with open(base + ".plan.json") as f:
        plan = json.load(f)
    galloc, graph, node_ids, leaf_ids, names = build(case, plan)
    alloc_like_sched(galloc, graph, node_ids, leaf_ids)
    return alloc_block(galloc, graph, names), plan["alloc"], (galloc, graph, node_ids, leaf_ids)


def case_names():
    if not os.path.isdir(CASES_DIR):
        return []
    out = []
    for sub in ("", "random"):
        d = os.path.join(CASES_DIR, sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".plan.json"):
                out.append(os.path.join(sub, f[:-len(".plan.json")]) if sub else f[:-len(".plan.json")])
    return out
