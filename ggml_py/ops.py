"""Op builders of ggml 0.10.1: shapes, types, sources and op_params as ggml.c sets them.

Every builder takes the Context first and returns the new Tensor, named like
ggml's function without the ``ggml_`` prefix (``mul_mat(ctx, a, b)``,
``rope_ext(ctx, a, pos, freq_factors, n_dims, mode, ...)``). Shapes are ggml's
``ne`` order throughout this module (dim 0 fastest), as ``Context.new_tensor(type,
ne=...)``; ``Context.new_tensor(type, shape)`` takes numpy order. op_params are the 16 int32
words ggml stores; float parameters are stored bit-wise as float32 (like
``ggml_set_op_params_f32``). Where ggml would assert, a GraphError names the op
and the tensor instead.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Protocol, Sequence, TypeVar

import numpy as np

from ggml_py._core import (EMPTY_OPS, GLU_OP_NAMES, PRECS as _PRECS, ROPE_TYPES as _ROPE_TYPES,
                           UNARY_OP_NAMES, VIEW_OPS, Context, Tensor, blck_size, int_arg,
                           type_size)
from ggml_py.errors import ArgumentTypeError, GraphError
# the shared numerics, under their old names here too (ops.f32_bits, ops.powf, ...)
from ggml_py.numerics import (alibi_bases as alibi_bases, bits_f32 as bits_f32,
                              f32_bits as f32_bits, powf as powf,
                              rope_theta_scale as rope_theta_scale,
                              rope_yarn_corr_dims as rope_yarn_corr_dims)

if TYPE_CHECKING:
    from ggml_py._core import TypeSpec

# ---------------------------------------------------------------------------
# argument checks: every public function here says which of its arguments are the
# Context and tensors (by its annotations, checked once at the module boundary), so a
# wrong argument is an ArgumentTypeError naming it and not an AttributeError from deep
# inside a builder. @_builder also lists the function for builder() (op case files).

_F = TypeVar("_F", bound=Callable[..., Any])
_CHECKED_TYPES = {"Context": (Context, False), "Tensor": (Tensor, False),
                  "Tensor | None": (Tensor, True)}
_BUILDERS: dict[str, Callable[..., Tensor]] = {}


def _checked(fn: _F) -> _F:
    """fn with its Context, Tensor and Tensor | None arguments checked on every call."""
    checks = [(i, p.name) + _CHECKED_TYPES[p.annotation]
              for i, p in enumerate(inspect.signature(fn).parameters.values())
              if p.annotation in _CHECKED_TYPES]

    @functools.wraps(fn)
    def checked(*args: object, **kwargs: object) -> Any:
        for i, name, cls, optional in checks:
            value = args[i] if i < len(args) else kwargs.get(name, None if optional else cls)
            if not isinstance(value, cls) and not (optional and value is None) \
                    and value is not cls:       # (a missing argument: Python's TypeError)
                raise ArgumentTypeError(f"{fn.__name__}: {name} must be a {cls.__name__}"
                                        f"{' or None' if optional else ''}, got "
                                        f"{type(value).__name__}")
        return fn(*args, **kwargs)
    return checked  # type: ignore[return-value]


def _builder(fn: _F) -> _F:
    """An op builder: checked, and found by builder() under its name."""
    checked = _checked(fn)
    _BUILDERS[fn.__name__] = checked
    return checked


def builder(call: str) -> Callable[..., Tensor]:
    """The builder for a ggml C function name ('ggml_mul_mat' -> mul_mat)."""
    if not isinstance(call, str):
        raise ArgumentTypeError(f"an op builder is named by a string, got {type(call).__name__}")
    f = _BUILDERS.get(call[5:] if call.startswith("ggml_") else call)
    if f is None:
        raise GraphError(f"no op builder for {call!r}")
    return f


# ---------------------------------------------------------------------------
# enums (ggml.h)

UNARY_OPS = UNARY_OP_NAMES          # (listed once, in ggml-py-vocab.h)
GLU_OPS = GLU_OP_NAMES
SORT_ORDERS = ("ASC", "DESC")
ROPE_TYPES = _ROPE_TYPES
PRECS = _PRECS
UNARY_OP_IDS = {n: i for i, n in enumerate(UNARY_OPS)}
GLU_OP_IDS = {n: i for i, n in enumerate(GLU_OPS)}


def _enum(value: str | int, table: Sequence[str] | dict[str, int], prefix: str,
          what: str) -> int:
    """An enum given as int, 'NAME' or 'GGML_<prefix>_NAME' -> its int value."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        name = value.upper()
        if name.startswith(prefix):
            name = name[len(prefix):]
        if isinstance(table, dict):
            if name in table:
                return table[name]
        elif name in table:
            return table.index(name)
    raise GraphError(f"{what}: unknown value {value!r}")


def unary_op_id(op: str | int) -> int:
    """A unary op ('SILU', 'GGML_UNARY_OP_SILU' or its int) as its ggml enum value."""
    return _enum(op, UNARY_OPS, "GGML_UNARY_OP_", "unary op")


def glu_op_id(op: str | int) -> int:
    """A GLU op ('SWIGLU', 'GGML_GLU_OP_SWIGLU' or its int) as its ggml enum value."""
    return _enum(op, GLU_OPS, "GGML_GLU_OP_", "glu op")


def sort_order_id(order: str | int) -> int:
    """A sort order ('ASC', 'DESC', 'GGML_SORT_ORDER_DESC' or its int) as its ggml enum value."""
    return _enum(order, SORT_ORDERS, "GGML_SORT_ORDER_", "sort order")


def rope_mode_id(mode: str | int) -> int:
    """A rope mode ('NORMAL', 'NEOX', 'MROPE', 'IMROPE', 'VISION', 'GGML_ROPE_TYPE_NEOX' or its int)
    as its ggml value."""
    return _enum(mode, ROPE_TYPES, "GGML_ROPE_TYPE_", "rope mode")


def _i32(x: int) -> int:
    """A C int32 cast of an integer (size_t params are stored truncated, as ggml does)."""
    x = int(x) & 0xFFFFFFFF
    return x - (1 << 32) if x >= (1 << 31) else x


# ---------------------------------------------------------------------------
# tensor facts (ggml.c predicates)

def _name(t: Tensor) -> str:
    return repr(t.name) if t.name else f"#{t.id}"


