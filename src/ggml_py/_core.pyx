"""Tensor and graph core of ggml_py.

A port of the parts of ggml.c that scheduling, allocation and compute stand
on: type traits and byte sizes, the open-addressing hash set on tensor
pointers, a tensor arena (ggml's no_alloc context: metadata only, data lives
in backend buffers) and the graph with ggml's exact parent-visiting order.
Python sees thin handles (Context, Tensor, Graph); nothing in the C loops
needs a Python object per tensor.
"""

from cpython.number cimport PyNumber_Index
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memset, memcpy, strncpy
from libc.stdio cimport snprintf
from libc.stdint cimport int32_t, int64_t, uint64_t, SIZE_MAX
from libc.math cimport log

cdef extern from "<stdlib.h>" nogil:
    char * getenv(const char * name)
cdef extern from *:
    """
    #include <sys/mman.h>
    /* transparent huge pages for [p, p + n), where the system has them (Linux) */
    static void ggml_py_madvise_huge(void * p, size_t n) {
    #ifdef MADV_HUGEPAGE
        madvise(p, n, MADV_HUGEPAGE);
    #else
        (void)p; (void)n;
    #endif
    }
    /* n bytes aligned to n (a power of two) straight from the kernel, and back to it:
       the arena's blocks. (From malloc, a freed 2 MiB block stays in its heap, and the
       next lands beside it on fresh pages: a process making and dropping schedulers
       grew by a page a cycle.) */
    static void * ggml_py_map_aligned(size_t n) {
        char * p = (char *)mmap(NULL, 2 * n, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == (char *)MAP_FAILED) {
            return NULL;
        }
        char * a = (char *)(((size_t)p + n - 1) & ~(n - 1));
        if (a > p) {
            munmap(p, (size_t)(a - p));
        }
        if (a + n < p + 2 * n) {
            munmap(a + n, (size_t)(p + 2 * n - (a + n)));
        }
        return a;
    }
    static void ggml_py_unmap(void * p, size_t n) {
        munmap(p, n);
    }
    """
    void madvise_huge "ggml_py_madvise_huge" (void * p, size_t n) noexcept nogil
    void * map_aligned "ggml_py_map_aligned" (size_t n) noexcept nogil
    void unmap "ggml_py_unmap" (void * p, size_t n) noexcept nogil

from ggml_py._ggml cimport *

from ggml_py.errors import (AllocationError, ArgumentError, ArgumentTypeError, GraphError,
                            OutOfRangeError, UnknownNameError)

# ---------------------------------------------------------------------------
# argument checks: every public entry point converts its numbers and names
# here, so that a bad argument is an ArgumentError naming it, never an
# OverflowError from a C conversion or a wrapped size

cdef object _integer(object value, what):
    """value as a Python int (anything with __index__ but bool)."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be an integer, got {value!r}")
    try:
        return PyNumber_Index(value)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be an integer, got "
                                f"{type(value).__name__}") from None


cpdef size_t size_arg(object value, what) except? 0:
    """A byte count or offset: an integer in [0, SIZE_MAX]."""
    v = _integer(value, what)
    if not 0 <= v <= SIZE_MAX:
        raise ArgumentError(f"{what} must be in [0, {SIZE_MAX}], got {v}")
    return v


cpdef int64_t int_arg(object value, what, object lo, object hi) except? -1:
    """An integer in [lo, hi] (the range of the C field it goes to, within int64)."""
    v = _integer(value, what)
    if not lo <= v <= hi or not _INT64_MIN <= v <= _INT64_MAX:
        raise ArgumentError(f"{what} must be in [{lo}, {hi}], got {v}")
    return v


cpdef Py_ssize_t index_arg(object value, what, object n) except? -1:
    """An index into n items; negative ones count from the end, as in Python."""
    v = _integer(value, what)
    n = _integer(n, "index_arg: n")
    if v < 0:
        v += n
    if not 0 <= v < n or v > _INT64_MAX:
        raise OutOfRangeError(f"{what} {value} is out of range ({n} items)")
    return v


cpdef bytes name_arg(object value, what, bint allow_empty=False):
    """A name as the UTF-8 bytes of ggml's 64-byte name fields."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a string, got {type(value).__name__}")
    try:
        b = (<str>value).encode()
    except UnicodeEncodeError:
        raise ArgumentError(f"{what} {value!r} is not valid Unicode (a lone surrogate?)") from None
    if len(b) >= GGML_MAX_NAME or (not b and not allow_empty):
        raise ArgumentError(f"{what} must have {0 if allow_empty else 1} to "
                            f"{GGML_MAX_NAME - 1} bytes, got {value!r}")
    return b


cpdef object instance_arg(object value, cls, what, bint optional=False):
    """value, which must be an instance of cls (a class or a tuple of them), or None
    when optional: the check at the entry of a Python API function."""
    if (optional and value is None) or isinstance(value, cls):
        return value
    names = " or ".join([c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,))])
    raise ArgumentTypeError(f"{what} must be a {names}{' or None' if optional else ''}, "
                            f"got {type(value).__name__}")


cpdef list items_arg(object value, what, object of=None, object limit=None):
    """A list from a sequence argument, each item an instance of `of` (a class) when
    given, at most `limit` items when given."""
    if of is not None and not isinstance(of, type):
        raise ArgumentTypeError(f"items_arg: `of` must be a class, got {type(of).__name__}")
    cdef Py_ssize_t n_max = PY_SSIZE_T_MAX if limit is None else int_arg(limit, "limit", 0,
                                                                           PY_SSIZE_T_MAX)
    kind = f" of {of.__name__}" if of is not None else ""
    try:
        items = list(value)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be a sequence{kind}, got "
                                f"{type(value).__name__}") from None
    if len(items) > n_max:
        raise ArgumentError(f"{what}: at most {n_max} items, got {len(items)}")
    if of is not None:
        for x in items:
            if not isinstance(x, of):
                raise ArgumentTypeError(f"{what} must be a sequence{kind}, got a "
                                        f"{type(x).__name__} in it")
    return items


# ---------------------------------------------------------------------------
# large tables: 2 MiB pages
# A split of 100k nodes walks 40 MB of tensor structs and hash slots; with 4 KiB pages
# nearly every line it asks for is a TLB miss as well (a page walk, nested under a
# hypervisor). Tables of several MiB and the tensor arena's blocks after its first
# ask the kernel for transparent huge pages (where it grants them on request, as with
# "madvise", Linux's usual setting). GGML_PY_NO_HUGE_PAGES=1 turns this off.

cdef enum:
    HUGE_PAGE = 1 << 21

cdef bint want_huge_pages = getenv("GGML_PY_NO_HUGE_PAGES") == NULL
if ARENA_BLOCK_BYTES != HUGE_PAGE or \
        ARENA_HEADER_BYTES + CTX_BLOCK * sizeof(ggml_tensor) > ARENA_BLOCK_BYTES or \
        ARENA_HEADER_BYTES >= sizeof(ggml_tensor):
    raise ImportError("_core.pxd: an arena block (a huge page) must hold its header and "
                      "CTX_BLOCK tensors, the header less than a tensor")


cdef void advise_huge_pages(void * p, size_t n) noexcept nogil:
    """Ask for huge pages in the whole 2 MiB pages of [p, p + n), when n is large
    enough for them to matter."""
    cdef size_t start = (<size_t>p + HUGE_PAGE - 1) & ~(<size_t>HUGE_PAGE - 1)
    cdef size_t end = (<size_t>p + n) & ~(<size_t>HUGE_PAGE - 1)
    if want_huge_pages and n >= 2 * HUGE_PAGE and end > start:
        madvise_huge(<void *>start, end - start)


cdef int safe_realloc(void ** p, size_t n, size_t size, what) except -1:
    """*p = realloc(*p, n * size), or AllocationError naming what it was for (*p is left
    as it was). scikit-learn's safe_realloc, for every growing table of ggml_py."""
    cdef void * q = NULL
    if size == 0 or n <= SIZE_MAX // size:
        q = realloc(p[0], (n if n else 1) * (size if size else 1))
    if q == NULL:
        raise AllocationError(f"cannot grow {what} ({n} x {size} bytes)")
    p[0] = q
    advise_huge_pages(q, n * size)
    return 0


cdef void * checked_calloc(size_t n, size_t size, what) except NULL:
    """calloc(n, size), or AllocationError naming what it was for."""
    cdef void * p = NULL
    if size == 0 or n <= SIZE_MAX // size:
        p = calloc(n if n else 1, size if size else 1)
    if p == NULL:
        raise AllocationError(f"cannot allocate {what} ({n} x {size} bytes)")
    advise_huge_pages(p, n * size)
    return p


# ---------------------------------------------------------------------------
# memory the process can still take
# Linux hands out memory it does not have (overcommit) and kills the process that
# touches it when none is left. ggml_py checks what it is about to fill (host buffers,
# the scheduler's tables, a random model's weights) against what is available, and
# raises AllocationError instead.

def _read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# what a memory cgroup's folder says, by version: its limit, its usage, and the
# memory.stat line of its inactive page cache
_CGROUP_FILES = {True: ("memory.max", "memory.current", "inactive_file"),
                 False: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}


