"""ops-check: rebuild ggml's op case files and model files, compute them on a backend and
compare with the stored reference results (the rules of OPS_CASES.md / test-backend-ops).

Each PATH is an op case file (a JSON list of cases), a model file (a JSON object with
"calls"), or a folder: every *.json in it and in its sub-folders. Every file is read and
checked before the first case runs. Prints a line per case (OK, FAIL or SKIP, with the
error and the tolerance), then `N passed, M failed, K skipped`; the exit status is 1
when a case failed. With --time each case is also computed repeatedly after a warm-up,
and its median compute time is reported (`compute_us_median` and `n_nodes` with --json).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import json
import os
from typing import Any, Iterator, Sequence

import numpy as np

from ggml_py import backends, ops, quants
from ggml_py.tools import cli
from ggml_py._backend import Backend, tensor_get, tensor_set
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.runtime import time_graph_compute
from ggml_py._core import Context, Graph
from ggml_py.errors import BackendError, CaseFormatError, GgmlPyError, GraphError

FLT_MAX = float(np.finfo(np.float32).max)
# what a malformed case, one too large to allocate, or an op the backend gets wrong
# raises: that case fails, the run goes on
CASE_ERRORS = (GgmlPyError, KeyError, ValueError, TypeError, AttributeError, IndexError)


# ---------------------------------------------------------------------------
# backends by name (the registry of ggml_py.backends: those that compute)

def check_backend_options(name: str, *, rpc: str | None = None,
                          threads: int | None = None) -> None:
    """BackendError unless `name` is a computing backend and the options fit it."""
    names = backends.available(computes=True)
    if name not in names:
        raise BackendError(f"unknown backend {name!r}; ops-check runs on {', '.join(names)}")
    if name == "rpc" and rpc is None:
        raise BackendError("the rpc backend needs its server: --rpc HOST:PORT")
    if name != "rpc" and rpc is not None:
        raise BackendError(f"--rpc names a server for the rpc backend, not for {name}")
    if threads is not None and name != "cpu":
        raise BackendError(f"--threads sets the cpu backend's threads, not {name}'s")


def make_backend(name: str, *, rpc: str | None = None, threads: int | None = None) -> Backend:
    """A new backend of the registry's computing backends ('cpu', 'opencl', ...); `rpc`
    is the server ('host:port') of the 'rpc' backend, `threads` the CPU's thread count."""
    check_backend_options(name, rpc=rpc, threads=threads)
    if name == "rpc":
        return backends.create(name, rpc)
    return backends.create(name, n_threads=threads) if threads is not None else backends.create(name)


def _time_into(res: dict[str, Any], backend: Backend, graph: Graph, time_reps: int) -> None:
    """With time_reps > 0: the case's compute time (time_graph_compute) into `res`."""
    if time_reps > 0:
        t = time_graph_compute(backend, graph, reps=time_reps)
        res.update(compute_us_median=round(t["compute_us_median"], 3), n_nodes=graph.n_nodes)


# ---------------------------------------------------------------------------
# standalone allocation (ggml_backend_alloc_ctx_tensors, as test-backend-ops does)

class HostAllocation:
    """Places tensors in buffers of the backend's buffer type (alloc_ctx_tensors_from_buft,
    view sources first) and keeps the buffers alive."""

    def __init__(self, backend):
        self.backend = backend
        self.buft = backend.get_default_buffer_type()
        self.buffers = []

    def alloc_tensors(self, tensors):
        order = {}
        for t in tensors:
            chain = []
            while t is not None and t not in order:
                chain.append(t)
                t = t.view_src
            for x in reversed(chain):
                order[x] = None
        self.buffers += alloc_ctx_tensors_from_buft(list(order), self.buft)
        return self

    def alloc(self, t):
        return self.alloc_tensors([t])

    def alloc_graph(self, graph):
        return self.alloc_tensors(list(graph.leafs) + list(graph.nodes))


def prepare(backend, out, feeds, graph_size=64):
    """The graph of `out` with every tensor in its own host buffer of `backend`, the
    (tensor, numpy array) `feeds` written first; returns (graph, allocation)."""
    alloc = HostAllocation(backend)
    for t, arr in feeds:
        alloc.alloc(t)
        tensor_set(t, np.ascontiguousarray(arr))
    graph = Graph(graph_size)
    graph.build_forward_expand(out)
    alloc.alloc_graph(graph)
    return graph, alloc