def _shape(t: Tensor) -> str:
    """A tensor's shape as errors give it: numpy order, as the user wrote it."""
    return f"shape {t.shape}"


_CONT = "; ops.cont(ctx, t) makes a contiguous copy of it"


def _fail(op: str, t: Tensor, msg: str) -> NoReturn:
    """GraphError naming the op and the tensor, its shape in numpy order and (for the
    rules that speak of ggml's dims, ne[0] the innermost) its ggml ne."""
    raise GraphError(f"{op}: tensor {_name(t)} ({t.type}, {_shape(t)}; ggml ne {list(t.ne)}): "
                     f"{msg}")


@_checked
def is_contiguous_n(t: Tensor, n: int) -> bool:
    """ggml_is_contiguous_n: rows packed, and dims above n packed on the ones below (dims 1..n may
    have gaps)."""
    ne, nb = t.ne, t.nb
    bs = blck_size(t.type)
    next_nb = type_size(t.type)
    if ne[0] != bs and nb[0] != next_nb:
        return False
    next_nb *= ne[0] // bs
    for i in range(1, 4):
        if ne[i] != 1:
            if i > n:
                if nb[i] != next_nb:
                    return False
                next_nb *= ne[i]
            else:
                next_nb = ne[i] * nb[i]
    return True


@_checked
def is_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: every element packed, in ne order, without gaps."""
    return is_contiguous_n(t, 0)


@_checked
def is_contiguous_1(t: Tensor) -> bool:
    """ggml_is_contiguous_1: rows packed, dims 2 and 3 packed on dim 1 (rows may be padded)."""
    return is_contiguous_n(t, 1)


@_checked
def is_contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: the elements of each row (dim 0) are packed."""
    return t.ne[0] == blck_size(t.type) or t.nb[0] == type_size(t.type)


@_checked
def is_transposed(t: Tensor) -> bool:
    """ggml_is_transposed: dim 0's stride is larger than dim 1's."""
    return t.nb[0] > t.nb[1]


@_checked
def is_empty(t: Tensor) -> bool:
    """ggml_is_empty: some dimension is 0."""
    return any(x == 0 for x in t.ne)


@_checked
def nelements(t: Tensor) -> int:
    """ggml_nelements: the number of elements."""
    n = 1
    for x in t.ne:
        n *= x
    return n


@_checked
def can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat: t0 can be tiled to t1's shape."""
    return is_empty(t0) or all(t0.ne[i] and t1.ne[i] % t0.ne[i] == 0 for i in range(4))


@_checked
def are_same_shape(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_shape: equal ne in all four dims."""
    return tuple(a.ne) == tuple(b.ne)


@_checked
def is_vector(t: Tensor) -> bool:
    """ggml_is_vector: dims 1 to 3 are all 1."""
    return t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


# ---------------------------------------------------------------------------
# constructors

def _ne4(ne: Sequence[int]) -> list[int]:
    ne = [int(x) for x in ne]
    if len(ne) > 4:
        raise GraphError(f"at most 4 dimensions, got {ne}")
    return ne + [1] * (4 - len(ne))


def _new(ctx: Context, op: str, srcs: Sequence[Tensor | None], type: TypeSpec, ne: Sequence[int],
         params: Sequence[int] = (), view_of: Tensor | None = None, view_offs: int = 0,
         nb: Sequence[int] | None = None, name: str | None = None) -> Tensor:
    ne = _ne4(ne)
    if any(x < 0 for x in ne):
        raise GraphError(f"{op}: negative dimension in {ne}")
    return ctx.new_op(op, srcs, type, list(reversed(ne)), params=list(params), view_of=view_of,
                      view_offs=view_offs, nb=nb, name=name)


@_builder
def new_tensor(ctx: Context, type: TypeSpec, ne: Sequence[int], name: str | None = None) -> Tensor:
    """ggml_new_tensor: a tensor of `type` with ggml-order shape `ne`."""
    return ctx.new_tensor(type, ne=_ne4(ne), name=name)


@_builder
def new_tensor_1d(ctx: Context, type: TypeSpec, ne0: int, name: str | None = None) -> Tensor:
    """ggml_new_tensor_1d: a new tensor of `type` with ne0 elements."""
    return new_tensor(ctx, type, [ne0], name)


@_builder
def new_tensor_2d(ctx: Context, type: TypeSpec, ne0: int, ne1: int,
                  name: str | None = None) -> Tensor:
    """ggml_new_tensor_2d: a new tensor of `type`, shape [ne0, ne1] (ggml order)."""
    return new_tensor(ctx, type, [ne0, ne1], name)


@_builder
def new_tensor_3d(ctx: Context, type: TypeSpec, ne0: int, ne1: int, ne2: int,
                  name: str | None = None) -> Tensor:
    """ggml_new_tensor_3d: a new tensor of `type`, shape [ne0, ne1, ne2] (ggml order)."""
    return new_tensor(ctx, type, [ne0, ne1, ne2], name)


@_builder
def new_tensor_4d(ctx: Context, type: TypeSpec, ne0: int, ne1: int, ne2: int, ne3: int,
                  name: str | None = None) -> Tensor:
    """ggml_new_tensor_4d: a new tensor of `type`, shape [ne0, ne1, ne2, ne3] (ggml order)."""
    return new_tensor(ctx, type, [ne0, ne1, ne2, ne3], name)


def _dup_tensor(ctx: Context, op: str, a: Tensor, srcs: Sequence[Tensor | None],
                params: Sequence[int] = (), type: str | None = None,
                name: str | None = None) -> Tensor:
    """ggml_dup_tensor + op: a new contiguous tensor of a's shape."""
    return _new(ctx, op, srcs, type or a.type, a.ne, params, name=name)


def _view_tensor(ctx: Context, op: str, a: Tensor, srcs: Sequence[Tensor | None],
                 params: Sequence[int] = (), name: str | None = None) -> Tensor:
    """ggml_view_tensor + op: all of a, same strides, sharing a's memory."""
    return _new(ctx, op, srcs, a.type, a.ne, params, view_of=a, view_offs=0, nb=list(a.nb),
                name=name)


def _un(ctx: Context, op: str, a: Tensor, params: Sequence[int] = (),
        inplace: bool = False) -> Tensor:
    if inplace:
        return _view_tensor(ctx, op, a, [a], params)
    return _dup_tensor(ctx, op, a, [a], params)


# ---------------------------------------------------------------------------
# views (no data movement)

@_builder
def view_tensor(ctx: Context, a: Tensor) -> Tensor:
    """ggml_view_tensor: op NONE, same shape and strides, named '<a> (view)'."""
    t = _new(ctx, "NONE", [], a.type, a.ne, view_of=a, nb=list(a.nb))
    t.name = f"{a.name} (view)"[:63]
    return t


def _view_impl(ctx: Context, a: Tensor, ne: Sequence[int], nb: Sequence[int],
               offset: int) -> Tensor:
    ne = _ne4(ne)
    return ctx.view(a, list(reversed(ne)), nb=list(nb), offset=int(offset))


@_builder
def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    """ggml_view_1d: ne0 elements of a from byte `offset`, sharing a's memory."""
    es = type_size(a.type)
    n1 = ne0 // blck_size(a.type) * es
    return _view_impl(ctx, a, [ne0], [es, n1, n1, n1], offset)


@_builder
def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    """ggml_view_2d: an [ne0, ne1] view of a from byte `offset`, rows nb1 bytes apart."""
    es = type_size(a.type)
    return _view_impl(ctx, a, [ne0, ne1], [es, nb1, nb1 * ne1, nb1 * ne1], offset)


@_builder
def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int = 0) -> Tensor:
    """ggml_view_3d: an [ne0, ne1, ne2] view of a from byte `offset`, strides nb1 and nb2 (bytes).
    ggml_view_3d: an [ne0, ne1, ne2] view of a from byte `offset`, strides nb1 and nb2 (bytes)."""
    es = type_size(a.type)
    return _view_impl(ctx, a, [ne0, ne1, ne2], [es, nb1, nb2, nb2 * ne2], offset)