def _cgroup_dirs(proc, cgroup_root):
    """The memory cgroup folders of this process, innermost first, up to the root (a
    parent's limit binds as well): (folder, v2) for cgroup v2 or v1."""
    text = _read_text(f"{proc}/self/cgroup") or ""
    dirs = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        v2 = parts[0] == "0" and parts[1] == ""
        if not v2 and "memory" not in parts[1].split(","):
            continue
        base = cgroup_root if v2 else f"{cgroup_root}/memory"
        # inside a cgroup namespace the path is relative to a root mounted at base
        path = parts[2].strip("/")
        while True:
            dirs.append((f"{base}/{path}" if path else base, v2))
            if not path:
                break
            path = path.rpartition("/")[0]
    return dirs


def _stat_field(text, key):
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _cgroup_room(folder, v2):
    """What the cgroup in folder can still take: its limit less its working set (usage
    less the inactive page cache, which the kernel reclaims first); None: no limit (or
    no such folder)."""
    limit_file, usage_file, inactive_key = _CGROUP_FILES[v2]
    try:
        limit = int(_read_text(f"{folder}/{limit_file}"))
        usage = int(_read_text(f"{folder}/{usage_file}"))
    except (TypeError, ValueError):     # "max", or unreadable
        return None
    if limit >= 1 << 62:                # v1 spells "no limit" as a huge number
        return None
    inactive = _stat_field(_read_text(f"{folder}/memory.stat"), inactive_key)
    return max(0, limit - max(0, usage - inactive))


def memory_available(proc="/proc", cgroup_root="/sys/fs/cgroup"):
    """Bytes of memory this process can still fill before the kernel's out-of-memory
    killer stops it: the system's available memory and free swap (/proc/meminfo), or
    less where its cgroup (v2 or v1, or a parent) is limited; None where /proc does not
    say (not Linux)."""
    text = _read_text(f"{proc}/meminfo")
    if text is None:
        return None
    kib = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields = value.split()
        if fields and fields[0].isdigit():
            kib[name] = int(fields[0])
    if "MemAvailable" not in kib and "MemFree" not in kib:
        return None
    room = 1024 * (kib.get("MemAvailable", kib.get("MemFree")) + kib.get("SwapFree", 0))
    for folder, v2 in _cgroup_dirs(proc, cgroup_root):
        cg = _cgroup_room(folder, v2)
        if cg is not None:
            room = min(room, cg)
    return room


def check_memory_available(n, what):
    """AllocationError unless n bytes can be filled (memory_available), naming what
    they are for."""
    room = memory_available()
    if room is not None and n > room:
        raise AllocationError(f"{what}: cannot allocate {n} bytes ({n / 2**30:.1f} GiB), more "
                              f"than the {room} bytes ({room / 2**30:.1f} GiB) of memory "
                              f"available (the system's, or its cgroup's limit)")


# ---------------------------------------------------------------------------
# type traits and op names (ggml 0.10.1 enums)

def _type_vocabulary():
    """(TYPE_NAMES, layouts) from the one list of types, ggml-py-vocab.h."""
    names = [None] * GGML_PY_TYPE_COUNT
    layout = {}
    cdef int i
    for i in range(GGML_PY_N_TYPE_INFOS):
        info = ggml_py_type_infos[i]
        name = info.name.decode()
        if names[info.id] is not None:
            raise ImportError(f"ggml-py-vocab.h lists type id {info.id} twice")
        names[info.id] = name
        if info.blck_size:
            layout[name] = (info.blck_size, info.type_size)
    return tuple(names), layout


# ggml's type names by id (None where ggml has no type), and (block size, bytes per
# block) of the types ggml_py knows the layout of
TYPE_NAMES, TYPE_LAYOUTS = _type_vocabulary()

cdef tuple _names(const char * const * names, int n):
    return tuple(names[i].decode() for i in range(n))


cdef dict _named_values(const char * const * names, const int * values, int n):
    return {names[i].decode(): values[i] for i in range(n)}


# ggml's op, unary op and GLU op names by id (ggml-py-vocab.h)
OP_NAMES_LIST = _names(ggml_py_op_names, GGML_PY_OP_COUNT)
UNARY_OP_NAMES = _names(ggml_py_unary_op_names, GGML_PY_UNARY_OP_COUNT)
GLU_OP_NAMES = _names(ggml_py_glu_op_names, GGML_PY_GLU_OP_COUNT)
# ggml.h's named values (ggml-py-vocab.h): rope modes, and the precisions of MUL_MAT and
# FLASH_ATTN_EXT
ROPE_TYPES = _named_values(ggml_py_rope_type_names, ggml_py_rope_type_values,
                           GGML_PY_N_ROPE_TYPES)
PRECS = _named_values(ggml_py_prec_names, ggml_py_prec_values, GGML_PY_N_PRECS)

FLAG_NAMES = {"INPUT": GGML_TENSOR_FLAG_INPUT, "OUTPUT": GGML_TENSOR_FLAG_OUTPUT,
              "PARAM": GGML_TENSOR_FLAG_PARAM, "LOSS": GGML_TENSOR_FLAG_LOSS,
              "COMPUTE": GGML_TENSOR_FLAG_COMPUTE}

TYPE_IDS = {name: i for i, name in enumerate(TYPE_NAMES) if name in TYPE_LAYOUTS}
OP_IDS = {name: i for i, name in enumerate(OP_NAMES_LIST)}

# ops without computation: the views (ggml_is_view_op) share their source's memory;
# with NONE they are ggml's empty ops (ggml_op_is_empty), which need no kernel
VIEW_OPS = tuple(OP_NAMES_LIST[i] for i in (OP_VIEW, OP_RESHAPE, OP_PERMUTE, OP_TRANSPOSE))
EMPTY_OPS = ("NONE",) + VIEW_OPS

GGML_TYPE_COUNT = len(TYPE_NAMES)
GGML_OP_COUNT = len(OP_NAMES_LIST)

# C copies of the names: the byte strings must outlive the module
_NAME_BYTES = [n.encode() if n else b"" for n in TYPE_NAMES + OP_NAMES_LIST]

cdef void _init_tables():
    cdef int i
    for i in range(GGML_TYPE_COUNT):
        TYPE_TRAITS[i].name = <const char *>_NAME_BYTES[i]
        name = TYPE_NAMES[i]
        if name in TYPE_LAYOUTS:
            TYPE_TRAITS[i].blck_size, TYPE_TRAITS[i].type_size = TYPE_LAYOUTS[name]
            TYPE_TRAITS[i].is_quantized = TYPE_TRAITS[i].blck_size > 1
        else:
            TYPE_TRAITS[i].blck_size = 0
            TYPE_TRAITS[i].type_size = 0
            TYPE_TRAITS[i].is_quantized = False
    for i in range(GGML_OP_COUNT):
        OP_NAMES[i] = <const char *>_NAME_BYTES[GGML_TYPE_COUNT + i]

_init_tables()


def type_id(name):
    """ggml type id of a type ('f32', 'q8_0', ..., or a numpy dtype: see ggml_type);
    UnknownNameError (a KeyError) names the type."""
    if isinstance(name, str) and name in TYPE_IDS:
        return TYPE_IDS[name]
    return TYPE_IDS[ggml_type(name)]


# numpy's names of the types numpy has (numpy has no bfloat16; ml_dtypes' is named so)
NUMPY_TYPE_NAMES = {"float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8",
                    "int16": "i16", "int32": "i32", "int64": "i64", "bfloat16": "bf16"}


def ggml_type(spec):
    """The ggml type name of a type given the way a user may give it: ggml's name ('f32',
    'f16', 'bf16', 'q8_0', ...), a numpy dtype or scalar type (np.float32,
    np.dtype('float16'), np.int32, ...) or numpy's name of one ('float32', 'float16',
    'int32', ...; 'bfloat16' is bf16). ggml's names come first: 'i8' is ggml's int8 (numpy's
    int64 code), 'f16' half precision. Every call that takes a type reads it here (type_id).
    UnknownNameError (a KeyError and ValueError) says what is accepted."""
    cdef object name = None
    if isinstance(spec, str):
        if spec in TYPE_IDS:
            return spec
        name = spec
    elif spec is not None and not isinstance(spec, (bool, int, float, bytes)):
        import numpy as np
        try:
            dt = np.dtype(spec)
        except (TypeError, ValueError):
            dt = None
        if dt is not None:
            if not dt.isnative:
                raise UnknownNameError(f"type {spec!r}: ggml types are little-endian; "
                                       f"{dt.str} is not (use {dt.newbyteorder('=').name})")
            name = dt.name
    t = NUMPY_TYPE_NAMES.get(name) if name is not None else None
    if t is None:
        raise UnknownNameError(
            f"unknown ggml type {spec!r}; a type is one of ggml's names "
            f"({', '.join(sorted(TYPE_IDS))}) or a numpy dtype or its name "
            f"({', '.join(NUMPY_TYPE_NAMES)})")
    return t


def op_id(name):
    """ggml op id of an op name without GGML_OP_ ('MUL_MAT', ...)."""
    if isinstance(name, str) and name in OP_IDS:
        return OP_IDS[name]
    raise UnknownNameError(f"unknown ggml op {name!r}")


def type_name(type):
    """Name of a ggml type id (None for ids ggml removed)."""
    return TYPE_NAMES[index_arg(type, "type id", GGML_TYPE_COUNT)]


