"""Case files (SCHED_CASES.md, "ggml-sched-case/1"): load, check, write back.

A case is one scheduling problem: simulated backends in priority order, a
graph of tensors and where the pre-allocated tensors live. `load_case`
checks the file thoroughly (every error names the tensor, backend or field)
and builds the project's own objects; `Case.to_dict` reads those objects
back into the file's form, so a load/write round trip is a real test of both.
"""

import contextlib
import gc
import json
import math
import os

from ggml_py._backend import BUFFER_USAGES, fake_buffers, get_buffer, set_buffer
from ggml_py._caseio import document_tables, read_case_tables
from ggml_py._core import (Context, Graph, FLAG_NAMES, MAX_BYTES, MAX_ELEMENTS, OP_IDS,
                           TYPE_IDS, blck_size, row_size)
from ggml_py._validate import (INT32_MAX, INT64_MAX, SIZE_MAX, check_keys, check_int,
                               check_bool, check_str, check_name, check_list, check_choice,
                               fail, is_int)
from ggml_py.backends.sim import SimBackend, buffer_types_from_dicts
from ggml_py.errors import ArgumentTypeError, CaseFormatError, GgmlPyError, UnknownNameError

FORMAT = "ggml-sched-case/1"
CASE_KEYS = ("format", "name", "graph_size", "parallel", "op_offload", "backends", "tensors",
             "nodes", "leafs")
TENSOR_KEYS = ("id", "name", "op", "type", "ne", "nb", "src", "view_src", "view_offs", "flags",
               "buffer", "backend")
BUFFER_KEYS = ("buffer_type", "usage")
MAX_SRC = 10
GGML_MAX_BACKENDS = 16      # a case may hold more: the scheduler then refuses it
MAX_BACKENDS = 64           # the most Scheduler(max_backends=...) takes


class Case:
    """A loaded case: backends, buffer types, tensors, graph, user assignments.

    Attributes
    ----------
    name, graph_size, parallel, op_offload : as in the file
    backends : list of SimBackend, priority order (the last should be the CPU)
    buffer_types : dict name -> BufferType, one object per name
    context : the Context holding the tensors; tensor i of the file is context[i]
    tensors : list of Tensor, indexed by the file's ids
    graph : the Graph (nodes and leafs in file order)
    assignments : list of (Tensor, backend name), user assignments in tensor id order
    buffers : the dummy buffers of the pre-allocated tensors (kept alive here)

    `restore()` puts every tensor's sources, view, flags and placement back
    as loaded (a split rewrites node sources; the allocator sets data); `rebuilt()`
    builds the case's graph again from new tensors.
    """

    def __init__(self, name, graph_size, parallel, op_offload, backends, buffer_types,
                 context, tensors, graph, assignments, buffers, tables, placements, source):
        self.name = name
        self.graph_size = graph_size
        self.parallel = parallel
        self.op_offload = op_offload
        self.backends = backends
        self.buffer_types = buffer_types
        self.context = context
        self.tensors = tensors
        self.graph = graph
        self.assignments = assignments
        self.buffers = buffers
        # the tensors, nodes and leafs as the case wrote them (a CaseTables)
        self._tables = tables
        # tensor id -> (dummy buffer, offset in it) for pre-allocated tensors
        self._placements = placements
        # the case dict, or the path of the file, it was loaded from
        self._source = source

    @property
    def _document(self):
        """The case dict it was loaded from, or its file's document (read again)."""
        return self._source if isinstance(self._source, dict) else read_json(self._source)

    def restore(self):
        """Reset sources, views, flags, buffers and data pointers to the loaded state."""
        _wire(self.tensors, self._tables, self._placements)

    def rebuilt(self):
        """The case built again: new tensors and graph in a new context, on the same
        backends, with the pre-allocated tensors in the same buffers at the same
        offsets (a model's next step, which builds an equal graph)."""
        settings = {"name": self.name, "graph_size": self.graph_size,
                    "parallel": self.parallel, "op_offload": self.op_offload}
        return _build_case(settings, self.backends, self.buffer_types, self._placements,
                           self._tables, self._source)

    def backend(self, name):
        """The backend called `name` (UnknownNameError, a KeyError, if there is none)."""
        for b in self.backends:
            if b.name == name:
                return b
        raise UnknownNameError(f"case {self.name!r} has no backend {name!r}")

    def __repr__(self):
        return (f"<Case {self.name!r}: {len(self.backends)} backends, {len(self.tensors)} "
                f"tensors, {self.graph.n_nodes} nodes, {self.graph.n_leafs} leafs>")

    def _id_of(self, t, where):
        """Case id of a tensor that must be one of this case's tensors."""
        if t is None:
            return None
        if (t.context is not self.context or t.id >= len(self.tensors)
                or self.tensors[t.id] != t):
            raise CaseFormatError(f"{where} refers to {t!r}, which is not a tensor of case "
                                  f"{self.name!r}")
        return t.id

    def to_dict(self):
        """The case in file form, read from the live objects.

        It reflects the tensors as they are now: call it before a split
        rewrites node sources, or after restoring them.
        """
        own_buffers = {id(b) for b in self.buffers}
        assigned = {t.id: name for t, name in self.assignments}
        tensors = []
        for i, t in enumerate(self.tensors):
            where = f"tensor {i} {t.name!r}"
            src = [self._id_of(s, f"{where} src") for s in t.src]
            # keep trailing nulls where the file wrote them (the shared files never do)
            src += [None] * (self._tables.n_src(i) - len(src))
            buf = get_buffer(t)
            tensors.append({
                "id": i,
                "name": t.name,
                "op": t.op,
                "type": t.type,
                "ne": list(t.ne),
                "nb": list(t.nb),
                "src": src,
                "view_src": self._id_of(t.view_src, f"{where} view_src"),
                "view_offs": t.view_offs,
                "flags": t.flags,
                "buffer": ({"buffer_type": buf.buffer_type.name, "usage": buf.usage}
                           if buf is not None and id(buf) in own_buffers else None),
                "backend": assigned.get(i),
            })
        return {
            "format": FORMAT,
            "name": self.name,
            "graph_size": self.graph_size,
            "parallel": self.parallel,
            "op_offload": self.op_offload,
            "backends": [b.to_dict() for b in self.backends],
            "tensors": tensors,
            "nodes": [self._id_of(t, "graph node") for t in self.graph.nodes],
            "leafs": [self._id_of(t, "graph leaf") for t in self.graph.leafs],
        }


