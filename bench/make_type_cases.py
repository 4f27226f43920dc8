"""Op cases and model files for the weight types ggml_py is gaining, computed by ggml
0.10.1's own CPU backend: tests/data/ops/types/{mul_mat,mul_mat_id,get_rows,cpy,set_rows}.json,
in the op-case format of OPS_CASES.md (the conventions of tests/data/ops/*.json: names, desc
strings in test-backend-ops style, init, base64 data, output, tolerance, compare), and
tests/data/ops/models/llama_2L_{q4_K_M,q6_K,iq4_nl}.json, whole-model files in the format
and conventions of llama_2L.json.

    python bench/make_type_cases.py            # write all eight files, then self-check them
    python bench/make_type_cases.py --check    # only the self-check of the files as they are
    python bench/make_type_cases.py --only models   # (or cases) only the model files
    python bench/make_type_cases.py --out DIR --models-out DIR2   # write (and check) elsewhere

Regenerate with `python bench/make_type_cases.py` (deterministic: seeded per case by the
case's name; ggml 0.10.1 found as bench_vs_ggml.py finds it, --ggml-lib DIR).

The cases:
- MUL_MAT, src0 in q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs,
  mxfp4, src1 f32: a vector (m=16, n=1, k=512), a batch (m=16, n=8, k=256, weights
  quantised with an importance matrix of ones, as test-backend-ops does half the time) and
  a broadcast over dims 2/3 (m=8, n=1, k=256, bs/nr [2,1]/[2,1] or [1,2]/[1,2]).
- MUL_MAT_ID, as [256, 8, 4], n_used 2, ids a view of per-token permutations of 0..3, b
  [256, 2, n_tok] or (b=True) [256, 1, n_tok]; once per type.
- GET_ROWS, n=256, once per type (plain, batched or with a view of the row ids).
- CPY and SET_ROWS from f32 into q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl (the types
  test-backend-ops gives a tolerance for): plain, a permuted source, a store into a view
  of a cache (rows 2.. of [64, 8]); SET_ROWS plain (i64), broadcast or viewed (i32) and
  into a view of a cache. q8_0, which tests/data/ops already covers, gets one of each.
Stored weights are ggml_quantize_chunk of uniform(-1, 1) values (uniform(-150, 150) for
CPY's destinations, as test-backend-ops draws them); the output is what ggml's CPU backend
computes on 1 thread (ggml_backend_cpu_init, tensors in the context's own memory, so no
repacking). Tolerances are test-backend-ops' max_nmse_err of each test class.

The model files: bench_vs_ggml.model_file('llama', n_layer=2, n_embd=256, n_tokens=6,
seed=0, mix=...) in llama.cpp's Q4_K_M, Q6_K and IQ4_NL weight mixes (bench_vs_ggml.MIXES:
Q4_K_M = q4_K with q6_K attn_v/ffn_down/output; Q6_K = all q6_K; IQ4_NL = iq4_nl with a
q6_K output; the token table in the mix's type too; norms f32). Head size 64, 4/2 heads,
n_ff 512, vocab 256 (model_file fixes those), so each file is 1.1 to 1.5 MB. The weights are
ggml_quantize_chunk bytes of model_file's float32 values (model_file's own call of ggml_py's
reference quantiser is compared with them and reported, not used); every call's op, type
and ne, the logits and the checkpoints (token embeddings, each layer's output, the final
norm) are what ggml's CPU backend computes on 1 thread for the calls built with ggml's own
functions; tolerance NMSE 2e-3 as llama_2L.json's. The self-check rebuilds each model from
its JSON in ggml (bit for bit, every call's op/type/ne), through ggml_py's model reader and
Mirror where ggml_py can build it (bit for bit), and compares it with a float64 numpy forward
pass of the dequantised weights (within the tolerance). The same check reproduces
llama_2L.json bit for bit.

The self-check (always run after writing) reads every case back from its file and
rebuilds it in ggml: through ggml_py's case reader and bench_vs_ggml.Mirror where
ggml_py can build the case, else straight from the JSON through ggml's own functions
(ggml_new_tensor, the view ops, the op); either way the output (and `after`) must come
back bit for bit, with the stored type, ne, op and op_params. It also checks the cases
against independent references: GET_ROWS equals ggml's to_float of the rows, CPY and
SET_ROWS equal the CPU quantiser (from_float) of the source rows, and a float64 product
of the dequantised weights lies within each MUL_MAT(_ID) case's tolerance.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_vs_ggml import GgmlTensor, HOW_TO_GET_GGML, InitParams, find_ggml  # noqa: E402
from ggml_quants_ref import TYPE_IDS, GgmlQuants  # noqa: E402

OUT_DIR = os.path.join(HERE, "..", "tests", "data", "ops", "types")
SEED = 20251205

WEIGHT_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
                "iq4_nl", "iq4_xs", "mxfp4"]
WRITE_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"]

IDS = dict(TYPE_IDS, i32=26, i64=27)
PLAIN = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}
ZERO_PARAMS = [0] * 16


# ---------------------------------------------------------------------------
# ggml through ctypes

class Lib:
    """The ggml functions that build, compute and read the cases."""

    def __init__(self, lib_dir):
        self.q = GgmlQuants(lib_dir)
        load = lambda name: ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)  # noqa: E731
        base, cpu = load("libggml-base.so"), load("libggml-cpu.so")
        load("libggml.so")
        P, T, I64, SZ = ctypes.c_void_p, ctypes.POINTER(GgmlTensor), ctypes.c_int64, ctypes.c_size_t
        I = ctypes.c_int
        sigs = [(base, "ggml_init", P, [InitParams]), (base, "ggml_free", None, [P]),
                (base, "ggml_new_tensor", T, [P, I, I, ctypes.POINTER(I64)]),
                (base, "ggml_new_graph_custom", P, [P, SZ, ctypes.c_bool]),
                (base, "ggml_build_forward_expand", None, [P, T]),
                (base, "ggml_tensor_overhead", SZ, []),
                (base, "ggml_graph_overhead_custom", SZ, [SZ, ctypes.c_bool]),
                (base, "ggml_nbytes", SZ, [T]),
                (base, "ggml_op_name", ctypes.c_char_p, [I]),
                (base, "ggml_mul_mat", T, [P, T, T]),
                (base, "ggml_mul_mat_id", T, [P, T, T, T]),
                (base, "ggml_get_rows", T, [P, T, T]),
                (base, "ggml_cpy", T, [P, T, T]),
                (base, "ggml_set_rows", T, [P, T, T, T]),
                (base, "ggml_view_1d", T, [P, T, I64, SZ]),
                (base, "ggml_view_2d", T, [P, T, I64, I64, SZ, SZ]),
                (base, "ggml_view_3d", T, [P, T, I64, I64, I64, SZ, SZ, SZ]),
                (base, "ggml_view_4d", T, [P, T, I64, I64, I64, I64, SZ, SZ, SZ, SZ]),
                (base, "ggml_permute", T, [P, T, I, I, I, I]),
                (base, "ggml_transpose", T, [P, T]),
                (base, "ggml_rms_norm", T, [P, T, ctypes.c_float]),
                (base, "ggml_mul", T, [P, T, T]),
                (base, "ggml_add", T, [P, T, T]),
                (base, "ggml_reshape_3d", T, [P, T, I64, I64, I64]),
                (base, "ggml_rope_ext", T, [P, T, T, T, I, I, I] + [ctypes.c_float] * 6),
                (base, "ggml_soft_max_ext", T, [P, T, T, ctypes.c_float, ctypes.c_float]),
                (base, "ggml_cont", T, [P, T]),
                (base, "ggml_cont_2d", T, [P, T, I64, I64]),
                (base, "ggml_swiglu_split", T, [P, T, T]),
                (base, "ggml_backend_graph_compute", I, [P, P]),
                (base, "ggml_backend_free", None, [P]),
                (cpu, "ggml_backend_cpu_init", P, []),
                (cpu, "ggml_backend_cpu_set_n_threads", None, [P, I])]
        for lib, name, res, args in sigs:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)

    def row_bytes(self, type_name, ne0):
        if type_name in PLAIN:
            return np.dtype(PLAIN[type_name]).itemsize * ne0
        qk, size = self.q.block(type_name)
        assert ne0 % qk == 0, (type_name, ne0)
        return ne0 // qk * size


# the view ops a case may name, with their arguments in C order
VIEW_ARGS = {"ggml_view_1d": ["ne0", "offset"],
             "ggml_view_2d": ["ne0", "ne1", "nb1", "offset"],
             "ggml_view_3d": ["ne0", "ne1", "ne2", "nb1", "nb2", "offset"],
             "ggml_view_4d": ["ne0", "ne1", "ne2", "ne3", "nb1", "nb2", "nb3", "offset"],
             "ggml_permute": ["axis0", "axis1", "axis2", "axis3"],
             "ggml_transpose": []}
OPS = {"ggml_mul_mat": 2, "ggml_mul_mat_id": 3, "ggml_get_rows": 2, "ggml_cpy": 2,
       "ggml_set_rows": 3}


def type_name_of(type_id):
    return {v: k for k, v in IDS.items()}[type_id]


def read_logical(lib, tp):
    """A ggml tensor's elements in logical order (raw rows for block types), as bytes."""
    c = tp.contents
    t = type_name_of(c.type)
    ne, nb = list(c.ne), list(c.nb)
    if t in PLAIN:
        dtype = np.dtype(PLAIN[t])
        shape, strides, last = (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], nb[0]), dtype.itemsize
    else:
        dtype = np.dtype(np.uint8)
        rb = lib.row_bytes(t, ne[0])
        shape, strides, last = (ne[3], ne[2], ne[1], rb), (nb[3], nb[2], nb[1], 1), 1
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + last
    raw = ctypes.string_at(c.data, span)
    arr = np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)
    return np.ascontiguousarray(arr).tobytes()