def op_name(op):
    return OP_NAMES_LIST[index_arg(op, "op id", GGML_OP_COUNT)]


def blck_size(name):
    return TYPE_TRAITS[type_id(name)].blck_size


def type_size(name):
    return TYPE_TRAITS[type_id(name)].type_size


def row_size(name, ne):
    """Bytes of a row of ne elements of this type (ggml_row_size)."""
    cdef int t = type_id(name)
    cdef int64_t n = int_arg(ne, "row_size: ne", 0, MAX_ELEMENTS)
    if n % TYPE_TRAITS[t].blck_size:
        raise ArgumentError(f"row of {n} elements is not a whole number of {name} blocks "
                            f"({TYPE_TRAITS[t].blck_size})")
    return ggml_row_size(t, n)


# ---------------------------------------------------------------------------
# tensor facts

cdef size_t ggml_row_size(int type, int64_t ne) noexcept nogil:
    return TYPE_TRAITS[type].type_size * ne // TYPE_TRAITS[type].blck_size


cdef int64_t ggml_nelements(const ggml_tensor * t) noexcept nogil:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


cdef int64_t ggml_nrows(const ggml_tensor * t) noexcept nogil:
    return t.ne[1] * t.ne[2] * t.ne[3]


cdef bint ggml_is_contiguous_n(const ggml_tensor * t, int n) noexcept nogil:
    """Packed rows, and dims above n packed over the extent of the dims up to n (dims of
    size 1 may have any stride)."""
    cdef size_t next_nb = TYPE_TRAITS[t.type].type_size
    cdef int i
    if t.ne[0] != TYPE_TRAITS[t.type].blck_size and t.nb[0] != next_nb:
        return False
    next_nb *= t.ne[0] // TYPE_TRAITS[t.type].blck_size
    for i in range(1, GGML_MAX_DIMS):
        if i > n:
            if t.ne[i] != 1 and t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
        else:
            next_nb = t.ne[i] * t.nb[i]     # this dim need not be contiguous
    return True


cdef bint ggml_is_contiguous(const ggml_tensor * t) noexcept nogil:
    return ggml_is_contiguous_n(t, 0)


cdef bint ggml_is_contiguous_1(const ggml_tensor * t) noexcept nogil:
    return ggml_is_contiguous_n(t, 1)


cdef void ggml_set_name(ggml_tensor * t, const char * name) noexcept nogil:
    strncpy(t.name, name, GGML_MAX_NAME - 1)
    t.name[GGML_MAX_NAME - 1] = 0


cdef void ggml_join_name(ggml_tensor * t, const char * a, const char * b, const char * c,
                         const char * d) noexcept nogil:
    """t.name = a + b + c + d, cut to the name's size like snprintf (without its
    cost: the scheduler names every copy it makes on every split)."""
    cdef size_t n = 0, k
    cdef const char * part
    cdef const char * parts[4]
    parts[0] = a
    parts[1] = b
    parts[2] = c
    parts[3] = d
    for k in range(4):
        part = parts[k]
        while part[0] != 0 and n < GGML_MAX_NAME - 1:
            t.name[n] = part[0]
            n += 1
            part += 1
    t.name[n] = 0


# ---------------------------------------------------------------------------
# hash set

cdef size_t[32] _PRIMES = [
    2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771,
    65537, 131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259,
    33554467, 67108879, 134217757, 268435459, 536870923, 1073741827, 2147483659,
]


cdef size_t ggml_hash_size(size_t min_sz) noexcept nogil:
    """Smallest prime of ggml's table >= min_sz (min_sz | 1 past the table)."""
    cdef size_t l = 0, r = 32, m
    while l < r:
        m = (l + r) // 2
        if _PRIMES[m] < min_sz:
            l = m + 1
        else:
            r = m
    return _PRIMES[l] if l < 32 else (min_sz | 1)


cdef int ggml_hash_set_init(ggml_hash_set * hs, size_t min_sz) except -1:
    hs.size = ggml_hash_size(min_sz)
    hs.size_magic = ggml_py_mod_magic(hs.size)
    hs.keys = NULL
    hs.used = NULL
    if hs.size <= SIZE_MAX // sizeof(ggml_tensor *):
        hs.keys = <ggml_tensor **>malloc(hs.size * sizeof(ggml_tensor *))
        hs.used = <ggml_bitset_t *>calloc(ggml_bitset_size(hs.size), sizeof(ggml_bitset_t))
        if hs.keys != NULL:
            advise_huge_pages(hs.keys, hs.size * sizeof(ggml_tensor *))
    if hs.keys == NULL or hs.used == NULL:
        ggml_hash_set_free(hs)
        raise AllocationError(f"cannot allocate a hash set of {hs.size} slots")
    return 0


cdef void ggml_hash_set_free(ggml_hash_set * hs) noexcept nogil:
    free(hs.keys)
    free(hs.used)
    hs.keys = NULL
    hs.used = NULL


cdef void ggml_hash_set_reset(ggml_hash_set * hs) noexcept nogil:
    memset(hs.used, 0, ggml_bitset_size(hs.size) * sizeof(ggml_bitset_t))


cdef size_t _probes(const ggml_hash_set * hs, size_t home, uint64_t key,
                   const ggml_tensor * stop_at) noexcept nogil:
    """How many slots a lookup of the hash key `key` from `home` reads (ggml_hash_find's
    order) until it reaches stop_at, or a free slot where stop_at is NULL."""
    cdef size_t i = home, n = 1
    cdef uint64_t k = 0
    cdef size_t step = ggml_hash_walk_step(hs, key)
    while not _hash_stop(hs, i, stop_at) or (stop_at != NULL and hs.keys[i] != stop_at):
        k += 1
        n += 1
        i = ggml_hash_probe(hs, key, k, i, step)
    return n


cdef dict hash_probe_stats(const ggml_hash_set * hs):
    """How many slots lookups in hs read, counted from where its keys lie: a lookup of a
    key reads its home slot and the slots it draws up to its own (a hit); a lookup of an
    absent key up to the first free one (a miss: one from every slot as home, with the
    draws of a key of the slot's number). Beside the counts, what slots drawn at random
    read on average at the same load a (uniform hashing: ln(1/(1 - a)) / a for a hit,
    1 / (1 - a) for a miss), the yardstick of a hash that clusters."""
    cdef size_t i, k, n = 0, hit_max = 0
    cdef double hits = 0, misses = 0, a
    cdef size_t size = hs.size
    cdef ggml_tensor * t
    for i in range(size):
        if ggml_bitset_get(hs.used, i):
            t = hs.keys[i]
            k = _probes(hs, ggml_hash_home(hs, t), ggml_hash(t), t)
            hits += k
            hit_max = max(hit_max, k)
            n += 1
    if n == size:
        misses = float("inf")
    else:
        for i in range(size):
            misses += _probes(hs, i, i, NULL)
    a = n / <double>size
    return {"size": size, "keys": n, "load": a,
            "hit_probes_mean": hits / n if n else 0.0, "hit_probes_max": hit_max,
            "miss_probes_mean": misses / size,
            "ideal_hit_probes": (log(1 / (1 - a)) / a if n else 1.0) if n < size
                                else float("inf"),
            "ideal_miss_probes": 1 / (1 - a) if n < size else float("inf")}


cdef class HashSet:
    """Python view of the C hash set, for tests: keys are tensor handles."""
    cdef ggml_hash_set hs
    cdef list _keep

    def __cinit__(self, min_size):
        self.hs.keys = NULL
        self.hs.used = NULL
        self.hs.size = 0
        ggml_hash_set_init(&self.hs, size_arg(min_size, "HashSet(min_size)"))
        self._keep = []

    def __dealloc__(self):
        ggml_hash_set_free(&self.hs)

    @property
    def size(self):
        """The number of slots."""
        return self.hs.size

    def insert(self, Tensor t not None):
        """Insert t: its slot, or None if it was there already (GraphError when full)."""
        cdef size_t i = ggml_hash_insert(&self.hs, t.ptr)
        if i == GGML_HASHSET_FULL:
            raise GraphError(f"hash set full ({self.hs.size} slots)")
        if i != GGML_HASHSET_ALREADY_EXISTS:
            self._keep.append(t)
            return i
        return None

    def find(self, Tensor t not None):
        """t's slot, or the empty slot where it would go (None: the set is full
        and t is not in it)."""
        cdef size_t i = ggml_hash_find(&self.hs, t.ptr)
        return None if i == GGML_HASHSET_FULL else i

    def __contains__(self, Tensor t not None):
        return ggml_hash_contains(&self.hs, t.ptr)

    def slot_of_hash(self, Tensor t not None):
        """The home slot of t before probing."""
        return ggml_hash_home(&self.hs, t.ptr)

    def probe_slots(self, Tensor t not None, n):
        """The first n slots a lookup of t reads (its home first), as ggml_hash_find
        reads them while they are taken by other keys."""
        cdef size_t i = ggml_hash_home(&self.hs, t.ptr)
        cdef uint64_t key = ggml_hash(t.ptr), k
        cdef size_t step = ggml_hash_walk_step(&self.hs, key)
        out = []
        for k in range(int_arg(n, "n", 0, 1 << 20)):
            if k:
                i = ggml_hash_probe(&self.hs, key, k, i, step)
            out.append(i)
        return out

    @staticmethod
    def home_of_key(key, size):
        """The home slot of a hash key (a tensor's number in the arena; below 2^63) in a
        set of `size` slots, as lookups compute it: key % size, without a division."""
        cdef uint64_t k = int_arg(key, "key", 0, 2**63 - 1)
        cdef uint64_t n = int_arg(size, "size", 2, 2**63 - 1)
        return ggml_py_mod(k, ggml_py_mod_magic(n), n)

    def probe_stats(self):
        """Slots read per lookup, counted, beside a uniformly random hash's at the
        same load (see Graph.hash_stats)."""
        return hash_probe_stats(&self.hs)

    def reset(self):
        """Empty the set."""
        ggml_hash_set_reset(&self.hs)
        self._keep = []

    def __len__(self):
        cdef size_t i, n = 0
        for i in range(self.hs.size):
            n += ggml_bitset_get(self.hs.used, i)
        return n