# ---------------------------------------------------------------------------
# checks


def _tensor_where(i, t):
    name = t.get("name") if isinstance(t, dict) else None
    return f"tensor {i} {name!r}" if isinstance(name, str) else f"tensor {i}"


def _check_dims(value, where, field, limit):
    check_list(value, where, field)
    if len(value) != 4 or not all(is_int(x) and 0 <= x <= limit for x in value):
        fail(where, f"{field} must be 4 non-negative integers, got {value!r}")


def _check_ref(value, n, where, field, self_id):
    """A tensor id in range that is not the tensor itself."""
    if not is_int(value):
        fail(where, f"{field} must be a tensor id or null, got {value!r}")
    if not 0 <= value < n:
        fail(where, f"{field} = {value} is out of range ({n} tensors)")
    if value == self_id:
        fail(where, f"{field} refers to the tensor itself")


def _check_tensor(i, t, n, buffer_types, backend_names):
    """Everything about one tensor entry that needs no other tensor."""
    where = _tensor_where(i, t)
    check_keys(t, TENSOR_KEYS, (), where)
    if t["id"] != i:
        fail(where, f"id {t['id']!r} does not match its position {i} in the tensor list")
    check_name(t["name"], where, "name", allow_empty=True)
    check_choice(t["op"], OP_IDS, where, "op")
    check_choice(t["type"], TYPE_IDS, where, "type")
    _check_dims(t["ne"], where, "ne", INT64_MAX)
    _check_dims(t["nb"], where, "nb", SIZE_MAX)
    blck = blck_size(t["type"])
    if t["ne"][0] % blck:
        fail(where, f"ne[0] = {t['ne'][0]} is not a multiple of the {t['type']} block size {blck}")
    if math.prod(t["ne"]) > MAX_ELEMENTS:
        fail(where, f"ne {t['ne']} has {math.prod(t['ne'])} elements, more than {MAX_ELEMENTS}")
    if _nbytes(t) > MAX_BYTES:
        fail(where, f"ne {t['ne']} with nb {t['nb']} span {_nbytes(t)} bytes, more than "
                    f"{MAX_BYTES}")
    check_list(t["src"], where, "src")
    if len(t["src"]) > MAX_SRC:
        fail(where, f"src has {len(t['src'])} entries; ggml allows at most {MAX_SRC}")
    for j, s in enumerate(t["src"]):
        if s is not None:
            _check_ref(s, n, where, f"src[{j}]", i)
    if t["view_src"] is not None:
        _check_ref(t["view_src"], n, where, "view_src", i)
    check_int(t["view_offs"], where, "view_offs", 0, SIZE_MAX)
    check_list(t["flags"], where, "flags")
    for f in t["flags"]:
        check_choice(f, FLAG_NAMES, where, "flag")
    if len(set(t["flags"])) != len(t["flags"]):
        fail(where, f"a flag is listed twice in {t['flags']!r}")
    buf = t["buffer"]
    if buf is not None:
        check_keys(buf, BUFFER_KEYS, (), f"{where} buffer")
        if not isinstance(buf["buffer_type"], str) or buf["buffer_type"] not in buffer_types:
            fail(where, f"buffer: unknown buffer type {buf['buffer_type']!r}; no backend declares "
                        f"or supports it (known: {', '.join(sorted(buffer_types)) or 'none'})")
        check_choice(buf["usage"], BUFFER_USAGES, f"{where} buffer", "usage")
    if t["backend"] is not None and t["backend"] not in backend_names:
        fail(where, f"backend: assigned to unknown backend {t['backend']!r} "
                    f"(backends: {', '.join(backend_names) or 'none'})")