@_builder
def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int,
            nb3: int, offset: int = 0) -> Tensor:
    """ggml_view_4d: an [ne0, ne1, ne2, ne3] view of a from byte `offset`, strides nb1, nb2, nb3
    (bytes)."""
    es = type_size(a.type)
    return _view_impl(ctx, a, [ne0, ne1, ne2, ne3], [es, nb1, nb2, nb3], offset)


@_builder
def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_reshape: a's data with b's shape."""
    if nelements(a) != nelements(b):
        _fail("RESHAPE", a, f"has {nelements(a)} elements, target {_shape(b)} has "
              f"{nelements(b)}")
    return reshape_4d(ctx, a, *b.ne)


def _reshape(ctx: Context, a: Tensor, ne: Sequence[int]) -> Tensor:
    if not is_contiguous(a):
        _fail("RESHAPE", a, "is not contiguous" + _CONT)
    ne = _ne4(ne)
    if math.prod(ne) != nelements(a):
        _fail("RESHAPE", a, f"{nelements(a)} elements cannot take shape "
              f"{tuple(reversed(ne))} (ggml ne {ne})")
    return ctx.reshape(a, list(reversed(ne)))


@_builder
def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_reshape_1d: contiguous a's elements as one row of ne0 (a view)."""
    return _reshape(ctx, a, [ne0])


@_builder
def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_reshape_2d: contiguous a's elements with shape [ne0, ne1] (a view)."""
    return _reshape(ctx, a, [ne0, ne1])


@_builder
def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_reshape_3d: contiguous a's elements with shape [ne0, ne1, ne2] (a view)."""
    return _reshape(ctx, a, [ne0, ne1, ne2])


@_builder
def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_reshape_4d: contiguous a's elements with shape [ne0, ne1, ne2, ne3] (a view)."""
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3])


@_builder
def permute(ctx: Context, a: Tensor, axis0: int = 0, axis1: int = 1, axis2: int = 2,
            axis3: int = 3) -> Tensor:
    """ggml_permute: source dim i goes to position axis_i."""
    axes = [axis0, axis1, axis2, axis3]
    if sorted(axes) != [0, 1, 2, 3]:
        _fail("PERMUTE", a, f"axes {axes} are not a permutation of 0..3")
    return ctx.permute(a, axes)


@_builder
def transpose(ctx: Context, a: Tensor) -> Tensor:
    """ggml_transpose: a with dims 0 and 1 swapped (a view: permute(a, 1, 0, 2, 3))."""
    return ctx.transpose(a)


# ---------------------------------------------------------------------------
# copies

