"""Case and plan files at C speed (issue 36: `ggml-py plan` on a 100k-node case): the plan
file's text (json.dumps with indent=1, byte for byte, whose pure-Python encoder a large
plan keeps busy for seconds); the typed checks of a case's tensor list that
ggml_py.tools.cases runs before it explains any fault in words; and the making and
wiring of a checked case's tensors."""

from libc.stdlib cimport malloc, calloc, realloc, free
from libc.stdio cimport snprintf
from libc.string cimport memcpy, memset
from libc.stdint cimport int64_t, uint64_t, INT32_MAX, INT64_MAX
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_DecodeASCII

from ggml_py._ggml cimport ggml_tensor, GGML_MAX_SRC, GGML_MAX_NAME
from ggml_py._core cimport (Context, Tensor, TYPE_TRAITS, GGML_PY_MAX_BYTES, ggml_new_tensor_impl,
                            ggml_set_name,
                            layout_changed, size_arg, tensor_changed, tensor_handle,
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
# the case file's tensor list, checked in one typed pass

cdef extern from *:
    ctypedef unsigned long long u128 "unsigned __int128"

cdef enum:
    MAX_SRC = GGML_MAX_SRC
    MAX_NAME_BYTES = GGML_MAX_NAME - 1

cdef object K_ID = "id", K_NAME = "name", K_OP = "op", K_TYPE = "type", K_NE = "ne"
cdef object K_NB = "nb", K_SRC = "src", K_VIEW_SRC = "view_src", K_VIEW_OFFS = "view_offs"
cdef object K_FLAGS = "flags", K_BUFFER = "buffer", K_BACKEND = "backend"
cdef object K_BUFFER_TYPE = "buffer_type", K_USAGE = "usage"
cdef int N_TENSOR_KEYS = 12
cdef int64_t MAX_ELEMENTS = _MAX_ELEMENTS


cdef struct tensor_facts:
    int type
    int64_t ne[4]
    uint64_t nb[4]
    uint64_t view_offs
    int view_src            # -1: none
    int src[MAX_SRC]        # -1: an empty slot or past the end
    bint has_buffer


cdef bint get_int(object x, int64_t lo, int64_t hi, int64_t * out) noexcept:
    """x is a plain int in [lo, hi] (JSON's integers: bool and subclasses take the
    checks in words)."""
    cdef int overflow
    cdef long long v
    if type(x) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow or v < lo or v > hi:
        return False
    out[0] = v
    return True


cdef bint get_dims(object x, int64_t * out) noexcept:
    """4 plain ints in [0, INT64_MAX] (an nb past INT64_MAX takes the checks in words)."""
    cdef int i
    if type(x) is not list or len(<list>x) != 4:
        return False
    for i in range(4):
        if not get_int((<list>x)[i], 0, INT64_MAX, &out[i]):
            return False
    return True


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


cdef bint name_ok(object name) noexcept:
    cdef Py_ssize_t n
    if type(name) is not str:
        return False
    try:
        PyUnicode_AsUTF8AndSize(name, &n)   # (a lone surrogate raises)
    except UnicodeEncodeError:
        return False
    return n <= MAX_NAME_BYTES


cdef bint tensor_ok(dict t, int i, int n, tensor_facts * f, dict buffer_types,
                    list backend_names) except -1:
    """What _check_tensor checks of tensor i, typed: its facts in f when it passes."""
    cdef int64_t v, elements
    cdef int j
    if len(t) != N_TENSOR_KEYS:
        return False
    keys = (K_ID, K_NAME, K_OP, K_TYPE, K_NE, K_NB, K_SRC, K_VIEW_SRC, K_VIEW_OFFS, K_FLAGS,
            K_BUFFER, K_BACKEND)
    for k in keys:
        if k not in t:
            return False
    if not get_int(t[K_ID], i, i, &v) or not name_ok(t[K_NAME]):
        return False
    if type(t[K_OP]) is not str or t[K_OP] not in _OP_IDS:
        return False
    if type(t[K_TYPE]) is not str or t[K_TYPE] not in _TYPE_IDS:
        return False
    f.type = _TYPE_IDS[t[K_TYPE]]
    if not get_dims(t[K_NE], f.ne) or not get_dims(t[K_NB], <int64_t *>f.nb):
        return False
    if f.ne[0] % TYPE_TRAITS[f.type].blck_size:
        return False
    elements = 1
    for j in range(4):
        if f.ne[j] == 0:
            elements = 0
        elif elements > MAX_ELEMENTS // f.ne[j]:
            return False
        else:
            elements *= f.ne[j]
    if nbytes_of(f) > GGML_PY_MAX_BYTES:
        return False
    src = t[K_SRC]
    if type(src) is not list or len(<list>src) > MAX_SRC:
        return False
    for j in range(MAX_SRC):
        f.src[j] = -1
        if j < len(<list>src) and (<list>src)[j] is not None:
            if not get_int((<list>src)[j], 0, n - 1, &v) or v == i:
                return False
            f.src[j] = v
    f.view_src = -1
    if t[K_VIEW_SRC] is not None:
        if not get_int(t[K_VIEW_SRC], 0, n - 1, &v) or v == i:
            return False
        f.view_src = v
    if not get_int(t[K_VIEW_OFFS], 0, INT64_MAX, <int64_t *>&f.view_offs):
        return False
    flags = t[K_FLAGS]
    if type(flags) is not list:
        return False
    for j, flag in enumerate(<list>flags):
        if type(flag) is not str or flag not in _FLAG_NAMES or flag in (<list>flags)[:j]:
            return False
    buf = t[K_BUFFER]
    f.has_buffer = buf is not None
    if buf is not None:
        if type(buf) is not dict or len(<dict>buf) != 2:
            return False
        if K_BUFFER_TYPE not in buf or K_USAGE not in buf:
            return False
        buft, usage = buf[K_BUFFER_TYPE], buf[K_USAGE]
        if type(buft) is not str or buft not in buffer_types:
            return False
        if type(usage) is not str or usage not in _BUFFER_USAGES:
            return False
    return t[K_BACKEND] is None or t[K_BACKEND] in backend_names


cdef bint view_ok(const tensor_facts * facts, int i) noexcept:
    """What _check_views checks of tensor i."""
    cdef const tensor_facts * f = &facts[i]
    cdef const tensor_facts * base
    cdef u128 data_size, size
    if f.view_src < 0:
        return True
    base = &facts[f.view_src]
    if base.view_src >= 0 or (f.has_buffer and not base.has_buffer):
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


cdef bint graph_lists_ok(object nodes, object leafs, int n) except -1:
    """What _check_graph_lists checks: ids in range, none listed twice."""
    cdef char * seen = <char *>calloc(n + 1, 1)
    cdef int64_t v
    cdef bint ok = type(nodes) is list and type(leafs) is list
    if seen == NULL:
        raise MemoryError("the graph list check of a case")
    try:
        for ids in (nodes, leafs):
            if not ok:
                break
            for x in <list>ids:
                if not get_int(x, 0, n - 1, &v) or seen[v]:
                    ok = False
                    break
                seen[v] = 1
    finally:
        free(seen)
    return ok


def case_tensors_ok(tensors, nodes, leafs, dict buffer_types, list backend_names):
    """True when a case's tensor, node and leaf lists pass every check of
    ggml_py.tools.cases (_check_tensor, _check_views, _check_acyclic,
    _check_graph_lists), made in one typed pass; False at the first doubt -- the
    checks in words then find the fault and name it (a file this pass doubts
    without cause is only loaded more slowly)."""
    cdef Py_ssize_t n
    cdef int i
    cdef tensor_facts * facts
    if type(tensors) is not list or len(<list>tensors) > INT32_MAX:
        return False
    n = len(<list>tensors)
    facts = <tensor_facts *>malloc(n * sizeof(tensor_facts) + 1)
    if facts == NULL:
        raise MemoryError(f"the checks of {n} tensors")
    try:
        for i in range(n):
            t = (<list>tensors)[i]
            if type(t) is not dict or not tensor_ok(t, i, n, &facts[i], buffer_types,
                                                     backend_names):
                return False
        for i in range(n):
            if not view_ok(facts, i):
                return False
        return acyclic(facts, n) and graph_lists_ok(nodes, leafs, n)
    finally:
        free(facts)


# ---------------------------------------------------------------------------
# a checked case's tensors, made and wired in one typed pass

def build_tensors(Context ctx, list docs):
    """New tensors in ctx, one per tensor entry of a checked case (ggml_py.tools.cases):
    op, type, name, ne and nb as written, no sources yet (wire sets them). What
    ctx.new_op(op, (), type, ne[::-1], name=name) then `.nb = nb` make, without the
    per-argument checks that the case's checks have already made."""
    cdef ggml_tensor * t
    cdef int64_t ne[4]
    cdef int64_t nb[4]
    cdef int i
    out = []
    for doc in docs:
        for i in range(4):
            ne[i] = doc[K_NE][i]
        t = ggml_new_tensor_impl(&ctx.ctx, _TYPE_IDS[doc[K_TYPE]], 4, ne, NULL, 0)
        t.op = _OP_IDS[doc[K_OP]]
        if get_dims(doc[K_NB], nb):
            for i in range(4):
                t.nb[i] = nb[i]
            layout_changed(t)
        else:
            # strides past INT64_MAX (or not plain ints): the builder's own setter takes
            # them, and refuses what it has always refused
            tensor_handle(t).nb = doc[K_NB]
        ggml_set_name(t, PyUnicode_AsUTF8AndSize(doc[K_NAME], NULL))
        tensor_changed(t)
        out.append(tensor_handle(t))
    return out


def wire(list tensors, list wiring):
    """Set every tensor's sources, view_src and view_offs and flags as a case wrote them
    (wiring[i] = (src ids, view_src id, view_offs, flag names), ids into `tensors`, all
    of one context) and take it out of any buffer: what set_src, set_view_src, the
    flags setter and clear_buffer do, for every tensor in one pass."""
    cdef ggml_tensor * t
    cdef int i, j, flags
    if len(wiring) > len(tensors):
        raise ArgumentError(f"wiring for {len(wiring)} tensors, but {len(tensors)} tensors")
    for i, (src, view_src, view_offs, names) in enumerate(wiring):
        t = (<Tensor?>tensors[i]).ptr
        for j in range(MAX_SRC):
            s = (<list?>src)[j] if j < len(<list?>src) else None
            tensor_set_src(t, j, NULL if s is None else (<Tensor?>tensors[s]).ptr)
        t.view_src = NULL if view_src is None else (<Tensor?>tensors[view_src]).ptr
        t.view_offs = size_arg(view_offs, "view_offs")
        flags = 0
        for name in names:
            flags |= _FLAG_NAMES[name]
        t.flags = flags
        t.buffer = NULL
        t.data = NULL
        tensor_changed(t)