def hash_size(min_size):
    """ggml_hash_size: the slot count ggml gives a hash set asked for min_size."""
    return ggml_hash_size(size_arg(min_size, "hash_size(min_size)"))


# ---------------------------------------------------------------------------
# tensor arena

cdef int ggml_context_init(ggml_context * ctx) except -1:
    ctx.blocks = NULL
    ctx.n_blocks = 0
    ctx.n_tensors = 0
    ctx.no_layout_ids = False
    return 0


# The numbers of the arena's blocks: the next never used, and those given back (a stack:
# the blocks of a graph made anew each step take the numbers of the last step's)
cdef uint64_t _arena_next_block = 0
cdef uint64_t * _arena_free_blocks = NULL
cdef size_t _arena_n_free = 0, _arena_free_cap = 0


cdef inline arena_header * _header_of(ggml_tensor * first) noexcept nogil:
    return <arena_header *>(<char *>first - ARENA_HEADER_BYTES)


cdef ggml_tensor * _arena_block_new(bint huge) except NULL:
    """A 2 MiB aligned block with its header, numbered; its first tensor."""
    global _arena_next_block, _arena_n_free
    cdef char * block = <char *>map_aligned(ARENA_BLOCK_BYTES)
    if block == NULL:
        raise AllocationError("cannot grow the tensor arena")
    if huge:
        madvise_huge(block, ARENA_BLOCK_BYTES)
    cdef arena_header * h = <arena_header *>block
    if _arena_n_free:
        _arena_n_free -= 1
        h.first_key = _arena_free_blocks[_arena_n_free] * CTX_BLOCK
    else:
        h.first_key = _arena_next_block * CTX_BLOCK
        _arena_next_block += 1
    return <ggml_tensor *>(block + ARENA_HEADER_BYTES)


cdef void _arena_block_free(ggml_tensor * first) noexcept nogil:
    """Free a block and give its number back (where the stack cannot grow, the number
    is lost: keys stay distinct)."""
    global _arena_free_blocks, _arena_n_free, _arena_free_cap
    cdef arena_header * h = _header_of(first)
    cdef uint64_t * grown
    if _arena_n_free == _arena_free_cap:
        grown = <uint64_t *>realloc(_arena_free_blocks, (2 * _arena_free_cap + 64) * sizeof(uint64_t))
        if grown != NULL:
            _arena_free_blocks = grown
            _arena_free_cap = 2 * _arena_free_cap + 64
    if _arena_n_free < _arena_free_cap:
        _arena_free_blocks[_arena_n_free] = h.first_key // CTX_BLOCK
        _arena_n_free += 1
    unmap(h, ARENA_BLOCK_BYTES)


cdef void ggml_context_free(ggml_context * ctx) noexcept nogil:
    cdef int i
    for i in range(ctx.n_blocks):
        _arena_block_free(ctx.blocks[i])
    free(ctx.blocks)
    ctx.blocks = NULL
    ctx.n_blocks = 0
    ctx.n_tensors = 0


cdef void ggml_context_reset(ggml_context * ctx) noexcept nogil:
    # keep the blocks: the scheduler reuses its arena on every split
    ctx.n_tensors = 0


cdef ggml_tensor * _context_alloc(ggml_context * ctx) except NULL:
    cdef ggml_tensor ** blocks
    cdef ggml_tensor * block
    cdef int i = ctx.n_tensors
    if (i >> CTX_BLOCK_SHIFT) >= ctx.n_blocks:
        safe_realloc(<void **>&ctx.blocks, ctx.n_blocks + 1, sizeof(ggml_tensor *),
                     "the tensor arena")
        # a context that needs a second block is a large graph's: its blocks are huge
        # pages each
        block = _arena_block_new(ctx.n_blocks > 0 and want_huge_pages)
        ctx.blocks[ctx.n_blocks] = block
        ctx.n_blocks += 1
    cdef ggml_tensor * t = ggml_context_tensor(ctx, i)
    memset(t, 0, sizeof(ggml_tensor))
    tensor_changed(t)               # (a reset context makes new tensors where old ones were)
    t.id = i
    t.owner = ctx
    ctx.n_tensors += 1
    return t


cdef ggml_tensor * ggml_new_tensor_impl(ggml_context * ctx, int type, int n_dims,
                                        const int64_t * ne, ggml_tensor * view_src,
                                        size_t view_offs) except NULL:
    """ggml_new_tensor_impl: contiguous strides; a view shares view_src's memory. The
    callers set the layout id (layout_changed) once they have written strides and
    op_params."""
    cdef ggml_tensor * t
    cdef int i
    cdef size_t data_size, src_size
    if view_src != NULL and view_src.view_src != NULL:
        if view_offs > SIZE_MAX - view_src.view_offs:
            raise GraphError(f"view offset {view_offs} + {view_src.view_offs} of "
                             f"'{tensor_name(view_src)}' overflows")
        view_offs += view_src.view_offs
        view_src = view_src.view_src
    t = _context_alloc(ctx)
    t.type = type
    for i in range(GGML_MAX_DIMS):
        t.ne[i] = ne[i] if i < n_dims else 1
    t.nb[0] = TYPE_TRAITS[type].type_size
    t.nb[1] = t.nb[0] * (t.ne[0] // TYPE_TRAITS[type].blck_size)
    for i in range(2, GGML_MAX_DIMS):
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1]
    if view_src != NULL:
        # data_size + view_offs must fit in view_src (ggml asserts this)
        data_size = ggml_row_size(type, t.ne[0]) * t.ne[1] * t.ne[2] * t.ne[3]
        src_size = ggml_nbytes(view_src)
        if data_size != 0 and (data_size > src_size or view_offs > src_size - data_size):
            ctx.n_tensors -= 1
            raise GraphError(f"view of {data_size} bytes at offset {view_offs} does not fit in "
                             f"'{tensor_name(view_src)}' ({src_size} bytes)")
        if view_src.data != NULL:
            t.data = view_src.data + view_offs
    # like ggml, a new view has no buffer until it is initialised in one
    t.view_src = view_src
    t.view_offs = view_offs
    return t


cdef ggml_tensor * ggml_dup_tensor_layout(ggml_context * ctx, const ggml_tensor * src) except NULL:
    """A new tensor of src's type and shape with src's strides (ggml-backend.cpp)."""
    cdef ggml_tensor * t = ggml_new_tensor_impl(ctx, src.type, GGML_MAX_DIMS, src.ne, NULL, 0)
    memcpy(t.nb, src.nb, sizeof(t.nb))
    layout_changed(t)
    return t


cdef ggml_tensor * ggml_view_tensor(ggml_context * ctx, ggml_tensor * src) except NULL:
    """ggml_view_tensor: all of src, same strides, named '<src> (view)'; like
    ggml it keeps op NONE and no sources."""
    cdef ggml_tensor * t = ggml_new_tensor_impl(ctx, src.type, GGML_MAX_DIMS, src.ne, src, 0)
    ggml_join_name(t, src.name, b" (view)", b"", b"")
    memcpy(t.nb, src.nb, sizeof(t.nb))
    layout_changed(t)
    return t


# ---------------------------------------------------------------------------
# graph

cdef int ggml_graph_init(ggml_cgraph * g, int size) except -1:
    if size <= 0:
        raise ArgumentError(f"graph size must be positive, got {size}")
    g.size = size
    g.n_nodes = 0
    g.n_leafs = 0
    g.nodes = <ggml_tensor **>malloc(size * sizeof(ggml_tensor *))
    g.leafs = <ggml_tensor **>malloc(size * sizeof(ggml_tensor *))
    g.visited_hash_set.keys = NULL
    g.visited_hash_set.used = NULL
    g.use_counts = NULL
    if g.nodes == NULL or g.leafs == NULL:
        ggml_graph_free(g)
        raise AllocationError(f"cannot allocate a graph of size {size}")
    # the hash set holds nodes and leafs, hence twice the size (as ggml)
    try:
        ggml_hash_set_init(&g.visited_hash_set, <size_t>size * 2)
    except AllocationError:
        ggml_graph_free(g)
        raise AllocationError(f"cannot allocate a graph of size {size}") from None
    g.use_counts = <int32_t *>calloc(g.visited_hash_set.size, sizeof(int32_t))
    if g.use_counts == NULL:
        ggml_graph_free(g)
        raise AllocationError(f"cannot allocate a graph of size {size}")
    return 0


