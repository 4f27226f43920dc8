"""Variants of the reference op cases: other shapes, other parameters, other data.

The op case files (tests/data/ops) fix one shape and one set of parameters per case;
the held-out set has others. `variants(case, rng)` derives cases of the same op with

- the case's float and enum arguments moved (eps, scale, bias, rope's frequencies and
  mode, softmax's ALiBi bias, clamp bounds, the GLU and unary kind, the sort order ...);
- its shapes remapped: each dimension size above 1 becomes another of the same parity
  (multiples of 32, a quant block, stay multiples of 32), or twice itself (which keeps
  every multiple a multiple), the same size everywhere in the case, so that
  broadcasting and matching dimensions stay consistent;
- its inputs redrawn from the case's own `init` rule (row ids within the remapped rows,
  rows of distinct row or expert indices, sort keys without ties, causal masks and masks
  with -inf holes, as the files make them).

A variant has no reference output: `with_reference` computes it with ggml's own CPU
kernels (an RPC server), for test_op_variants.py to compare ggml_py's backends with.
A view input is remapped with what it views: its view ops' sizes, and their strides and
offsets re-expressed in the new shape's strides; so are arguments in bytes (ACC's).
"""

from __future__ import annotations

import base64
import copy
import re

import numpy as np

from ggml_py import quants
from ggml_py._core import Context, Graph
from ggml_py.tools import opscheck

# enum arguments: the values a variant may take instead
ENUMS = {
    "mode": ["GGML_ROPE_TYPE_NORMAL", "GGML_ROPE_TYPE_NEOX"],
    "order": ["GGML_SORT_ORDER_ASC", "GGML_SORT_ORDER_DESC"],
}
GLU_OPS = ["GGML_GLU_OP_SWIGLU", "GGML_GLU_OP_GEGLU", "GGML_GLU_OP_REGLU",
           "GGML_GLU_OP_GEGLU_ERF", "GGML_GLU_OP_GEGLU_QUICK"]
# float arguments that must keep their sign (a zero stays zero: it switches a feature off)
SCALED = {"eps", "s", "scale", "freq_base", "freq_scale", "attn_factor", "beta_fast",
          "beta_slow", "ext_factor", "max_bias", "logit_softcap", "max_period"}
SHIFTED = {"b", "min", "max", "start", "stop"}

# integer arguments that are sizes of the case's dimensions (remapped with them)
SIZE_ARGS = {("ggml_rope_ext", "n_dims"), ("ggml_top_k", "k"), ("ggml_diag_mask_inf", "n_past"),
             ("ggml_timestep_embedding", "dim")}
# arguments in bytes (ACC's: strides and an offset in its first input)
BYTE_ARGS = {"nb1", "nb2", "nb3", "offset"}
MAX_SCALED_ELEMENTS = 1 << 14   # doubling every size multiplies a tensor by up to 16
RELAYOUT_RATE = 0.2             # of the plain inputs: seen through a view instead

_UNIFORM = re.compile(r"uniform\((-?[\d.]+), *(-?[\d.]+)\)$")
_INTEGERS = re.compile(r"integers in \[(-?\d+), *(-?\d+)\)$")
_PERMUTED_ROWS = "each row a random permutation of 0..ne0-1 (as floats, no ties)"
_CAUSAL = "causal: 0 if key <= query + (ne0-ne1) else -inf"
_HOLES = "uniform(-1,1) with ~25% -inf (first key of every row finite)"
# rows of distinct indices into N = M + 1 rows or experts (SET_ROWS, MUL_MAT_ID)
_DISTINCT = re.compile(r"(each row a random permutation of|per index row: first r of a "
                       r"random permutation of) 0\.\.(\d+)$")


def _redrawable(spec):
    """Can this input be drawn anew, at another shape? (Row ids are, their range
    [0, N) remapped with the shapes; see variants. Views are, where what they view is:
    _remap_view says how.)"""
    if spec is None:
        return True
    init = spec.get("init", "")
    return (_UNIFORM.match(init) is not None or init in (_PERMUTED_ROWS, _CAUSAL, _HOLES)
            or _INTEGERS.match(init) is not None or _DISTINCT.match(init) is not None)


def _stored_ne(spec):
    return spec["view"]["stored_ne"] if "view" in spec else spec["ne"]


def _strides(type_name, ne):
    """The byte strides of a contiguous tensor, finest first: an element's (none for a
    block type, whose rows are the finest unit), then a row's, a matrix's, ..."""
    row = quants.row_bytes(type_name, ne[0])
    out = [] if quants.is_quantized(type_name) else [quants.PLAIN_DTYPES[type_name].itemsize]
    for d in [row, row * ne[1], row * ne[1] * ne[2]]:
        out.append(d)
    return out