def _check_views(tensors):
    """ggml's invariants for views: view_src is a base tensor (ggml_new_tensor_impl
    collapses chains) and the view's data fits in it (ggml asserts this)."""
    for i, t in enumerate(tensors):
        v = t["view_src"]
        if v is None:
            continue
        where = _tensor_where(i, t)
        base = tensors[v]
        if base["view_src"] is not None:
            fail(where, f"view_src {v} {base['name']!r} is itself a view; ggml points views "
                        f"at the base tensor ({base['view_src']})")
        if t["buffer"] is not None and base["buffer"] is None:
            fail(where, f"a view with a buffer needs a view_src with one: view_src {v} "
                        f"{base['name']!r} has none (a view's memory is its view_src's)")
        data_size = row_size(t["type"], t["ne"][0]) * t["ne"][1] * t["ne"][2] * t["ne"][3]
        size = _nbytes(base)
        if data_size and data_size + t["view_offs"] > size:
            fail(where, f"view of {data_size} bytes at view_offs {t['view_offs']} does not fit "
                        f"in view_src {v} {base['name']!r} ({size} bytes)")
        # ggml checks the contiguous size only; strides reaching further would have
        # kernels read and write past the view_src
        if data_size and _nbytes(t) + t["view_offs"] > size:
            fail(where, f"the view's strides {t['nb']} reach {_nbytes(t)} bytes from view_offs "
                        f"{t['view_offs']}, past view_src {v} {base['name']!r} ({size} bytes)")


def _nbytes(t):
    """ggml_nbytes of a tensor entry."""
    ne, nb = t["ne"], t["nb"]
    if any(x <= 0 for x in ne):
        return 0
    blck = blck_size(t["type"])
    if blck == 1:
        return row_size(t["type"], 1) + sum((ne[i] - 1) * nb[i] for i in range(4))
    return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))


def _check_acyclic(tensors):
    """No tensor depends on itself through src and view_src (ggml builds
    every tensor from tensors made before it)."""
    deps = [[s for s in t["src"] if s is not None] +
            ([t["view_src"]] if t["view_src"] is not None else []) for t in tensors]
    state = [0] * len(tensors)      # 0 new, 1 on the current path, 2 done
    for root in range(len(tensors)):
        if state[root]:
            continue
        path, nexts = [root], [0]
        state[root] = 1
        while path:
            i = path[-1]
            if nexts[-1] == len(deps[i]):
                state[i] = 2
                path.pop()
                nexts.pop()
                continue
            j = deps[i][nexts[-1]]
            nexts[-1] += 1
            if state[j] == 1:
                cycle = path[path.index(j):] + [j]
                fail(_tensor_where(j, tensors[j]),
                     f"cycle in the source graph: {' -> '.join(map(str, cycle))}")
            if state[j] == 0:
                state[j] = 1
                path.append(j)
                nexts.append(0)


