"""Case and plan files at C speed (issue 36: `ggml-py plan` on a 100k-node case): the plan
file's text (json.dumps with indent=1, byte for byte, whose pure-Python encoder a large
plan keeps busy for seconds); a case's tensors, nodes and leafs as typed tables
(CaseTables), read straight from the file's bytes by a JSON reader in C or taken from a
parsed case; the typed checks that ggml_py.tools.cases runs on them before it explains
any fault in words; and the making and wiring of a checked case's tensors."""

from libc.stdlib cimport malloc, calloc, realloc, free
from libc.stdio cimport snprintf
from libc.string cimport memcmp, memcpy, memset, strlen
from libc.stdint cimport int64_t, uint64_t, INT32_MAX, INT64_MAX
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8

from ggml_py._ggml cimport ggml_tensor, GGML_MAX_SRC, GGML_MAX_NAME
from ggml_py._core cimport (Context, Tensor, TYPE_TRAITS, GGML_PY_MAX_BYTES, ggml_new_tensor_impl,
                            ggml_set_name,
                            int_arg, layout_changed, tensor_changed, tensor_handle,
                            tensor_set_src)

import json
import sys
from json.encoder import encode_basestring_ascii

from ggml_py.errors import ArgumentError

from ggml_py._backend import BUFFER_USAGES as _BUFFER_USAGES
from ggml_py._core import (FLAG_NAMES as _FLAG_NAMES, MAX_ELEMENTS as _MAX_ELEMENTS,
                           OP_IDS as _OP_IDS, TYPE_IDS as _TYPE_IDS)

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object s)
    const char * PyUnicode_AsUTF8AndSize(object s, Py_ssize_t * size) except NULL


# ---------------------------------------------------------------------------
# the plan file's text

cdef struct text_buf:
    char * data
    size_t n
    size_t cap


cdef int buf_reserve(text_buf * b, size_t n) except -1:
    """Room for n more bytes."""
    cdef size_t cap = b.cap
    cdef char * p
    if b.n + n > cap:
        while b.n + n > cap:
            cap = cap * 2 if cap else 1 << 16
        p = <char *>realloc(b.data, cap)
        if p == NULL:
            raise MemoryError(f"the plan text needs {cap} bytes")
        b.data, b.cap = p, cap
    return 0


cdef int buf_put(text_buf * b, const char * s, size_t n) except -1:
    buf_reserve(b, n)
    memcpy(b.data + b.n, s, n)
    b.n += n
    return 0


cdef int put_str(text_buf * b, str s) except -1:
    """A str as json writes it (ensure_ascii): the bytes as they are when no character
    needs an escape, else json's own escaping."""
    cdef Py_ssize_t n, i
    cdef const char * p
    cdef unsigned char c
    if PyUnicode_IS_ASCII(s):
        p = PyUnicode_AsUTF8AndSize(s, &n)
        for i in range(n):
            c = p[i]
            if c < 0x20 or c == 0x22 or c == 0x5c or c == 0x7f:
                break
        else:
            buf_put(b, "\"", 1)
            buf_put(b, p, n)
            return buf_put(b, "\"", 1)
    return put_ascii(b, encode_basestring_ascii(s))


cdef int put_ascii(text_buf * b, str s) except -1:
    cdef Py_ssize_t n
    cdef const char * p = PyUnicode_AsUTF8AndSize(s, &n)
    return buf_put(b, p, n)


cdef int put_newline(text_buf * b, int depth) except -1:
    """A newline and the indent of depth (one space a level)."""
    buf_reserve(b, depth + 1)
    b.data[b.n] = b"\n"
    memset(b.data + b.n + 1, b" ", depth)
    b.n += depth + 1
    return 0


cdef int put_value(text_buf * b, object value, int depth, int max_depth) except -1:
    cdef char num[24]
    cdef int overflow, n
    cdef long long v
    cdef bint first = True
    if value is None:
        return buf_put(b, "null", 4)
    if value is True:
        return buf_put(b, "true", 4)
    if value is False:
        return buf_put(b, "false", 5)
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return put_ascii(b, int.__repr__(value))
        n = snprintf(num, sizeof(num), "%lld", v)
        return buf_put(b, num, n)
    if type(value) is str:
        return put_str(b, value)
    if depth >= max_depth:
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")
    if isinstance(value, dict):
        if not value:
            return buf_put(b, "{}", 2)
        buf_put(b, "{", 1)
        for k, x in (<dict>value).items():
            if not first:
                buf_put(b, ",", 1)
            first = False
            put_newline(b, depth + 1)
            # json writes a key that is not a str as the text of its JSON value, quoted
            put_str(b, k if isinstance(k, str) else json.dumps(k))
            buf_put(b, ": ", 2)
            put_value(b, x, depth + 1, max_depth)
        put_newline(b, depth)
        return buf_put(b, "}", 1)
    if isinstance(value, (list, tuple)):
        if not value:
            return buf_put(b, "[]", 2)
        buf_put(b, "[", 1)
        for x in value:
            if not first:
                buf_put(b, ",", 1)
            first = False
            put_newline(b, depth + 1)
            put_value(b, x, depth + 1, max_depth)
        put_newline(b, depth)
        return buf_put(b, "]", 1)
    # floats, subclasses of str and int: json's own text (and its TypeError for the rest)
    return put_ascii(b, json.dumps(value))


def json_text(value):
    """json.dumps(value, indent=1), byte for byte: the text of a plan file."""
    cdef text_buf b
    b.data, b.n, b.cap = NULL, 0, 0
    try:
        put_value(&b, value, 0, sys.getrecursionlimit())
        return PyUnicode_DecodeASCII(b.data, b.n, NULL) if b.n else ""
    finally:
        free(b.data)


# ---------------------------------------------------------------------------
# a case's tensors, nodes and leafs as typed tables

cdef extern from *:
    ctypedef unsigned long long u128 "unsigned __int128"