@_builder
def dup(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup: a contiguous copy of a (op DUP)."""
    return _un(ctx, "DUP", a)


@_builder
def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup_inplace: DUP as a view of a."""
    return _un(ctx, "DUP", a, inplace=True)


@_builder
def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy: copy a's elements (logical order) into b; returns a view of b."""
    if nelements(a) != nelements(b):
        _fail("CPY", a, f"has {nelements(a)} elements, destination {_name(b)} has {nelements(b)}")
    t = _view_tensor(ctx, "CPY", b, [a, b])
    nm = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    t.name = nm.encode()[:63].decode(errors="ignore")
    return t


@_builder
def cast(ctx: Context, a: Tensor, type: TypeSpec) -> Tensor:
    """ggml_cast: a's elements converted to `type` in a new tensor (op CPY, its own destination)."""
    t = _new(ctx, "CPY", [a], type, a.ne)
    t.set_src(1, t)
    t.name = f"{a.name} (copy)".encode()[:63].decode(errors="ignore")
    return t


@_builder
def cont(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cont: a contiguous copy of a (of a view, a permutation or a transpose)."""
    t = _dup_tensor(ctx, "CONT", a, [a])
    t.name = f"{a.name} (cont)".encode()[:63].decode(errors="ignore")
    return t


@_builder
def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_cont_4d: a's elements, in order, copied into a contiguous [ne0, ne1, ne2, ne3] tensor.
    ggml_cont_4d: a's elements, in order, copied into a contiguous [ne0, ne1, ne2, ne3] tensor."""
    if ne0 * ne1 * ne2 * ne3 != nelements(a):
        _fail("CONT", a, f"{nelements(a)} elements cannot take shape {[ne0, ne1, ne2, ne3]}")
    t = _new(ctx, "CONT", [a], a.type, [ne0, ne1, ne2, ne3])
    t.name = f"{a.name} (cont)".encode()[:63].decode(errors="ignore")
    return t


@_builder
def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_cont_1d: a's elements, in order, copied into a contiguous row of ne0."""
    return cont_4d(ctx, a, ne0, 1, 1, 1)


@_builder
def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_cont_2d: a's elements, in order, copied into a contiguous [ne0, ne1] tensor."""
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


@_builder
def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_cont_3d: a's elements, in order, copied into a contiguous [ne0, ne1, ne2] tensor."""
    return cont_4d(ctx, a, ne0, ne1, ne2, 1)


# ---------------------------------------------------------------------------
# element-wise binary

def _binary(ctx: Context, op: str, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    if not can_repeat(b, a):
        _fail(op, b, f"cannot be broadcast to {_name(a)} ({_shape(a)}): each of its "
              f"dimensions must divide a's")
    if inplace:
        return _view_tensor(ctx, op, a, [a, b])
    return _dup_tensor(ctx, op, a, [a, b])


@_builder
def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add: a + b element-wise, b repeated to a's shape; the result has a's shape and type."""
    return _binary(ctx, "ADD", a, b)


@_builder
def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add_inplace: a + b (b repeated to a's shape), written into a: a view of a."""
    return _binary(ctx, "ADD", a, b, inplace=True)


@_builder
def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub: a - b element-wise, b repeated to a's shape; the result has a's shape and type."""
    return _binary(ctx, "SUB", a, b)


@_builder
def sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub_inplace: a - b (b repeated to a's shape), written into a: a view of a."""
    return _binary(ctx, "SUB", a, b, inplace=True)


@_builder
def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul: a * b element-wise, b repeated to a's shape; the result has a's shape and type."""
    return _binary(ctx, "MUL", a, b)


@_builder
def mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_inplace: a * b (b repeated to a's shape), written into a: a view of a."""
    return _binary(ctx, "MUL", a, b, inplace=True)


@_builder
def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div: a / b element-wise, b repeated to a's shape; the result has a's shape and type."""
    return _binary(ctx, "DIV", a, b)


@_builder
def div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div_inplace: a / b (b repeated to a's shape), written into a: a view of a."""
    return _binary(ctx, "DIV", a, b, inplace=True)


@_builder
def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
        inplace: bool = False) -> Tensor:
    """ggml_acc: a copy of a (f32) with b added into its view of strides nb1, nb2, nb3 at byte
    `offset`; inplace writes into a."""
    op = "ACC"
    if nelements(b) > nelements(a):
        _fail(op, b, f"has more elements than {_name(a)}")
    if not is_contiguous(a):
        _fail(op, a, "is not contiguous" + _CONT)
    if a.type != "f32" or b.type != "f32":
        _fail(op, a if a.type != "f32" else b, "ACC needs f32 tensors")
    params = [_i32(nb1), _i32(nb2), _i32(nb3), _i32(offset), 1 if inplace else 0]
    if inplace:
        return _view_tensor(ctx, op, a, [a, b], params)
    return _dup_tensor(ctx, op, a, [a, b], params)


@_builder
def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                offset: int) -> Tensor:
    """ggml_acc_inplace: acc written into a (a view of a)."""
    return acc(ctx, a, b, nb1, nb2, nb3, offset, inplace=True)


# ---------------------------------------------------------------------------
# element-wise unary and friends

@_builder
def sqr(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqr: a * a element-wise."""
    return _un(ctx, "SQR", a)


@_builder
def sqrt(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqrt: the square root of each element."""
    return _un(ctx, "SQRT", a)


@_builder
def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """ggml_scale: a * s (s a float)."""
    return scale_bias(ctx, a, s, 0.0)


@_builder
def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """ggml_scale_inplace: a * s written into a (a view of a)."""
    return scale_bias(ctx, a, s, 0.0, inplace=True)


@_builder
def scale_bias(ctx: Context, a: Tensor, s: float, b: float, inplace: bool = False) -> Tensor:
    """ggml_scale_bias: a * s + b (floats); inplace writes into a."""
    ne, nb = a.ne, a.nb
    if not (nb[0] == type_size(a.type) and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]):
        _fail("SCALE", a, "is not padded-1d (rows may be padded, nothing else)")
    return _un(ctx, "SCALE", a, [f32_bits(s), f32_bits(b)], inplace)


@_builder
def clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    """ggml_clamp: returns a view of a and clamps in place."""
    return _view_tensor(ctx, "CLAMP", a, [a], [f32_bits(min), f32_bits(max)])


@_builder
def unary(ctx: Context, a: Tensor, op: str | int, inplace: bool = False) -> Tensor:
    """ggml_unary: the unary op `op` ('SILU', 'GELU', ..., or its id) on each element; inplace
    writes into a."""
    if not is_contiguous_rows(a):
        _fail("UNARY", a, "rows are not contiguous" + _CONT)
    op = unary_op_id(op)
    if not 0 <= op < len(UNARY_OPS):
        _fail("UNARY", a, f"unary op {op} out of range")
    return _un(ctx, "UNARY", a, [op], inplace)


@_builder
def unary_inplace(ctx: Context, a: Tensor, op: str | int) -> Tensor:
    """ggml_unary_inplace: unary written into a (a view of a)."""
    return unary(ctx, a, op, inplace=True)


class UnaryBuilder(Protocol):
    """The signature of the per-op unary builders (relu, silu, ...): (ctx, a) -> Tensor."""
    def __call__(self, ctx: Context, a: Tensor) -> Tensor: ...


def _make_unary(name: str) -> UnaryBuilder:
    def f(ctx: Context, a: Tensor) -> Tensor:
        return unary(ctx, a, name)
    f.__name__ = name.lower()
    f.__doc__ = f"ggml_{name.lower()}: UNARY {name}."
    return _builder(f)


# ggml_abs, ggml_relu, ...: one builder per unary op (XIELU has parameters: xielu below)
abs = _make_unary("ABS")
sgn = _make_unary("SGN")
neg = _make_unary("NEG")
step = _make_unary("STEP")
tanh = _make_unary("TANH")
elu = _make_unary("ELU")
relu = _make_unary("RELU")
sigmoid = _make_unary("SIGMOID")
gelu = _make_unary("GELU")
gelu_quick = _make_unary("GELU_QUICK")
silu = _make_unary("SILU")
hardswish = _make_unary("HARDSWISH")
hardsigmoid = _make_unary("HARDSIGMOID")
exp = _make_unary("EXP")
expm1 = _make_unary("EXPM1")
softplus = _make_unary("SOFTPLUS")
gelu_erf = _make_unary("GELU_ERF")
floor = _make_unary("FLOOR")
ceil = _make_unary("CEIL")
round = _make_unary("ROUND")
trunc = _make_unary("TRUNC")


def _softplus_f32(x: float) -> float:
    import numpy as np
    x32 = np.float32(x)
    with np.errstate(over="ignore"):
        return float(x32 if x32 > 20.0 else np.log(np.float32(1) + np.exp(x32)))


@_builder
def xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float,
          eps: float) -> Tensor:
    """ggml_xielu: UNARY XIELU; op_params [op, beta + softplus(alpha_n), softplus(alpha_p),
    beta, eps] (floats as float32 bits)."""
    import numpy as np
    an = float(np.float32(beta) + np.float32(_softplus_f32(alpha_n)))
    return _dup_tensor(ctx, "UNARY", a, [a], [UNARY_OP_IDS["XIELU"], f32_bits(an),
                       f32_bits(_softplus_f32(alpha_p)), f32_bits(beta), f32_bits(eps)])