def compute(backend, graph):
    """Allocate what `graph` still needs (one buffer per tensor) and compute it."""
    alloc = HostAllocation(backend).alloc_graph(graph)
    backend.graph_compute(graph)
    return alloc


# ---------------------------------------------------------------------------
# data

def decode(type_name, ne, b64):
    """Stored case data -> numpy array in numpy order (raw rows for block types)."""
    raw = base64.b64decode(b64)
    ne = list(ne) + [1] * (4 - len(ne))
    if quants.is_quantized(type_name):
        rb = quants.row_bytes(type_name, ne[0])
        want = rb * ne[1] * ne[2] * ne[3]
        if len(raw) != want:
            raise CaseFormatError(f"{type_name}{ne}: {len(raw)} data bytes, expected {want}")
        return np.frombuffer(raw, dtype=np.uint8).reshape(ne[3], ne[2], ne[1], rb)
    try:
        dt = quants.PLAIN_DTYPES[type_name]
    except KeyError:
        raise CaseFormatError(f"unknown tensor type {type_name!r}") from None
    want = dt.itemsize * ne[0] * ne[1] * ne[2] * ne[3]
    if len(raw) != want:
        raise CaseFormatError(f"{type_name}{ne}: {len(raw)} data bytes, expected {want}")
    return np.frombuffer(raw, dtype=dt).reshape(ne[3], ne[2], ne[1], ne[0])


def as_float(type_name, arr):
    if quants.is_quantized(type_name) or type_name in ("f16", "bf16", "f32", "f64"):
        return quants.to_f32(type_name, arr).astype(np.float64)
    return np.asarray(arr).astype(np.float64)


def read_tensor(backend, t):
    """A tensor's elements in logical order, numpy order (raw rows for block types): the
    bytes it spans (tensor_get), laid out with its strides."""
    raw = np.frombuffer(tensor_get(t), dtype=np.uint8)
    ne, nb = t.ne, t.nb
    if quants.is_quantized(t.type):
        shape, strides, dtype = (ne[3], ne[2], ne[1], quants.row_bytes(t.type, ne[0])), \
            (nb[3], nb[2], nb[1], 1), np.uint8
    else:
        shape, strides, dtype = (ne[3], ne[2], ne[1], ne[0]), tuple(reversed(nb)), \
            quants.PLAIN_DTYPES[t.type]
    if 0 in shape:
        return np.zeros(shape, dtype=dtype)
    return np.array(np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides))


def _write(backend, t, arr):
    tensor_set(t, np.ascontiguousarray(arr))


# ---------------------------------------------------------------------------
# comparison rules