cdef enum:
    MAX_SRC = GGML_MAX_SRC
    MAX_NAME_BYTES = GGML_MAX_NAME - 1

cdef object K_ID = "id", K_NAME = "name", K_OP = "op", K_TYPE = "type", K_NE = "ne"
cdef object K_NB = "nb", K_SRC = "src", K_VIEW_SRC = "view_src", K_VIEW_OFFS = "view_offs"
cdef object K_FLAGS = "flags", K_BUFFER = "buffer", K_BACKEND = "backend"
cdef object K_BUFFER_TYPE = "buffer_type", K_USAGE = "usage"
cdef tuple TENSOR_KEYS = (K_ID, K_NAME, K_OP, K_TYPE, K_NE, K_NB, K_SRC, K_VIEW_SRC,
                          K_VIEW_OFFS, K_FLAGS, K_BUFFER, K_BACKEND)
cdef int N_TENSOR_KEYS = 12
cdef int64_t MAX_ELEMENTS = _MAX_ELEMENTS
cdef dict _OP_NAMES = {v: k for k, v in _OP_IDS.items()}
cdef dict _TYPE_NAMES = {v: k for k, v in _TYPE_IDS.items()}


cdef struct tensor_facts:
    int type
    int op
    int64_t ne[4]
    uint64_t nb[4]
    uint64_t view_offs
    int view_src            # -1: none
    int src[MAX_SRC]        # -1: an empty slot or past the end
    int n_src               # src entries as written (trailing nulls too)
    int flags
    int buffer_type         # index in CaseTables.strings; -1: no buffer
    int usage               # index in CaseTables.strings
    int backend             # index in CaseTables.strings; -1: none
    size_t name             # offset of the name (NUL-terminated) in CaseTables.names


cdef u128 nbytes_of(const tensor_facts * f) noexcept:
    """ggml_nbytes, wide enough that no file's numbers wrap."""
    cdef u128 n
    cdef int64_t blck = TYPE_TRAITS[f.type].blck_size
    cdef int i
    for i in range(4):
        if f.ne[i] <= 0:
            return 0
    n = <u128>TYPE_TRAITS[f.type].type_size if blck == 1 else <u128>f.ne[0] * f.nb[0] // blck
    for i in range(0 if blck == 1 else 1, 4):
        n += <u128>(f.ne[i] - 1) * f.nb[i]
    return n


cdef bint facts_ok(const tensor_facts * f, int i, Py_ssize_t n) noexcept:
    """What _check_tensor checks of tensor i beyond the kinds of its values."""
    cdef int64_t elements = 1
    cdef int j
    if f.ne[0] % TYPE_TRAITS[f.type].blck_size:
        return False
    for j in range(4):
        if f.ne[j] == 0:
            elements = 0
        elif elements > MAX_ELEMENTS // f.ne[j]:
            return False
        else:
            elements *= f.ne[j]
    if nbytes_of(f) > GGML_PY_MAX_BYTES:
        return False
    for j in range(MAX_SRC):
        if f.src[j] >= n or f.src[j] == i:
            return False
    return f.view_src < n and f.view_src != i


cdef bint view_ok(const tensor_facts * facts, int i) noexcept:
    """What _check_views checks of tensor i."""
    cdef const tensor_facts * f = &facts[i]
    cdef const tensor_facts * base
    cdef u128 data_size, size
    if f.view_src < 0:
        return True
    base = &facts[f.view_src]
    if base.view_src >= 0 or (f.buffer_type >= 0 and base.buffer_type < 0):
        return False
    data_size = <u128>TYPE_TRAITS[f.type].type_size * f.ne[0] // TYPE_TRAITS[f.type].blck_size
    data_size = data_size * f.ne[1] * f.ne[2] * f.ne[3]     # < 2**(56 + 9): no wrap
    size = nbytes_of(base)
    return not data_size or (data_size + f.view_offs <= size
                             and nbytes_of(f) + f.view_offs <= size)


cdef bint acyclic(const tensor_facts * facts, int n) except -1:
    """What _check_acyclic checks: no tensor depends on itself (an iterative
    depth-first walk over src and view_src)."""
    cdef char * state = <char *>calloc(n + 1, 1)    # 0 new, 1 on the path, 2 done
    cdef int * path = <int *>malloc(2 * n * sizeof(int) + 1)    # the path, then
    cdef int * next_dep = path + n                                # each one's next dep
    cdef int root, depth, i, j, k
    cdef bint ok = True
    if state == NULL or path == NULL:
        free(state)
        free(path)
        raise MemoryError("the cycle check of a case")
    for root in range(n):
        if state[root] or not ok:
            continue
        depth = 0
        path[0], next_dep[0], state[root] = root, 0, 1
        while depth >= 0:
            i = path[depth]
            k = next_dep[depth]
            next_dep[depth] += 1
            if k > MAX_SRC:                 # deps 0..9 are src, 10 is view_src
                state[i] = 2
                depth -= 1
                continue
            j = facts[i].view_src if k == MAX_SRC else facts[i].src[k]
            if j < 0 or state[j] == 2:
                continue
            if state[j] == 1:
                ok = False
                break
            depth += 1
            path[depth], next_dep[depth], state[j] = j, 0, 1
    free(state)
    free(path)
    return ok


