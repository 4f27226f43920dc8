"""Variants of the reference op cases: other shapes, other parameters, other data.

The op case files (tests/data/ops) fix one shape and one set of parameters per case;
the held-out set has others. `variants(case, rng)` derives cases of the same op with

- the case's float and enum arguments moved (eps, scale, bias, rope's frequencies and
  mode, softmax's ALiBi bias, clamp bounds, the GLU and unary kind, the sort order ...);
- its shapes remapped: each dimension size above 1 becomes another of the same parity
  (multiples of 32, a quant block, stay multiples of 32), or twice itself (which keeps
  every multiple a multiple), the same size everywhere in the case, so that
  broadcasting and matching dimensions stay consistent;
- its inputs redrawn from the case's own `init` rule.

A variant has no reference output: `with_reference` computes it with ggml's own CPU
kernels (an RPC server), for test_op_variants.py to compare ggml_py's CPU backend with.
Only what can be redrawn is varied: a case whose inputs are views, index lists
(permutations, row ids) or masks keeps its shapes and those inputs, and only its
arguments move.
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
# arguments in bytes: a case with them keeps its shapes
BYTE_ARGS = {"nb1", "nb2", "nb3", "offset"}
MAX_SCALED_ELEMENTS = 1 << 14   # doubling every size multiplies a tensor by up to 16

_UNIFORM = re.compile(r"uniform\((-?[\d.]+), *(-?[\d.]+)\)$")
_INTEGERS = re.compile(r"integers in \[(-?\d+), *(-?\d+)\)$")
_PERMUTED_ROWS = "each row a random permutation of 0..ne0-1 (as floats, no ties)"
_CAUSAL = "causal: 0 if key <= query + (ne0-ne1) else -inf"


def _redrawable(spec):
    """Can this input be drawn anew, at another shape? (Row ids are, their range
    [0, N) remapped with the shapes; see variants.)"""
    if spec is None:
        return True
    init = spec.get("init", "")
    return "view" not in spec and (_UNIFORM.match(init) is not None or init in (
        _PERMUTED_ROWS, _CAUSAL) or _INTEGERS.match(init) is not None)


def _draw(spec, rng):
    """Stored data for an input from its init rule, at its ne, in its type."""
    ne = list(spec["ne"]) + [1] * (4 - len(spec["ne"]))
    shape = (ne[3], ne[2], ne[1], ne[0])
    init = spec["init"]
    m = _UNIFORM.match(init)
    if m:
        x = rng.uniform(float(m.group(1)), float(m.group(2)), size=shape).astype(np.float32)
    elif init == _PERMUTED_ROWS:
        x = rng.permuted(np.broadcast_to(np.arange(ne[0], dtype=np.float32), shape), axis=-1)
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
    return max((int(np.prod(s["ne"])) for s in inputs if s), default=0)


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


def variants(case, rng, n):
    """n variants of an op case (dicts in the case format, no output data)."""
    inputs = case["inputs"]
    remap_ok = (all(_redrawable(s) for s in inputs)
                and not BYTE_ARGS & set(case.get("args", {})))
    for _ in range(n):
        v = copy.deepcopy(case)
        v["args"] = _move_args(case.get("args", {}), rng)
        if remap_ok and rng.random() < 0.75:
            sizes = sorted({d for s in inputs if s for d in s["ne"] if d > 1})
            if rng.random() < 0.5 and _largest(inputs) <= MAX_SCALED_ELEMENTS:
                remap = {d: 2 * d for d in sizes}   # keeps every multiple a multiple (REPEAT)
            else:
                remap = {d: _other_size(d, rng) for d in sizes}
            for s in v["inputs"]:
                if s is not None:
                    s["ne"] = [remap.get(d, d) for d in s["ne"]]
                    m = _INTEGERS.match(s.get("init", ""))
                    if m and int(m.group(1)) == 0 and int(m.group(2)) in remap:
                        s["init"] = f"integers in [0, {remap[int(m.group(2))]})"     # row ids
            for k, a in v["args"].items():
                if (case["call"], k) in SIZE_ARGS:
                    v["args"][k] = remap.get(a, a)
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
    variant's shapes or arguments, or the backend does not run it."""
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