def _check_graph_lists(d, n):
    seen = {}
    for field in ("nodes", "leafs"):
        check_list(d[field], field, "value")
        for k, i in enumerate(d[field]):
            where = f"{field}[{k}]"
            if not is_int(i):
                fail(where, f"must be a tensor id, got {i!r}")
            if not 0 <= i < n:
                fail(where, f"tensor id {i} is out of range ({n} tensors)")
            if i in seen:
                fail(where, f"{_tensor_where(i, d['tensors'][i])} is already listed in {seen[i]}")
            seen[i] = where


def _check_header(d):
    """Check everything of a case dict but its tensor entries, nodes and leafs; return
    the buffer types and backends it describes."""
    check_keys(d, CASE_KEYS, (), "case")
    if d["format"] != FORMAT:
        fail("format", f"expected {FORMAT!r}, got {d['format']!r}")
    check_str(d["name"], "name", "case name")
    # ggml's graph size is an int
    check_int(d["graph_size"], "graph_size", "value", 1, INT32_MAX)
    check_bool(d["parallel"], "parallel", "value")
    check_bool(d["op_offload"], "op_offload", "value")
    check_list(d["backends"], "backends", "value")
    # limits before building anything: past these nothing could run the case
    if len(d["backends"]) > MAX_BACKENDS:
        fail("backends", f"{len(d['backends'])} backends; a scheduler takes at most "
                         f"{MAX_BACKENDS} (ggml: {GGML_MAX_BACKENDS})")
    check_list(d["tensors"], "tensors", "value")
    if len(d["tensors"]) > INT32_MAX:
        fail("tensors", f"{len(d['tensors'])} tensors, more than a graph can hold")
    buffer_types = buffer_types_from_dicts(d["backends"])
    backends = [SimBackend.from_dict(b, buffer_types) for b in d["backends"]]
    names = [b.name for b in backends]
    for k, name in enumerate(names):
        if name in names[:k]:
            fail(f"backends[{k}]", f"duplicate backend name {name!r}")
    return buffer_types, backends


def _check_case(d):
    """Check a case dict; return the buffer types and backends it describes and the
    typed tables of its tensors, nodes and leafs."""
    buffer_types, backends = _check_header(d)
    names = [b.name for b in backends]
    tensors = d["tensors"]
    # one typed pass clears a sound file; where it doubts, the checks below find the
    # fault and say it in words
    tables = document_tables(tensors, d["nodes"], d["leafs"])
    if tables is None or not tables.check(buffer_types, names):
        for i, t in enumerate(tensors):
            _check_tensor(i, t, len(tensors), buffer_types, names)
        _check_views(tensors)
        _check_acyclic(tensors)
        _check_graph_lists(d, len(tensors))
        if tables is None:      # passed in words, but with values of no JSON kind
            fail("tensors", "a tensor entry holds a value of a kind no case file has")
    return buffer_types, backends, tables


# ---------------------------------------------------------------------------
# load and write


def _wire(tensors, tables, placements):
    """Set every tensor's sources, view, flags and placement (see Case.restore)."""
    tables.wire(tensors)
    # the bases first: a view is placed after its view_src
    for i in sorted(placements, key=tables.is_view):
        set_buffer(tensors[i], *placements[i])


def load_case(source):
    """Load a case from a file path or from an already parsed dict.

    Raises CaseFormatError (naming the tensor, backend or field) for any
    malformed input.
    """
    with gc_paused():
        if isinstance(source, dict):
            d = source
        else:
            raw = _read_bytes(source)
            case = _load_typed(raw, source)
            if case is not None:
                return case
            d = _json_document(raw, source)
        buffer_types, backends, tables = _check_case(d)
        return _build_case(d, backends, buffer_types, None, tables, source)


def _load_typed(raw, path):
    """The case in file bytes `raw`, read straight into typed tables (no Python object
    per tensor); None where the reader or the typed checks doubt: json.loads and the
    checks in words then read the file and name any fault."""
    try:
        header, tables = read_case_tables(raw)
    except ValueError:
        return None
    d = dict(header, tensors=[], nodes=[], leafs=[])
    try:
        buffer_types, backends = _check_header(d)
    except GgmlPyError:
        return None
    if not tables.check(buffer_types, [b.name for b in backends]):
        return None
    return _build_case(d, backends, buffer_types, None, tables, path)