cdef list id_list(const text_buf * ids):
    cdef const int * p = <const int *>ids.data
    return [p[i] for i in range(<Py_ssize_t>(ids.n // sizeof(int)))]


cdef class CaseTables:
    """A case's tensors, nodes and leafs as C tables: what the file says of each tensor
    (its facts), its name, and the graph's lists of tensor ids. Made by
    read_case_tables from a file's bytes or by document_tables from a parsed case;
    `check` runs the case's typed checks, `build` and `wire` make its tensors."""

    cdef text_buf facts_buf     # tensor_facts, one per tensor
    cdef text_buf names         # the names, each NUL-terminated
    cdef text_buf node_ids      # int, one per graph node
    cdef text_buf leaf_ids      # int, one per graph leaf
    cdef Py_ssize_t n
    cdef list strings           # values of buffer_type, usage and backend fields
    cdef dict string_ids        # ... and their indices
    cdef bint ids_ok            # every id a plain int equal to its position

    def __cinit__(self):
        self.strings, self.string_ids, self.ids_ok = [], {}, True

    def __dealloc__(self):
        free(self.facts_buf.data)
        free(self.names.data)
        free(self.node_ids.data)
        free(self.leaf_ids.data)

    cdef inline tensor_facts * facts(self) noexcept:
        return <tensor_facts *>self.facts_buf.data


    cdef tensor_facts * at(self, object i) except NULL:
        return &self.facts()[int_arg(i, f"a tensor id of a case of {self.n} tensors", 0,
                                     self.n - 1)]

    cdef int check_tensors(self, list tensors) except -1:
        """tensors must be one per tensor of the tables (made by `build`)."""
        if len(tensors) != self.n:
            raise ArgumentError(f"{len(tensors)} tensors for the {self.n} of a case's tables")
        return 0

    cdef tensor_facts * new_tensor(self) except NULL:
        cdef tensor_facts * f
        cdef int j
        buf_reserve(&self.facts_buf, sizeof(tensor_facts))
        f = <tensor_facts *>(self.facts_buf.data + self.facts_buf.n)
        memset(f, 0, sizeof(tensor_facts))
        f.view_src = f.buffer_type = f.usage = f.backend = -1
        for j in range(MAX_SRC):
            f.src[j] = -1
        f.name = self.names.n
        self.facts_buf.n += sizeof(tensor_facts)
        self.n += 1
        return f

    cdef int add_name(self, const char * p, Py_ssize_t n) except -1:
        buf_put(&self.names, p, n)
        return buf_put(&self.names, "\0", 1)


    cdef int string_id(self, str s) except -1:
        k = self.string_ids.get(s)
        if k is None:
            k = self.string_ids[s] = len(self.strings)
            self.strings.append(s)
        return k

    def check(self, dict buffer_types not None, list backend_names not None):
        """True when the tables pass every check of ggml_py.tools.cases (_check_tensor,
        _check_views, _check_acyclic, _check_graph_lists); False at the first doubt --
        the checks in words then find the fault and name it."""
        cdef tensor_facts * facts = self.facts()
        cdef tensor_facts * f
        cdef char * seen
        cdef Py_ssize_t i
        cdef int k, v
        cdef const text_buf * ids
        cdef bint ok = self.ids_ok
        known_buft = [s in buffer_types for s in self.strings]
        known_usage = [s in _BUFFER_USAGES for s in self.strings]
        known_backend = [s in backend_names for s in self.strings]
        for i in range(self.n):
            if not ok:
                return False
            f = &facts[i]
            ok = (facts_ok(f, i, self.n)
                  and (f.buffer_type < 0 or (known_buft[f.buffer_type] and known_usage[f.usage]))
                  and (f.backend < 0 or known_backend[f.backend]))
        for i in range(self.n):
            if not ok or not view_ok(facts, i):
                return False
        if not ok or not acyclic(facts, self.n):
            return False
        seen = <char *>calloc(self.n + 1, 1)
        if seen == NULL:
            raise MemoryError("the graph list check of a case")
        for k in range(2):
            ids = &self.node_ids if k == 0 else &self.leaf_ids
            for i in range(<Py_ssize_t>(ids.n // sizeof(int))):
                v = (<int *>ids.data)[i]
                if v >= self.n or seen[v]:
                    ok = False
                    break
                seen[v] = 1
        free(seen)
        return ok

    def build(self, Context ctx not None):
        """New tensors in ctx, one per tensor of the tables: op, type, name, ne and nb as
        written, no sources yet (wire sets them). What ctx.new_op(op, (), type,
        ne[::-1], name=name) then `.nb = nb` make, without the per-argument checks that
        `check` has already made."""
        cdef tensor_facts * f
        cdef ggml_tensor * t
        cdef int i, j
        out = []
        for i in range(self.n):
            f = &self.facts()[i]
            t = ggml_new_tensor_impl(&ctx.ctx, f.type, 4, f.ne, NULL, 0)
            t.op = f.op
            ggml_set_name(t, self.names.data + f.name)
            if f.nb[0] | f.nb[1] | f.nb[2] | f.nb[3] <= <uint64_t>INT64_MAX:
                for j in range(4):
                    t.nb[j] = f.nb[j]
                layout_changed(t)
            else:
                # strides past INT64_MAX: the builder's own setter refuses them as it
                # always has
                tensor_handle(t).nb = [f.nb[j] for j in range(4)]
            tensor_changed(t)
            out.append(tensor_handle(t))
        return out

    def wire(self, list tensors not None):
        """Set every tensor's sources, view_src and view_offs and flags as the case wrote
        them (tensors[i] made by `build` from these tables) and take it out of any
        buffer: what set_src, set_view_src, the flags setter and clear_buffer do, for
        every tensor in one pass."""
        cdef tensor_facts * f
        cdef ggml_tensor * t
        cdef ggml_tensor ** ptrs
        cdef int i, j
        self.check_tensors(tensors)
        ptrs = <ggml_tensor **>malloc(self.n * sizeof(ggml_tensor *) + 1)
        if ptrs == NULL:
            raise MemoryError(f"wiring {self.n} tensors")
        try:
            for i in range(self.n):
                ptrs[i] = (<Tensor?>tensors[i]).ptr
            for i in range(self.n):
                f, t = &self.facts()[i], ptrs[i]
                for j in range(MAX_SRC):
                    tensor_set_src(t, j, NULL if f.src[j] < 0 else ptrs[f.src[j]])
                t.view_src = NULL if f.view_src < 0 else ptrs[f.view_src]
                t.view_offs = f.view_offs
                t.flags = f.flags
                t.buffer = NULL
                t.data = NULL
                tensor_changed(t)
        finally:
            free(ptrs)

    def preallocated(self):
        """The pre-allocated tensors, in id order, as columns: (ids, buffer types, usages,
        offsets, sizes). Each sits in a dummy buffer of its own of `size` bytes, at
        offset 0, or at its view_offs for a view (the buffer then spans the whole
        extent)."""
        cdef tensor_facts * f
        cdef uint64_t offset
        cdef int i
        ids, types, usages, offsets, sizes = [], [], [], [], []
        for i in range(self.n):
            f = &self.facts()[i]
            if f.buffer_type >= 0:
                offset = f.view_offs if f.view_src >= 0 else 0
                ids.append(i)
                types.append(self.strings[f.buffer_type])
                usages.append(self.strings[f.usage])
                offsets.append(offset)
                sizes.append(max(offset + <uint64_t>nbytes_of(f), 1))
        return ids, types, usages, offsets, sizes

    def is_view(self, i):
        """Is tensor i a view (has it a view_src)?"""
        return self.at(i).view_src >= 0

    def graph_tensors(self, list tensors not None):
        """(nodes, leafs): the graph's lists of tensors."""
        self.check_tensors(tensors)
        return [tensors[i] for i in id_list(&self.node_ids)], \
            [tensors[i] for i in id_list(&self.leaf_ids)]

    def assignments(self, list tensors not None):
        """[(tensor, backend name)] of the user assignments, in tensor id order."""
        cdef int i
        self.check_tensors(tensors)
        return [(tensors[i], self.strings[self.facts()[i].backend]) for i in range(self.n)
                if self.facts()[i].backend >= 0]

    def n_src(self, i):
        """The number of src entries tensor i's entry wrote (trailing nulls too)."""
        return self.at(i).n_src

    def rows(self):
        """The tables in Python values, a dict per tensor (names as in the case's
        tensor entries; buffer as (buffer type, usage)), then the node and leaf ids
        and whether every id was its position: for tests and debugging."""
        cdef tensor_facts * f
        cdef int i, j
        out = []
        for i in range(self.n):
            f = &self.facts()[i]
            out.append({
                "name": (self.names.data + f.name).decode("utf-8", "surrogatepass"),
                "op": _OP_NAMES[f.op], "type": _TYPE_NAMES[f.type],
                "ne": [f.ne[j] for j in range(4)], "nb": [f.nb[j] for j in range(4)],
                "src": [None if f.src[j] < 0 else f.src[j] for j in range(f.n_src)],
                "view_src": None if f.view_src < 0 else f.view_src,
                "view_offs": f.view_offs,
                "flags": sorted(k for k, v in _FLAG_NAMES.items() if f.flags & v),
                "buffer": None if f.buffer_type < 0 else (self.strings[f.buffer_type],
                                                          self.strings[f.usage]),
                "backend": None if f.backend < 0 else self.strings[f.backend]})
        return out, id_list(&self.node_ids), id_list(&self.leaf_ids), bool(self.ids_ok)

    def __len__(self):
        return self.n


# ---------------------------------------------------------------------------
# the tables of a parsed case (dicts and lists, as json.loads gives them)

cdef bint get_int(object x, int64_t lo, int64_t hi, int64_t * out) noexcept:
    """x is an int in [lo, hi] (not a bool: the checks in words take ints as is_int does)."""
    cdef int overflow
    cdef long long v
    if not isinstance(x, int) or isinstance(x, bool):
        return False
    v = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow or v < lo or v > hi:
        return False
    out[0] = v
    return True


cdef bint get_size(object x, uint64_t * out) except -1:
    """x is an int in [0, SIZE_MAX] (not a bool)."""
    if not isinstance(x, int) or isinstance(x, bool):
        return False
    try:
        out[0] = x
    except OverflowError:
        return False
    return True


cdef bint get_dims(object x, int64_t * ne, uint64_t * nb) except -1:
    """4 ints: in [0, INT64_MAX] into ne, or in [0, SIZE_MAX] into nb."""
    cdef int i
    if not isinstance(x, list) or len(<list>x) != 4:
        return False
    for i in range(4):
        if not (get_int((<list>x)[i], 0, INT64_MAX, &ne[i]) if ne != NULL
                else get_size((<list>x)[i], &nb[i])):
            return False
    return True


cdef bint get_ref(object x, int * out) except -1:
    """None (-1), or a tensor id that may be in range (in [0, INT32_MAX])."""
    cdef int64_t v
    if x is None:
        out[0] = -1
        return True
    if not get_int(x, 0, INT32_MAX, &v):
        return False
    out[0] = v
    return True


cdef bint tensor_from_dict(CaseTables tables, object t, Py_ssize_t i,
                           tensor_facts * f) except -1:
    """Tensor entry t's facts into f: False where a value is not of the kind the
    checks in words take (they then name the fault)."""
    cdef const char * name
    cdef Py_ssize_t n
    cdef int64_t v
    cdef int j
    if not isinstance(t, dict) or len(<dict>t) != N_TENSOR_KEYS:
        return False
    for k in TENSOR_KEYS:
        if k not in t:
            return False
    tables.ids_ok &= type(t[K_ID]) is int and get_int(t[K_ID], i, i, &v)
    if not isinstance(t[K_NAME], str):
        return False
    try:
        name = PyUnicode_AsUTF8AndSize(t[K_NAME], &n)   # (a lone surrogate raises)
    except UnicodeEncodeError:
        return False
    if n > MAX_NAME_BYTES:
        return False
    tables.add_name(name, n)
    op, type_ = t[K_OP], t[K_TYPE]
    if not isinstance(op, str) or op not in _OP_IDS:
        return False
    if not isinstance(type_, str) or type_ not in _TYPE_IDS:
        return False
    f.op, f.type = _OP_IDS[op], _TYPE_IDS[type_]
    if not get_dims(t[K_NE], f.ne, NULL) or not get_dims(t[K_NB], NULL, f.nb):
        return False
    src = t[K_SRC]
    if not isinstance(src, list) or len(<list>src) > MAX_SRC:
        return False
    f.n_src = len(<list>src)
    for j in range(f.n_src):
        if not get_ref((<list>src)[j], &f.src[j]):
            return False
    if not get_ref(t[K_VIEW_SRC], &f.view_src) or not get_size(t[K_VIEW_OFFS], &f.view_offs):
        return False
    flags = t[K_FLAGS]
    if not isinstance(flags, list):
        return False
    for flag in <list>flags:
        if not isinstance(flag, str) or flag not in _FLAG_NAMES or f.flags & _FLAG_NAMES[flag]:
            return False
        f.flags |= _FLAG_NAMES[flag]
    buf = t[K_BUFFER]
    if buf is not None:
        if not isinstance(buf, dict) or len(<dict>buf) != 2:
            return False
        if K_BUFFER_TYPE not in buf or K_USAGE not in buf:
            return False
        buft, usage = buf[K_BUFFER_TYPE], buf[K_USAGE]
        if not isinstance(buft, str) or not isinstance(usage, str):
            return False
        f.buffer_type, f.usage = tables.string_id(buft), tables.string_id(usage)
    backend = t[K_BACKEND]
    if backend is not None:
        if not isinstance(backend, str):
            return False
        f.backend = tables.string_id(backend)
    return True


cdef bint ids_from_list(object ids, text_buf * out) except -1:
    cdef int64_t v
    cdef int id_
    if not isinstance(ids, list):
        return False
    for x in <list>ids:
        if not get_int(x, 0, INT32_MAX, &v):
            return False
        id_ = v
        buf_put(out, <char *>&id_, sizeof(int))
    return True


def document_tables(tensors, nodes, leafs):
    """The CaseTables of a parsed case's tensor, node and leaf lists; None where a value
    is not of the kind the case checks take (they then name the fault)."""
    cdef CaseTables tables = CaseTables()
    cdef Py_ssize_t i
    if not isinstance(tensors, list) or len(<list>tensors) > INT32_MAX:
        return None
    for i, t in enumerate(<list>tensors):
        if not tensor_from_dict(tables, t, i, tables.new_tensor()):
            return None
    if not ids_from_list(nodes, &tables.node_ids) or not ids_from_list(leafs, &tables.leaf_ids):
        return None
    return tables


# ---------------------------------------------------------------------------
# a case file read straight into its tables

cdef enum:
    MAX_DEPTH = 100         # deeper documents are left to json.loads
    MAX_STRINGS = 256       # distinct values of enumerated fields the reader keeps
    STRING_SLOTS = 512

cdef const char * TENSOR_KEY_NAMES[12]
TENSOR_KEY_NAMES[:] = [b"id", b"name", b"op", b"type", b"ne", b"nb", b"src", b"view_src",
                       b"view_offs", b"flags", b"buffer", b"backend"]
cdef size_t TENSOR_KEY_LENGTHS[12]
for _k in range(12):
    TENSOR_KEY_LENGTHS[_k] = strlen(TENSOR_KEY_NAMES[_k])
cdef enum:
    KEY_ID, KEY_NAME, KEY_OP, KEY_TYPE, KEY_NE, KEY_NB, KEY_SRC, KEY_VIEW_SRC, KEY_VIEW_OFFS
    KEY_FLAGS, KEY_BUFFER, KEY_BACKEND


cdef struct str_token:
    const unsigned char * p     # the bytes between the quotes
    Py_ssize_t n
    bint escaped
    bint ascii


cdef bint utf8_ok(const unsigned char * p, Py_ssize_t n) noexcept:
    """p[:n] is UTF-8 as Python's strict decoder takes it (no surrogates, no overlong
    forms, nothing past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef int need, k
    cdef unsigned char c, lo, hi
    while i < n:
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            need = 1
        elif 0xE0 <= c <= 0xEF:
            need = 2
        elif 0xF0 <= c <= 0xF4:
            need = 3
        else:
            return False
        # the second byte's range is narrower after lead bytes that would otherwise start
        # overlong forms (E0, F0), surrogates (ED) or code points past U+10FFFF (F4)
        lo = 0xA0 if c == 0xE0 else 0x90 if c == 0xF0 else 0x80
        hi = 0x9F if c == 0xED else 0x8F if c == 0xF4 else 0xBF
        if i + need >= n or not lo <= p[i + 1] <= hi:
            return False
        for k in range(2, need + 1):
            if not 0x80 <= p[i + k] <= 0xBF:
                return False
        i += need + 1
    return True


cdef bint hex4(const unsigned char * p, unsigned int * out) noexcept:
    cdef unsigned int v = 0
    cdef int k
    cdef unsigned char c
    for k in range(4):
        c = p[k]
        if 0x30 <= c <= 0x39:
            v = v * 16 + c - 0x30
        elif 0x61 <= c <= 0x66:
            v = v * 16 + c - 0x61 + 10
        elif 0x41 <= c <= 0x46:
            v = v * 16 + c - 0x41 + 10
        else:
            return False
    out[0] = v
    return True


cdef int put_utf8(text_buf * b, unsigned int cp) except -1:
    """Code point cp in UTF-8 (a surrogate in the 3 bytes of 'surrogatepass')."""
    cdef char s[4]
    if cp < 0x80:
        s[0] = cp
        return buf_put(b, s, 1)
    if cp < 0x800:
        s[0], s[1] = 0xC0 | cp >> 6, 0x80 | cp & 0x3F
        return buf_put(b, s, 2)
    if cp < 0x10000:
        s[0], s[1], s[2] = 0xE0 | cp >> 12, 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F
        return buf_put(b, s, 3)
    s[0], s[1] = 0xF0 | cp >> 18, 0x80 | cp >> 12 & 0x3F
    s[2], s[3] = 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F
    return buf_put(b, s, 4)


cdef class _Reader:
    """JSON text (UTF-8 bytes) read into Python values as json.loads reads them, and a
    case's tensors, nodes and leafs straight into CaseTables. It takes a subset of
    what json.loads takes and raises ValueError, naming the byte, for the rest
    (NaN and Infinity, nesting past MAX_DEPTH, escapes in a tensor entry's keys and
    enumerated fields, a value the case checks would refuse): json.loads and the
    checks in words then read the file and name any fault."""

    cdef object data                # the bytes (kept alive: the tokens point into them)
    cdef const unsigned char * start
    cdef const unsigned char * p    # the next byte
    cdef const unsigned char * end
    cdef int depth
    cdef text_buf scratch           # a string with escapes, decoded to UTF-8
    cdef CaseTables tables
    # the distinct values of enumerated fields: their bytes, index in tables.strings,
    # and the op, type and flag they name (-1, -1, 0: none)
    cdef int n_strings
    cdef const unsigned char * string_at[MAX_STRINGS]
    cdef Py_ssize_t string_len[MAX_STRINGS]
    cdef int string_index[MAX_STRINGS]
    cdef int op_of[MAX_STRINGS]
    cdef int type_of[MAX_STRINGS]
    cdef int flag_of[MAX_STRINGS]
    cdef int slots[STRING_SLOTS]    # entry + 1, 0: free

    def __cinit__(self, bytes data not None):
        self.data = data
        self.start = self.p = <const unsigned char *><const char *>data
        self.end = self.start + len(data)
        if self.end - self.p >= 3 and self.p[0] == 0xEF and self.p[1] == 0xBB and \
                self.p[2] == 0xBF:
            self.p += 3                 # a BOM, as the utf-8-sig codec drops it
        self.tables = CaseTables()
        memset(self.slots, 0, sizeof(self.slots))

    def __dealloc__(self):
        free(self.scratch.data)

    cdef int doubt(self, str what) except -1:
        raise ValueError(f"byte {self.p - self.start}: {what}")

    cdef inline void skip_ws(self) noexcept:
        while self.p < self.end and (self.p[0] == 0x20 or self.p[0] == 0x0A
                                     or self.p[0] == 0x0D or self.p[0] == 0x09):
            self.p += 1

    cdef inline bint next_is(self, unsigned char c) noexcept:
        """After any whitespace, is the next byte c? (It is then taken.)"""
        self.skip_ws()
        if self.p < self.end and self.p[0] == c:
            self.p += 1
            return True
        return False

    cdef int expect(self, unsigned char c) except -1:
        if not self.next_is(c):
            self.doubt(f"expected {chr(c)!r}")
        return 0

    cdef bint literal(self, const char * word, Py_ssize_t n) noexcept:
        """After any whitespace, is the text `word`? (It is then taken.)"""
        self.skip_ws()
        if self.end - self.p >= n and memcmp(self.p, word, n) == 0:
            self.p += n
            return True
        return False

    cdef int string_token(self, str_token * s) except -1:
        """The next string's bytes, as they stand in the text."""
        cdef unsigned char c
        self.expect(b'"')
        s.p, s.escaped, s.ascii = self.p, False, True
        while True:
            if self.p >= self.end:
                return self.doubt("an unterminated string")
            c = self.p[0]
            if c == b'"':
                break
            if c == b'\\':
                if self.end - self.p < 2:
                    return self.doubt("an unterminated string")
                s.escaped = True
                self.p += 2
                continue
            if c < 0x20:
                return self.doubt("a control character in a string")
            if c >= 0x80:
                s.ascii = False
            self.p += 1
        s.n = self.p - s.p
        self.p += 1
        if not s.ascii and not utf8_ok(s.p, s.n):
            self.doubt("a string that is not UTF-8")
        return 0

    cdef str string_value(self, const str_token * s):
        """A string token's text, its escapes decoded as json.loads decodes them."""
        cdef Py_ssize_t i = 0, j
        cdef unsigned int cp, lo
        cdef unsigned char e
        cdef const unsigned char * p = s.p
        if not s.escaped:
            return PyUnicode_DecodeUTF8(<const char *>p, s.n, NULL)
        self.scratch.n = 0
        while i < s.n:
            if p[i] != b'\\':
                j = i
                while j < s.n and p[j] != b'\\':
                    j += 1
                buf_put(&self.scratch, <const char *>p + i, j - i)
                i = j
                continue
            e = p[i + 1]
            if e == b'u':
                if i + 6 > s.n or not hex4(p + i + 2, &cp):
                    self.doubt("a bad \\u escape")
                i += 6
                # a surrogate pair in two escapes is one character
                if (0xD800 <= cp <= 0xDBFF and i + 6 <= s.n and p[i] == b'\\'
                        and p[i + 1] == b'u' and hex4(p + i + 2, &lo)
                        and 0xDC00 <= lo <= 0xDFFF):
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    i += 6
                put_utf8(&self.scratch, cp)
                continue
            if e == b'"' or e == b'\\' or e == b'/':
                cp = e
            elif e == b'b':
                cp = 8
            elif e == b'f':
                cp = 12
            elif e == b'n':
                cp = 10
            elif e == b'r':
                cp = 13
            elif e == b't':
                cp = 9
            else:
                self.doubt("a bad escape")
            put_utf8(&self.scratch, cp)
            i += 2
        return PyUnicode_DecodeUTF8(self.scratch.data, self.scratch.n, "surrogatepass")

    cdef object number(self):
        """The next number, an int or a float as json.loads makes it."""
        cdef const unsigned char * q = self.p
        cdef const unsigned char * mark
        cdef bint is_int = True
        if self.p < self.end and self.p[0] == b'-':
            self.p += 1
        if self.p >= self.end or not 0x30 <= self.p[0] <= 0x39:
            self.doubt("a value")
        if self.p[0] == b'0':
            self.p += 1
        else:
            while self.p < self.end and 0x30 <= self.p[0] <= 0x39:
                self.p += 1
        if self.end - self.p >= 2 and self.p[0] == b'.' and 0x30 <= self.p[1] <= 0x39:
            is_int = False
            self.p += 2
            while self.p < self.end and 0x30 <= self.p[0] <= 0x39:
                self.p += 1
        if self.p < self.end and (self.p[0] == b'e' or self.p[0] == b'E'):
            mark = self.p
            self.p += 1
            if self.p < self.end and (self.p[0] == b'+' or self.p[0] == b'-'):
                self.p += 1
            if self.p < self.end and 0x30 <= self.p[0] <= 0x39:
                is_int = False
                while self.p < self.end and 0x30 <= self.p[0] <= 0x39:
                    self.p += 1
            else:
                self.p = mark           # not an exponent: json stops before the 'e'
        text = PyUnicode_DecodeASCII(<const char *>q, self.p - q, NULL)
        return int(text) if is_int else float(text)

    cdef object value(self):
        """The next JSON value, as json.loads makes it."""
        cdef str_token s
        cdef unsigned char c
        self.skip_ws()
        if self.p >= self.end:
            self.doubt("a value")
        c = self.p[0]
        if c == b'"':
            self.string_token(&s)
            return self.string_value(&s)
        if c == b'{' or c == b'[':
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self.doubt("nesting deeper than the reader takes")
            out = self.object() if c == b'{' else self.array()
            self.depth -= 1
            return out
        if self.literal(b"true", 4):
            return True
        if self.literal(b"false", 5):
            return False
        if self.literal(b"null", 4):
            return None
        return self.number()

    cdef dict object(self):
        cdef str_token s
        cdef dict out = {}
        self.p += 1
        if self.next_is(b'}'):
            return out
        while True:
            self.string_token(&s)
            key = self.string_value(&s)
            self.expect(b':')
            out[key] = self.value()
            if not self.next_is(b','):
                break
        self.expect(b'}')
        return out

    cdef list array(self):
        cdef list out = []
        self.p += 1
        if self.next_is(b']'):
            return out
        while True:
            out.append(self.value())
            if not self.next_is(b','):
                break
        self.expect(b']')
        return out

    cdef int end_of_text(self) except -1:
        self.skip_ws()
        if self.p != self.end:
            self.doubt("text after the document")
        return 0

    # --- a case's typed parts ---

    cdef uint64_t whole(self, uint64_t hi) except? 0xFFFFFFFFFFFFFFFF:
        """The next value: an integer in [0, hi]."""
        cdef uint64_t v = 0, d
        self.skip_ws()
        if self.p >= self.end or not 0x30 <= self.p[0] <= 0x39:
            self.doubt("a non-negative integer")
        if self.p[0] == b'0':
            self.p += 1
        else:
            while self.p < self.end and 0x30 <= self.p[0] <= 0x39:
                d = self.p[0] - 0x30
                if v > (hi - d) // 10:
                    self.doubt(f"an integer past {hi}")
                v = v * 10 + d
                self.p += 1
        if self.p < self.end and (self.p[0] == b'.' or self.p[0] == b'e' or self.p[0] == b'E'):
            self.doubt("a number that is not an integer")
        return v

    cdef int ref(self) except -2:
        """The next value: null (-1) or a tensor id that may be in range."""
        return -1 if self.literal(b"null", 4) else <int>self.whole(INT32_MAX)

    cdef int enumerated(self) except -1:
        """The next value: a string of an enumerated field, without escapes; its entry
        in the reader's table of such strings."""
        cdef str_token s
        cdef uint64_t h = 14695981039346656037ULL
        cdef Py_ssize_t i
        cdef int slot, e
        self.string_token(&s)
        if s.escaped:
            self.doubt("an escape in an enumerated field")
        for i in range(s.n):
            h = (h ^ s.p[i]) * 1099511628211ULL
        slot = h % STRING_SLOTS
        while self.slots[slot]:
            e = self.slots[slot] - 1
            if self.string_len[e] == s.n and memcmp(self.string_at[e], s.p, s.n) == 0:
                return e
            slot = (slot + 1) % STRING_SLOTS
        if self.n_strings == MAX_STRINGS:
            self.doubt("more distinct strings than the reader keeps")
        e = self.n_strings
        text = self.string_value(&s)
        self.string_at[e], self.string_len[e] = s.p, s.n
        self.string_index[e] = self.tables.string_id(text)
        self.op_of[e] = _OP_IDS.get(text, -1)
        self.type_of[e] = _TYPE_IDS.get(text, -1)
        self.flag_of[e] = _FLAG_NAMES.get(text, 0)
        self.n_strings += 1
        self.slots[slot] = e + 1
        return e

    cdef int name(self) except -1:
        cdef str_token s
        cdef const char * p
        cdef Py_ssize_t n
        self.string_token(&s)
        if s.escaped:
            p = PyUnicode_AsUTF8AndSize(self.string_value(&s), &n)  # (a lone surrogate raises)
        else:
            p, n = <const char *>s.p, s.n
        if n > MAX_NAME_BYTES:
            self.doubt(f"a name longer than {MAX_NAME_BYTES} bytes")
        return self.tables.add_name(p, n)

    cdef int key(self, int guess) except -1:
        """The next key of a tensor entry: its KEY_ number (`guess` tried first: files
        write the keys in one order)."""
        cdef str_token s
        cdef int k, i
        self.string_token(&s)
        if not s.escaped:
            for i in range(N_TENSOR_KEYS):
                k = (guess + i) % N_TENSOR_KEYS
                if TENSOR_KEY_LENGTHS[k] == <size_t>s.n and \
                        memcmp(TENSOR_KEY_NAMES[k], s.p, s.n) == 0:
                    self.expect(b':')
                    return k
        return self.doubt("a key a tensor entry does not have")

    cdef int tensor(self, int i) except -1:
        """Tensor entry i into the tables."""
        cdef tensor_facts * f = self.tables.new_tensor()
        cdef int seen = 0, k = -1, j, e
        self.expect(b'{')
        while True:
            k = self.key(k + 1)
            if seen & 1 << k:
                self.doubt("a key given twice")
            seen |= 1 << k
            if k == KEY_ID:
                if self.whole(INT32_MAX) != <uint64_t>i:
                    self.doubt(f"an id that is not the entry's position {i}")
            elif k == KEY_NAME:
                self.name()
            elif k == KEY_OP or k == KEY_TYPE:
                e = self.enumerated()
                if k == KEY_OP:
                    f.op = self.op_of[e]
                else:
                    f.type = self.type_of[e]
                if f.op < 0 or f.type < 0:
                    self.doubt("an unknown op or type")
            elif k == KEY_NE or k == KEY_NB:
                self.expect(b'[')
                for j in range(4):
                    if j:
                        self.expect(b',')
                    if k == KEY_NE:
                        f.ne[j] = self.whole(INT64_MAX)
                    else:
                        f.nb[j] = self.whole(0xFFFFFFFFFFFFFFFFULL)
                self.expect(b']')
            elif k == KEY_SRC:
                self.expect(b'[')
                if not self.next_is(b']'):
                    while True:
                        if f.n_src == MAX_SRC:
                            self.doubt(f"more than {MAX_SRC} sources")
                        f.src[f.n_src] = self.ref()
                        f.n_src += 1
                        if not self.next_is(b','):
                            break
                    self.expect(b']')
            elif k == KEY_VIEW_SRC:
                f.view_src = self.ref()
            elif k == KEY_VIEW_OFFS:
                f.view_offs = self.whole(0xFFFFFFFFFFFFFFFFULL)
            elif k == KEY_FLAGS:
                self.expect(b'[')
                if not self.next_is(b']'):
                    while True:
                        e = self.enumerated()
                        if not self.flag_of[e] or f.flags & self.flag_of[e]:
                            self.doubt("an unknown or repeated flag")
                        f.flags |= self.flag_of[e]
                        if not self.next_is(b','):
                            break
                    self.expect(b']')
            elif k == KEY_BUFFER:
                if not self.literal(b"null", 4):
                    self.buffer(f)
            elif k == KEY_BACKEND:
                if not self.literal(b"null", 4):
                    f.backend = self.string_index[self.enumerated()]
            if not self.next_is(b','):
                break
        self.expect(b'}')
        if seen != (1 << N_TENSOR_KEYS) - 1:
            self.doubt("a tensor entry without all its keys")
        return 0

    cdef int buffer(self, tensor_facts * f) except -1:
        """A tensor entry's buffer object: {"buffer_type": ..., "usage": ...}."""
        cdef str_token s
        cdef int k
        self.expect(b'{')
        for k in range(2):
            if k:
                self.expect(b',')
            self.string_token(&s)
            self.expect(b':')
            if s.n == 11 and memcmp(s.p, b"buffer_type", 11) == 0 and f.buffer_type < 0:
                f.buffer_type = self.string_index[self.enumerated()]
            elif s.n == 5 and memcmp(s.p, b"usage", 5) == 0 and f.usage < 0:
                f.usage = self.string_index[self.enumerated()]
            else:
                self.doubt("a key a buffer object does not have")
        return self.expect(b'}')

    cdef int tensors(self) except -1:
        cdef int i = 0
        self.expect(b'[')
        if self.next_is(b']'):
            return 0
        while True:
            if i == INT32_MAX:
                self.doubt("more tensors than a graph can hold")
            self.tensor(i)
            i += 1
            if not self.next_is(b','):
                break
        return self.expect(b']')

    cdef int id_list(self, text_buf * out) except -1:
        cdef int v
        self.expect(b'[')
        if self.next_is(b']'):
            return 0
        while True:
            v = <int>self.whole(INT32_MAX)
            buf_put(out, <char *>&v, sizeof(int))
            if not self.next_is(b','):
                break
        return self.expect(b']')


def read_json_value(bytes data not None):
    """The JSON document in `data` (UTF-8, a BOM allowed) as json.loads reads it; a
    ValueError naming the byte where the text leaves what this reader takes (a subset
    of what json.loads takes: see read_case_tables)."""
    cdef _Reader r = _Reader(data)
    out = r.value()
    r.end_of_text()
    return out


def read_case_tables(bytes data not None):
    """A case file's bytes read in one pass: (header, tables), the header a dict of
    every top-level key but tensors, nodes and leafs, whose values go straight into
    CaseTables (no Python object per tensor). A ValueError naming the byte where the
    text leaves what the reader takes: where json.loads would refuse it, where it is
    outside the typed subset (escapes in keys and enumerated fields, NaN, nesting past
    MAX_DEPTH, ...), and where the case checks would refuse a tensor entry's value
    outright. json.loads and the checks in words then take the file and name any
    fault. The tables still need CaseTables.check."""
    cdef _Reader r = _Reader(data)
    cdef str_token s
    cdef dict header = {}
    cdef int typed = 0
    r.expect(b'{')
    while True:
        r.string_token(&s)
        key = r.string_value(&s)
        r.expect(b':')
        if key in header or (key == "tensors" and typed & 1) or \
                (key == "nodes" and typed & 2) or (key == "leafs" and typed & 4):
            r.doubt(f"the key {key!r} given twice")
        if key == "tensors":
            r.tensors()
            typed |= 1
        elif key == "nodes":
            r.id_list(&r.tables.node_ids)
            typed |= 2
        elif key == "leafs":
            r.id_list(&r.tables.leaf_ids)
            typed |= 4
        else:
            header[key] = r.value()
        if not r.next_is(b','):
            break
    r.expect(b'}')
    r.end_of_text()
    if typed != 7:
        r.doubt("a case without its tensors, nodes and leafs")
    return header, r.tables
