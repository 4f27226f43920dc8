"""Side by side: the same graphs computed by ggml 0.10.1's own CPU backend and by
ggml_py's CPUBackend, in one run, alternating, medians; and their outputs compared.

    python bench/bench_vs_ggml.py [--ggml-lib DIR] [--threads N] [--reps N] [--quick] [--json]

ggml comes from its shared libraries (libggml-base.so, libggml.so, libggml-cpu.so),
loaded with ctypes: --ggml-lib DIR, else $GGML_PY_GGML_LIB, else the `ggml` package of
`pip install ggml-py==0.10.1` (its sdist builds ggml 0.10.1 in about a minute; the
package's own Python bindings follow an older API, so only its libraries are used).
It is an optional extra: without it this script says how to get it and stops.

Every ggml_py graph is mirrored into a ggml context generically: each tensor's type,
ne, nb, op, op_params, sources and view (view_src, view_offs) go into a ctypes
ggml_tensor, weights and inputs are copied, and the nodes are expanded in ggml_py's
order, so both sides run the same nodes on the same bytes. Both sides compute on N
threads (default 1; OpenBLAS is held to 1 thread too, so BLAS calls stay fair).

Graphs (default): the model files of tests/data/ops/models (llama_2L, moe_2L), the same model
structure scaled up (llama 2 and 8 layers with f16 weights at n_embd 256 and 512,
n_ff = 2 n_embd, head size 64, vocab 256, one token and 32 tokens; a Qwen2-MoE-style
2-layer model with q8_0 experts and 32 tokens), and a chain of 3,000 f32[16]
ADD/MUL/SCALE nodes. "before" is the issue's measurement of the executor this one
replaced (same machine kind, ggml's times of that run beside it).

--types: the llama structure (2 layers, n_embd 512, 1 and 32 tokens) in llama.cpp's
Q4_K_M, Q6_K and IQ4_NL weight mixes (MIXES). --mul-mat TYPES: one MUL_MAT of 4096 x 4096
weights of each type by 1, 32 and 512 f32 columns (--columns). Both hold ggml_py to at
most 1.0x ggml's time (issue 30); lower is better. --flash-attn: one FLASH_ATTN_EXT with
an f16 KV cache, Llama-3-8B's shape (32 heads of 128, 8 KV heads), decode over 512 to 4096
positions, 32- and 128-token prompt batches, held to 1.0x too (issue 31).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before numpy loads OpenBLAS

import numpy as np                                     # noqa: E402

from ggml_py import ops, quants                        # noqa: E402
from ggml_py.tools import opscheck                     # noqa: E402
from ggml_py.tools.machine import announce, with_machine  # noqa: E402
from ggml_py._core import Context, Graph, op_id, type_id   # noqa: E402
from ggml_py.backends.cpu import CPUBackend, tensor_array  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "tests", "data", "ops", "models")

# the issue's table (ggml µs, ggml_py µs before this executor)
BEFORE = {
    "llama_2L": (43, 692), "moe_2L": (80, 1249),
    "llama 2L n256 t1": (49, 1634), "llama 2L n512 t1": (160, 3563),
    "llama 8L n256 t1": (186, 6257), "llama 8L n256 t32": (5602, 11123),
    "llama 2L n512 t32": (5056, 6751), "moe 2L n256 t32": (3029, 5889),
    "chain 3000": (86, 16993),
}
TARGETS = {"t1": 3.0, "t32": 1.0}       # the issue's bounds on ggml_py / ggml


# ---------------------------------------------------------------------------
# ggml through ctypes

class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml 0.10.1 (include/ggml.h)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


HOW_TO_GET_GGML = (
    "ggml 0.10.1 was not found. Get it with\n"
    "    pip install 'ggml-py==0.10.1'            (builds ggml from the sdist, ~1 minute)\n"
    "or point --ggml-lib / $GGML_PY_GGML_LIB at a folder with libggml-base.so, libggml.so\n"
    "and libggml-cpu.so of ggml 0.10.1.")


def find_ggml(lib_dir=None):
    """The folder of ggml's shared libraries, or None."""
    candidates = [lib_dir, os.environ.get("GGML_PY_GGML_LIB")]
    spec = importlib.util.find_spec("ggml")
    if spec is not None and spec.submodule_search_locations:
        candidates += [os.path.join(p, "lib") for p in spec.submodule_search_locations]
    for d in candidates:
        if d and os.path.exists(os.path.join(d, "libggml-cpu.so")):
            return os.path.abspath(d)
    return None


