"""The graph allocator (port of ggml-alloc.c): `GraphAllocator` (ggml_gallocr, with
ggml's names: reserve, reserve_n, reserve_n_size, alloc_graph, get_buffer_size) and
`TensorAllocator` (ggml_tallocr) are the Cython classes of _alloc.pyx.

`alloc_ctx_tensors_from_buft` places a context's tensors (weights, caches, the tensors
of a test) in as few buffers of one buffer type as its largest buffer allows;
`tensors_from_arrays` makes, places and fills such tensors from numpy arrays in one call.

`validate_allocation` checks an allocated graph: every tensor lies inside its
buffer, and no two tensors that are alive at the same time share bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from ggml_py._alloc import (GraphAllocator, TensorAllocator, VBuffer,
                            op_can_inplace, INPLACE_OPS)
from ggml_py._backend import Backend, Buffer, BufferType, BUFFER_USAGES, get_buffer, view_init
from ggml_py._core import Context, Graph, Tensor, instance_arg, items_arg
from ggml_py.errors import AllocationError, ArgumentTypeError, UnknownNameError

if TYPE_CHECKING:
    from ggml_py._core import TypeSpec

__all__ = ["GraphAllocator", "TensorAllocator", "VBuffer", "op_can_inplace", "INPLACE_OPS",
           "alloc_ctx_tensors_from_buft", "tensors_from_arrays", "validate_allocation",
           "allocation_problems"]


# ---------------------------------------------------------------------------
# a context's tensors in buffers of one type (ggml-alloc.c)

def alloc_ctx_tensors_from_buft(tensors: Context | Iterable[Tensor], buft: BufferType,
                                usage: str = "any") -> list[Buffer]:
    """Port of ggml_backend_alloc_ctx_tensors_from_buft: place every tensor of `tensors`
    (a Context, or tensors in order) that has no memory yet, one after another at the
    buffer type's alignment, starting a new buffer where the next tensor would pass
    the type's largest buffer; views then take their view_src's memory. Returns the
    new buffers (ggml: one buffer, or a multi-buffer), each with `usage`; an empty list
    when every tensor already has memory (ggml: NULL)."""
    instance_arg(buft, BufferType, "buft")
    if not isinstance(usage, str) or usage not in BUFFER_USAGES:
        raise UnknownNameError(f"buffer usage is one of {', '.join(BUFFER_USAGES)}, got {usage!r}")
    if isinstance(tensors, Context):
        tensors = list(tensors)
    tensors = items_arg(tensors, "alloc_ctx_tensors_from_buft: tensors", Tensor)
    align, max_size = buft.get_alignment(), buft.get_max_size()
    buffers = []

    def alloc_range(group, size):
        buf = buft.alloc_buffer(size)
        buf.usage = usage
        talloc = TensorAllocator(buf)
        for t in group:
            if t.data_address == 0 and get_buffer(t) is None:
                if t.view_src is None:
                    talloc.alloc(t)
                elif get_buffer(t.view_src) is not None:
                    view_init(t)
        buffers.append(buf)

    group: list[Tensor] = []
    size = 0
    for t in tensors:
        this = 0
        if t.data_address == 0 and t.view_src is None:
            this = -(-buft.get_alloc_size(t) // align) * align        # GGML_PAD
        if size > 0 and size + this > max_size:
            alloc_range(group, size)
            group, size = [], 0
        group.append(t)
        size += this
    if size > 0:
        alloc_range(group, size)
    # views whose view_src came later in the list
    for t in tensors:
        if get_buffer(t) is None and t.view_src is not None and get_buffer(t.view_src) is not None:
            view_init(t)
    return buffers


# ---------------------------------------------------------------------------
# validation

def _liveness(graph):
    """First and last node index at which each memory-owning tensor must hold its data.

    The rules are ggml-alloc's: leafs and INPUT tensors are placed before the
    first node (-1); any other tensor when it is first met as a node or a
    source. It stays alive until its last reader, where reading a view that is
    a graph node (VIEW, RESHAPE, ... not the scheduler's op-NONE dependency
    views) counts as reading its view source; OUTPUT tensors stay alive to
    the end. Keys are tensors (handles hash by pointer).
    """
    nodes = graph.nodes
    n = len(nodes)
    first, last = {}, {}

    def touch(t, i):
        if t not in first:
            first[t] = i
        last[t] = max(last.get(t, -1), i)

    for t in graph.leafs:
        touch(t, -1)
    for i, node in enumerate(nodes):
        if "INPUT" in node.flags:
            touch(node, -1)
        for s in node.src:
            if s is not None and "INPUT" in s.flags:
                touch(s, -1)
    for i, node in enumerate(nodes):
        for s in node.src:
            if s is None:
                continue
            touch(s, i)
            vs = s.view_src
            if vs is not None and s in graph and s.op != "NONE":
                touch(vs, i)
        touch(node, i)
        if node.view_src is not None and node.op != "NONE":
            touch(node.view_src, i)
    for t in list(first):
        if "OUTPUT" in t.flags:
            last[t] = n
    return first, last


def allocation_problems(graph, allocator=None):
    """Problems of an allocated graph, as messages (empty when it is sound).

    Checks that every tensor with a buffer lies inside it, and that no two
    tensors whose lifetimes (see _liveness) meet share bytes; the only allowed
    meeting is ggml's in-place reuse, where a node of an in-place op starts at
    the address of a source whose life ends at that node. With `allocator`,
    only tensors in its chunk buffers are checked for overlap.
    """
    instance_arg(graph, Graph, "graph")
    instance_arg(allocator, GraphAllocator, "allocator", optional=True)
    problems = []
    seen = {}
    for t in list(graph.leafs) + list(graph.nodes):
        for x in [t] + [s for s in t.src if s is not None]:
            seen.setdefault(x, None)
            if x.view_src is not None:
                seen.setdefault(x.view_src, None)

    # inside the buffer
    owners = []
    for t in seen:
        buf = get_buffer(t)
        if buf is None:
            continue
        addr, size = t.data_address, t.nbytes
        if addr == 0:
            if size and buf.size:
                problems.append(f"'{t.name}' has a {buf.buffer_type.name} buffer but no data")
            continue
        if addr < buf.base or addr + size > buf.base + buf.size:
            problems.append(f"'{t.name}' [{addr - buf.base}, +{size}) lies outside its "
                            f"{buf.buffer_type.name} buffer of {buf.size} bytes")
        if t.view_src is None and size > 0:
            if allocator is None or allocator.tensor_location(t)[2] is not None:
                owners.append(t)

    # no overlap while alive, within each buffer (simulated buffers' fake addresses may
    # coincide across buffers: nothing is behind them)
    first, last = _liveness(graph)
    nodes = graph.nodes
    live = [(t, first.get(t), last.get(t), get_buffer(t)) for t in owners if t in first]
    live.sort(key=lambda e: (id(e[3]), e[0].data_address))
    for a in range(len(live)):
        ta, fa, la, buf = live[a]
        end_a = ta.data_address + ta.nbytes
        for b in range(a + 1, len(live)):
            tb, fb, lb, buf_b = live[b]
            if buf_b is not buf or tb.data_address >= end_a:
                break
            if la < fb or lb < fa:
                continue            # lifetimes do not meet
            if _in_place(ta, la, tb, fb, nodes) or _in_place(tb, lb, ta, fa, nodes):
                continue
            problems.append(
                f"'{ta.name}' [{ta.data_address:#x}, +{ta.nbytes}) alive {fa}..{la} overlaps "
                f"'{tb.name}' [{tb.data_address:#x}, +{tb.nbytes}) alive {fb}..{lb}")
    return problems


def _in_place(parent, parent_last, node, node_first, nodes):
    """node is computed in place in parent's memory at the node where parent dies."""
    if parent_last != node_first or node_first < 0 or nodes[node_first] != node:
        return False
    return (op_can_inplace(node.op) and parent.data_address == node.data_address
            and any(s == parent for s in node.src if s is not None))