cdef int ggml_graph_check_order(ggml_cgraph * g) except -1:
    """Refuse a graph that breaks the order rules (_core.pxd): backends run nodes in
    order and would compute garbage. (The split checks the same rules in its passes.)"""
    cdef int i, j
    cdef ggml_tensor * node
    cdef ggml_tensor * src
    for i in range(g.n_nodes):
        g.nodes[i].order = i
    for i in range(g.n_leafs):
        if ggml_views_computed_node(g, g.leafs[i]):
            raise GraphError(leaf_view_message(g.leafs[i]))
    for i in range(g.n_nodes):
        node = g.nodes[i]
        if node.op == OP_NONE:
            continue
        for j in range(GGML_MAX_SRC):
            src = node.src[j]
            if src == NULL:
                continue
            if ggml_is_node_from(g, src, i):
                raise GraphError(order_message(node, i, src))
            if ggml_views_computed_node(g, src):
                raise GraphError(leaf_view_message(src))
        if node.view_src != NULL and ggml_is_computed_from(g, node.view_src, i):
            raise GraphError(order_message(node, i, node.view_src))
    return 0


cdef str order_message(const ggml_tensor * node, int i, const ggml_tensor * src):
    verb = "writes into" if src == node.view_src and not ggml_is_view_op(node.op) else "reads"
    return (f"graph is not in topological order: node {i} '{tensor_name(node)}' {verb} "
            f"'{tensor_name(src)}', which the graph computes at the same position or later")


cdef str leaf_view_message(const ggml_tensor * t):
    return (f"'{tensor_name(t)}' is not a node of the graph but a view of "
            f"'{tensor_name(t.view_src)}', which the graph computes: nothing orders them "
            f"(list the view as a node after what it views)")


cdef void ggml_graph_free(ggml_cgraph * g) noexcept nogil:
    free(g.nodes)
    free(g.leafs)
    free(g.use_counts)
    ggml_hash_set_free(&g.visited_hash_set)
    g.nodes = NULL
    g.leafs = NULL
    g.use_counts = NULL


cdef void ggml_graph_clear(ggml_cgraph * g) noexcept nogil:
    g.n_nodes = 0
    g.n_leafs = 0
    ggml_hash_set_reset(&g.visited_hash_set)


cdef size_t _graph_enter(ggml_cgraph * g, ggml_tensor * t, bint * is_new) except? GGML_HASHSET_FULL:
    """First half of ggml_visit_parents_graph: flags and the visited set."""
    if t.op != OP_NONE:
        t.flags |= GGML_TENSOR_FLAG_COMPUTE
    cdef size_t pos = ggml_hash_find(&g.visited_hash_set, t)
    if pos == GGML_HASHSET_FULL:
        raise GraphError(f"graph hash set is full ({g.visited_hash_set.size} slots) "
                         f"while adding tensor '{t.name.decode(errors='replace')}'")
    is_new[0] = not ggml_bitset_get(g.visited_hash_set.used, pos)
    if is_new[0]:
        g.visited_hash_set.keys[pos] = t
        ggml_bitset_set(g.visited_hash_set.used, pos)
        g.use_counts[pos] = 0
    return pos


cdef int _graph_append(ggml_cgraph * g, ggml_tensor * t) except -1:
    """Second half of ggml_visit_parents_graph: a leaf or a node, named if unnamed."""
    cdef bint is_leaf = t.op == OP_NONE and not (t.flags & GGML_TENSOR_FLAG_PARAM)
    cdef int n = g.n_leafs if is_leaf else g.n_nodes
    if n >= g.size:
        raise GraphError(f"graph is full: {g.size} {'leafs' if is_leaf else 'nodes'} "
                         f"(adding '{t.name.decode(errors='replace')}'); use a larger graph size")
    if t.name[0] == 0:
        snprintf(t.name, GGML_MAX_NAME, b"leaf_%d" if is_leaf else b"node_%d", n)
    if is_leaf:
        g.leafs[g.n_leafs] = t
        g.n_leafs += 1
    else:
        g.nodes[g.n_nodes] = t
        g.n_nodes += 1
    return 0


cdef int ggml_build_forward_expand(ggml_cgraph * g, ggml_tensor * root) except -1:
    """Port of ggml_build_forward_expand: depth-first over src[0..9], parents first.

    Iterative (an explicit stack) so that chains of 100k nodes do not overflow
    the C stack; the order is exactly that of ggml's recursion.
    """
    cdef int cap = 256, sp = 0
    cdef ggml_tensor ** stack = <ggml_tensor **>malloc(cap * sizeof(ggml_tensor *))
    cdef int * next_src = <int *>malloc(cap * sizeof(int))
    cdef ggml_tensor * t
    cdef ggml_tensor * src
    cdef bint is_new
    cdef size_t pos
    cdef void * tmp
    try:
        if stack == NULL or next_src == NULL:
            raise AllocationError("cannot allocate the graph visit stack")
        _graph_enter(g, root, &is_new)
        if not is_new:
            return 0
        stack[0] = root
        next_src[0] = 0
        sp = 1
        while sp > 0:
            t = stack[sp - 1]
            while next_src[sp - 1] < GGML_MAX_SRC and t.src[next_src[sp - 1]] == NULL:
                next_src[sp - 1] += 1
            if next_src[sp - 1] == GGML_MAX_SRC:
                _graph_append(g, t)
                sp -= 1
                continue
            src = t.src[next_src[sp - 1]]
            next_src[sp - 1] += 1
            pos = _graph_enter(g, src, &is_new)
            g.use_counts[pos] += 1
            if is_new:
                if sp == cap:
                    cap *= 2
                    safe_realloc(<void **>&stack, cap, sizeof(ggml_tensor *),
                                 "the graph visit stack")
                    safe_realloc(<void **>&next_src, cap, sizeof(int), "the graph visit stack")
                stack[sp] = src
                next_src[sp] = 0
                sp += 1
    finally:
        free(stack)
        free(next_src)
    return 0


# ---------------------------------------------------------------------------
# mutation epochs: what lets the scheduler reuse a plan without looking at the graph

cdef uint64_t _epoch = 0          # the last stamp handed out (any change)
cdef uint64_t _world_epoch = 0    # the last change outside tensors and graphs
cdef uint64_t _buffers_epoch = 0  # the last stamp of any buffer


cdef dict _layouts = {}           # (type, ne + nb + op_params bytes) -> layout id
_LAYOUTS_MAX = 1 << 16            # ids handed out at most (then 0: no id)


cdef inline tuple _layout_key(const ggml_tensor * t):
    return (t.type, (<const char *>&t.ne[0])[:LAYOUT_BYTES])


cdef int layout_changed(ggml_tensor * t) except -1:
    """Give t the id of its type, ne, nb and op_params: every write of those calls this.
    Ids are never reused, so equal ids are equal layouts (graph reuse compares a
    tensor's layout by its id); past _LAYOUTS_MAX distinct layouts a tensor gets 0
    (no id), which is compared field by field."""
    if (<ggml_context *>t.owner).no_layout_ids:
        t.layout = 0                        # compared field by field, if ever
        return 0
    key = _layout_key(t)
    cdef object id = _layouts.get(key)
    if id is None and len(_layouts) < _LAYOUTS_MAX:
        id = _layouts[key] = len(_layouts) + 1
    t.layout = 0 if id is None else id
    return 0


def layout_is_current(Tensor tensor not None):
    """Has the tensor a layout id, and is it that of its fields? (For tests.)"""
    cdef ggml_tensor * t = tensor.ptr
    return t.layout != 0 and _layouts.get(_layout_key(t)) == t.layout


cdef uint64_t mutation_epoch() noexcept nogil:
    return _epoch


cdef uint64_t world_epoch() noexcept nogil:
    return _world_epoch


cdef uint64_t buffers_epoch() noexcept nogil:
    return _buffers_epoch


cdef void tensor_changed(ggml_tensor * t) noexcept nogil:
    global _epoch
    _epoch += 1
    t.gen = _epoch


cdef uint64_t new_epoch() noexcept nogil:
    """A stamp for a batch of tensors changed together (each t.gen = it), as if each
    had called tensor_changed: a plan sees all of them changed or none."""
    global _epoch
    _epoch += 1
    return _epoch


cdef void buffer_changed(ggml_backend_buffer * b) noexcept nogil:
    global _epoch, _buffers_epoch
    _epoch += 1
    b.gen = _epoch
    _buffers_epoch = _epoch


cdef inline bint _changed_after(const ggml_tensor * t, uint64_t epoch) noexcept nogil:
    """Do t or the buffer it lives in carry a stamp above epoch?"""
    return t.gen > epoch or (t.buffer != NULL and t.buffer.gen > epoch)


cdef inline bint _stamped_after(const ggml_tensor * t, uint64_t epoch) noexcept nogil:
    """Do t, its view base or the buffer either lives in carry a stamp above epoch?"""
    return _changed_after(t, epoch) or (t.view_src != NULL and _changed_after(t.view_src, epoch))


cdef void world_changed() noexcept nogil:
    global _epoch, _world_epoch
    _epoch += 1
    _world_epoch = _epoch


cdef uint64_t graph_changed() noexcept nogil:
    global _epoch
    _epoch += 1
    return _epoch