@_builder
def swiglu_oai(ctx: Context, a: Tensor, b: Tensor | None, alpha: float, limit: float) -> Tensor:
    """ggml_swiglu_oai: GLU SWIGLU_OAI with op_params [op, 0, alpha, limit]."""
    t = _glu_impl(ctx, a, b, "SWIGLU_OAI", False)
    p = t.op_params
    p[2], p[3] = f32_bits(alpha), f32_bits(limit)
    t.set_op_params(p)
    return t


@_builder
def glu(ctx: Context, a: Tensor, op: str | int, swapped: bool = False) -> Tensor:
    """ggml_glu: the gated linear unit `op` over each row's halves, act(first) * second (swapped:
    act(second) * first); rows half as long."""
    return _glu_impl(ctx, a, None, op, swapped)


@_builder
def glu_split(ctx: Context, a: Tensor, b: Tensor, op: str | int) -> Tensor:
    """ggml_glu_split: the gated linear unit `op` of two tensors of one shape: act(a) * b."""
    return _glu_impl(ctx, a, b, op, False)


def _glu_impl(ctx: Context, a: Tensor, b: Tensor | None, op: str | int,
              swapped: bool) -> Tensor:
    if not is_contiguous_1(a):
        _fail("GLU", a, "is not contiguous in dims 1..3" + _CONT)
    if b is not None:
        if not is_contiguous_1(b):
            _fail("GLU", b, "is not contiguous in dims 1..3" + _CONT)
        if not are_same_shape(a, b):
            _fail("GLU", b, f"shape differs from {_name(a)} ({_shape(a)})")
        if a.type != b.type:
            _fail("GLU", b, f"type differs from {_name(a)} ({a.type})")
    op = glu_op_id(op)
    ne = list(a.ne) if b is not None else [a.ne[0] // 2] + list(a.ne[1:])
    return _new(ctx, "GLU", [a, b] if b is not None else [a], a.type, ne, [op, int(bool(swapped))])


class GluBuilder(Protocol):
    """The signature of the per-op GLU builders (swiglu, geglu, ...): (ctx, a, swapped=False) ->
    Tensor."""
    def __call__(self, ctx: Context, a: Tensor, swapped: bool = False) -> Tensor: ...


class GluSplitBuilder(Protocol):
    """The signature of the per-op split GLU builders (swiglu_split, ...): (ctx, a, b) -> Tensor."""
    def __call__(self, ctx: Context, a: Tensor, b: Tensor) -> Tensor: ...


def _make_glu(name: str) -> tuple[GluBuilder, GluSplitBuilder]:
    def f(ctx: Context, a: Tensor, swapped: bool = False) -> Tensor:
        return glu(ctx, a, name, swapped)

    def fs(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return glu_split(ctx, a, b, name)
    f.__name__ = name.lower()
    fs.__name__ = name.lower() + "_split"
    f.__doc__ = (f"ggml_{f.__name__}: GLU {name} over each row's halves, act(first) * second "
                 "(swapped: act(second) * first); rows half as long.")
    fs.__doc__ = f"ggml_{fs.__name__}: GLU {name} of two tensors of one shape, act(a) * b."
    return _builder(f), _builder(fs)


# ggml_swiglu (one input, halves) and ggml_swiglu_split (two inputs), ... per GLU op
reglu, reglu_split = _make_glu("REGLU")
geglu, geglu_split = _make_glu("GEGLU")
swiglu, swiglu_split = _make_glu("SWIGLU")
geglu_erf, geglu_erf_split = _make_glu("GEGLU_ERF")
geglu_quick, geglu_quick_split = _make_glu("GEGLU_QUICK")


@_builder
def reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_reglu_swapped: REGLU over each row's halves, relu(second) * first."""
    return glu(ctx, a, "REGLU", True)


@_builder
def geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_swapped: GEGLU over each row's halves, gelu(second) * first."""
    return glu(ctx, a, "GEGLU", True)


@_builder
def swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_swiglu_swapped: SWIGLU over each row's halves, silu(second) * first."""
    return glu(ctx, a, "SWIGLU", True)


# ---------------------------------------------------------------------------
# reductions, norms

@_builder
def sum(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum: the sum of all of a's elements, a one-element tensor."""
    return _new(ctx, "SUM", [a], a.type, [1])


@_builder
def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum_rows: the sum of each row, shape [1, ne1, ne2, ne3]."""
    return _new(ctx, "SUM_ROWS", [a], a.type, [1] + list(a.ne[1:]))


@_builder
def mean(ctx: Context, a: Tensor) -> Tensor:
    """ggml_mean: the mean of each row (f32), shape [1, ne1, ne2, ne3]."""
    return _new(ctx, "MEAN", [a], "f32", [1] + list(a.ne[1:]))


@_builder
def norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """ggml_norm: each row shifted to mean 0 and scaled to variance 1 (eps added to the variance);
    inplace writes into a."""
    return _un(ctx, "NORM", a, [f32_bits(eps)], inplace)


@_builder
def rms_norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """ggml_rms_norm: each row divided by its root mean square (eps added to the mean square);
    inplace writes into a."""
    return _un(ctx, "RMS_NORM", a, [f32_bits(eps)], inplace)


@_builder
def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_norm_inplace: norm written into a (a view of a)."""
    return norm(ctx, a, eps, True)


@_builder
def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_inplace: rms_norm written into a (a view of a)."""
    return rms_norm(ctx, a, eps, True)


@_builder
def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat: a tiled to b's shape (each of b's dims a multiple of a's)."""
    if not can_repeat(a, b):
        _fail("REPEAT", a, f"cannot be tiled to {_name(b)} ({_shape(b)})")
    return _new(ctx, "REPEAT", [a], a.type, b.ne)


@_builder
def repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_repeat_4d: a tiled to shape [ne0, ne1, ne2, ne3] (each a multiple of a's dim)."""
    ne = [ne0, ne1, ne2, ne3]
    if not (is_empty(a) or all(ne[i] % a.ne[i] == 0 for i in range(4))):
        _fail("REPEAT", a, f"cannot be tiled to shape {tuple(reversed(ne))}")
    return _new(ctx, "REPEAT", [a], a.type, ne)


@_builder
def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """ggml_concat: a and b joined along `dim` (0..3; the other dims equal, one type)."""
    if not 0 <= dim < 4:
        _fail("CONCAT", a, f"dim {dim} out of range 0..3")
    if a.type != b.type:
        _fail("CONCAT", b, f"type differs from {_name(a)} ({a.type})")
    ne = []
    for d in range(4):
        if d == dim:
            ne.append(a.ne[d] + b.ne[d])
        else:
            if a.ne[d] != b.ne[d]:
                _fail("CONCAT", b, f"ne[{d}]={b.ne[d]} differs from {_name(a)}'s {a.ne[d]}")
            ne.append(a.ne[d])
    return _new(ctx, "CONCAT", [a, b], a.type, ne, [dim])


# ---------------------------------------------------------------------------
# matrix products

def _can_mul_mat(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


@_builder
def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: every row of a dotted with every row of b: shape [a.ne1, b.ne1, b.ne2, b.ne3],
    f32 (b @ a.T in numpy terms; a's dims 2 and 3 are broadcast over b's)."""
    if not _can_mul_mat(a, b):
        _fail("MUL_MAT", b, f"cannot be multiplied with {_name(a)} ({_shape(a)}): "
              f"mul_mat(a, b) is b @ a.T, so their last dimensions (numpy order) must "
              f"match ({b.ne[0]} vs {a.ne[0]}), and a's first two must divide b's")
    if is_transposed(a):
        _fail("MUL_MAT", a, "is transposed (its rows are not contiguous); ggml reads a's "
              "rows in place: ops.cont(ctx, a) makes a contiguous copy of it")
    return _new(ctx, "MUL_MAT", [a, b], "f32", [a.ne[1], b.ne[1], b.ne[2], b.ne[3]])


@_checked
def mul_mat_set_prec(a: Tensor, prec: str | int) -> None:
    """ggml_mul_mat_set_prec: a MUL_MAT node's precision, 'DEFAULT' or 'F32'."""
    if a.op != "MUL_MAT":
        _fail("mul_mat_set_prec", a, "is not a MUL_MAT")
    p = a.op_params
    p[0] = _enum(prec, PRECS, "GGML_PREC_", "precision")
    a.set_op_params(p)


@_builder
def mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: for each token, the experts of as_ (one matrix each) named by ids (i32
    [n_used, n_tokens]) applied to b: shape [as_.ne1, n_used, n_tokens], f32 (mixture of
    experts)."""
    op = "MUL_MAT_ID"
    if is_transposed(as_):
        _fail(op, as_, "is transposed (its rows are not contiguous)" + _CONT)
    if ids.type != "i32":
        _fail(op, ids, "ids must be i32")
    if as_.ne[3] != 1:
        _fail(op, as_, "must be 3d (one matrix per expert)")
    if b.ne[3] != 1:
        _fail(op, b, "must be 3d")
    if ids.ne[2] != 1 or ids.ne[3] != 1:
        _fail(op, ids, "must be 2d")
    if ids.ne[1] != b.ne[2]:
        _fail(op, ids, f"needs one expert list per token: ne[1]={ids.ne[1]} vs b.ne[2]={b.ne[2]}")
    if as_.ne[0] != b.ne[0]:
        _fail(op, b, f"ne[0]={b.ne[0]} differs from the experts' {as_.ne[0]}")
    if ids.ne[0] % b.ne[1] != 0:
        _fail(op, b, f"ne[1]={b.ne[1]} does not divide n_expert_used={ids.ne[0]}")
    return _new(ctx, op, [as_, b, ids], "f32", [as_.ne[1], ids.ne[0], b.ne[2], 1])


# ---------------------------------------------------------------------------
# rows

@_builder
def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_get_rows: the rows of a at the indices in b (i32): shape [a.ne0, b.ne0, b.ne1, b.ne2],
    f32 (i32 for an i32 a)."""
    op = "GET_ROWS"
    if a.ne[2] != b.ne[1] or a.ne[3] != b.ne[2]:
        _fail(op, b, f"dims 1/2 {b.ne[1]},{b.ne[2]} must equal {_name(a)}'s dims 2/3 "
              f"{a.ne[2]},{a.ne[3]}")
    if b.ne[3] != 1:
        _fail(op, b, "ne[3] must be 1")
    if b.type != "i32":
        _fail(op, b, "row ids must be i32")
    type = "i32" if a.type == "i32" else "f32"
    return _new(ctx, op, [a, b], type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]])


@_builder
def set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_set_rows(dst a, src b, ids c): returns a view of a; src order is (b, c, a)."""
    op = "SET_ROWS"
    if a.ne[0] != b.ne[0] or a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3]:
        _fail(op, b, f"does not match destination {_name(a)} ({_shape(a)}): rows of equal "
              f"length, the same outer two dimensions")
    if b.ne[1] != c.ne[0]:
        _fail(op, c, f"ne[0]={c.ne[0]} must equal the source row count {b.ne[1]}")
    if b.ne[2] % c.ne[1] or b.ne[3] % c.ne[2]:
        _fail(op, c, "cannot be broadcast over the source's dims 2/3")
    if c.ne[3] != 1:
        _fail(op, c, "ne[3] must be 1")
    if b.type != "f32":
        _fail(op, b, "source must be f32")
    if c.type not in ("i32", "i64"):
        _fail(op, c, "row ids must be i32 or i64")
    if not is_contiguous_rows(a):
        _fail(op, a, "rows are not contiguous" + _CONT)
    if not is_contiguous_rows(b):
        _fail(op, b, "rows are not contiguous" + _CONT)
    return _view_tensor(ctx, op, a, [b, c, a])


@_builder
def diag_mask_inf(ctx: Context, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """ggml_diag_mask_inf: a with every element past the diagonal shifted by n_past (column > n_past
    + row) set to -inf; inplace writes into a."""
    return _un(ctx, "DIAG_MASK_INF", a, [int(n_past)], inplace)


@_builder
def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_inf_inplace: diag_mask_inf written into a (a view of a)."""
    return diag_mask_inf(ctx, a, n_past, True)


# ---------------------------------------------------------------------------
# attention pieces

@_builder
def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max: the softmax of each row."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0)


@_builder
def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max_inplace: the softmax of each row, written into a (a view of a)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0, inplace=True)


@_builder
def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float,
                 inplace: bool = False) -> Tensor:
    """ggml_soft_max_ext: softmax(a * scale + mask) of each row; the mask (f16 or f32, optional) is
    broadcast over dims 2 and 3, and max_bias > 0 adds ALiBi slopes to it; inplace writes into a."""
    op = "SOFT_MAX"
    if not is_contiguous(a):
        _fail(op, a, "is not contiguous" + _CONT)
    if mask is not None:
        if mask.type not in ("f16", "f32"):
            _fail(op, mask, "mask must be f16 or f32")
        if not is_contiguous(mask):
            _fail(op, mask, "mask is not contiguous")
        if mask.ne[0] != a.ne[0]:
            _fail(op, mask, f"ne[0]={mask.ne[0]} differs from {_name(a)}'s {a.ne[0]}")
        if mask.ne[1] < a.ne[1]:
            _fail(op, mask, f"has {mask.ne[1]} rows, fewer than {_name(a)}'s {a.ne[1]}")
        if a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]:
            _fail(op, mask, "dims 2/3 do not divide a's")
    if max_bias > 0.0 and mask is None:
        _fail(op, a, "ALiBi (max_bias > 0) needs a mask")
    params = [f32_bits(scale), f32_bits(max_bias)]
    srcs = [a, mask] if mask is not None else [a]
    if inplace:
        return _view_tensor(ctx, op, a, srcs, params)
    return _dup_tensor(ctx, op, a, srcs, params)