def compute_in_ggml(lib, case):
    """Build a case straight from its JSON form with ggml's functions, compute it on ggml's
    CPU backend (1 thread) and return {type, ne, op, op_params, data, is_view_of?, after}."""
    specs = [s for s in case["inputs"] if s is not None]
    size = 1 << 20
    for s in specs:
        sne = s["view"]["stored_ne"] if s.get("view") else s["ne"]
        size += lib.row_bytes(s["type"], sne[0]) * sne[1] * sne[2] * sne[3] + 256
    size += 64 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead_custom(64, False)
    size *= 2
    ctx = lib.ggml_init(InitParams(size, None, False))
    backend = lib.ggml_backend_cpu_init()
    try:
        lib.ggml_backend_cpu_set_n_threads(backend, 1)
        stored, args = {}, []
        for s in case["inputs"]:
            if s is None:
                args.append(None)
                continue
            view = s.get("view")
            sname = view["of"] if view else s["name"]
            sne = view["stored_ne"] if view else s["ne"]
            ne = (ctypes.c_int64 * 4)(*sne)
            base = lib.ggml_new_tensor(ctx, IDS[s["type"]], 4, ne)
            raw = base64.b64decode(s["data"])
            if len(raw) != lib.ggml_nbytes(base):
                raise ValueError(f"{case['name']}: input {s['name']}: {len(raw)} bytes, "
                                 f"ggml_nbytes {lib.ggml_nbytes(base)}")
            ctypes.memmove(base.contents.data, raw, len(raw))
            stored[sname] = (base, s)
            t = base
            if view:
                for o in view["ops"]:
                    fn = getattr(lib, o["call"])
                    t = fn(ctx, t, *[o["args"][k] for k in VIEW_ARGS[o["call"]]])
                c = t.contents
                got = (list(c.ne), list(c.nb), int(c.view_offs))
                want = (s["ne"], view["nb"], view["offset"])
                if got != want:
                    raise ValueError(f"{case['name']}: view {s['name']}: ggml made {got}, case says {want}")
            elif list(t.contents.ne) != s["ne"]:
                raise ValueError(f"{case['name']}: input {s['name']} ne {list(t.contents.ne)}")
            args.append(t)
        if case.get("args"):
            raise ValueError(f"{case['name']}: unexpected args {case['args']}")
        if len(args) != OPS[case["call"]]:
            raise ValueError(f"{case['name']}: {case['call']} takes {OPS[case['call']]} tensors")
        out = getattr(lib, case["call"])(ctx, *args)
        graph = lib.ggml_new_graph_custom(ctx, 64, False)
        lib.ggml_build_forward_expand(graph, out)
        if lib.ggml_backend_graph_compute(backend, graph) != 0:
            raise RuntimeError(f"{case['name']}: ggml_backend_graph_compute failed")
        c = out.contents
        res = {"type": type_name_of(c.type), "ne": list(c.ne),
               "op": lib.ggml_op_name(c.op).decode(), "op_params": list(c.op_params),
               "data": base64.b64encode(read_logical(lib, out)).decode()}
        if c.view_src:
            roots = [n for n, (b, _) in stored.items()
                     if ctypes.cast(b, ctypes.c_void_p).value == c.view_src]
            if len(roots) != 1:
                raise ValueError(f"{case['name']}: the result views no stored input")
            res["is_view_of"] = roots[0]
            _, spec = stored[roots[0]]
            if spec.get("view"):            # written through a view: the whole tensor after
                b, _ = stored[roots[0]]
                res["after"] = {roots[0]: base64.b64encode(
                    ctypes.string_at(b.contents.data, lib.ggml_nbytes(b))).decode()}
        return res
    finally:
        lib.ggml_backend_free(backend)
        lib.ggml_free(ctx)


# ---------------------------------------------------------------------------
# making cases

def b64(arr):
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()


def rng_for(name):
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def uniform(rng, ne, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=tuple(reversed(ne))).astype(np.float32)