cdef bint graph_unchanged_since(Graph g, uint64_t epoch) noexcept:
    """Is every stamp a plan of g made at `epoch` depends on still at most `epoch`?
    O(1) when nothing at all changed since; else one sweep over g's nodes and leafs,
    their view bases (a base outside the graph places its views) and buffers."""
    cdef int i
    cdef ggml_cgraph * cg = &g.graph
    if _epoch == epoch:
        return True
    if _world_epoch > epoch or g.generation > epoch:
        return False
    for i in range(cg.n_nodes):
        if _stamped_after(cg.nodes[i], epoch):
            return False
    for i in range(cg.n_leafs):
        if _stamped_after(cg.leafs[i], epoch):
            return False
    return True


cdef bint nodes_unchanged_since(ggml_tensor ** nodes, int n, uint64_t epoch) noexcept nogil:
    """Is every stamp an execution of nodes made at `epoch` depends on still at most
    `epoch`: each node's and each of its sources' own and their buffers' (the CPU
    executor's cplans: a view's data is written, and stamped, by its placement, so view
    bases do not matter here)? O(1) when nothing at all changed since; else one sweep."""
    cdef int i
    cdef uint16_t sources
    if _epoch == epoch:
        return True
    if _world_epoch > epoch:
        return False
    for i in range(n):
        if _changed_after(nodes[i], epoch):
            return False
        sources = nodes[i].src_mask
        while sources:
            if _changed_after(nodes[i].src[lowest_bit(sources)], epoch):
                return False
            sources &= sources - 1
    return True


def note_world_change():
    """Say that something outside tensors and graphs that plans depend on changed (the
    CPU kernel table): every plan and cplan made before is made again (world_changed)."""
    world_changed()


def mutation_epochs():
    """(epoch, world epoch): the process-wide mutation counters (tests, debugging)."""
    return _epoch, _world_epoch


# ---------------------------------------------------------------------------
# Python handles

cdef Tensor tensor_handle(ggml_tensor * t):
    if t == NULL:
        return None
    cdef Tensor h = Tensor.__new__(Tensor)
    h.ptr = t
    h.owner = <object>(<ggml_context *>t.owner).pyobj
    return h


cdef ggml_tensor * tensor_ptr(object t, what="tensor") except NULL:
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"{what} must be a ggml_py Tensor, got {type(t).__name__}")
    return (<Tensor>t).ptr


cdef str tensor_name(const ggml_tensor * t):
    return t.name.decode("utf-8", errors="replace")


def _dims(value, what):
    """A tuple of integers from a shape-like argument."""
    return tuple(int_arg(x, what, _INT64_MIN, _INT64_MAX) for x in items_arg(value, what))


def _shape_to_ne(shape):
    """numpy-order shape -> ggml ne (fastest dimension first)."""
    dims = _dims(shape, "shape")
    ne = list(reversed(dims))
    if not 1 <= len(ne) <= GGML_MAX_DIMS:
        raise ArgumentError(f"tensors have 1 to 4 dimensions, got shape {dims}")
    if any(x < 0 for x in ne):
        raise ArgumentError(f"negative dimension in shape {dims}")
    n = 1
    for x in ne:
        n *= x
    if n > MAX_ELEMENTS:
        # sizes are size_t in C: a product that wraps would place a huge tensor in a
        # tiny buffer
        raise ArgumentError(f"shape {dims} has {n} elements, more than {MAX_ELEMENTS}")
    return ne + [1] * (GGML_MAX_DIMS - len(ne))


def acc_region_end(Tensor tensor not None):
    """One past the last byte of its a that the ACC `tensor` adds its b to (0 for an
    empty b): ggml's CPU kernel asserts that it is within a (ggml_nbytes), and aborts."""
    if tensor.ptr.op != op_id("ACC") or tensor.ptr.src[1] == NULL:
        raise ArgumentError(f"acc_region_end: '{tensor.name}' is not an ACC with a b")
    return ggml_acc_region_end(tensor.ptr)


def check_extent(type, ne, nb, what="tensor"):
    """Refuse strides whose byte extent (ggml_nbytes) would not fit the C sizes: every
    size computed from it would wrap. Returns the extent."""
    cdef int t = type_id(type)
    ne, nb = _dims(ne, "ne"), _dims(nb, "nb")
    if len(ne) != 4 or len(nb) != 4:
        raise ArgumentError(f"{what}: ne and nb need 4 entries each, got {ne} and {nb}")
    if any(x <= 0 for x in ne):
        return 0
    blck = TYPE_TRAITS[t].blck_size
    if blck == 1:
        extent = TYPE_TRAITS[t].type_size + sum((ne[i] - 1) * nb[i] for i in range(4))
    else:
        extent = ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))
    if extent > MAX_BYTES:
        raise GraphError(f"{what}: ne {list(ne)} with strides nb {list(nb)} span {extent} "
                         f"bytes, more than {MAX_BYTES}")
    return extent


MAX_ELEMENTS = 1 << 56      # bytes stay far below 2**63 for every type
MAX_BYTES = GGML_PY_MAX_BYTES     # the largest tensor extent: sums of a few never wrap size_t
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


cdef class Context:
    """An arena of tensors (ggml's no_alloc context: metadata only).

    Tensors live as long as their context. Shapes passed to the builders are
    in numpy order (slowest dimension first); `Tensor.ne` gives ggml's order.
    """

    def __cinit__(self, str label=""):
        ggml_context_init(&self.ctx)
        self.ctx.pyobj = <void *>self
        self.label = label
        self._refs = {}

    def keep(self, obj):
        """Keep `obj` (a buffer its tensors point into) alive as long as this context."""
        self._refs[id(obj)] = obj

    def __dealloc__(self):
        ggml_context_free(&self.ctx)

    cdef Tensor wrap(self, ggml_tensor * t):
        return tensor_handle(t)

    def __len__(self):
        return self.ctx.n_tensors

    def __getitem__(self, i):
        return tensor_handle(ggml_context_tensor(
            &self.ctx, index_arg(i, "tensor index", self.ctx.n_tensors)))

    def __iter__(self):
        for i in range(self.ctx.n_tensors):
            yield tensor_handle(ggml_context_tensor(&self.ctx, i))

    def __repr__(self):
        return f"Context({self.label!r}, {self.ctx.n_tensors} tensors)"

    def new_tensor(self, type, shape=None, name=None, *, ne=None):
        """A new tensor of `type` ('f32', 'q8_0', ...). Its shape is given one of two
        ways, named for their order: `shape`, numpy order (outermost first, as the
        array it holds), or `ne`, ggml order (ne[0] innermost, as ops and ggml take it)."""
        if (shape is None) == (ne is None):
            raise ArgumentError("new_tensor takes `shape` (numpy order) or `ne=` (ggml order): "
                                "exactly one of them")
        if ne is not None:
            shape = list(reversed(items_arg(ne, "ne (ggml order)", None, GGML_MAX_DIMS)))
        return self.new_op("NONE", (), type, shape, name=name)

    def new_op(self, op, srcs, type, shape, *, params=(), name=None, view_of=None, view_offs=0,
               nb=None):
        """A tensor computed by `op` from `srcs` (the generic op builder).

        `view_of` makes it a view (sharing that tensor's memory at `view_offs`);
        `nb` overrides the contiguous strides (ggml order, bytes).
        Every argument is checked before the tensor is made.
        """
        cdef int oid = op_id(op)
        cdef int tid = type_id(type)
        cdef int i
        type = TYPE_NAMES[tid]
        cdef int64_t c_ne[4]
        cdef ggml_tensor * c_srcs[GGML_MAX_SRC]
        cdef int32_t c_params[GGML_MAX_OP_PARAMS]
        ne = _shape_to_ne(shape)
        if ne[0] % TYPE_TRAITS[tid].blck_size:
            raise ArgumentError(f"ne[0]={ne[0]} is not a multiple of the {type} block size "
                                f"{TYPE_TRAITS[tid].blck_size}")
        srcs = items_arg(srcs, "srcs", None, GGML_MAX_SRC)
        for i in range(GGML_MAX_SRC):
            c_srcs[i] = NULL
            if i < len(srcs) and srcs[i] is not None:
                c_srcs[i] = tensor_ptr(srcs[i], f"srcs[{i}]")
        params = items_arg(params, "params", None, GGML_MAX_OP_PARAMS)
        for i in range(GGML_MAX_OP_PARAMS):
            # int32 words; unsigned 32-bit values keep their bits (ggml stores them so)
            c_params[i] = <int32_t>int_arg(params[i], "op param", -(1 << 31), (1 << 32) - 1) \
                if i < len(params) else 0
        cdef ggml_tensor * vsrc = NULL if view_of is None else tensor_ptr(view_of, "view_of")
        cdef size_t offs = size_arg(view_offs, "view_offs")
        strides = None
        if nb is not None:
            strides = items_arg(nb, "nb", None, 4)
            if len(strides) != 4:
                raise ArgumentError(f"nb needs 4 strides, got {len(strides)}")
            strides = [size_arg(x, "nb") for x in strides]
            extent = check_extent(type, ne, strides, f"{op} tensor")
            if vsrc != NULL and extent and (
                    (vsrc.view_offs if vsrc.view_src != NULL else 0) + offs + extent
                    > ggml_nbytes(vsrc if vsrc.view_src == NULL else vsrc.view_src)):
                raise GraphError(f"{op} of '{tensor_name(vsrc)}' reaches past its data: "
                                 f"{extent} bytes at offset {offs}")
        bname = None if name is None else name_arg(name, "tensor name", True)
        for i in range(4):
            c_ne[i] = ne[i]
        cdef ggml_tensor * t = ggml_new_tensor_impl(&self.ctx, tid, 4, c_ne, vsrc, offs)
        t.op = oid
        memcpy(t.src, c_srcs, sizeof(c_srcs))
        t.src_mask = scan_sources(t)
        memcpy(t.op_params, c_params, sizeof(c_params))
        if strides is not None:
            for i in range(4):
                t.nb[i] = strides[i]
        layout_changed(t)
        if bname is not None:
            ggml_set_name(t, bname)
        # sources from other contexts stay alive as long as this one
        for x in list(srcs) + [view_of]:
            if x is not None and (<Tensor>x).owner is not self:
                self.keep((<Tensor>x).owner)
        return tensor_handle(t)

    # --- the view family (ggml.c): share memory, no data movement ---

    def view(self, Tensor a not None, shape, nb=None, offset=0, name=None):
        """ggml_view_Nd: a VIEW of `a` with numpy-order `shape`, ggml-order byte
        strides `nb` (contiguous when None) at byte `offset`."""
        cdef size_t offs = size_arg(offset, "view offset")
        t = self.new_op("VIEW", [a], type_name(a.ptr.type), shape, view_of=a, view_offs=offs,
                        nb=nb, params=[offs & 0xffffffff, offs >> 32])
        if name is None:
            t.name = f"{a.name} (view)"
        else:
            t.name = name
        return t

    def reshape(self, Tensor a not None, shape, name=None):
        """ggml_reshape: same data, new shape; `a` must be contiguous."""
        if not ggml_is_contiguous(a.ptr):
            raise GraphError(f"reshape of non-contiguous tensor '{a.name}'")
        ne = _shape_to_ne(shape)
        n = ne[0] * ne[1] * ne[2] * ne[3]
        if n != ggml_nelements(a.ptr):
            raise GraphError(f"reshape of '{a.name}' to {tuple(shape)}: {n} elements, "
                             f"tensor has {ggml_nelements(a.ptr)}")
        t = self.new_op("RESHAPE", [a], type_name(a.ptr.type), shape, view_of=a)
        t.name = f"{a.name} (reshaped)" if name is None else name
        return t

    def permute(self, Tensor a not None, axes, name=None):
        """ggml_permute(a, axis0..axis3): ggml axis i of `a` moves to axes[i]."""
        axes = list(_dims(axes, "permute axes"))
        axes += list(range(len(axes), 4))
        if sorted(axes) != [0, 1, 2, 3]:
            raise GraphError(f"permute of '{a.name}': {axes} is not a permutation of 0..3")
        ne = [0] * 4
        nb = [0] * 4
        for i in range(4):
            ne[axes[i]] = a.ptr.ne[i]
            nb[axes[i]] = a.ptr.nb[i]
        t = self.new_op("PERMUTE", [a], type_name(a.ptr.type), list(reversed(ne)), view_of=a,
                        nb=nb, params=axes[:4])
        t.name = f"{a.name} (permuted)" if name is None else name
        return t

    def transpose(self, Tensor a not None, name=None):
        """ggml_transpose: swap the first two ggml dimensions."""
        ne = [a.ptr.ne[1], a.ptr.ne[0], a.ptr.ne[2], a.ptr.ne[3]]
        nb = [a.ptr.nb[1], a.ptr.nb[0], a.ptr.nb[2], a.ptr.nb[3]]
        t = self.new_op("TRANSPOSE", [a], type_name(a.ptr.type), list(reversed(ne)),
                        view_of=a, nb=nb, params=[1, 0, 2, 3])
        t.name = f"{a.name} (transposed)" if name is None else name
        return t