@_builder
def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                         max_bias: float) -> Tensor:
    """ggml_soft_max_ext_inplace: soft_max_ext written into a (a view of a)."""
    return soft_max_ext(ctx, a, mask, scale, max_bias, inplace=True)


@_builder
def rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: str | int,
             n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0, inplace: bool = False,
             sections: Sequence[int] | None = None) -> Tensor:
    """ggml_rope_ext: rotary position embedding of a ([head dim, heads, tokens, ...]) at positions b
    (i32, one per token; four for M-RoPE), over the first n_dims of each head; c: optional
    frequency factors; mode 'NORMAL', 'NEOX', 'MROPE' (with sections), ...; YaRN scaling by
    n_ctx_orig, freq_scale, ext_factor, attn_factor, beta_fast and beta_slow; inplace writes into
    a."""
    op = "ROPE"
    mode = rope_mode_id(mode)
    if mode & 1:
        _fail(op, a, "mode & 1 == 1 is no longer supported")
    if not is_vector(b):
        _fail(op, b, "positions must be a vector")
    if b.type != "i32":
        _fail(op, b, "positions must be i32")
    mrope = bool(mode & ROPE_TYPES["MROPE"])
    if mrope:
        if a.ne[2] * 4 != b.ne[0]:
            _fail(op, b, f"mrope needs 4 positions per token ({a.ne[2] * 4}), got {b.ne[0]}")
    elif a.ne[2] != b.ne[0]:
        _fail(op, b, f"has {b.ne[0]} positions, {_name(a)} has {a.ne[2]} tokens (ne[2])")
    if c is not None:
        if c.type != "f32":
            _fail(op, c, "freq_factors must be f32")
        if c.ne[0] < n_dims // 2:
            _fail(op, c, f"needs at least n_dims/2 = {n_dims // 2} factors")
    params = [0, int(n_dims), mode, 0, int(n_ctx_orig), f32_bits(freq_base), f32_bits(freq_scale),
              f32_bits(ext_factor), f32_bits(attn_factor), f32_bits(beta_fast), f32_bits(beta_slow)]
    if mrope and sections:
        params += ([int(x) for x in sections] + [0, 0, 0, 0])[:4]
    else:
        params += [0, 0, 0, 0]
    srcs = [a, b, c] if c is not None else [a, b]
    if inplace:
        return _view_tensor(ctx, op, a, srcs, params)
    return _dup_tensor(ctx, op, a, srcs, params)