@contextlib.contextmanager
def gc_paused():
    """The cyclic collector off for a while (and back on after, if it was on): while a
    case is parsed and built, or planned, it would walk the case's objects again and
    again (a million at 100k nodes: half the load time) and find nothing to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build_case(d, backends, buffer_types, placements, tables=None, source=None):
    """The case of checked document d on these backends (its tensors, nodes and leafs
    in typed `tables`, made from d when None); its pre-allocated tensors in
    `placements` (tensor id -> (buffer, offset)), or in new dummy buffers when None."""
    if tables is None:
        tables = document_tables(d["tensors"], d["nodes"], d["leafs"])
        if tables is None:
            fail("tensors", "a tensor entry holds a value of a kind no case file has")
    ctx = Context(d["name"])
    # create every tensor first (ne and nb exactly as written), then wire sources and
    # views: a tensor may name a later one
    tensors = tables.build(ctx)

    if placements is None:
        ids, types, usages, offsets, sizes = tables.preallocated()
        # made in one call: a case's buffer types are simulated (SimBufferType, whose
        # alloc_buffer is fake_buffer)
        buffers = fake_buffers([buffer_types[t] for t in types], sizes, usages)
        placements = dict(zip(ids, zip(buffers, offsets)))
    _wire(tensors, tables, placements)

    # the graph holds what it lists: graph_size sizes the scheduler (a case may ask for
    # more than the machine has, which the scheduler refuses), not the graph
    nodes, leafs = tables.graph_tensors(tensors)
    graph = Graph.from_lists(nodes, leafs, context=ctx)
    buffers = [buf for buf, _ in placements.values()]
    return Case(d["name"], d["graph_size"], d["parallel"], d["op_offload"], backends,
                buffer_types, ctx, tensors, graph, tables.assignments(tensors), buffers,
                tables, placements, d if source is None else source)


def _read_bytes(source):
    """The bytes of case file `source` (CaseFormatError, naming it, where it cannot be
    read)."""
    try:
        path = os.fspath(source)
    except TypeError:
        raise ArgumentTypeError(f"a case is a file path or a dict, got "
                                f"{type(source).__name__}") from None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CaseFormatError(f"{path}: cannot read: {e}") from None


def read_json(source):
    """The JSON document in file `source`: UTF-8 text (a BOM allowed), as RFC 8259 asks.
    CaseFormatError, naming the file, for anything else."""
    return _json_document(_read_bytes(source), source)


def _json_document(raw, source):
    """The JSON document in a file's bytes (CaseFormatError, naming the file, where they
    are not one)."""
    path = os.fspath(source)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CaseFormatError(f"{path}: not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                              f"{e.start}); case files are UTF-8 JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseFormatError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise CaseFormatError(f"{path}: JSON nested too deeply") from None
    except ValueError as e:         # an integer literal past Python's digit limit, ...
        raise CaseFormatError(f"{path}: not a JSON document this reader accepts: {e}") from None


def format_case(d):
    """A case dict as text in the layout of the shared files: one line per
    backend and per tensor."""
    if not isinstance(d, dict):
        raise ArgumentTypeError(f"format_case needs a case dict, got {type(d).__name__}")
    lines = ["{"]
    items = list(d.items())
    for k, (key, value) in enumerate(items):
        comma = "," if k < len(items) - 1 else ""
        if key in ("backends", "tensors"):
            lines.append(f"  {json.dumps(key)}: [")
            lines.extend(f"    {json.dumps(x)}{',' if j < len(value) - 1 else ''}"
                         for j, x in enumerate(value))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dump_case(case, path):
    """Write a Case (or a case dict) to `path` in the shared files' layout."""
    if not isinstance(case, (dict, Case)):
        raise ArgumentTypeError(f"dump_case needs a Case or a case dict, got "
                                f"{type(case).__name__}")
    d = case if isinstance(case, dict) else case.to_dict()
    text = format_case(d)
    try:
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(text)
    except (OSError, TypeError, ValueError) as e:
        raise CaseFormatError(f"{path!r}: cannot write the case: {e}") from e