def tensors_from_arrays(arrays: Mapping[str, Any], where: Backend | BufferType,
                        type: TypeSpec | None = None, usage: str = "weights"
                        ) -> dict[str, Tensor]:
    """Weights (or any tensors the graphs read) from numpy arrays, in one call: a new
    context with a tensor per array, named by its key, of the array's numpy-order shape
    and of `type` (default: the array's dtype), placed by alloc_ctx_tensors_from_buft in
    `where` (a backend: its default buffer type) with `usage`, each array then written
    with ggml's rounding (Tensor.write). {name: Tensor}, in the mapping's order; the
    tensors keep their context and memory alive."""
    if not isinstance(arrays, Mapping):
        raise ArgumentTypeError(f"tensors_from_arrays: arrays is a mapping of names to arrays, "
                                f"got {_type_name(arrays)}")
    buft = where.get_default_buffer_type() if isinstance(where, Backend) else where
    instance_arg(buft, BufferType, "tensors_from_arrays: where (a Backend or a BufferType)")
    ctx = Context()
    values = {name: np.asarray(a) for name, a in arrays.items()}
    tensors = {name: ctx.new_tensor(a.dtype if type is None else type, a.shape, name=name)
               for name, a in values.items()}
    alloc_ctx_tensors_from_buft(ctx, buft, usage)
    for name, t in tensors.items():
        t.write(values[name])
    return tensors


def _type_name(x: object) -> str:
    return type(x).__name__


def validate_allocation(graph: Graph, allocator: GraphAllocator | None = None) -> int:
    """Raise AllocationError listing every problem of an allocated graph (see
    allocation_problems); return the number of tensors checked otherwise."""
    problems = allocation_problems(graph, allocator)
    if problems:
        raise AllocationError("invalid allocation:\n  " + "\n  ".join(problems))
    return len(graph.leafs) + len(graph.nodes)