@_builder
def rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                     mode: str | int, n_ctx_orig: int = 0, freq_base: float = 10000.0,
                     freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
                     beta_fast: float = 32.0, beta_slow: float = 1.0) -> Tensor:
    """ggml_rope_ext_inplace: rope_ext written into a (a view of a)."""
    return rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                    attn_factor, beta_fast, beta_slow, inplace=True)


@_builder
def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: str | int) -> Tensor:
    """ggml_rope: rope_ext with base 10000 and no scaling (beta_fast = beta_slow = 0)."""
    return rope_ext(ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


@_builder
def rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
               sections: Sequence[int], mode: str | int, n_ctx_orig: int, freq_base: float,
               freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
               beta_slow: float) -> Tensor:
    """ggml_rope_multi: rope_ext with M-RoPE: four positions per token in b, and `sections` dividing
    the rotated dims among them."""
    return rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                    attn_factor, beta_fast, beta_slow, sections=sections)


@_builder
def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   scale: float, max_bias: float = 0.0, logit_softcap: float = 0.0,
                   prec: str | int | None = None) -> Tensor:
    """ggml_flash_attn_ext: attention, softmax(q k^T * scale + mask) v, in one op.
    q [d, n_q, heads, n], k [d, n_kv, kv heads, n], v [dv, n_kv, kv heads, n], mask f16;
    the result is [dv, heads, n_q, n], f32 (heads before tokens). Optional: ALiBi
    (max_bias), logit soft-capping and the precision."""
    op = "FLASH_ATTN_EXT"
    if not _can_mul_mat(k, q):
        _fail(op, k, f"cannot be multiplied with q ({_shape(q)}): the last dimensions must "
              f"match, k's heads must divide q's")
    if q.ne[3] != k.ne[3] or q.ne[3] != v.ne[3]:
        _fail(op, q, "q, k and v must have the same ne[3]")
    if mask is not None:
        if mask.type != "f16":
            _fail(op, mask, "mask must be f16")
        if not is_contiguous(mask):
            _fail(op, mask, "mask is not contiguous")
        if q.ne[2] % mask.ne[2] or q.ne[3] % mask.ne[3]:
            _fail(op, mask, "dims 2/3 do not divide q's")
    if max_bias > 0.0 and mask is None:
        _fail(op, q, "ALiBi (max_bias > 0) needs a mask")
    srcs = [q, k, v, mask] if mask is not None else [q, k, v]
    params = [f32_bits(scale), f32_bits(max_bias), f32_bits(logit_softcap)]
    if prec is not None:
        params.append(_enum(prec, PRECS, "GGML_PREC_", "precision"))
    return _new(ctx, op, srcs, "f32", [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], params)