def nmse(ref, x):
    """(error, message): test-backend-ops' NMSE with its NaN / inf rules."""
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if ref.shape != x.shape:
        return float("inf"), f"{x.size} values, reference has {ref.size}"
    if np.isnan(x).any():
        return float("inf"), f"NaN in result at {int(np.flatnonzero(np.isnan(x))[0])}"
    if np.isnan(ref).any():
        return float("inf"), "NaN in reference"
    ri = np.isinf(ref) | (np.abs(ref) >= FLT_MAX)
    xi = np.isinf(x) | (np.abs(x) >= FLT_MAX)
    bad = (ri != xi) | (ri & (np.sign(ref) != np.sign(x)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return float("inf"), f"infinity mismatch at {i}: got {x[i]}, reference {ref[i]}"
    keep = ~ri
    r, v = ref[keep], x[keep]
    num = float(np.sum((r - v) ** 2))
    den = float(np.sum(r ** 2))
    if den == 0.0:
        return (0.0 if num == 0.0 else float("inf")), ""
    return num / den, ""


def compare(rule, type_name, ref, got, tolerance):
    """(passed, error, message) for one output under a case's rule."""
    if rule == "exact":
        same = ref.shape == got.shape and np.array_equal(ref, got)
        n = int(np.sum(ref != got)) if ref.shape == got.shape else -1
        return same, (0.0 if same else float(n)), "" if same else f"{n} values differ"
    if rule == "set_per_row":
        a = np.sort(ref.reshape(-1, ref.shape[-1]), axis=-1)
        b = np.sort(got.reshape(-1, got.shape[-1]), axis=-1)
        bad = int(np.sum(np.any(a != b, axis=-1))) if a.shape == b.shape else -1
        return bad == 0, float(bad), "" if bad == 0 else f"{bad} rows hold other indices"
    if rule != "nmse":
        raise CaseFormatError(f"unknown compare rule {rule!r}")
    err, msg = nmse(as_float(type_name, ref), as_float(type_name, got))
    return err <= tolerance, err, msg


# ---------------------------------------------------------------------------
# building

def _call(ctx, call, inputs, args):
    try:
        f = ops.builder(call)
    except GraphError:
        raise NotImplementedError(f"no builder for {call}") from None
    return f(ctx, *inputs, **args)


def _check_meta(t, want_type, want_ne, what):
    ne = list(want_ne) + [1] * (4 - len(want_ne))
    if t.type != want_type or list(t.ne) != ne:
        raise CaseFormatError(f"{what}: built {t.type}{list(t.ne)}, case says {want_type}{ne}")


def _make_input(ctx, backend, alloc, spec, stored):
    """A case input: the stored tensor with its data, then its view ops."""
    if spec is None:
        return None
    view = spec.get("view")
    sname = view["of"] if view else spec["name"]
    sne = view["stored_ne"] if view else spec["ne"]
    base = ops.new_tensor(ctx, spec["type"], sne, name=sname[:63])
    alloc.alloc(base)
    _write(backend, base, decode(spec["type"], sne, spec["data"]))
    stored[sname] = (base, spec)
    t = base
    if view:
        for o in view["ops"]:
            t = _call(ctx, o["call"], [t], o.get("args", {}))
        want_nb = list(view.get("nb", t.nb))
        if list(t.nb) != want_nb or t.view_offs != view.get("offset", t.view_offs):
            raise CaseFormatError(f"input {spec['name']}: view has nb {list(t.nb)} offset "
                                  f"{t.view_offs}, case says {want_nb} offset {view.get('offset')}")
        t.name = spec["name"][:63]
    _check_meta(t, spec["type"], spec["ne"], f"input {spec['name']}")
    return t


def build_case(ctx, case, backend, alloc):
    """An op case's result tensor, built in ctx by ggml_py's op builders from its
    inputs, which are placed by `alloc` and written first; and the stored inputs
    {name: (tensor, spec)}."""
    stored = {}
    inputs = [_make_input(ctx, backend, alloc, s, stored) for s in case["inputs"]]
    return _call(ctx, case["call"], inputs, case.get("args", {})), stored


@contextlib.contextmanager
def _case_outcome(res):
    """How a case ends, into `res`: an op without a builder skips it, a malformed case or
    an op the backend gets wrong fails it; the run goes on."""
    try:
        yield
    except NotImplementedError as e:
        res.update(skipped=True, message=str(e))
    except CASE_ERRORS as e:
        res.update(passed=False, message=f"{type(e).__name__}: {e}")


def run_case(case, backend, time_reps=0):
    """Rebuild, compute and compare one op case; returns the result dict (timed with
    time_reps > 0)."""
    name = case.get("name", "?")
    res = {"name": name, "passed": False, "error": None, "tolerance": case.get("tolerance"),
           "skipped": False, "message": ""}
    with _case_outcome(res):
        ctx = Context(name)
        alloc = HostAllocation(backend)
        out, stored = build_case(ctx, case, backend, alloc)
        o = case["output"]
        _check_meta(out, o["type"], o["ne"], "output")
        if out.op != o["op"]:
            raise CaseFormatError(f"output op is {out.op}, case says {o['op']}")
        if list(out.op_params) != list(o["op_params"]):
            raise CaseFormatError(f"output op_params {out.op_params} differ from the case's "
                                  f"{o['op_params']}")
        if not backend.supports_op(out):
            res["skipped"] = True
            res["message"] = f"backend {backend.name} does not support {out.op}"
            return res
        g = Graph(64)
        g.build_forward_expand(out)
        alloc.alloc_graph(g)
        backend.graph_compute(g)
        tol = float(case.get("tolerance", 1e-7))
        rule = case.get("compare", "nmse")
        ref = decode(o["type"], o["ne"], o["data"])
        got = read_tensor(backend, out)
        ok, err, msg = compare(rule, o["type"], ref, got, tol)
        for sname, b64 in (case.get("after") or {}).items():
            if sname not in stored:
                raise CaseFormatError(f"'after' names {sname!r}, which is no stored input")
            base, spec = stored[sname]
            sne = spec["view"]["stored_ne"] if spec.get("view") else spec["ne"]
            aref = decode(spec["type"], sne, b64)
            aok, aerr, amsg = compare("nmse" if rule == "nmse" else "exact", spec["type"], aref,
                                      read_tensor(backend, base), tol)
            if not aok:
                ok = False
                msg = f"after: {sname}: {amsg or f'nmse {aerr:.3g}'}"
            err = max(err, aerr)
        res.update(passed=bool(ok), error=float(err), message=msg)
        _time_into(res, backend, g, time_reps)
    return res


def run_model(model, backend, time_reps=0):
    """Rebuild a whole-model file, compute it and compare output and checkpoints (timed
    with time_reps > 0)."""
    name = model.get("name", "?")
    tol = float(model.get("tolerance", 2e-3))
    res = {"name": name, "passed": False, "error": None, "tolerance": tol, "skipped": False,
           "message": ""}
    with _case_outcome(res):
        ctx = Context(name)
        alloc = HostAllocation(backend)
        env = {}
        for spec in list(model["weights"]) + list(model["inputs"]):
            t = ops.new_tensor(ctx, spec["type"], spec["ne"], name=spec["name"][:63])
            alloc.alloc(t)
            _write(backend, t, decode(spec["type"], spec["ne"], spec["data"]))
            env[spec["name"]] = t
        for c in model["calls"]:
            ins = []
            for n in c["inputs"]:
                if n is None:
                    ins.append(None)
                elif n in env:
                    ins.append(env[n])
                else:
                    raise CaseFormatError(f"call {c['call']} -> {c['result']}: unknown input {n!r}")
            t = _call(ctx, c["call"], ins, c.get("args", {}))
            t.name = c["result"][:63]
            _check_meta(t, c["type"], c["ne"], f"result {c['result']}")
            if c.get("op") and t.op != c["op"]:
                raise CaseFormatError(f"result {c['result']}: op {t.op}, model says {c['op']}")
            env[c["result"]] = t
        o = model["output"]
        targets = [(o["name"], o)] + [(cp["name"], cp) for cp in model.get("checkpoints", [])]
        g = Graph(max(64, 4 * len(model["calls"])))
        for n, spec in targets:
            if n not in env:
                raise CaseFormatError(f"model output/checkpoint {n!r} is never computed")
            g.build_forward_expand(env[n])
        for t in g.nodes:
            if not backend.supports_op(t):
                res.update(skipped=True, message=f"backend {backend.name} does not support {t.op}")
                return res
        alloc.alloc_graph(g)
        backend.graph_compute(g)
        worst, msgs, ok = 0.0, [], True
        for n, spec in targets:
            ref = decode(spec["type"], spec["ne"], spec["data"])
            got = read_tensor(backend, env[n])
            p, err, msg = compare(model.get("compare", "nmse"), spec["type"], ref, got, tol)
            worst = max(worst, err)
            if not p:
                ok = False
                msgs.append(f"{n}: {msg or f'nmse {err:.3g}'}")
        res.update(passed=ok, error=worst, message="; ".join(msgs))
        _time_into(res, backend, g, time_reps)
    return res


# ---------------------------------------------------------------------------
# files

def case_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The files behind `paths`: a folder means every *.json in it and below."""
    files: list[str] = []
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise FileNotFoundError(2, "no such file or folder", p)
    return files


def load_cases(path: str) -> list[tuple[str, dict[str, Any]]]:
    """[(kind, case)] of one file: kind 'op' for op cases, 'model' for a model file.
    CaseFormatError names the file when it is neither."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaseFormatError(f"{path}: not a JSON file ({e})") from None
    if isinstance(data, dict) and "calls" in data:
        return [("model", data)]
    if isinstance(data, dict) and "call" in data:
        return [("op", data)]
    if isinstance(data, list) and data and all(isinstance(c, dict) and "call" in c
                                               for c in data):
        return [("op", c) for c in data]
    raise CaseFormatError(f"{path}: neither a list of op cases (objects with \"call\") "
                          f"nor a model file (an object with \"calls\")")


def iter_results(paths: Sequence[str | os.PathLike[str]], backend_name: str = "cpu", *,
                 rpc: str | None = None, threads: int | None = None,
                 time_reps: int = 0) -> Iterator[dict[str, Any]]:
    """Result dicts, case by case; every file is loaded and checked before the first
    case runs. rpc/threads: make_backend's options; time_reps > 0 times each case."""
    check_backend_options(backend_name, rpc=rpc, threads=threads)
    loaded = [(path, load_cases(path)) for path in case_files(paths)]
    backend = make_backend(backend_name, rpc=rpc, threads=threads)
    for path, cases in loaded:
        for kind, case in cases:
            run = run_model if kind == "model" else run_case
            r = run(case, backend, time_reps)
            r["file"] = path
            r["kind"] = kind
            yield r


def run_ops_check(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                  backend_name: str = "cpu", **options: Any) -> list[dict[str, Any]]:
    """Run every case of the given files/folders; a list of result dicts
    {name, passed, error, tolerance, skipped, message, file, kind} (and
    compute_us_median, n_nodes when timed); options as iter_results'."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return list(iter_results(paths, backend_name, **options))


def _fmt(r: dict[str, Any]) -> str:
    if r["skipped"]:
        status = "SKIP"
    else:
        status = "OK  " if r["passed"] else "FAIL"
    err = "" if r["error"] is None else f" err={r['error']:.3g}"
    tol = "" if r["tolerance"] is None else f" tol={r['tolerance']:.3g}"
    msg = f"  {r['message']}" if r.get("message") else ""
    timed = (f" {r['compute_us_median']:.1f} us ({r['n_nodes']} nodes)"
             if "compute_us_median" in r else "")
    return f"{status} {r['name']}{err}{tol}{timed}{msg}"


# ---------------------------------------------------------------------------
# the command line: `ggml-py ops-check`

def add_arguments(p: argparse.ArgumentParser) -> None:
    names = backends.available(computes=True)
    p.add_argument("paths", nargs="+", metavar="PATH", type=cli.input_file_or_folder("*.json"),
                   help="an op case file, a model file, or a folder of them")
    p.add_argument("--backend", default="cpu", choices=names, metavar="NAME",
                   help=f"the backend to compute on: {', '.join(names)} (default: cpu)")
    p.add_argument("--rpc", type=cli.endpoints, metavar="HOST:PORT",
                   help="the ggml RPC server of --backend rpc (start one with "
                        "`python -m ggml_py.rpc_server`)")
    p.add_argument("--json", action="store_true", help="one JSON object per case and line")
    p.add_argument("--time", action="store_true",
                   help="also time each case: the median compute time over --reps computes "
                        "after a warm-up (compute_us_median and n_nodes with --json)")
    p.add_argument("--reps", type=cli.count(1), metavar="N",
                   help="timed computes per case with --time (default 20)")
    p.add_argument("--threads", type=cli.count(1), metavar="N",
                   help="threads of the cpu backend (default: the cores this process may use)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.rpc is not None and len(args.rpc) != 1:
        raise cli.UsageError(f"--rpc takes one server for ops-check, got {', '.join(args.rpc)}")
    if args.reps is not None and not args.time:
        raise cli.UsageError("--reps would be ignored without --time")
    rpc = args.rpc[0] if args.rpc else None
    try:
        check_backend_options(args.backend, rpc=rpc, threads=args.threads)
    except BackendError as e:
        raise cli.UsageError(str(e)) from None
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    time_reps = (args.reps or 20) if args.time else 0
    for r in iter_results(args.paths, args.backend, rpc=rpc, threads=args.threads,
                          time_reps=time_reps):
        counts["skipped" if r["skipped"] else "passed" if r["passed"] else "failed"] += 1
        if args.json:
            d = dict(r)
            if d["error"] is not None and not np.isfinite(d["error"]):
                d["error"] = None if np.isnan(d["error"]) else str(d["error"])
            print(json.dumps(d), flush=True)
        else:
            print(_fmt(r), flush=True)
    print(", ".join(f"{n} {k}" for k, n in counts.items()))
    return cli.EXIT_FAILED if counts["failed"] else cli.EXIT_OK
