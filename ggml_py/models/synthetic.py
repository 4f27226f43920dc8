"""Synthetic model graphs for planning: llama-shaped graphs of any depth with
weights in simulated device memory. They carry the ops, shapes and placement
that scheduling depends on; they are not meant to be computed."""

from __future__ import annotations

from ggml_py._backend import Backend
from ggml_py._core import Context, Graph, int_arg
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.backends.sim import SimBufferType

MAX_LAYERS = 100_000        # ~3M nodes: minutes to build in Python; deeper is a mistake


def synthetic_llama(n_layers: int, n_gpus: int = 1, gpu_unsupported=(), offload: bool = True):
    """A llama-shaped graph (~31 nodes a layer) with its layers' weights spread
    over `n_gpus` simulated GPUs (or on the host when not `offload`) and token
    embeddings on the CPU: the shape of llama-80L-full-offload. The GPUs run
    every op but `gpu_unsupported` ("how would ggml split this on a GPU that
    lacks ROPE?"). Returns (backends, graph, buffers to keep alive)."""
    backends, build, keep = synthetic_llama_builder(n_layers, n_gpus, gpu_unsupported, offload)
    return backends, build(), keep


def synthetic_llama_builder(n_layers: int, n_gpus: int = 1, gpu_unsupported=(),
                            offload: bool = True):
    """As synthetic_llama, but returns (backends, build, buffers to keep alive): each
    build() makes the graph anew (new inputs and activations, as a model's next step
    does) over the same weights."""
    n_layers = int_arg(n_layers, "n_layers", 1, MAX_LAYERS)
    n_gpus = int_arg(n_gpus, "n_gpus", 0, 15)
    # simulated memory: the graph can be allocated (fake addresses), not computed
    host = SimBufferType("CPU", 32, None, True)
    gpu_bufts = [SimBufferType(f"GPU{i}", 32, None, False) for i in range(n_gpus)]
    gpus = [Backend(f"GPU{i}", b, "gpu", unsupported_ops=tuple(gpu_unsupported))
            for i, b in enumerate(gpu_bufts)]
    cpu = Backend("CPU", host, "cpu")
    weights_ctx = Context("synthetic")
    # buffer type -> its weights, placed once all are made: side by side in one buffer
    # of the type, as a model loader allocates them, so that a large graph's weights
    # share a few buffer structs as in llama.cpp (and in the ggml mirror of the graph,
    # bench/ggml_sched_ref.py), not one each
    placements = {}

    def weight(name, shape, buft):
        t = weights_ctx.new_tensor("f16", shape, name=name)
        placements.setdefault(buft, []).append(t)
        return t

    E, T = 64, 8
    tok = weight("token_embd", (512, E), host)
    layers = []
    for il in range(n_layers):
        wbuft = gpu_bufts[il * n_gpus // n_layers] if offload and n_gpus else host
        w = {n: weight(f"blk.{il}.{n}", (E, E), wbuft)
             for n in ("attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down")}
        w.update({n: weight(f"blk.{il}.{n}_norm", (E,), wbuft) for n in ("attn", "ffn")})
        w["kc"] = weight(f"cache_k_l{il}", (T, E), wbuft)
        w["vc"] = weight(f"cache_v_l{il}", (T, E), wbuft)
        layers.append(w)
    w_out = weight("output", (512, E), gpu_bufts[-1] if offload and n_gpus else host)
    keep = [buf for buft, tensors in placements.items()
            for buf in alloc_ctx_tensors_from_buft(tensors, buft, usage="weights")]

    def build():
        ctx = Context("synthetic-graph")
        outputs = []    # the KV-cache writes, expanded before the result (as llama.cpp does)
        inp = ctx.new_tensor("i32", (T,), name="inp_tokens").set_input()
        pos = ctx.new_tensor("i32", (T,), name="inp_pos").set_input()
        mask = ctx.new_tensor("f32", (T, T), name="KQ_mask").set_input()
        op = ctx.new_op
        x = op("GET_ROWS", [tok, inp], "f32", (T, E), name="inp_embd")
        for w in layers:
            kc, vc = w["kc"], w["vc"]
            cur = op("MUL", [op("RMS_NORM", [x], "f32", (T, E)), w["attn"]], "f32", (T, E))
            q = op("ROPE", [ctx.reshape(op("MUL_MAT", [w["attn_q"], cur], "f32", (T, E)),
                                        (T, 4, 16)), pos], "f32", (T, 4, 16))
            k = op("ROPE", [ctx.reshape(op("MUL_MAT", [w["attn_k"], cur], "f32", (T, E)),
                                        (T, 4, 16)), pos], "f32", (T, 4, 16))
            v = op("MUL_MAT", [w["attn_v"], cur], "f32", (T, E))
            kcpy = op("CPY", [k, ctx.view(kc, (T, E))], "f32", (T, E))
            vcpy = op("CPY", [v, ctx.view(vc, (T, E))], "f32", (T, E))
            kq = op("MUL_MAT", [ctx.permute(ctx.view(kc, (T, 4, 16)), (0, 2, 1, 3)),
                                ctx.permute(q, (0, 2, 1, 3))], "f32", (4, T, T))
            kq = op("SOFT_MAX", [kq, mask], "f32", (4, T, T))
            kqv = op("MUL_MAT", [ctx.permute(ctx.view(vc, (T, 4, 16)), (1, 2, 0, 3)), kq], "f32",
                     (4, T, 16))
            merged = op("CONT", [ctx.permute(kqv, (0, 2, 1, 3))], "f32", (T, 4, 16))
            attn = op("MUL_MAT", [w["attn_o"], ctx.reshape(merged, (T, E))], "f32", (T, E))
            x = op("ADD", [attn, x], "f32", (T, E))
            cur = op("MUL", [op("RMS_NORM", [x], "f32", (T, E)), w["ffn"]], "f32", (T, E))
            g = op("GLU", [op("MUL_MAT", [w["ffn_gate"], cur], "f32", (T, E)),
                           op("MUL_MAT", [w["ffn_up"], cur], "f32", (T, E))], "f32", (T, E))
            x = op("ADD", [op("MUL_MAT", [w["ffn_down"], g], "f32", (T, E)), x], "f32", (T, E))
            outputs += [kcpy.set_output(), vcpy.set_output()]
        out = op("MUL_MAT", [w_out, op("RMS_NORM", [x], "f32", (T, E))], "f32", (T, 512),
                 name="result")
        out.set_output()
        graph = Graph(8 * (n_layers * 40 + 64))
        for t in outputs + [out]:
            graph.build_forward_expand(t)
        return graph

    return gpus + [cpu], build, keep