@_checked
def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_flash_attn_ext_add_sinks: sinks (f32, one per head) become src[4]."""
    if sinks is None:
        return
    if a.op != "FLASH_ATTN_EXT":
        _fail("flash_attn_ext_add_sinks", a, "is not a FLASH_ATTN_EXT")
    if sinks.type != "f32":
        _fail("FLASH_ATTN_EXT", sinks, "sinks must be f32")
    a.set_src(4, sinks)


@_checked
def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_soft_max_add_sinks: sinks (f32, one per head) become src[2]."""
    if sinks is None:
        return
    if a.op != "SOFT_MAX":
        _fail("soft_max_add_sinks", a, "is not a SOFT_MAX")
    if sinks.type != "f32":
        _fail("SOFT_MAX", sinks, "sinks must be f32")
    if sinks.ne[0] != a.ne[2]:
        _fail("SOFT_MAX", sinks, f"needs one sink per head ({a.ne[2]})")
    a.set_src(2, sinks)


@_checked
def flash_attn_ext_set_prec(a: Tensor, prec: str | int) -> None:
    """ggml_flash_attn_ext_set_prec: a FLASH_ATTN_EXT node's precision, 'DEFAULT' or 'F32'."""
    if a.op != "FLASH_ATTN_EXT":
        _fail("flash_attn_ext_set_prec", a, "is not a FLASH_ATTN_EXT")
    p = a.op_params
    p[3] = _enum(prec, PRECS, "GGML_PREC_", "precision")
    a.set_op_params(p)


# ---------------------------------------------------------------------------
# sorting

@_builder
def argsort(ctx: Context, a: Tensor, order: str | int = "ASC") -> Tensor:
    """ggml_argsort: the indices that sort each row, 'ASC' or 'DESC' (i32, a's shape)."""
    if a.ne[0] > 2**31 - 1:
        _fail("ARGSORT", a, "rows longer than INT32_MAX")
    return _new(ctx, "ARGSORT", [a], "i32", a.ne, [sort_order_id(order)])


@_builder
def argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: the indices of each row's k largest values, largest first (a view of a
    DESC argsort)."""
    if a.ne[0] < k:
        _fail("ARGSORT", a, f"has {a.ne[0]} values per row, fewer than k={k}")
    r = argsort(ctx, a, "DESC")
    return view_4d(ctx, r, k, r.ne[1], r.ne[2], r.ne[3], r.nb[1], r.nb[2], r.nb[3], 0)


@_builder
def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_top_k: the indices of each row's k largest values, in any order (i32, shape [k, ne1,
    ne2, ne3])."""
    if a.ne[0] < k:
        _fail("TOP_K", a, f"has {a.ne[0]} values per row, fewer than k={k}")
    return _new(ctx, "TOP_K", [a], "i32", [k, a.ne[1], a.ne[2], a.ne[3]])


# ---------------------------------------------------------------------------
# generators and padding

@_builder
def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    """ggml_arange: start, start + step, ... while below stop (f32)."""
    if not stop > start:
        raise GraphError(f"ARANGE: stop ({stop}) must be greater than start ({start})")
    with np.errstate(all="ignore"):     # (ggml's float32 arithmetic; checked below)
        count = np.float32(np.float32(stop) - np.float32(start)) / np.float32(step)
    if not (np.isfinite(count) and count > 0):
        raise GraphError(f"ARANGE: from {start} to {stop} by {step} is not a finite, "
                         "positive number of values")
    steps = int(np.ceil(count))
    return _new(ctx, "ARANGE", [], "f32", [steps],
                [f32_bits(start), f32_bits(stop), f32_bits(step)])


@_builder
def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int,
                       max_period: int = 10000) -> Tensor:
    """ggml_timestep_embedding: sinusoidal embeddings of the timesteps (f32 [n]): shape [dim, n],
    f32."""
    return _new(ctx, "TIMESTEP_EMBEDDING", [timesteps], "f32", [dim, timesteps.ne[0]],
                [int(dim), int(max_period)])


@_builder
def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int, circular: bool = False) -> Tensor:
    """ggml_pad_ext: a with lp_i elements added before and rp_i after along dim i: zeros, or with
    circular, the elements from the other end."""
    p = [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3]
    ne = [a.ne[i] + p[2 * i] + p[2 * i + 1] for i in range(4)]
    return _new(ctx, "PAD", [a], a.type, ne, [int(x) for x in p] + [1 if circular else 0])


@_builder
def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int = 0, p3: int = 0) -> Tensor:
    """ggml_pad: a with p_i zeros added at the end of dim i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


@_builder
def pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int = 0, p3: int = 0) -> Tensor:
    """ggml_pad_circular: a with p_i elements added at the end of dim i, wrapped from its start."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3, circular=True)


@_builder
def pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int,
                     rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext_circular: pad_ext wrapping around (circular)."""
    return pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular=True)