cdef class Tensor:
    """A handle on a tensor struct; it keeps the owning context alive."""

    def __init__(self):
        raise ArgumentTypeError("tensors are made by a Context (new_tensor, new_op, view, ...)")

    def __eq__(self, other):
        return isinstance(other, Tensor) and (<Tensor>other).ptr == self.ptr

    def __hash__(self):
        return hash(<size_t>self.ptr)

    @property
    def id(self):
        """Index of the tensor in its context."""
        return self.ptr.id

    @property
    def context(self):
        """The Context that owns the tensor (kept alive by the tensor)."""
        return self.owner

    @property
    def name(self):
        """The tensor's name (at most 63 bytes of UTF-8; settable)."""
        return self.ptr.name.decode("utf-8", errors="replace")

    @name.setter
    def name(self, value):
        ggml_set_name(self.ptr, name_arg(value, "tensor name", True))
        tensor_changed(self.ptr)        # the names of a plan's copies come from it

    @property
    def type(self):
        """The element type's name: 'f32', 'f16', 'q8_0', ..."""
        return TYPE_NAMES[self.ptr.type]

    @property
    def op(self):
        """The op's name, ggml's GGML_OP_ without the prefix ('NONE' for a leaf;
        settable)."""
        return OP_NAMES_LIST[self.ptr.op]

    @op.setter
    def op(self, name):
        self.ptr.op = op_id(name)
        tensor_changed(self.ptr)

    @property
    def ne(self):
        """Elements per dimension in ggml order (ne[0] is the fastest)."""
        return (self.ptr.ne[0], self.ptr.ne[1], self.ptr.ne[2], self.ptr.ne[3])

    @ne.setter
    def ne(self, value):
        dims = _dims(value, "ne")
        if len(dims) != 4:
            raise ArgumentError(f"ne needs 4 dimensions, got {dims}")
        ne = _shape_to_ne(tuple(reversed(dims)))
        check_extent(self.type, ne, self.nb, f"tensor '{self.name}'")
        for i in range(4):
            self.ptr.ne[i] = ne[i]
        layout_changed(self.ptr)
        tensor_changed(self.ptr)

    @property
    def nb(self):
        """Byte strides in ggml order."""
        return (self.ptr.nb[0], self.ptr.nb[1], self.ptr.nb[2], self.ptr.nb[3])

    @nb.setter
    def nb(self, value):
        nb = items_arg(value, "nb", None, 4)
        if len(nb) != 4:
            raise ArgumentError(f"nb needs 4 strides, got {len(nb)}")
        nb = [size_arg(x, "nb") for x in nb]
        check_extent(self.type, self.ne, nb, f"tensor '{self.name}'")
        for i in range(4):
            self.ptr.nb[i] = nb[i]
        layout_changed(self.ptr)
        tensor_changed(self.ptr)

    @property
    def shape(self):
        """numpy-order shape: reversed ne, trailing ggml dimensions of 1 dropped."""
        n = 4
        while n > 1 and self.ptr.ne[n - 1] == 1:
            n -= 1
        return tuple(self.ptr.ne[i] for i in reversed(range(n)))

    @property
    def nbytes(self):
        """Bytes the tensor spans in memory (ggml_nbytes: its strides included)."""
        return ggml_nbytes(self.ptr)

    @property
    def nelements(self):
        """The number of elements (the product of ne)."""
        return ggml_nelements(self.ptr)

    @property
    def is_contiguous(self):
        """Whether every element is packed in ne order, without gaps."""
        return ggml_is_contiguous(self.ptr)

    @property
    def is_view(self):
        """Whether the tensor is a view of another one's memory (view_src is set)."""
        return self.ptr.view_src != NULL

    @property
    def src(self):
        """Sources, trailing empty slots cut (an empty slot inside is None). Read as the
        scheduler reads them: the slots the source mask names."""
        cdef int i, n = 0
        cdef uint32_t m = source_mask(self.ptr)       # (GGML_MAX_SRC bits at most)
        while m >> n:
            n += 1
        return [tensor_handle(self.ptr.src[i]) if m >> i & 1 else None for i in range(n)]

    def set_src(self, i, src):
        """Set source slot i (0..9) to src (a Tensor, or None to empty it)."""
        cdef Py_ssize_t k = index_arg(i, "src index", GGML_MAX_SRC)
        tensor_set_src(self.ptr, k, NULL if src is None else tensor_ptr(src, "src"))
        tensor_changed(self.ptr)
        if src is not None and (<Tensor>src).owner is not self.owner:
            self.owner.keep((<Tensor>src).owner)

    @property
    def view_src(self):
        """The tensor whose memory this view shares (None: not a view)."""
        return tensor_handle(self.ptr.view_src)

    @property
    def view_offs(self):
        """Byte offset of this view in view_src's memory."""
        return self.ptr.view_offs

    def set_view_src(self, view_src, view_offs=0):
        """Set view_src and view_offs as given: no collapse to the base, no
        extent check, data untouched. For loaders that wire tensors after
        creating them (a case file may name a later tensor)."""
        cdef size_t offs = size_arg(view_offs, "view_offs")
        self.ptr.view_src = NULL if view_src is None else tensor_ptr(view_src, "view_src")
        self.ptr.view_offs = offs
        tensor_changed(self.ptr)
        if view_src is not None and (<Tensor>view_src).owner is not self.owner:
            self.owner.keep((<Tensor>view_src).owner)

    @property
    def op_params(self):
        """The op's 16 int32 parameter words, as ggml stores them (floats bit-wise)."""
        return [self.ptr.op_params[i] for i in range(GGML_MAX_OP_PARAMS)]

    def set_op_params(self, params):
        """Set the op's parameter words (at most 16 int32; the rest become 0)."""
        params = [<int32_t>int_arg(p, "op param", -(1 << 31), (1 << 32) - 1)
                  for p in items_arg(params, "op_params", None, GGML_MAX_OP_PARAMS)]
        for i in range(GGML_MAX_OP_PARAMS):
            self.ptr.op_params[i] = params[i] if i < len(params) else 0
        layout_changed(self.ptr)
        tensor_changed(self.ptr)

    @property
    def flags(self):
        """Names of the set flags (INPUT, OUTPUT, PARAM, LOSS, COMPUTE)."""
        return [n for n, bit in FLAG_NAMES.items() if self.ptr.flags & bit]

    @flags.setter
    def flags(self, names):
        cdef int f = 0
        for n in items_arg(names, "flags", None, len(FLAG_NAMES) * 2):
            if not isinstance(n, str) or n not in FLAG_NAMES:
                raise UnknownNameError(f"unknown tensor flag {n!r}; known: {', '.join(FLAG_NAMES)}")
            f |= FLAG_NAMES[n]
        self.ptr.flags = f
        tensor_changed(self.ptr)

    def set_input(self):
        """Flag the tensor INPUT (ggml_set_input: the scheduler places it on the CPU
        backend and copies it to where it is read); returns the tensor."""
        self.ptr.flags |= GGML_TENSOR_FLAG_INPUT
        tensor_changed(self.ptr)
        return self

    def set_output(self):
        """Flag the tensor OUTPUT (ggml_set_output: the graph allocator never gives its
        memory to another tensor); returns the tensor."""
        self.ptr.flags |= GGML_TENSOR_FLAG_OUTPUT
        tensor_changed(self.ptr)
        return self

    def set_param(self):
        """Flag the tensor PARAM (ggml_set_param: a trainable parameter); returns the
        tensor."""
        self.ptr.flags |= GGML_TENSOR_FLAG_PARAM
        tensor_changed(self.ptr)
        return self

    @property
    def generation(self):
        """Mutation epoch of the tensor's last change through the API (at first, its
        creation's). See Scheduler's graph reuse."""
        return self.ptr.gen

    @property
    def data_address(self):
        """Address of the tensor's data (0 when not allocated)."""
        return <size_t>self.ptr.data

    def numpy(self, dtype=None, *, copy=True):
        """The tensor's values as a numpy array of its numpy-order shape, read wherever it
        lives (host memory or a device's; ggml_py.arrays.read): float32, float16, float64
        or the integer type as stored, float32 for bf16 and the block types (ggml's
        to_float). `dtype` converts them; `copy=False` gives a read-only view where the
        memory is the host's and no conversion is needed (else a copy)."""
        from ggml_py.arrays import read
        return read(self, dtype, copy)

    def write(self, array):
        """Store a numpy array (or anything np.asarray takes) as the tensor's values,
        wherever it lives (ggml_py.arrays.write): its shape must be the tensor's (numpy
        order), its values are converted to the tensor's type through ggml's rounding
        (f32 -> f16, bf16, block types); an array that cannot be converted exactly in
        kind (floats into an integer tensor, integers past its range) is an error naming
        the tensor, both shapes and the dtype. Returns the tensor."""
        from ggml_py.arrays import write
        write(self, array)
        return self

    def __repr__(self):
        shape = "x".join(str(x) for x in self.shape)
        return f"<Tensor '{self.name}' {self.op} {self.type}[{shape}]>"