def _restride(value, old, new):
    """A byte stride or offset of a view, written in the viewed tensor's strides `old`
    (coarsest first), in the same terms of `new`; None where it is not such a sum."""
    out = 0
    for o, n in reversed(list(zip(old, new))):
        out += (value // o) * n
        value %= o
    return out if value == 0 else None


def _padded(ne):
    return list(ne) + [1] * (4 - len(ne))


def _remap_view(spec, remap):
    """Remap a view input: what it views, the sizes of its view ops, and their strides
    and offsets, re-expressed in the new shape's strides. False where they are not."""
    view = spec["view"]
    ne = [remap.get(d, d) for d in view["stored_ne"]]
    old, new = _strides(spec["type"], _padded(view["stored_ne"])), _strides(spec["type"], _padded(ne))
    for o in view["ops"]:
        for k, a in o.get("args", {}).items():
            if k.startswith("ne"):
                o["args"][k] = remap.get(a, a)
            elif k.startswith("nb") or k == "offset":
                o["args"][k] = _restride(a, old, new)
                if o["args"][k] is None:
                    return False
    view["stored_ne"] = ne
    view.pop("nb", None)            # the view's strides and offset are checked against these
    view.pop("offset", None)
    return True


def _draw(spec, rng):
    """Stored data for an input from its init rule, at its (stored) ne, in its type."""
    ne = _padded(_stored_ne(spec))
    shape = (ne[3], ne[2], ne[1], ne[0])
    init = spec["init"]
    m = _UNIFORM.match(init)
    if m:
        x = rng.uniform(float(m.group(1)), float(m.group(2)), size=shape).astype(np.float32)
    elif init == _PERMUTED_ROWS:
        x = rng.permuted(np.broadcast_to(np.arange(ne[0], dtype=np.float32), shape), axis=-1)
    elif _DISTINCT.match(init):
        n = int(_DISTINCT.match(init).group(2)) + 1
        x = np.array([rng.permutation(n)[:ne[0]] for _ in range(int(np.prod(shape[:-1])))])
        x = x.reshape(shape)
    elif init == _HOLES:
        x = rng.uniform(-1, 1, size=shape).astype(np.float32)
        x[rng.random(shape) < 0.25] = -np.inf
        x[..., 0] = rng.uniform(-1, 1, size=shape[:-1])
    elif init == _CAUSAL:
        # (no row all -inf where the remapped mask has more rows than keys)
        key, query = np.arange(ne[0]), np.arange(ne[1])[:, None]
        x = np.broadcast_to(np.where(key <= query + max(ne[0] - ne[1], 0), 0.0, -np.inf), shape)
    else:
        m = _INTEGERS.match(init)
        x = rng.integers(int(m.group(1)), int(m.group(2)), size=shape)
    if quants.is_quantized(spec["type"]):
        raw = quants.quantize(spec["type"], np.asarray(x, np.float32).reshape(-1, ne[0]))
    else:
        raw = np.asarray(x).astype(quants.PLAIN_DTYPES[spec["type"]])
    return base64.b64encode(np.ascontiguousarray(raw).tobytes()).decode()


def _other_size(v, rng):
    if v % 32 == 0:
        return int(v + 32 * rng.choice([-1, 1, 2] if v > 32 else [1, 2]))
    return int(max(2 + v % 2, v + 2 * rng.choice([-2, -1, 1, 2, 3])))


def _largest(inputs):
    return max((int(np.prod(_stored_ne(s))) for s in inputs if s), default=0)


def _move_args(args, rng):
    out = dict(args)
    for k, v in args.items():
        if isinstance(v, bool):
            out[k] = bool(rng.integers(2))
        elif isinstance(v, float) and k in SCALED:
            out[k] = float(np.float32(v * rng.choice([0.5, 0.8, 1.25, 2.0])))
        elif isinstance(v, float) and k in SHIFTED:
            out[k] = float(np.float32(v + rng.choice([-0.5, -0.25, 0.25, 0.5])))
        elif k in ENUMS:
            out[k] = str(rng.choice(ENUMS[k]))
        elif k == "op" and str(v).startswith("GGML_GLU_OP_"):
            out[k] = str(rng.choice(GLU_OPS))
    if "min" in out and "max" in out and out["min"] > out["max"]:
        out["min"], out["max"] = out["max"], out["min"]
    return out


def _remapped_inputs(inputs, remap):
    """The inputs with every dimension size remapped (None where a view cannot be)."""
    out = copy.deepcopy(inputs)
    for s in out:
        if s is None:
            continue
        if "view" in s and not _remap_view(s, remap):
            return None
        s["ne"] = [remap.get(d, d) for d in s["ne"]]
        m = _INTEGERS.match(s.get("init", ""))
        if m and int(m.group(1)) == 0 and int(m.group(2)) in remap:
            s["init"] = f"integers in [0, {remap[int(m.group(2))]})"     # row ids
        m = _DISTINCT.match(s.get("init", ""))
        if m:
            n = remap.get(int(m.group(2)) + 1, int(m.group(2)) + 1)
            if _stored_ne(s)[0] > n:
                return None                 # more distinct indices a row than there are
            s["init"] = f"{m.group(1)} 0..{n - 1}"
    return out


def _remapped_args(case, args, remap, inputs):
    """The arguments with the sizes remapped, and those in bytes (ACC's, in the strides
    of its first input) re-expressed in the remapped strides; None where they are not."""
    out = dict(args)
    for k, a in args.items():
        if (case["call"], k) in SIZE_ARGS:
            out[k] = remap.get(a, a)
        elif k in BYTE_ARGS and inputs is not None:
            a0, b0 = case["inputs"][0], inputs[0]
            out[k] = _restride(a, _strides(a0["type"], _padded(_stored_ne(a0))),
                               _strides(b0["type"], _padded(_stored_ne(b0))))
            if out[k] is None:
                return None
    return out


# a stored tensor seen with the input's shape through a view op: ne -> (stored_ne, ops)
RELAYOUTS = {
    "transposed": lambda ne: ([ne[1], ne[0], ne[2], ne[3]], [{"call": "ggml_transpose", "args": {}}]),
    "permuted_0213": lambda ne: ([ne[0], ne[2], ne[1], ne[3]], [{"call": "ggml_permute", "args": {
        "axis0": 0, "axis1": 2, "axis2": 1, "axis3": 3}}]),
}


def _relayout(spec, rng):
    """A plain input as a view of another layout with the same logical shape:
    transposed, dims 1 and 2 swapped, or rows of a wider tensor (strided rows; for a
    block type, wider by whole blocks); the op then reads it non-contiguously. ggml
    computes the same graph, so any layout its builders and the CPU-server rule accept
    must agree."""
    ne = _padded(spec["ne"])
    blocks = quants.is_quantized(spec["type"])
    kind = str(rng.choice(["permuted_0213", "sliced"] if blocks else
                          ["transposed", "permuted_0213", "sliced"]))
    if kind == "sliced":
        unit = 32 if blocks else 1
        stored = [ne[0] + unit * int(rng.integers(1, 4)), ne[1], ne[2], ne[3]]
        row = quants.row_bytes(spec["type"], stored[0])
        ops = [{"call": "ggml_view_4d", "args": {
            "ne0": ne[0], "ne1": ne[1], "ne2": ne[2], "ne3": ne[3], "nb1": row,
            "nb2": row * ne[1], "nb3": row * ne[1] * ne[2],
            "offset": quants.row_bytes(spec["type"], stored[0] - ne[0])}}]
    else:
        stored, ops = RELAYOUTS[kind](ne)
    spec["view"] = {"of": f"{spec['name']}_{kind}"[:63], "stored_ne": stored, "ops": ops}


def variants(case, rng, n):
    """n variants of an op case (dicts in the case format, no output data)."""
    inputs = case["inputs"]
    remap_ok = all(_redrawable(s) for s in inputs)
    for _ in range(n):
        v = copy.deepcopy(case)
        v["args"] = _move_args(case.get("args", {}), rng)
        if remap_ok and rng.random() < 0.75:
            sizes = sorted({d for s in inputs if s for d in s["ne"] + _stored_ne(s) if d > 1})
            if rng.random() < 0.5 and _largest(inputs) <= MAX_SCALED_ELEMENTS:
                remap = {d: 2 * d for d in sizes}   # keeps every multiple a multiple (REPEAT)
            else:
                remap = {d: _other_size(d, rng) for d in sizes}
            remapped = _remapped_inputs(v["inputs"], remap)
            args = _remapped_args(case, v["args"], remap, remapped)
            if remapped is not None and args is not None:
                v["inputs"], v["args"] = remapped, args
        for s in v["inputs"]:
            if (s is not None and "view" not in s and s["type"] in ("f32", "f16", "q8_0")
                    and s["name"] not in case.get("after", {})       # (compared after)
                    and _UNIFORM.match(s.get("init", "")) and rng.random() < RELAYOUT_RATE):
                _relayout(s, rng)
        for s in v["inputs"]:
            if s is not None and _redrawable(s):
                s["data"] = _draw(s, rng)
        v.pop("output", None)
        v.pop("after", None)
        yield v


def _b64(arr):
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()


def with_reference(variant, case, backend):
    """The variant with its output (and, where the case has them, its inputs as they are
    after the graph ran) computed on `backend`; None where the builder refuses the
    variant's shapes or arguments, or the backend does not run it (a ggml server's rule
    refuses what its kernels would abort on: an ACC past its tensor, unpacked rows ...)."""
    ctx = Context(variant["name"])
    alloc = opscheck.HostAllocation(backend)
    try:
        out, stored = opscheck.build_case(ctx, variant, backend, alloc)
    except opscheck.CASE_ERRORS:
        return None
    if not backend.supports_op(out):
        return None
    graph = Graph(64)
    graph.build_forward_expand(out)
    alloc.alloc_graph(graph)
    backend.graph_compute(graph)
    v = dict(variant)
    v["output"] = {"type": out.type, "ne": list(out.ne), "op": out.op,
                   "op_params": list(out.op_params),
                   "data": _b64(opscheck.read_tensor(backend, out))}
    if case.get("after"):
        v["after"] = {name: _b64(opscheck.read_tensor(backend, stored[name][0]))
                      for name in case["after"]}
    return v
