"""The graph allocator against a plain model of ggml-alloc's planning.

The allocator plans from dense per-tensor records found through the tensors' `order`
fields (see hash_node in _alloc.pxd); ggml keys its planning state by tensor address.
The model below keys it by tensor, in Python dictionaries, and follows ggml-alloc.c's
control flow (ggml_gallocr_alloc_graph_impl, ggml_dyn_tallocr): on random graphs --
with sources outside the graph, tensors listed twice, buffer types sizing tensors in
Python, and tensors whose `order` another graph set last -- every tensor must land
where the model puts it, and every buffer must have the model's chunk sizes.
"""

from hypothesis import given, settings, strategies as st, HealthCheck

from ggml_py import Graph
from ggml_py._backend import clear_buffer, get_buffer
from ggml_py.alloc import GraphAllocator, op_can_inplace, validate_allocation

from test_alloc import Sim, random_problem

SIZE_MAX = 2**64 - 1
MAX_CHUNKS = 16


class Padded(Sim):
    """Sizes tensors in Python (get_alloc_size), by layout, so in-place reuse stays legal."""

    def get_alloc_size(self, tensor):
        return tensor.nbytes + 40


def _pad(size, alignment):
    return size + (alignment - size % alignment) % alignment


class ModelChunks:
    """ggml_dyn_tallocr: per chunk a sorted free list [[offset, size], ...] and a high-water mark."""

    def __init__(self, alignment, max_size):
        self.alignment = alignment
        self.max_chunk = min(SIZE_MAX if max_size is None else max_size, SIZE_MAX // 2)
        self.free = []
        self.high = []

    def alloc(self, size):
        size = _pad(size, self.alignment)
        best = None
        for c, blocks in enumerate(self.free):      # best fit, not the last block of a chunk
            best_size = SIZE_MAX
            for i, (_, bsize) in enumerate(blocks[:-1]):
                if size <= bsize <= best_size:
                    best, best_size = (c, i), bsize
        if best is None:                            # a chunk's last block: least waste or growth
            best_reuse = -2**63
            for c, blocks in enumerate(self.free):
                if blocks:
                    off, bsize = blocks[-1]
                    reuse = (self.high[c] - off - size) % 2**64
                    reuse = reuse - 2**64 if reuse >= 2**63 else reuse
                    if bsize >= size and ((best_reuse < 0 and reuse > best_reuse)
                                          or 0 <= reuse < best_reuse):
                        best, best_reuse = (c, len(blocks) - 1), reuse
        if best is None:                            # a new chunk (the 16th is unbounded)
            assert len(self.free) < MAX_CHUNKS
            cap = SIZE_MAX // 2 if len(self.free) == MAX_CHUNKS - 1 else max(size, self.max_chunk)
            self.free.append([[0, cap]])
            self.high.append(0)
            best = (len(self.free) - 1, 0)
        c, i = best
        block = self.free[c][i]
        addr = (c, block[0])
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.free[c][i]
        self.high[c] = max(self.high[c], addr[1] + size)
        return addr

    def release(self, addr, size):
        size = _pad(size, self.alignment)
        c, off = addr
        blocks = self.free[c]
        for i, block in enumerate(blocks):
            if block[0] + block[1] == off:
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks.pop(i + 1)[1]
                return
            if off + size == block[0]:
                block[0] = off
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += blocks.pop(i)[1]
                return
        blocks.insert(sum(1 for b in blocks if b[0] < off), [off, size])


def _same_layout(a, b):
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def model_plan(g, id_types, node_ids, leaf_ids):
    """ggml_gallocr_alloc_graph_impl over dictionaries: {tensor: (buffer id, (chunk,
    offset))} of the tensors it plans, and each buffer type's chunk sizes."""
    chunks = {bt: ModelChunks(bt.alignment, bt.max_size) for bt in id_types}
    children, views, place, own = {}, {}, {}, set()

    def has_memory(t):
        return t.data_address != 0 or get_buffer(t) is not None

    def size(t, bid):
        return id_types[bid].get_alloc_size(t)

    def allocate(t, bid):
        if has_memory(t) or t in own or t.view_src is not None:
            return
        own.add(t)
        if op_can_inplace(t.op):
            for p in t.src:
                if (p is None or p not in own or "OUTPUT" in p.flags
                        or not _same_layout(t, p)):
                    continue
                if children.get(p, 0) == 1 and views.get(p, 0) == 0:
                    pbid, paddr = place[p]
                    place[t] = place[p]
                    own.discard(p)
                    psize = _pad(size(p, pbid), id_types[pbid].alignment)
                    tsize = _pad(size(t, pbid), id_types[pbid].alignment)
                    assert psize >= tsize
                    if psize > tsize:
                        chunks[id_types[pbid]].release((paddr[0], paddr[1] + tsize), psize - tsize)
                    return
        place[t] = (bid, chunks[id_types[bid]].alloc(size(t, bid)))

    def release(t):
        if "OUTPUT" not in t.flags:
            bid, addr = place[t]
            chunks[id_types[bid]].release(addr, size(t, bid))
            own.discard(t)

    nodes, leafs = list(g.nodes), list(g.leafs)
    for t, bid in zip(leafs, leaf_ids):
        allocate(t, bid)
    for t, bid in zip(nodes, node_ids):
        if t.view_src is not None and t.op != "NONE":
            views[t.view_src] = views.get(t.view_src, 0) + 1
        if "INPUT" in t.flags:
            allocate(t, bid)
        for s in t.src:
            if s is not None:
                children[s] = children.get(s, 0) + 1
                if "INPUT" in s.flags:
                    allocate(s, bid)
    for t, bid in zip(nodes, node_ids):
        for s in t.src:
            if s is not None:
                allocate(s, bid)
        allocate(t, bid)
        for s in t.src:
            if s is None:
                continue
            children[s] -= 1
            if children[s] == 0 and views.get(s, 0) == 0:
                if s.view_src is not None:
                    v = s.view_src
                    views[v] -= 1
                    if views[v] == 0 and children.get(v, 0) == 0 and v in own:
                        release(v)
                elif s in own:
                    release(s)
    return place, {bt: m.high for bt, m in chunks.items()}


def forget(g):
    """Take back every placement of the graph's tensors and their sources."""
    for t in list(g.nodes) + list(g.leafs):
        for x in [t] + [s for s in t.src if s is not None]:
            clear_buffer(x)


def check_against_model(ga, g, id_types, node_ids, leaf_ids, sound=True):
    place, high = model_plan(g, id_types, node_ids, leaf_ids)
    # the planned sizes (a dry run); an allocator's buffers never shrink, a new one's match
    assert ga.reserve_n_size(g, node_ids, leaf_ids) == [sum(high[bt]) for bt in id_types]
    fresh = all(ga.buffer(i) is None for i in range(len(id_types)))
    assert ga.reserve_n(g, node_ids, leaf_ids) and ga.alloc_graph(g)
    for t, (bid, (chunk, offset)) in place.items():
        assert ga.tensor_location(t) == (id_types[bid].name, offset, chunk), t.name
    for i, bt in enumerate(id_types):
        if fresh and id_types.index(bt) == i:
            assert ga.chunk_sizes(i) == (high[bt] if sum(high[bt]) else []), bt.name
    if sound:
        validate_allocation(g, ga)
    forget(g)


@st.composite
def changed_problem(draw):
    """A random problem, changed: some nodes left out of the graph (outside sources),
    some tensors listed twice, and maybe a buffer type that sizes in Python."""
    g, id_types, node_ids, leaf_ids = draw(random_problem())
    nodes, leafs = list(g.nodes), list(g.leafs)
    if draw(st.booleans()):
        padded = Padded("PAD", alignment=draw(st.sampled_from([16, 64])))
        id_types = [padded if draw(st.booleans()) else bt for bt in id_types]
    # a computing node read by others may live outside the graph (views may not: a
    # view of a computed tensor must be a node)
    keep = [draw(st.integers(0, 3)) > 0 or n.view_src is not None for n in nodes]
    node_ids = [b for b, k in zip(node_ids, keep) if k]
    nodes = [n for n, k in zip(nodes, keep) if k]
    if leafs and draw(st.booleans()):
        i = draw(st.integers(0, len(leafs) - 1))
        leafs.append(leafs[i])
        leaf_ids.append(leaf_ids[i])
    if not nodes:
        nodes, node_ids = list(g.nodes[:1]), node_ids[:1] or [0]
    g2 = Graph.from_lists(nodes, leafs, allow_duplicates=True)
    return g2, id_types, node_ids, leaf_ids, all(keep)


HYP = dict(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(**HYP)
@given(random_problem())
def test_random_graphs_match_the_model(problem):
    g, id_types, node_ids, leaf_ids = problem
    check_against_model(GraphAllocator(id_types), g, id_types, node_ids, leaf_ids)


@settings(**HYP)
@given(changed_problem())
def test_outside_sources_duplicates_and_python_sizes_match_the_model(problem):
    # (ggml plans a source outside the graph as memory that the graph does not compute,
    # which the soundness check of validate_allocation does not model)
    g, id_types, node_ids, leaf_ids, no_outside = problem
    check_against_model(GraphAllocator(id_types), g, id_types, node_ids, leaf_ids,
                        sound=no_outside)


@settings(**HYP)
@given(random_problem(), st.data())
def test_orders_left_by_other_graphs_are_not_trusted(problem, data):
    # the same tensors planned in other graphs first, at other positions, by this
    # allocator and by another: the records they leave in `order` must not leak
    g, id_types, node_ids, leaf_ids = problem
    nodes, leafs = list(g.nodes), list(g.leafs)
    ga, other = GraphAllocator(id_types), GraphAllocator(id_types)
    cut = data.draw(st.integers(0, len(nodes) - 1))
    # the first nodes as a graph of their own, the leafs in reverse
    part = Graph.from_lists(nodes[:cut + 1], leafs[::-1])
    for alloc in (other, ga):
        assert alloc.reserve(part) and alloc.alloc_graph(part)
        forget(part)
    check_against_model(ga, g, id_types, node_ids, leaf_ids)
    # and again, after the plan of g itself
    check_against_model(ga, g, id_types, node_ids, leaf_ids)


def test_a_source_replaced_after_the_plan_is_checked_and_placed():
    # alloc_graph checks and places a source at the graph position it had when planned;
    # a source swapped for another tensor (of the same graph, but larger) is not there
    from test_alloc import f32, op
    from ggml_py import Context
    ctx = Context()
    x = f32(ctx, 16, "x", flags=["INPUT"])
    a = op(ctx, "a", [x], (16,), "SCALE")
    big = op(ctx, "big", [x], (64,), "CONT")
    b = op(ctx, "b", [a], (16,), "CONT", flags=["OUTPUT"])
    g = Graph.from_lists([a, big, b], [x])
    bt = Sim("S", alignment=16)
    ga = GraphAllocator([bt])
    assert ga.reserve(g) and ga.alloc_graph(g)
    forget(g)
    b.set_src(0, big)             # b reads `big` now: its planned source was `a`
    assert ga.alloc_graph(g)      # a single buffer: planned again, and sound
    validate_allocation(g, ga)
    assert len(bt.calls) >= 1
    forget(g)
    check_against_model(GraphAllocator([bt]), g, [bt], [0, 0, 0], [0])