class Ggml:
    """The ggml functions the benchmark calls."""

    def __init__(self, lib_dir):
        self.lib_dir = lib_dir
        load = lambda name: ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)  # noqa: E731
        self.base = load("libggml-base.so")
        self.ggml = load("libggml.so")
        self.cpu = load("libggml-cpu.so")
        P, T = ctypes.c_void_p, ctypes.POINTER(GgmlTensor)
        sigs = [(self.base, "ggml_init", P, [InitParams]), (self.base, "ggml_free", None, [P]),
                (self.base, "ggml_new_tensor", T, [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
                (self.base, "ggml_view_tensor", T, [P, T]),
                (self.base, "ggml_new_graph_custom", P, [P, ctypes.c_size_t, ctypes.c_bool]),
                (self.base, "ggml_build_forward_expand", None, [P, T]),
                (self.base, "ggml_tensor_overhead", ctypes.c_size_t, []),
                (self.base, "ggml_graph_overhead_custom", ctypes.c_size_t, [ctypes.c_size_t, ctypes.c_bool]),
                (self.base, "ggml_nbytes", ctypes.c_size_t, [T]),
                (self.base, "ggml_backend_graph_compute", ctypes.c_int, [P, P]),
                (self.base, "ggml_backend_free", None, [P]),
                (self.cpu, "ggml_backend_cpu_init", P, []),
                (self.cpu, "ggml_backend_cpu_set_n_threads", None, [P, ctypes.c_int])]
        for lib, name, res, args in sigs:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)


def mirror_order(graph: Graph) -> list:
    """Every tensor the graph reaches, each once, its sources and view base first."""
    tensors = []
    seen = set()

    def visit(t):
        if t is None or t in seen:
            return
        seen.add(t)
        for s in t.src:
            visit(s)
        visit(t.view_src)
        tensors.append(t)
    for t in graph.leafs + graph.nodes:
        visit(t)
    return tensors


class Mirror:
    """A ggml_py graph rebuilt in a ggml context, tensor for tensor, computed by ggml's
    CPU backend on n_threads threads."""

    def __init__(self, g: Ggml, graph: Graph, n_threads=1):
        self.g = g
        tensors = mirror_order(graph)
        size = sum(-(-t.nbytes // 64) * 64 for t in tensors if t.view_src is None)
        size += len(tensors) * g.ggml_tensor_overhead() + g.ggml_graph_overhead_custom(
            graph.size, False) + (1 << 20)
        self.ctx = g.ggml_init(InitParams(size, None, False))
        self.t = {}
        for t in tensors:
            self.t[t] = self._mirror(t)
        self.graph = g.ggml_new_graph_custom(self.ctx, graph.size, False)
        for t in graph.nodes:
            g.ggml_build_forward_expand(self.graph, self.t[t])
        self.backend = g.ggml_backend_cpu_init()
        g.ggml_backend_cpu_set_n_threads(self.backend, n_threads)

    def _mirror(self, t):
        g = self.g
        if t.view_src is not None:
            base = self.t[t.view_src]
            m = g.ggml_view_tensor(self.ctx, base)
            m.contents.view_offs = t.view_offs
            m.contents.data = base.contents.data + t.view_offs
        else:
            ne = (ctypes.c_int64 * 4)(*t.ne)
            m = g.ggml_new_tensor(self.ctx, type_id(t.type), 4, ne)
            if t.op == "NONE":       # weights and inputs: their bytes
                ctypes.memmove(m.contents.data, np.ascontiguousarray(tensor_array(t)).ctypes.data,
                               t.nbytes)
        c = m.contents
        c.ne[:] = t.ne
        c.nb[:] = t.nb
        c.op = op_id(t.op)
        c.op_params[:] = t.op_params
        for i, s in enumerate(t.src):
            c.src[i] = ctypes.cast(self.t[s], ctypes.c_void_p) if s is not None else None
        c.name = t.name.encode()[:63]
        return m

    def compute(self):
        if self.g.ggml_backend_graph_compute(self.backend, self.graph) != 0:
            raise RuntimeError("ggml_backend_graph_compute failed")

    def values(self, t):
        """A contiguous f32 tensor's values as ggml computed them."""
        m = self.t[t].contents
        return np.frombuffer(ctypes.string_at(m.data, t.nbytes), dtype=np.float32).copy()

    def close(self):
        self.g.ggml_backend_free(self.backend)
        self.g.ggml_free(self.ctx)


# ---------------------------------------------------------------------------
# graphs

def _uniform(rng, shape, lo, hi):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# The weight types of llama.cpp's file types (llama-quant.cpp's choices, simplified: every
# layer alike): (the matrices' type, {weight: type} where it differs). "f16" is the mix of
# tests/data/ops/models: f16 matrices, a q8_0 token table (and q8_0 experts).
MIXES = {
    "f16": ("f16", {"tok_embd": "q8_0", "exps": "q8_0"}),
    "q4_K_M": ("q4_K", {"attn_v": "q6_K", "ffn_down": "q6_K", "output": "q6_K"}),
    "q6_K": ("q6_K", {}),
    "iq4_nl": ("iq4_nl", {"output": "q6_K"}),
}


def _mix_type(mix, name):
    """The type of weight `name` ('blk.0.attn_v', 'output', ...) in file type `mix`."""
    default, special = MIXES[mix]
    for key, t in special.items():
        if name.endswith(key):
            return t
    return default


def model_file(kind, n_layer, n_embd, n_tokens, seed=0, mix="f16"):
    """A model in the format of tests/data/ops/models (OPS_CASES.md), the structure of
    llama_2L ('llama') or moe_2L ('moe'), scaled: n_ff = 2 n_embd, head size 64 (16 at
    n_embd 64), half as many KV heads, vocab 256; weights drawn as those files' were, in
    the types of file type `mix` (MIXES)."""
    rng = np.random.default_rng(seed)
    hd = 16 if n_embd <= 64 else 64
    H = n_embd // hd
    Hkv = max(1, H // 2)
    F, V, T, G = 2 * n_embd, 256, n_tokens, Hkv * hd
    moe = kind == "moe"
    weights, calls = [], []

    def w(name, t, ne, lo_hi=None):
        if t != "f32":                      # (norms and the router stay f32)
            t = _mix_type(mix, name)
        fan_in = ne[0]
        lo, hi = lo_hi or (-math.sqrt(3 / fan_in), math.sqrt(3 / fan_in))
        vals = _uniform(rng, tuple(reversed(ne)), lo, hi)
        stored = quants.from_f32(t, vals, cpu=False) if t != "f32" else vals
        weights.append({"name": name, "type": t, "ne": list(ne) + [1] * (4 - len(ne)),
                        "array": stored})

    def call(fn, inputs, result, **args):
        calls.append({"call": fn, "inputs": inputs, "result": result, "args": args})

    w("tok_embd", "q8_0", [n_embd, V], (-1, 1))
    rope = dict(n_dims=hd, mode="GGML_ROPE_TYPE_NEOX" if moe else "GGML_ROPE_TYPE_NORMAL",
                n_ctx_orig=4096, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0,
                attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
    call("ggml_get_rows", ["tok_embd", "tokens"], "inp_embd")
    x = "inp_embd"
    for il in range(n_layer):
        p, q = f"blk.{il}.", f"l{il}."
        w(p + "attn_norm", "f32", [n_embd], (0.8, 1.2))
        for name, rows in (("attn_q", n_embd), ("attn_k", G), ("attn_v", G), ("attn_output", n_embd)):
            w(p + name, "f16", [n_embd, rows])
        w(p + "ffn_norm", "f32", [n_embd], (0.8, 1.2))
        call("ggml_rms_norm", [x], q + "attn_norm_raw", eps=1e-5)
        call("ggml_mul", [q + "attn_norm_raw", p + "attn_norm"], q + "attn_norm")
        for n, wn in (("Qcur", "attn_q"), ("Kcur", "attn_k"), ("Vcur", "attn_v")):
            call("ggml_mul_mat", [p + wn, q + "attn_norm"], q + n)
        call("ggml_reshape_3d", [q + "Qcur"], q + "Qcur_3d", ne0=hd, ne1=H, ne2=T)
        call("ggml_reshape_3d", [q + "Kcur"], q + "Kcur_3d", ne0=hd, ne1=Hkv, ne2=T)
        call("ggml_reshape_3d", [q + "Vcur"], q + "Vcur_3d", ne0=hd, ne1=Hkv, ne2=T)
        call("ggml_rope_ext", [q + "Qcur_3d", "pos", None], q + "Qcur_rope", **rope)
        call("ggml_rope_ext", [q + "Kcur_3d", "pos", None], q + "Kcur_rope", **rope)
        perm = dict(axis0=0, axis1=2, axis2=1, axis3=3)
        call("ggml_permute", [q + "Qcur_rope"], q + "q", **perm)
        call("ggml_permute", [q + "Kcur_rope"], q + "k", **perm)
        call("ggml_permute", [q + "Vcur_3d"], q + "v", **perm)
        call("ggml_mul_mat", [q + "k", q + "q"], q + "kq")
        call("ggml_soft_max_ext", [q + "kq", "kq_mask"], q + "kq_soft_max",
             scale=1.0 / math.sqrt(hd), max_bias=0.0)
        call("ggml_transpose", [q + "v"], q + "v_t")
        call("ggml_cont", [q + "v_t"], q + "v_t_cont")
        call("ggml_mul_mat", [q + "v_t_cont", q + "kq_soft_max"], q + "kqv")
        call("ggml_permute", [q + "kqv"], q + "kqv_merged", **perm)
        call("ggml_cont_2d", [q + "kqv_merged"], q + "kqv_merged_cont", ne0=n_embd, ne1=T)
        call("ggml_mul_mat", [p + "attn_output", q + "kqv_merged_cont"], q + "attn_out")
        call("ggml_add", [q + "attn_out", x], q + "ffn_inp")
        call("ggml_rms_norm", [q + "ffn_inp"], q + "ffn_norm_raw", eps=1e-5)
        call("ggml_mul", [q + "ffn_norm_raw", p + "ffn_norm"], q + "ffn_norm")
        if not moe:
            w(p + "ffn_up", "f16", [n_embd, F])
            w(p + "ffn_gate", "f16", [n_embd, F])
            w(p + "ffn_down", "f16", [F, n_embd])
            call("ggml_mul_mat", [p + "ffn_up", q + "ffn_norm"], q + "ffn_up")
            call("ggml_mul_mat", [p + "ffn_gate", q + "ffn_norm"], q + "ffn_gate")
            call("ggml_swiglu_split", [q + "ffn_gate", q + "ffn_up"], q + "ffn_swiglu")
            call("ggml_mul_mat", [p + "ffn_down", q + "ffn_swiglu"], q + "ffn_out")
        else:
            X, K = 8, 2
            w(p + "ffn_gate_inp", "f32", [n_embd, X])
            w(p + "ffn_gate_exps", "q8_0", [n_embd, F, X])
            w(p + "ffn_up_exps", "q8_0", [n_embd, F, X])
            w(p + "ffn_down_exps", "q8_0", [F, n_embd, X])
            for name, ne in (("ffn_gate_shexp", [n_embd, F]), ("ffn_up_shexp", [n_embd, F]),
                             ("ffn_down_shexp", [F, n_embd])):
                w(p + name, "f16", ne)
            call("ggml_mul_mat", [p + "ffn_gate_inp", q + "ffn_norm"], q + "ffn_moe_logits")
            call("ggml_soft_max", [q + "ffn_moe_logits"], q + "ffn_moe_probs")
            call("ggml_top_k", [q + "ffn_moe_probs"], q + "ffn_moe_topk", k=K)
            call("ggml_reshape_3d", [q + "ffn_moe_probs"], q + "ffn_moe_probs_3d", ne0=1, ne1=X, ne2=T)
            call("ggml_get_rows", [q + "ffn_moe_probs_3d", q + "ffn_moe_topk"], q + "ffn_moe_weights")
            call("ggml_reshape_3d", [q + "ffn_norm"], q + "ffn_moe_in_3d", ne0=n_embd, ne1=1, ne2=T)
            for e in ("up", "gate"):
                call("ggml_mul_mat_id", [p + f"ffn_{e}_exps", q + "ffn_moe_in_3d", q + "ffn_moe_topk"],
                     q + f"ffn_moe_{e}")
            call("ggml_swiglu_split", [q + "ffn_moe_gate", q + "ffn_moe_up"], q + "ffn_moe_swiglu")
            call("ggml_mul_mat_id", [p + "ffn_down_exps", q + "ffn_moe_swiglu", q + "ffn_moe_topk"],
                 q + "ffn_moe_down")
            call("ggml_mul", [q + "ffn_moe_down", q + "ffn_moe_weights"], q + "ffn_moe_weighted")
            for k in range(K):
                call("ggml_view_2d", [q + "ffn_moe_weighted"], q + f"ffn_moe_view_{k}", ne0=n_embd,
                     ne1=T, nb1=4 * n_embd * K, offset=4 * n_embd * k)
            call("ggml_add", [q + "ffn_moe_view_0", q + "ffn_moe_view_1"], q + "ffn_moe_sum_1")
            for e in ("up", "gate"):
                call("ggml_mul_mat", [p + f"ffn_{e}_shexp", q + "ffn_norm"], q + f"ffn_shexp_{e}")
            call("ggml_swiglu_split", [q + "ffn_shexp_gate", q + "ffn_shexp_up"], q + "ffn_shexp_swiglu")
            call("ggml_mul_mat", [p + "ffn_down_shexp", q + "ffn_shexp_swiglu"], q + "ffn_shexp_out")
            call("ggml_add", [q + "ffn_moe_sum_1", q + "ffn_shexp_out"], q + "ffn_out")
        call("ggml_add", [q + "ffn_out", q + "ffn_inp"], q + "out")
        x = q + "out"
    w("output_norm", "f32", [n_embd], (0.8, 1.2))
    w("output", "f16", [n_embd, V])
    call("ggml_rms_norm", [x], "result_norm_raw", eps=1e-5)
    call("ggml_mul", ["result_norm_raw", "output_norm"], "result_norm")
    call("ggml_mul_mat", ["output", "result_norm"], "logits")
    mask = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    mask_t = "f16" if moe else "f32"
    inputs = [{"name": "tokens", "type": "i32", "ne": [T, 1, 1, 1],
               "array": rng.integers(0, V, T).astype(np.int32)},
              {"name": "pos", "type": "i32", "ne": [T, 1, 1, 1], "array": np.arange(T, dtype=np.int32)},
              {"name": "kq_mask", "type": mask_t, "ne": [T, T, 1, 1],
               "array": mask.astype(quants.PLAIN_DTYPES[mask_t])}]
    suffix = "" if mix == "f16" else f" {mix}"
    return {"name": f"{kind} {n_layer}L n{n_embd} t{n_tokens}{suffix}", "weights": weights,
            "inputs": inputs, "calls": calls, "output": {"name": "logits"}}


def load_model_file(path):
    """A model file of tests/data/ops/models with its bytes decoded."""
    with open(path) as f:
        m = json.load(f)
    for spec in m["weights"] + m["inputs"]:
        spec["array"] = opscheck.decode(spec["type"], spec["ne"], spec["data"])
    return m


def build_model(model, backend):
    """The model's graph on `backend`, every tensor in a host buffer of its own (as the
    ggml side has them); (graph, output tensor, allocation)."""
    ctx = Context(model["name"])
    alloc = opscheck.HostAllocation(backend)
    env = {}
    for spec in model["weights"] + model["inputs"]:
        t = ops.new_tensor(ctx, spec["type"], spec["ne"], name=spec["name"][:63])
        alloc.alloc(t)
        backend.set_tensor(t, np.ascontiguousarray(spec["array"]).tobytes())
        env[spec["name"]] = t
    for c in model["calls"]:
        ins = [env[n] if n is not None else None for n in c["inputs"]]
        env[c["result"]] = t = opscheck._call(ctx, c["call"], ins, c.get("args", {}))
        t.name = c["result"][:63]
    out = env[model["output"]["name"]]
    graph = Graph(max(64, 4 * len(model["calls"])))
    graph.build_forward_expand(out)
    alloc.alloc_graph(graph)
    return graph, out, alloc


def chain_graph(backend, n_nodes=3000):
    """n_nodes f32[16] nodes: ADD, MUL, SCALE in turn."""
    ctx = Context("chain")
    a = ops.new_tensor_1d(ctx, "f32", 16, name="a")
    b = ops.new_tensor_1d(ctx, "f32", 16, name="b")
    x = a
    for i in range(n_nodes):
        x = (ops.add(ctx, x, b), ops.mul(ctx, x, b), ops.scale(ctx, x, 0.5))[i % 3]
    graph = Graph(2 * n_nodes + 16).build_forward_expand(x)
    alloc = opscheck.HostAllocation(backend).alloc_graph(graph)
    backend.set_tensor(a, np.full(16, 1.0, np.float32).tobytes())
    backend.set_tensor(b, np.full(16, 1.0001, np.float32).tobytes())
    return graph, x, alloc


def mul_mat_graph(t, m, k, n, seed=0):
    """A maker of one MUL_MAT: weights [k, m] of type t (ggml's reference quantiser on
    uniform values) times f32 [k, n]."""
    rng = np.random.default_rng(seed)
    w = _uniform(rng, (m, k), -1, 1)
    stored = quants.from_f32(t, w, cpu=False) if t != "f32" else w
    x = _uniform(rng, (n, k), -1, 1)

    def make(backend):
        ctx = Context(f"mul_mat {t}")
        alloc = opscheck.HostAllocation(backend)
        wt = ops.new_tensor(ctx, t, [k, m, 1, 1], name="w")
        xt = ops.new_tensor(ctx, "f32", [k, n, 1, 1], name="x")
        for tensor, arr in ((wt, stored), (xt, x)):
            alloc.alloc(tensor)
            backend.set_tensor(tensor, np.ascontiguousarray(arr).tobytes())
        out = ops.mul_mat(ctx, wt, xt)
        graph = Graph(16).build_forward_expand(out)
        alloc.alloc_graph(graph)
        return graph, out, alloc
    return make


def mul_mat_graphs(types, m=4096, k=4096, columns=(1, 32, 512)):
    """Issue 30's microbenchmark: per type, a MUL_MAT of m x k weights by 1, 32 and 512
    columns."""
    return [(f"mul_mat {t} {m}x{k} n{n}", mul_mat_graph(t, m, k, n)) for t in types for n in columns]


def flash_attn_graph(n_q, n_kv, n_head=32, n_head_kv=8, d=128, seed=0):
    """A maker of one FLASH_ATTN_EXT as llama.cpp's f16 KV cache feeds it: q f32
    [d, n_q, n_head], K and V f16 [d, n_kv, n_head_kv], an f16 causal mask (the n_q
    queries are the last positions of the n_kv)."""
    rng = np.random.default_rng(seed)
    q = _uniform(rng, (n_head, n_q, d), -1, 1)
    k = quants.from_f32("f16", _uniform(rng, (n_head_kv, n_kv, d), -1, 1))
    v = quants.from_f32("f16", _uniform(rng, (n_head_kv, n_kv, d), -1, 1))
    pos = np.arange(n_kv)[None, :]
    mask = np.where(pos <= (n_kv - n_q + np.arange(n_q))[:, None], 0.0, -np.inf).astype(np.float32)
    mask = quants.from_f32("f16", mask)

    def make(backend):
        ctx = Context(f"flash_attn q{n_q} kv{n_kv}")
        alloc = opscheck.HostAllocation(backend)
        qt = ops.new_tensor(ctx, "f32", [d, n_q, n_head, 1], name="q")
        kt = ops.new_tensor(ctx, "f16", [d, n_kv, n_head_kv, 1], name="k")
        vt = ops.new_tensor(ctx, "f16", [d, n_kv, n_head_kv, 1], name="v")
        mt = ops.new_tensor(ctx, "f16", [n_kv, n_q, 1, 1], name="mask")
        for tensor, arr in ((qt, q), (kt, k), (vt, v), (mt, mask)):
            alloc.alloc(tensor)
            backend.set_tensor(tensor, np.ascontiguousarray(arr).tobytes())
        out = ops.flash_attn_ext(ctx, qt, kt, vt, mt, 1.0 / math.sqrt(d))
        graph = Graph(16).build_forward_expand(out)
        alloc.alloc_graph(graph)
        return graph, out, alloc
    return make


def flash_attn_graphs():
    """FLASH_ATTN_EXT as a Llama-3-8B-shaped layer computes it (32 heads of 128, 8 KV
    heads): decode (one query) over 512 to 4096 cached positions, a 32-token prompt batch
    (ggml's one-row path) and a 128-token one (its tiled path)."""
    return ([(f"flash_attn decode kv{n}", flash_attn_graph(1, n)) for n in (512, 1024, 2048, 4096)] +
            [(f"flash_attn prompt t32 kv{n}", flash_attn_graph(32, n)) for n in (32, 512)] +
            [("flash_attn prompt t128 kv512", flash_attn_graph(128, 512))])


def type_graphs():
    """Issue 30's models: llama 2 layers at n_embd 512 in Q4_K_M, Q6_K and IQ4_NL, one
    token and 32 tokens."""
    return [(f"llama 2L n512 t{T} {mix}", lambda b, a=("llama", 2, 512, T, 0, mix): build_model(model_file(*a), b))
            for mix in ("q4_K_M", "q6_K", "iq4_nl") for T in (1, 32)]


def graphs(quick=False):
    """(name, maker(backend) -> (graph, output, keep-alive)) in the issue's order."""
    out = []
    for name in ("llama_2L", "moe_2L"):
        path = os.path.join(MODELS, name + ".json")
        out.append((name, lambda b, p=path: build_model(load_model_file(p), b)))
    sizes = [("llama", 2, 256, 1), ("llama", 2, 512, 1), ("llama", 8, 256, 1),
             ("llama", 8, 256, 32), ("llama", 2, 512, 32), ("moe", 2, 256, 32)]
    if quick:
        sizes = sizes[:1] + sizes[4:5]
    for kind, L, E, T in sizes:
        out.append((f"{kind} {L}L n{E} t{T}",
                    lambda b, a=(kind, L, E, T): build_model(model_file(*a), b)))
    out.append(("chain 3000", chain_graph))
    return out


# ---------------------------------------------------------------------------
# measuring

def nmse(ref, x):
    ref = np.asarray(ref, np.float64)
    x = np.asarray(x, np.float64)
    return float(np.sum((ref - x) ** 2) / max(np.sum(ref ** 2), 1e-300))


def compare(name, maker, g, n_threads, reps):
    cpu = CPUBackend(n_threads=n_threads)
    graph, out, keep = maker(cpu)
    mirror = Mirror(g, graph, n_threads)
    try:
        cpu.graph_compute(graph)
        mirror.compute()
        err = nmse(mirror.values(out), np.asarray(tensor_array(out), np.float32).reshape(-1))
        tg, tp = [], []
        for _ in range(2):                  # warm-up
            mirror.compute()
            cpu.graph_compute(graph)
        for _ in range(reps):
            t0 = time.perf_counter()
            mirror.compute()
            t1 = time.perf_counter()
            cpu.graph_compute(graph)
            t2 = time.perf_counter()
            tg.append(t1 - t0)
            tp.append(t2 - t1)
    finally:
        mirror.close()
    ggml_us, py_us = statistics.median(tg) * 1e6, statistics.median(tp) * 1e6
    before = BEFORE.get(name, (None, None))
    row = {"graph": name, "nodes": graph.n_nodes, "ggml_us": ggml_us, "ggml_py_us": py_us,
           "ratio": py_us / ggml_us, "nmse": err, "before_ggml_us": before[0],
           "before_ggml_py_us": before[1],
           "before_ratio": before[1] / before[0] if before[0] else None}
    if name.startswith("chain"):
        row["ggml_py_us_per_node"] = py_us / graph.n_nodes
        row["ggml_us_per_node"] = ggml_us / graph.n_nodes
        row["target"] = "<= 0.5 us/node"
        row["ok"] = row["ggml_py_us_per_node"] <= 0.5
    else:
        words = name.split()
        bound = (1.0 if words[0] in ("mul_mat", "flash_attn") or words[-1] in MIXES  # issues 30, 31
                 else TARGETS.get(words[-1]) if " " in name else None)
        if bound is not None:
            row["target"] = f"<= {bound:.1f}x"
            row["ok"] = row["ratio"] <= bound
    del keep
    return row


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-lib", help="folder of ggml 0.10.1's shared libraries")
    ap.add_argument("--threads", type=int, default=1, help="threads on each side (default 1)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per graph")
    ap.add_argument("--quick", action="store_true", help="fewer graphs and repetitions")
    ap.add_argument("--only", help="only graphs whose name contains this")
    ap.add_argument("--types", action="store_true",
                    help="the weight-type models instead (llama in Q4_K_M, Q6_K, IQ4_NL)")
    ap.add_argument("--mul-mat", metavar="TYPES",
                    help="the MUL_MAT microbenchmark instead, for these comma-separated "
                         "weight types ('all': every block type), 4096 x 4096 by 1/32/512 columns")
    ap.add_argument("--columns", default="1,32,512", help="--mul-mat's column counts")
    ap.add_argument("--flash-attn", action="store_true",
                    help="FLASH_ATTN_EXT instead: f16 K/V, 32 heads x 128, 8 KV heads; decode "
                         "over 512-4096 positions, 32- and 128-token prompts")
    ap.add_argument("--json", action="store_true", help="one JSON object per graph")
    a = ap.parse_args(argv)
    machine = announce(a.json)
    lib_dir = find_ggml(a.ggml_lib)
    if lib_dir is None:
        print(HOW_TO_GET_GGML, file=sys.stderr)
        return 2
    g = Ggml(lib_dir)
    reps = a.reps or (7 if a.quick else 31)
    from ggml_py.backends.cpu import isa
    if not a.json:
        print(f"ggml 0.10.1 from {lib_dir}; {a.threads} thread(s) each side; ggml_py hot loops: "
              f"{isa()}; OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; "
              f"medians of {reps} alternating runs\n")
        print("| graph | nodes | ggml µs | ggml_py µs | ggml_py / ggml | before: ggml µs | "
              "before: ggml_py µs | before: ratio | logits NMSE |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    if a.mul_mat:
        types = ([t for t in quants.BLOCKS if t not in ("q8_1", "q8_K")] if a.mul_mat == "all"
                 else a.mul_mat.split(","))
        todo = mul_mat_graphs(types, columns=[int(c) for c in a.columns.split(",")])
    elif a.flash_attn:
        todo = flash_attn_graphs()
    else:
        todo = type_graphs() if a.types else graphs(a.quick)
    for name, maker in todo:
        if a.only and a.only not in name:
            continue
        r = compare(name, maker, g, a.threads, reps)
        rows.append(r)
        if a.json:
            print(with_machine(r, machine), flush=True)
            continue
        ratio = f"{r['ratio']:.2f}x"
        if name.startswith("chain"):
            ratio += f" ({r['ggml_py_us_per_node']:.3f} µs/node)"
        if "ok" in r:
            ratio += "" if r["ok"] else " (over target)"
        print(f"| {name} | {r['nodes']} | {r['ggml_us']:,.0f} | {r['ggml_py_us']:,.0f} | {ratio} | "
              f"{_fmt(r['before_ggml_us'], ',')} | {_fmt(r['before_ggml_py_us'], ',')} | "
              f"{_fmt(r['before_ratio'], '.1f')}{'x' if r['before_ratio'] else ''} | "
              f"{r['nmse']:.1e} |", flush=True)
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