cdef class Graph:
    """A compute graph: `nodes` (computed tensors) and `leafs` (constants,
    inputs, weights), in ggml's order."""

    def __cinit__(self, size=2048, Context context=None):
        ggml_graph_init(&self.graph, int_arg(size, "graph size", 1, _INT32_MAX))
        self.context = context
        self._owners = set()
        self.generation = graph_changed()

    def __dealloc__(self):
        ggml_graph_free(&self.graph)

    def _keep(self, Tensor t not None):
        self._owners.add(t.owner)

    def keep_alive(self, obj):
        """Make every context whose tensors are in this graph keep `obj` alive (memory
        the caller pointed them into by hand; the graph allocator needs none of this:
        it takes its placements back before its buffers go)."""
        for ctx in self._owners:
            ctx.keep(obj)
        if self.context is not None:
            self.context.keep(obj)

    def build_forward_expand(self, Tensor t not None):
        """Add t and every tensor it depends on, parents first (ggml's order)."""
        self._keep(t)
        self.generation = graph_changed()
        ggml_build_forward_expand(&self.graph, t.ptr)
        return self

    @classmethod
    def from_lists(cls, nodes, leafs, size=0, Context context=None,
                   bint allow_duplicates=False):
        """A graph with exactly these nodes and leafs, in this order.

        `allow_duplicates` admits a tensor listed more than once, as in the
        scheduler's graph copy (with parallel copies, an input's copy 0 is the
        original leaf, listed again among the leafs)."""
        nodes = items_arg(nodes, "nodes", None, _INT32_MAX)
        leafs = items_arg(leafs, "leafs", None, _INT32_MAX)
        for what, lst in (("nodes", nodes), ("leafs", leafs)):
            for k, x in enumerate(lst):
                tensor_ptr(x, f"{what}[{k}]")
        size = int_arg(size, "graph size", 0, _INT32_MAX) or max(len(nodes), len(leafs), 1)
        if len(nodes) > size or len(leafs) > size:
            raise GraphError(f"graph size {size} is smaller than its {len(nodes)} nodes / "
                             f"{len(leafs)} leafs")
        cdef Graph g = cls(size, context)
        cdef Tensor t
        cdef size_t pos
        cdef int j
        for kind, lst in (("node", nodes), ("leaf", leafs)):
            for t in lst:
                g._keep(t)
                pos = ggml_hash_insert(&g.graph.visited_hash_set, t.ptr)
                if pos == GGML_HASHSET_ALREADY_EXISTS:
                    if not allow_duplicates:
                        raise GraphError(f"tensor '{t.name}' is listed twice in the graph")
                else:
                    g.graph.use_counts[pos] = 0
                if kind == "node":
                    g.graph.nodes[g.graph.n_nodes] = t.ptr
                    g.graph.n_nodes += 1
                else:
                    g.graph.leafs[g.graph.n_leafs] = t.ptr
                    g.graph.n_leafs += 1
        for i in range(g.graph.n_nodes):
            for j in range(GGML_MAX_SRC):
                if g.graph.nodes[i].src[j] != NULL:
                    pos = ggml_hash_find(&g.graph.visited_hash_set, g.graph.nodes[i].src[j])
                    if pos != GGML_HASHSET_FULL and ggml_bitset_get(g.graph.visited_hash_set.used, pos):
                        g.graph.use_counts[pos] += 1
        return g

    @property
    def size(self):
        """The most nodes (and leafs) the graph can hold."""
        return self.graph.size

    def hash_stats(self):
        """Slots read per lookup of the graph's visited set (ggml sizes it at twice the
        graph's size), counted from where its keys lie: `hit_probes_mean`/`_max` for
        the tensors in it, `miss_probes_mean` for one not in it, and the same means for
        a uniformly random hash at this `load` (`ideal_hit_probes`,
        `ideal_miss_probes`)."""
        return hash_probe_stats(&self.graph.visited_hash_set)

    @property
    def n_nodes(self):
        """The number of nodes (computed tensors)."""
        return self.graph.n_nodes

    @property
    def n_leafs(self):
        """The number of leafs (constants, inputs, weights)."""
        return self.graph.n_leafs

    def __len__(self):
        return self.graph.n_nodes

    @property
    def nodes(self):
        """The nodes, in order (a new list of handles)."""
        return [tensor_handle(self.graph.nodes[i]) for i in range(self.graph.n_nodes)]

    @property
    def leafs(self):
        """The leafs, in order (a new list of handles)."""
        return [tensor_handle(self.graph.leafs[i]) for i in range(self.graph.n_leafs)]

    def node(self, i):
        """Node i (a negative i counts from the end)."""
        return tensor_handle(self.graph.nodes[index_arg(i, "node", self.graph.n_nodes)])

    def check_order(self):
        """Raise GraphError unless every node comes after the sources it reads (and
        after the view bases of those sources): backends run nodes in order."""
        ggml_graph_check_order(&self.graph)
        return self

    def use_count(self, Tensor t not None):
        """How many node sources name t (0 if t is not in the graph)."""
        cdef size_t pos = ggml_hash_find(&self.graph.visited_hash_set, t.ptr)
        if pos == GGML_HASHSET_FULL or not ggml_bitset_get(self.graph.visited_hash_set.used, pos):
            return 0
        return self.graph.use_counts[pos]

    def __contains__(self, Tensor t not None):
        return ggml_hash_contains(&self.graph.visited_hash_set, t.ptr)

    def __repr__(self):
        return f"Graph({self.graph.n_nodes} nodes, {self.graph.n_leafs} leafs, size {self.graph.size})"