class Maker:
    def __init__(self, lib):
        self.lib = lib

    def tensor(self, rng, name, type_name, ne, lo=-1.0, hi=1.0, imatrix=False):
        """A stored tensor: uniform values, quantised by ggml_quantize_chunk for block types."""
        x = uniform(rng, ne, lo, hi)
        init = f"uniform({lo:g}, {hi:g})"
        if type_name == "f32":
            data = x
        else:
            im = np.ones(ne[0], np.float32) if imatrix else None
            data = self.lib.q.quantize_chunk(type_name, x, imatrix=im)
            if imatrix:
                init += ", ggml_quantize_chunk with an importance matrix of ones"
        return {"name": name, "type": type_name, "ne": list(ne), "init": init, "data": b64(data)}

    def finish(self, name, desc, call, inputs, tolerance):
        case = {"name": name, "desc": desc, "call": call, "args": {}, "inputs": inputs}
        res = compute_in_ggml(self.lib, case)
        out = {"type": res["type"], "ne": res["ne"], "op": res["op"],
               "op_params": res["op_params"], "data": res["data"]}
        if "is_view_of" in res:
            out["is_view_of"] = res["is_view_of"]
        case["output"] = out
        if "after" in res:
            case["after"] = res["after"]
        case["tolerance"] = tolerance
        case["compare"] = "nmse"
        return case

    # -- MUL_MAT ------------------------------------------------------------
    def mul_mat(self, name, ta, m, n, k, bs, nr, imatrix=False):
        rng = rng_for(name)
        a = self.tensor(rng, "a", ta, [k, m, bs[0], bs[1]], imatrix=imatrix)
        b = self.tensor(rng, "b", "f32", [k, n, bs[0] * nr[0], bs[1] * nr[1]])
        desc = (f"test_mul_mat(type_a={ta}, type_b=f32, m={m}, n={n}, k={k}, bs={list(bs)}, "
                f"nr={list(nr)}, per=[0, 1, 2, 3], k_v=0)")
        return self.finish(name, desc, "ggml_mul_mat", [a, b], 5e-4)

    # -- MUL_MAT_ID ---------------------------------------------------------
    def mul_mat_id(self, name, ta, n_mats, n_used, bcast_b, m, n, k, imatrix=False):
        rng = rng_for(name)
        as_ = self.tensor(rng, "as", ta, [k, m, n_mats, 1], imatrix=imatrix)
        b = self.tensor(rng, "b", "f32", [k, 1 if bcast_b else n_used, n, 1])
        ids = np.stack([rng.permutation(n_mats) for _ in range(n)]).astype(np.int32)
        ids_spec = {"name": "view_of_ids", "type": "i32", "ne": [n_used, n, 1, 1],
                    "view": {"of": "ids", "stored_ne": [n_mats, n, 1, 1],
                             "ops": [{"call": "ggml_view_2d", "args": {
                                 "ne0": n_used, "ne1": n, "nb1": 4 * n_mats, "offset": 0}}],
                             "nb": [4, 4 * n_mats, 4 * n_mats * n, 4 * n_mats * n], "offset": 0},
                    "init": f"each row a random permutation of 0..{n_mats - 1}", "data": b64(ids)}
        desc = (f"test_mul_mat_id(type_a={ta}, type_b=f32, n_mats={n_mats}, n_used={n_used}, "
                f"b={bcast_b}, m={m}, n={n}, k={k})")
        return self.finish(name, desc, "ggml_mul_mat_id", [as_, b, ids_spec], 5e-4)

    # -- GET_ROWS -----------------------------------------------------------
    def get_rows(self, name, t, n, m, r, be1, be2, v):
        rng = rng_for(name)
        a = self.tensor(rng, "in", t, [n, m, be1, be2])
        rows = rng.integers(0, m, size=(be2, be1, r)).astype(np.int32)
        spec = {"name": "rows", "type": "i32", "ne": [r, be1, be2, 1],
                "init": f"integers in [0, {m})", "data": b64(rows)}
        if v:
            spec = {"name": "view_of_rows", "type": "i32", "ne": [r // 2, be1, be2, 1],
                    "view": {"of": "rows", "stored_ne": [r, be1, be2, 1],
                             "ops": [{"call": "ggml_view_3d", "args": {
                                 "ne0": r // 2, "ne1": be1, "ne2": be2, "nb1": 4 * r,
                                 "nb2": 4 * r * be1, "offset": 0}}],
                             "nb": [4, 4 * r, 4 * r * be1, 4 * r * be1 * be2], "offset": 0},
                    "init": f"integers in [0, {m})", "data": b64(rows)}
        desc = f"test_get_rows(type={t}, n={n}, m={m}, r={r}, be1={be1}, be2={be2}, v={v})"
        return self.finish(name, desc, "ggml_get_rows", [a, spec], 1e-7)

    # -- CPY ----------------------------------------------------------------
    @staticmethod
    def cpy_tolerance(t, n):
        """test_cpy's max_nmse_err into a block type, n = elements copied."""
        e = 1.0 / 8.0 * 150.0
        if t == "iq4_nl":
            e *= 2.0
        if t in ("q5_0", "q5_1"):
            e /= 2.0
        if t == "q8_0":
            e /= 8.0
        return e * e / ((150.0 * 150.0 * 0.25) * n)

    def cpy(self, name, t, ne, permute_src=None):
        rng = rng_for(name)
        src = self.tensor(rng, "src", "f32", ne, -150, 150)
        dne = list(ne)
        if permute_src:
            p = permute_src
            nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
            vne, vnb = [0] * 4, [0] * 4
            for i in range(4):
                vne[p[i]], vnb[p[i]] = ne[i], nb[i]
            src = {"name": "src_permuted", "type": "f32", "ne": vne,
                   "view": {"of": "src", "stored_ne": list(ne),
                            "ops": [{"call": "ggml_permute", "args": {
                                f"axis{i}": p[i] for i in range(4)}}],
                            "nb": vnb, "offset": 0},
                   "init": src["init"], "data": src["data"]}
            dne = vne
        dst = self.tensor(rng, "dst", t, dne, -150, 150)
        ps = "None" if not permute_src else f"({', '.join(map(str, permute_src))})"
        desc = (f"test_cpy(type_src=f32, type_dst={t}, ne={list(ne)}, permute_src={ps}, "
                f"permute_dst=None, transpose_src=False)")
        return self.finish(name, desc, "ggml_cpy", [src, dst],
                           self.cpy_tolerance(t, ne[0] * ne[1] * ne[2] * ne[3]))

    def cpy_into_cache_view(self, name, t, n_embd, n_cache, row0, n_rows):
        rng = rng_for(name)
        cur = self.tensor(rng, "cur", "f32", [n_embd, n_rows, 1, 1], -150, 150)
        cache = self.tensor(rng, "cache", t, [n_embd, n_cache, 1, 1], -150, 150)
        rb = self.lib.row_bytes(t, n_embd)
        view = {"name": "cache_view", "type": t, "ne": [n_embd, n_rows, 1, 1],
                "view": {"of": "cache", "stored_ne": [n_embd, n_cache, 1, 1],
                         "ops": [{"call": "ggml_view_2d", "args": {
                             "ne0": n_embd, "ne1": n_rows, "nb1": rb, "offset": row0 * rb}}],
                         "nb": [self.lib.q.block(t)[1], rb, rb * n_rows, rb * n_rows],
                         "offset": row0 * rb},
                "init": cache["init"], "data": cache["data"]}
        desc = (f"KV-cache store: ggml_cpy(cur [{n_embd},{n_rows}] f32, ggml_view_2d(cache "
                f"[{n_embd},{n_cache}] {t}, rows {row0}..{row0 + n_rows - 1}))")
        return self.finish(name, desc, "ggml_cpy", [cur, view],
                           self.cpy_tolerance(t, n_embd * n_rows))

    # -- SET_ROWS -----------------------------------------------------------
    @staticmethod
    def set_rows_tolerance(t, n):
        """test_set_rows' max_nmse_err for a block type, n = ne0*r*(dims 2, 3)."""
        e = 1.0 / 8.0
        if t in ("q5_0", "q5_1"):
            e /= 2.0
        if t == "q8_0":
            e /= 8.0
        return e * e / (0.25 * n)

    @staticmethod
    def row_ids(rng, num_rows, r, c1, c2, type_idx):
        out = np.zeros((c2, c1, r), np.int64)
        for i2 in range(c2):
            for i1 in range(c1):
                out[i2, i1] = rng.permutation(num_rows)[:r]
        return out.astype(PLAIN[type_idx])

    def set_rows(self, name, t, type_idx, ne, nr23, r, v):
        rng = rng_for(name)
        D2, D3 = ne[2] * nr23[0], ne[3] * nr23[1]
        dst = self.tensor(rng, "dst", t, [ne[0], ne[1], D2, D3])
        src = self.tensor(rng, "src", "f32", [ne[0], r, D2, D3])
        ids = self.row_ids(rng, ne[1], r, ne[2], ne[3], type_idx)
        isz = np.dtype(PLAIN[type_idx]).itemsize
        idx = {"name": "row_idxs", "type": type_idx, "ne": [r, ne[2], ne[3], 1],
               "init": f"per index row: first r of a random permutation of 0..{ne[1] - 1}",
               "data": b64(ids)}
        if v:
            h = r // 2
            snb = [4, 4 * ne[0], 4 * ne[0] * r, 4 * ne[0] * r * D2]
            src = {"name": "view_of_src", "type": "f32", "ne": [ne[0], h, D2, D3],
                   "view": {"of": "src", "stored_ne": [ne[0], r, D2, D3],
                            "ops": [{"call": "ggml_view_4d", "args": {
                                "ne0": ne[0], "ne1": h, "ne2": D2, "ne3": D3, "nb1": snb[1],
                                "nb2": snb[2], "nb3": snb[3], "offset": 0}}],
                            "nb": snb, "offset": 0},
                   "init": src["init"], "data": src["data"]}
            inb = [isz, isz * r, isz * r * ne[2], isz * r * ne[2] * ne[3]]
            idx = {"name": "view_of_rows", "type": type_idx, "ne": [h, ne[2], ne[3], 1],
                   "view": {"of": "row_idxs", "stored_ne": [r, ne[2], ne[3], 1],
                            "ops": [{"call": "ggml_view_3d", "args": {
                                "ne0": h, "ne1": ne[2], "ne2": ne[3], "nb1": inb[1],
                                "nb2": inb[2], "offset": 0}}],
                            "nb": inb, "offset": 0},
                   "init": idx["init"], "data": idx["data"]}
        desc = (f"test_set_rows(type={t}, type_idx={type_idx}, ne={list(ne)}, "
                f"nr23={list(nr23)}, r={r}, v={v})")
        return self.finish(name, desc, "ggml_set_rows", [dst, src, idx],
                           self.set_rows_tolerance(t, ne[0] * r * D2 * D3))

    def set_rows_into_cache_view(self, name, t, n_embd, n_cache, row0, n_view, r):
        rng = rng_for(name)
        cache = self.tensor(rng, "cache", t, [n_embd, n_cache, 1, 1])
        src = self.tensor(rng, "cur", "f32", [n_embd, r, 1, 1])
        ids = self.row_ids(rng, n_view, r, 1, 1, "i64")
        rb = self.lib.row_bytes(t, n_embd)
        view = {"name": "cache_view", "type": t, "ne": [n_embd, n_view, 1, 1],
                "view": {"of": "cache", "stored_ne": [n_embd, n_cache, 1, 1],
                         "ops": [{"call": "ggml_view_2d", "args": {
                             "ne0": n_embd, "ne1": n_view, "nb1": rb, "offset": row0 * rb}}],
                         "nb": [self.lib.q.block(t)[1], rb, rb * n_view, rb * n_view],
                         "offset": row0 * rb},
                "init": cache["init"], "data": cache["data"]}
        idx = {"name": "row_idxs", "type": "i64", "ne": [r, 1, 1, 1],
               "init": f"first r of a random permutation of 0..{n_view - 1}", "data": b64(ids)}
        desc = (f"KV-cache store: ggml_set_rows(ggml_view_2d(cache [{n_embd},{n_cache}] {t}, "
                f"rows {row0}..{row0 + n_view - 1}), cur [{n_embd},{r}] f32, row_idxs [{r}] i64)")
        return self.finish(name, desc, "ggml_set_rows", [view, src, idx],
                           self.set_rows_tolerance(t, n_embd * r))


def make_all(lib):
    mk = Maker(lib)
    files = {"mul_mat": [], "mul_mat_id": [], "get_rows": [], "cpy": [], "set_rows": []}
    for i, t in enumerate(WEIGHT_TYPES):
        big = lib.q.block(t)[0] == 256
        kb = 256 if big else 128            # k of the batch, broadcast and MUL_MAT_ID cases
        kv = 512 if big else 256            # k of the vector case
        files["mul_mat"] += [
            mk.mul_mat(f"mul_mat_{t}_f32_vec_k{kv}", t, 8, 1, kv, (1, 1), (1, 1)),
            mk.mul_mat(f"mul_mat_{t}_f32_n8", t, 8, 8, kb, (1, 1), (1, 1), imatrix=True)]
        bs, nr = ((2, 1), (2, 1)) if i % 2 == 0 else ((1, 2), (1, 2))
        files["mul_mat"].append(mk.mul_mat(
            f"mul_mat_{t}_bcast_{bs[0]}x{bs[1]}_nr{nr[0]}x{nr[1]}", t, 4, 1, kb, bs, nr))
        bcast_b = i % 2 == 1
        files["mul_mat_id"].append(mk.mul_mat_id(
            f"mul_mat_id_{t}" + ("_bcast_b" if bcast_b else ""), t, 4, 2, bcast_b, 4, 2, kb,
            imatrix=i % 3 == 0))
        kind, n = i % 3, 256 if big else 128
        if kind == 0:
            files["get_rows"].append(mk.get_rows(f"get_rows_{t}", t, n, 5, 2, 1, 1, False))
        elif kind == 1:
            files["get_rows"].append(mk.get_rows(f"get_rows_{t}_batched", t, n, 3, 2, 2, 1, False))
        else:
            files["get_rows"].append(mk.get_rows(f"get_rows_{t}_view_rows", t, n, 5, 4, 1, 1, True))
    for i, t in enumerate(WRITE_TYPES):
        if t == "q8_0":     # tests/data/ops/cpy.json and set_rows.json have the others
            files["cpy"].append(mk.cpy("cpy_f32_q8_0_256", t, [256, 2, 1, 1]))
            files["set_rows"].append(mk.set_rows("set_rows_q8_0_i64_view", t, "i64",
                                                 [64, 5, 2, 1], [1, 1], 2, True))
            continue
        files["cpy"] += [
            mk.cpy(f"cpy_f32_{t}", t, [64, 2, 3, 1]),
            mk.cpy(f"cpy_f32_{t}_perm_src_rows", t, [64, 2, 3, 1], (0, 2, 1, 3)),
            mk.cpy_into_cache_view(f"cpy_f32_{t}_into_cache_view", t, 64, 8, 2, 3)]
        files["set_rows"].append(mk.set_rows(f"set_rows_{t}_i64", t, "i64", [64, 5, 1, 2],
                                             [1, 1], 2, False))
        if i % 2 == 0:
            files["set_rows"].append(mk.set_rows(f"set_rows_{t}_i32_bcast", t, "i32",
                                                 [64, 4, 1, 1], [2, 2], 1, False))
        else:
            files["set_rows"].append(mk.set_rows(f"set_rows_{t}_i32_view", t, "i32",
                                                 [64, 6, 2, 1], [1, 1], 2, True))
        files["set_rows"].append(mk.set_rows_into_cache_view(
            f"set_rows_{t}_into_cache_view", t, 64, 8, 2, 4, 2))
    return files


# ---------------------------------------------------------------------------
# writing (the layout of tests/data/ops/*.json: indent 1, number lists and view ops on
# one line)

def _dump(obj, ind, key=None):
    pad = " " * ind
    if isinstance(obj, dict) and (key is None or key not in ("args",)) and obj:
        inner = [f'{pad} {json.dumps(k)}: {_dump(v, ind + 1, k)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(inner) + "\n" + pad + "}"
    if isinstance(obj, list) and key in (None, "inputs"):
        inner = [pad + " " + _dump(v, ind + 1) for v in obj]
        return "[\n" + ",\n".join(inner) + "\n" + pad + "]"
    return json.dumps(obj)


def write_files(files, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for fam, cases in files.items():
        path = os.path.join(out_dir, fam + ".json")
        with open(path, "w") as f:
            f.write(_dump(cases, 0) + "\n")
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------
# the self-check

def _decode(lib, type_name, ne, b64s):
    raw = base64.b64decode(b64s)
    if type_name in PLAIN:
        return np.frombuffer(raw, PLAIN[type_name]).reshape(ne[3], ne[2], ne[1], ne[0])
    return np.frombuffer(raw, np.uint8).reshape(ne[3], ne[2], ne[1], lib.row_bytes(type_name, ne[0]))


def _stored(lib, spec):
    sne = spec["view"]["stored_ne"] if spec.get("view") else spec["ne"]
    return _decode(lib, spec["type"], sne, spec["data"])


def _logical(lib, spec):
    """An input's values as the op sees them (views applied with numpy)."""
    arr = _stored(lib, spec)
    if not spec.get("view"):
        return arr
    v = spec["view"]
    item = arr.itemsize
    ne, nb = spec["ne"], v["nb"]
    if spec["type"] in PLAIN:
        shape, strides = (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], nb[0])
    else:
        shape, strides = (ne[3], ne[2], ne[1], lib.row_bytes(spec["type"], ne[0])), (nb[3], nb[2], nb[1], 1)
    flat = np.ascontiguousarray(arr).reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[v["offset"] // item:], shape, strides).copy()


def _nmse(ref, x):
    ref, x = np.asarray(ref, np.float64).ravel(), np.asarray(x, np.float64).ravel()
    return float(np.sum((ref - x) ** 2) / np.sum(ref ** 2))


def independent_check(lib, case):
    """(ok, message): the case against a reference that is not ggml's graph."""
    ins, o = case["inputs"], case["output"]
    out = _decode(lib, o["type"], o["ne"], o["data"])
    call = case["call"]
    if call == "ggml_get_rows":
        a, rows = ins[0], _logical(lib, ins[1])
        w = lib.q.to_float(a["type"], _stored(lib, a))          # [be2, be1, m, n]
        d3, d2 = out.shape[0], out.shape[1]                     # rows: [1, be2, be1, r]
        ref = np.stack([np.stack([w[i3, i2][rows[0, i3, i2]] for i2 in range(d2)])
                        for i3 in range(d3)])
        same = np.array_equal(ref.view(np.uint32), out.view(np.uint32))
        return same, "" if same else "differs from ggml's to_float of the rows"
    if call in ("ggml_mul_mat", "ggml_mul_mat_id"):
        a, b = ins[0], _logical(lib, ins[1]).astype(np.float64)
        w = lib.q.to_float(a["type"], _stored(lib, a)).astype(np.float64)   # [a3, a2, m, k]
        if call == "ggml_mul_mat":
            B3, B2 = b.shape[0], b.shape[1]
            r2, r3 = B2 // w.shape[1], B3 // w.shape[0]
            ref = np.stack([np.stack([b[i3, i2] @ w[i3 // r3, i2 // r2].T for i2 in range(B2)])
                            for i3 in range(B3)])
        else:
            ids = _logical(lib, ins[2])[0, 0]                   # [n_tok, n_used]
            w = w[0]                                            # [n_exp, m, k]
            n_tok, n_used = ids.shape
            ref = np.zeros((1, n_tok, n_used, w.shape[1]))
            for t in range(n_tok):
                for e in range(n_used):
                    ref[0, t, e] = w[ids[t, e]] @ b[0, t, e % b.shape[2]]
        err = _nmse(ref, out)
        ok = err <= case["tolerance"]
        return ok, f"float64 reference nmse {err:.3g} (tolerance {case['tolerance']:.3g})"
    if call in ("ggml_cpy", "ggml_set_rows"):
        t = o["type"]
        if call == "ggml_cpy":
            src = _logical(lib, ins[0]).reshape(-1, o["ne"][0])
            ref = lib.q.from_float(t, src).reshape(out.shape)
        else:
            dst = _logical(lib, ins[0]).copy()                   # [d3, d2, d1, rb]
            src = _logical(lib, ins[1])                          # [d3, d2, r, ne0]
            idx = _logical(lib, ins[2])                          # [1, c2, c1, r]
            for i3 in range(src.shape[0]):
                for i2 in range(src.shape[1]):
                    for i in range(src.shape[2]):
                        row = idx[0, i3 % idx.shape[1], i2 % idx.shape[2], i]
                        dst[i3, i2, row] = lib.q.from_float(t, src[i3, i2, i][None])[0]
            ref = dst
        same = np.array_equal(ref, out)
        return same, "" if same else "differs from ggml's from_float of the source rows"
    return False, f"no independent check for {call}"


def mirror_bytes(lib, lib_dir, case):
    """The case's output (and after) through ggml_py's case reader and bench_vs_ggml.Mirror,
    or None with the reason when ggml_py cannot build it yet."""
    from bench_vs_ggml import Ggml, Mirror
    from ggml_py._core import Context, Graph
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.tools import opscheck
    try:
        backend = CPUBackend(n_threads=1)
        ctx = Context(case["name"])
        alloc = opscheck.HostAllocation(backend)
        out, stored = opscheck.build_case(ctx, case, backend, alloc)
        graph = Graph(64)
        graph.build_forward_expand(out)
        alloc.alloc_graph(graph)
    except Exception as e:                                   # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    g = Ggml(lib_dir)
    m = Mirror(g, graph, 1)
    try:
        m.compute()
        res = {"data": base64.b64encode(read_logical(lib, m.t[out])).decode(),
               "op": out.op, "op_params": list(out.op_params)}
        after = {}
        for sname in case.get("after") or {}:
            b = m.t[stored[sname][0]]
            after[sname] = base64.b64encode(ctypes.string_at(b.contents.data, g.ggml_nbytes(b))).decode()
        res["after"] = after
        return res, ""
    finally:
        m.close()


def self_check(lib, lib_dir, paths):
    n_ok = n_bad = n_mirror = 0
    refused = []
    for path in paths:
        with open(path) as f:
            cases = json.load(f)
        for case in cases:
            problems = []
            res = compute_in_ggml(lib, case)
            o = case["output"]
            for k in ("type", "ne", "op", "op_params", "data", "is_view_of"):
                if res.get(k) != o.get(k):
                    problems.append(f"direct rebuild: {k} differs")
            if res.get("after") != case.get("after"):
                problems.append("direct rebuild: after differs")
            mres, why = mirror_bytes(lib, lib_dir, case)
            if mres is None:
                refused.append((case["name"], why))
            else:
                n_mirror += 1
                if mres["data"] != o["data"]:
                    problems.append("Mirror: output differs")
                if mres["op"] != o["op"] or mres["op_params"] != o["op_params"]:
                    problems.append("Mirror: op/op_params differ")
                if mres["after"] != (case.get("after") or {}):
                    problems.append("Mirror: after differs")
            ok, msg = independent_check(lib, case)
            if not ok:
                problems.append(f"independent: {msg}")
            status = "OK  " if not problems else "FAIL"
            via = "direct+Mirror" if mres is not None else "direct"
            print(f"{status} {case['name']} ({via}) {msg}" + ("" if not problems else "  " + "; ".join(problems)))
            n_ok += not problems
            n_bad += bool(problems)
    print(f"\nself-check: {n_ok} OK, {n_bad} failed; {n_mirror} also rebuilt through ggml_py's "
          f"reader and Mirror, {len(refused)} not (ggml_py cannot build them yet)")
    reasons = {}
    for name, why in refused:
        reasons.setdefault(why, []).append(name)
    for why, names in reasons.items():
        print(f"  ggml_py refused {len(names)}: {why}")
    return n_bad == 0


# ---------------------------------------------------------------------------
# whole models: bench_vs_ggml.model_file's 'llama' structure in llama.cpp's weight mixes

MODEL_DIR = os.path.join(HERE, "..", "tests", "data", "ops", "models")
MODEL_MIXES = ("q4_K_M", "q6_K", "iq4_nl")
MODEL_SHAPE = dict(n_layer=2, n_embd=256, n_tokens=6, seed=0)
MODEL_TOLERANCE = 2e-3                      # llama_2L.json's (test_llama's)
ROPE_MODES = {"GGML_ROPE_TYPE_NORMAL": 0, "GGML_ROPE_TYPE_NEOX": 2}
MIX_NAMES = {"q4_K_M": "Q4_K_M", "q6_K": "Q6_K", "iq4_nl": "IQ4_NL"}

# the model calls: their tensor count and their non-tensor arguments in C order
MODEL_CALLS = {"ggml_get_rows": (2, []), "ggml_rms_norm": (1, ["eps"]),
               "ggml_mul": (2, []), "ggml_add": (2, []), "ggml_mul_mat": (2, []),
               "ggml_reshape_3d": (1, ["ne0", "ne1", "ne2"]),
               "ggml_rope_ext": (3, ["n_dims", "mode", "n_ctx_orig", "freq_base", "freq_scale",
                                     "ext_factor", "attn_factor", "beta_fast", "beta_slow"]),
               "ggml_permute": (1, ["axis0", "axis1", "axis2", "axis3"]),
               "ggml_soft_max_ext": (2, ["scale", "max_bias"]),
               "ggml_transpose": (1, []), "ggml_cont": (1, []),
               "ggml_cont_2d": (1, ["ne0", "ne1"]), "ggml_swiglu_split": (2, [])}


class _QuantsShim:
    """Stands in for bench_vs_ggml's `quants` while model_file draws a model: every
    weight is stored as ggml's own ggml_quantize_chunk bytes of model_file's float32
    values, and ggml_py's reference quantiser (quants.from_f32(cpu=False), what
    model_file calls) is tried on the same values and compared with them."""

    def __init__(self, lib, real):
        self.lib, self.real, self.log = lib, real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def from_f32(self, type_name, x, cpu=True, out=None):
        if cpu or out is not None or type_name in PLAIN:
            raise ValueError(f"model_file asked for from_f32({type_name}, cpu={cpu})")
        x = np.ascontiguousarray(x, np.float32)
        ref = self.lib.q.quantize_chunk(type_name, x)
        try:
            ours = np.ascontiguousarray(self.real.from_f32(type_name, x, cpu=False))
            ours = ours.view(np.uint8).reshape(ref.shape)
            n_diff = int(np.count_nonzero(ours != ref))
            why = "" if n_diff == 0 else f"{n_diff} of {ref.size} bytes differ"
        except Exception as e:                               # noqa: BLE001
            n_diff, why = -1, f"{type(e).__name__}: {e}"
        self.log.append({"type": type_name, "values": x, "same": n_diff == 0, "why": why})
        return ref


def _weight_range(name, ne0):
    if name == "tok_embd":
        return -1.0, 1.0
    if name.endswith("norm"):
        return 0.8, 1.2
    a = float(np.sqrt(3.0 / ne0))
    return -a, a


def model_spec(lib, mix):
    """The model file of mix `mix` without its results: weights (ggml_quantize_chunk
    bytes), inputs, calls (without op/type/ne yet); and the quantiser comparison."""
    import bench_vs_ggml as bvg
    shim = _QuantsShim(lib, bvg.quants)
    bvg.quants = shim
    try:
        m = bvg.model_file("llama", mix=mix, **MODEL_SHAPE)
    finally:
        bvg.quants = shim.real
    n_layer, E, T = MODEL_SHAPE["n_layer"], MODEL_SHAPE["n_embd"], MODEL_SHAPE["n_tokens"]
    hd = 16 if E <= 64 else 64
    H, V = E // hd, 256
    Hkv = max(1, H // 2)
    weights, log, quant_report = [], iter(shim.log), []
    for w in m["weights"]:
        arr = w["array"]
        lo, hi = _weight_range(w["name"], w["ne"][0])
        if w["type"] != "f32":
            entry = next(log)
            assert entry["type"] == w["type"]
            vals = entry["values"]
            quant_report.append((w["name"], w["type"], entry["same"], entry["why"]))
        else:
            vals = arr
        assert lo <= float(vals.min()) and float(vals.max()) <= hi, w["name"]
        weights.append({"name": w["name"], "type": w["type"], "ne": w["ne"],
                        "init": f"uniform({lo:g}, {hi:g})", "data": b64(arr)})
    assert next(log, None) is None
    inits = {"tokens": f"random token ids in [0, {V})", "pos": f"positions 0..{T - 1}",
             "kq_mask": "causal: 0 if key <= query else -inf"}
    inputs = [{"name": i["name"], "type": i["type"], "ne": i["ne"], "init": inits[i["name"]],
               "data": b64(i["array"])} for i in m["inputs"]]
    types = {w["name"]: w["type"] for w in weights}
    wt = {k: types[f"blk.0.{k}"] for k in ("attn_q", "attn_k", "attn_v", "attn_output",
                                            "ffn_gate", "ffn_up", "ffn_down")}
    wt = {"tok_embd": types["tok_embd"], **wt, "output": types["output"]}
    by_type = {}
    for k, t in wt.items():
        by_type.setdefault(t, []).append(k)
    mix_desc = ", ".join(f"{t} {'/'.join(ks)}" for t, ks in by_type.items())
    rope = next(c["args"] for c in m["calls"] if c["call"] == "ggml_rope_ext")
    config = {"n_layer": n_layer, "n_embd": E, "n_head": H, "n_head_kv": Hkv, "n_ff": 2 * E,
              "n_vocab": V, "n_tokens": T, "rms_eps": 1e-05, "n_ctx_orig": rope["n_ctx_orig"],
              "freq_base": rope["freq_base"], "freq_scale": rope["freq_scale"],
              "ext_factor": rope["ext_factor"], "attn_factor": rope["attn_factor"],
              "beta_fast": rope["beta_fast"], "beta_slow": rope["beta_slow"],
              "embd_type": types["tok_embd"], "pos0": 0, "moe": False,
              "rope_mode": rope["mode"], "mask_type": "f32", "n_embd_head": hd,
              "n_embd_gqa": Hkv * hd, "n_rot": hd, "kq_scale": 1.0 / float(np.sqrt(hd)),
              "mix": MIX_NAMES[mix], "weight_types": wt,
              "weight_init": "tok_embd uniform(-1,1); norm weights uniform(0.8,1.2); every other "
                             "matrix uniform(-a,a) with a = sqrt(3/fan_in) (fan_in = ne0); block "
                             "types stored as ggml_quantize_chunk of those float32 values (no "
                             "importance matrix); bench_vs_ggml.model_file('llama', 2, 256, 6, "
                             f"seed=0, mix='{mix}')"}
    calls = [{"call": c["call"], "args": c["args"], "inputs": c["inputs"], "result": c["result"]}
             for c in m["calls"]]
    desc = (f"llama-style {n_layer}-layer decoder, GQA {H}/{Hkv} heads (head size {hd}), NORMAL "
            f"rope, swiglu FFN, {T} tokens, in llama.cpp's {MIX_NAMES[mix]} weight mix "
            f"({mix_desc}; norms f32)")
    spec = {"name": f"llama_{n_layer}L_{mix}", "desc": desc, "config": config,
            "weights": weights, "inputs": inputs, "calls": calls,
            "output": {"name": m["output"]["name"]},
            "checkpoints": [{"name": n} for n in
                            ["inp_embd"] + [f"l{i}.out" for i in range(n_layer)] + ["result_norm"]],
            "tolerance": MODEL_TOLERANCE, "compare": "nmse"}
    return spec, quant_report


def _model_call(lib, ctx, c, ins):
    n_t, names = MODEL_CALLS[c["call"]]
    args = c.get("args") or {}
    if len(ins) != n_t or sorted(args) != sorted(names):
        raise ValueError(f"{c['result']}: {c['call']} takes {n_t} tensors and args {names}")
    vals = [ROPE_MODES[args[k]] if k == "mode" else args[k] for k in names]
    return getattr(lib, c["call"])(ctx, *ins, *vals)


def compute_model_in_ggml(lib, model):
    """Build a model file straight from its JSON with ggml's functions, compute it on
    ggml's CPU backend (1 thread): ({result: (op, type, ne)}, {output/checkpoint name:
    {type, ne, op, op_params, data}})."""
    size = 1 << 22
    for s in model["weights"] + model["inputs"]:
        size += lib.row_bytes(s["type"], s["ne"][0]) * s["ne"][1] * s["ne"][2] * s["ne"][3] + 256
    for c in model["calls"]:
        size += 4 * int(np.prod(c.get("ne") or [1 << 16])) + 256
    n_t = len(model["weights"]) + len(model["inputs"]) + len(model["calls"]) + 16
    size += n_t * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead_custom(1024, False)
    ctx = lib.ggml_init(InitParams(size, None, False))
    backend = lib.ggml_backend_cpu_init()
    try:
        lib.ggml_backend_cpu_set_n_threads(backend, 1)
        env, meta = {}, {}
        for s in model["weights"] + model["inputs"]:
            t = lib.ggml_new_tensor(ctx, IDS[s["type"]], 4, (ctypes.c_int64 * 4)(*s["ne"]))
            raw = base64.b64decode(s["data"])
            if len(raw) != lib.ggml_nbytes(t):
                raise ValueError(f"{model['name']}: {s['name']}: {len(raw)} bytes, "
                                 f"ggml_nbytes {lib.ggml_nbytes(t)}")
            ctypes.memmove(t.contents.data, raw, len(raw))
            env[s["name"]] = t
        for c in model["calls"]:
            ins = [None if n is None else env[n] for n in c["inputs"]]
            t = _model_call(lib, ctx, c, ins)
            tc = t.contents
            meta[c["result"]] = (lib.ggml_op_name(tc.op).decode(), type_name_of(tc.type), list(tc.ne))
            env[c["result"]] = t
        names = [model["output"]["name"]] + [cp["name"] for cp in model["checkpoints"]]
        graph = lib.ggml_new_graph_custom(ctx, 1024, False)
        for n in names:
            lib.ggml_build_forward_expand(graph, env[n])
        if lib.ggml_backend_graph_compute(backend, graph) != 0:
            raise RuntimeError(f"{model['name']}: ggml_backend_graph_compute failed")
        results = {}
        for n in names:
            c = env[n].contents
            results[n] = {"type": type_name_of(c.type), "ne": list(c.ne),
                          "op": lib.ggml_op_name(c.op).decode(), "op_params": list(c.op_params),
                          "data": base64.b64encode(read_logical(lib, env[n])).decode()}
        return meta, results
    finally:
        lib.ggml_backend_free(backend)
        lib.ggml_free(ctx)


def finish_model(lib, spec):
    """The model file: spec plus each call's op/type/ne and the output and checkpoints
    as ggml computed them."""
    meta, res = compute_model_in_ggml(lib, spec)
    for c in spec["calls"]:
        c["op"], c["type"], c["ne"] = meta[c["result"]]
    o = res[spec["output"]["name"]]
    spec["output"] = {"name": spec["output"]["name"], "type": o["type"], "ne": o["ne"],
                      "op": o["op"], "op_params": o["op_params"], "data": o["data"]}
    spec["checkpoints"] = [{"name": cp["name"], "type": res[cp["name"]]["type"],
                            "ne": res[cp["name"]]["ne"], "data": res[cp["name"]]["data"]}
                           for cp in spec["checkpoints"]]
    return spec


def dump_model(m):
    """The layout of tests/data/ops/models/*.json: indent 1, one line per call."""
    parts = []
    for k, v in m.items():
        if k in ("weights", "inputs", "checkpoints"):
            s = "[\n" + ",\n".join("  " + _dump(x, 2) for x in v) + "\n ]"
        elif k == "calls":
            s = "[\n" + ",\n".join("  " + json.dumps(c) for c in v) + "\n ]"
        elif isinstance(v, dict):
            s = _dump(v, 1, k)
        else:
            s = json.dumps(v)
        parts.append(f" {json.dumps(k)}: {s}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def make_models(lib, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for mix in MODEL_MIXES:
        spec, report = model_spec(lib, mix)
        model = finish_model(lib, spec)
        path = os.path.join(out_dir, model["name"] + ".json")
        with open(path, "w") as f:
            f.write(dump_model(model))
        paths.append(path)
        same = [r for r in report if r[2]]
        print(f"wrote {os.path.relpath(path)}: {os.path.getsize(path):,} bytes; ggml_py's "
              f"reference quantiser gives ggml_quantize_chunk's bytes for {len(same)} of "
              f"{len(report)} quantised weights (stored: ggml's bytes)")
        for name, t, ok, why in report:
            if not ok:
                print(f"  {name} ({t}): {why}")
    return paths


# -- the models' self-check -------------------------------------------------

def _model_weights(lib, model):
    """{name: float64 values [ne1, ne0]} through ggml's to_float."""
    out = {}
    for s in model["weights"]:
        raw = _decode(lib, s["type"], s["ne"], s["data"])
        vals = raw if s["type"] in PLAIN else lib.q.to_float(s["type"], raw)
        out[s["name"]] = np.asarray(vals, np.float64).reshape(s["ne"][1], s["ne"][0])
    return out


def numpy_forward(lib, model):
    """{name: float64 values} of the output and checkpoints: the llama forward pass in
    float64 numpy on the dequantised weights (no activation quantisation)."""
    cfg = model["config"]
    W = _model_weights(lib, model)
    ins = {s["name"]: _decode(lib, s["type"], s["ne"], s["data"]).reshape(-1, s["ne"][0])
           for s in model["inputs"]}
    tokens, pos, mask = ins["tokens"][0], ins["pos"][0], ins["kq_mask"].astype(np.float64)
    E, H, Hkv, hd, eps = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"], cfg["n_embd_head"], cfg["rms_eps"]
    T = len(tokens)
    assert cfg["rope_mode"] == "GGML_ROPE_TYPE_NORMAL" and cfg["ext_factor"] == 0 and cfg["freq_scale"] == 1

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w[0]

    def rope(x):                                            # [T, heads, hd], NORMAL
        i = np.arange(hd // 2)
        theta = pos[:, None].astype(np.float64) * cfg["freq_base"] ** (-2.0 * i / hd)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
        return y

    out = {}
    x = W["tok_embd"][tokens]
    out["inp_embd"] = x
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm"])
        q = rope((h @ W[p + "attn_q"].T).reshape(T, H, hd))
        k = rope((h @ W[p + "attn_k"].T).reshape(T, Hkv, hd))
        v = (h @ W[p + "attn_v"].T).reshape(T, Hkv, hd)
        att = np.empty((T, H, hd))
        for hh in range(H):
            kv = hh // (H // Hkv)
            sc = q[:, hh] @ k[:, kv].T * cfg["kq_scale"] + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            att[:, hh] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(T, E) @ W[p + "attn_output"].T
        h = rms(x, W[p + "ffn_norm"])
        g, u = h @ W[p + "ffn_gate"].T, h @ W[p + "ffn_up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down"].T
        out[f"l{il}.out"] = x
    out["result_norm"] = rms(x, W["output_norm"])
    out["logits"] = out["result_norm"] @ W["output"].T
    return out


def mirror_model_bytes(lib_dir, path):
    """{name: base64} of the output and checkpoints through ggml_py's model reader
    (bench_vs_ggml.load_model_file, build_model) and Mirror, or None with the reason
    when ggml_py cannot build the model yet."""
    from bench_vs_ggml import Ggml, Mirror, build_model, load_model_file, mirror_order
    from ggml_py.backends.cpu import CPUBackend
    try:
        model = load_model_file(path)
        graph, out, alloc = build_model(model, CPUBackend(n_threads=1))
    except Exception as e:                                   # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    names = [model["output"]["name"]] + [cp["name"] for cp in model["checkpoints"]]
    by_name = {t.name: t for t in mirror_order(graph)}
    m = Mirror(Ggml(lib_dir), graph, 1)
    try:
        m.compute()
        return {n: base64.b64encode(m.values(by_name[n]).tobytes()).decode() for n in names}, ""
    finally:
        m.close()


def check_models(lib, lib_dir, paths):
    n_bad = 0
    for path in paths:
        with open(path) as f:
            model = json.load(f)
        problems, notes = [], []
        meta, res = compute_model_in_ggml(lib, model)
        for c in model["calls"]:
            if list(meta[c["result"]]) != [c["op"], c["type"], c["ne"]]:
                problems.append(f"direct rebuild: {c['result']} is {meta[c['result']]}")
        targets = [model["output"]] + model["checkpoints"]
        o = model["output"]
        r = res[o["name"]]
        if [r["type"], r["ne"], r["op"], r["op_params"]] != [o["type"], o["ne"], o["op"], o["op_params"]]:
            problems.append("direct rebuild: output type/ne/op/op_params differ")
        for t in targets:
            if res[t["name"]]["data"] != t["data"]:
                problems.append(f"direct rebuild: {t['name']} differs")
        mres, why = mirror_model_bytes(lib_dir, path)
        if mres is None:
            notes.append(f"Mirror: ggml_py cannot build it ({why})")
        else:
            for t in targets:
                if mres[t["name"]] != t["data"]:
                    problems.append(f"Mirror: {t['name']} differs")
            notes.append("Mirror: bit for bit")
        ref = numpy_forward(lib, model)
        errs = []
        for t in targets:
            got = _decode(lib, t["type"], t["ne"], t["data"])
            err = _nmse(ref[t["name"]], got)
            errs.append(f"{t['name']} {err:.2g}")
            if not err <= model["tolerance"]:
                problems.append(f"independent: {t['name']} nmse {err:.3g} vs float64 numpy")
        notes.append("float64 numpy nmse: " + ", ".join(errs))
        status = "OK  " if not problems else "FAIL"
        print(f"{status} {model['name']} ({os.path.getsize(path):,} bytes): direct rebuild "
              f"{'bit for bit' if not any(p.startswith('direct') for p in problems) else 'DIFFERS'}; "
              + "; ".join(notes) + ("" if not problems else "\n     " + "; ".join(problems)))
        n_bad += bool(problems)
    print(f"\nmodel self-check: {len(paths) - n_bad} OK, {n_bad} failed")
    return n_bad == 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-lib", help="folder of ggml 0.10.1's shared libraries")
    ap.add_argument("--out", default=OUT_DIR, help="output folder (default tests/data/ops/types)")
    ap.add_argument("--models-out", default=MODEL_DIR,
                    help="output folder of the model files (default tests/data/ops/models)")
    ap.add_argument("--only", choices=("cases", "models"),
                    help="only the op cases or only the model files")
    ap.add_argument("--check", action="store_true", help="only self-check the existing files")
    a = ap.parse_args(argv)
    lib_dir = find_ggml(a.ggml_lib)
    if lib_dir is None:
        print(HOW_TO_GET_GGML, file=sys.stderr)
        return 2
    lib = Lib(lib_dir)
    ok = True
    if a.only != "models":
        fams = ("mul_mat", "mul_mat_id", "get_rows", "cpy", "set_rows")
        if a.check:
            paths = [os.path.join(a.out, f + ".json") for f in fams]
        else:
            files = make_all(lib)
            paths = write_files(files, a.out)
            for p in paths:
                with open(p) as f:
                    n = len(json.load(f))
                print(f"wrote {os.path.relpath(p)}: {n} cases, {os.path.getsize(p):,} bytes")
        ok &= self_check(lib, lib_dir, paths)
    if a.only != "cases":
        if a.check:
            paths = [os.path.join(a.models_out, f"llama_{MODEL_SHAPE['n_layer']}L_{mix}.json")
                     for mix in MODEL_MIXES]
        else:
            paths = make_models(lib, a.models_out)
        ok &= check_models(lib, lib_dir, paths)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
