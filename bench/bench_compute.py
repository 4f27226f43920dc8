"""Compute benchmark of the CPU backend and the demo models.

    python bench/bench_compute.py [--quick] [--json] [--threads N] [--crossover]

1. dispatch: a graph of many tiny ops (f32[16] ADD/MUL/SCALE chains): µs per node
   through CPUBackend.graph_compute (and Scheduler.graph_compute), against the same
   ops written directly in numpy.
2. decode: one decode step of the demo llama (llama_config()), the whole
   llama_decode-like step (build graph, alloc_graph, set inputs, compute, read logits)
   against the time spent inside the nodes (the executor's profile): the share outside
   them is the price of graphs, scheduling and dispatch. The step keeps its graph
   (Session's decode graph, the scheduler's graph reuse: no build, split or alloc);
   the same step building a new graph each time runs alternately beside it. The kept
   step's Python overhead (issue 34's figure, `kept_step_outside_kernels_us`): setting
   its inputs and its graph_compute, less the median time in the nodes; and
   graph_compute's alone (`compute_outside_kernels_us`). Medians.
3. matmul: a graph of f32 MUL_MATs (the shapes of a prompt's projections) against the
   same products done directly with np.matmul; throughput ratio.
4. --crossover: for each weight type, the batch size from which BLAS (numpy) beats the
   C kernels (ggml_py.backends.cpu.blas.BLAS_MIN_BATCH holds the measured values), at
   1 thread each (OPENBLAS_NUM_THREADS=1 is set for this mode).
5. --gemm: q8_0 MUL_MATs of a prompt's shapes by batch size through the AVX-512 build's
   GEMM (gemm-q8.c), the AVX2 dot tiles and BLAS, 1 thread each: time over the GEMM's.

Medians of wall time. This machine has 2 noisy cores: read ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

if "--crossover" in sys.argv or "--gemm" in sys.argv:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before numpy loads OpenBLAS

import numpy as np

from ggml_py import Context, Graph, ops, quants
from ggml_py.backends.cpu import CPUBackend, isa_supported, set_isa, tensor_array
from ggml_py._backend import tensor_set_all
from ggml_py.models.transformer import Model, Session, llama_config, tensor_values
from ggml_py.tools.opscheck import HostAllocation
from ggml_py.sched import Scheduler
from ggml_py.tools.machine import announce, with_machine


def paired_times(fa, fb, reps, warmup=2):
    """Median times of fa and fb run alternately (a noisy machine slows both alike) and
    the median of the per-pair ratios time(fb) / time(fa)."""
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fa()
        t1 = time.perf_counter()
        fb()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return (statistics.median(ta), statistics.median(tb),
            statistics.median(b / a for a, b in zip(ta, tb)))


def median_time(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# ---------------------------------------------------------------------------
# 1. per-node dispatch

def bench_dispatch(n_nodes, reps, n_threads=1):
    cpu = CPUBackend(n_threads=n_threads)
    ctx = Context("dispatch")
    a = ops.new_tensor_1d(ctx, "f32", 16, name="a")
    b = ops.new_tensor_1d(ctx, "f32", 16, name="b")
    x = a
    for i in range(n_nodes):
        k = i % 3
        x = ops.add(ctx, x, b) if k == 0 else ops.mul(ctx, x, b) if k == 1 else \
            ops.scale(ctx, x, 0.5)
    g = Graph(2 * n_nodes + 16).build_forward_expand(x)
    HostAllocation(cpu).alloc_graph(g)
    tensor_array(a)[...] = 1.0
    tensor_array(b)[...] = 1.0
    an, bn = np.ones(16, np.float32), np.ones(16, np.float32)

    def direct():
        y = an
        for i in range(n_nodes):
            k = i % 3
            y = y + bn if k == 0 else y * bn if k == 1 else y * np.float32(0.5)
        return y
    t_backend, t_numpy, _ = paired_times(lambda: cpu.graph_compute(g), direct, reps)
    row = {"bench": "dispatch", "n_nodes": g.n_nodes,
           "backend_us_per_node": t_backend / g.n_nodes * 1e6,
           "numpy_us_per_op": t_numpy / n_nodes * 1e6}
    row["overhead_us_per_node"] = row["backend_us_per_node"] - row["numpy_us_per_op"]
    sched = Scheduler([cpu], graph_size=g.n_nodes + g.n_leafs + 16)
    sched.alloc_graph(g)
    t_sched = median_time(lambda: sched.graph_compute(g), reps)
    row["sched_us_per_node"] = t_sched / g.n_nodes * 1e6
    return row


# ---------------------------------------------------------------------------
# 2. a decode step of the demo llama

def bench_decode(reps, n_threads=1):
    cfg = llama_config()
    cpu = CPUBackend(n_threads=n_threads)
    model = Model.random(cfg, seed=0).place(cpu)
    sess = Session(model, [cpu])
    rebuilt = Session(model, [cpu], reuse_decode_graph=False)
    prompt = list(range(1, 17))
    for s in (sess, rebuilt):
        s.forward(prompt, logits="last")
    n_past = sess.cache.n_past

    # decode walks forward through the cells of one KV pad window (n_past .. its end),
    # then starts over at n_past: as in generation, a step follows the one before
    # (the kept graph's inputs advance in place), and no step grows the padded length
    window = range(n_past, -(-(n_past + 1) // cfg.kv_pad) * cfg.kv_pad)

    def stepper(s):
        positions = itertools.cycle(window)

        def step():
            s.cache.n_past = next(positions)
            s.forward([7], logits="last")
        return step
    t_rebuilt, t_step, _ = paired_times(stepper(rebuilt), stepper(sess), reps)
    last = sess.history[-1]
    assert last.graph_reused and last.plan_reused, "the decode step did not keep its graph"

    # the kept step's own graph and plan, as the last step left them in sess.sched
    fw = sess.decode.kept

    def kept_step():
        """Seconds of (setting the inputs, graph_compute) of the kept step, as
        Session.forward does them: the inputs are set each time, since the allocator may
        reuse their memory once read, as ggml-alloc does (llama.cpp sets them every
        step too)."""
        t0 = time.perf_counter()
        tensor_set_all(fw.inputs)
        t1 = time.perf_counter()
        sess.sched.graph_compute(fw.graph)
        return t1 - t0, time.perf_counter() - t1

    def kernels_us():
        return sum(sum(p.node_times()) for p in cpu.executor.cached_cplans())
    for _ in range(2):
        kept_step()
    timed = [kept_step() for _ in range(reps)]
    t_inputs = statistics.median(i for i, _ in timed)
    t_compute = statistics.median(c for _, c in timed)
    t_kept = statistics.median(i + c for i, c in timed)
    cpu.executor.set_profiling(True)        # nodes timed from here on
    in_kernels = []
    for _ in range(reps):
        before = kernels_us()
        kept_step()
        in_kernels.append(kernels_us() - before)
    t_kernels = statistics.median(in_kernels) / 1e6
    cpu.executor.set_profiling(False)
    tensor_values(fw.logits)
    return {"bench": "decode", "model": f"llama {cfg.n_layer}L n_embd {cfg.n_embd}",
            "n_nodes": fw.graph.n_nodes, "step_ms": t_step * 1e3,
            "step_rebuilt_ms": t_rebuilt * 1e3, "reuse_speedup": t_rebuilt / t_step,
            "step_build_us": last.build_s * 1e6, "step_alloc_inputs_us": last.alloc_s * 1e6,
            "n_inputs": len(fw.inputs), "inputs_us": t_inputs * 1e6,
            "compute_ms": t_compute * 1e3, "kernels_ms": t_kernels * 1e3,
            "compute_outside_kernels_us": (t_compute - t_kernels) * 1e6,
            "kept_step_outside_kernels_us": (t_kept - t_kernels) * 1e6,
            "outside_kernels_share": (t_step - t_kernels) / t_step,
            "graph_alloc_share": (t_step - t_compute) / t_step,
            "dispatch_share": (t_compute - t_kernels) / t_step}


# ---------------------------------------------------------------------------
# 3. matmul-heavy graph vs numpy

def bench_matmul(n_embd, n_tokens, n_mats, reps, wtype="f32", n_threads=1):
    cpu = CPUBackend(n_threads=n_threads)
    rng = np.random.default_rng(0)
    ctx = Context("matmul")
    ws = [ops.new_tensor_2d(ctx, wtype, n_embd, n_embd, name=f"w{i}") for i in range(n_mats)]
    x = ops.new_tensor_2d(ctx, "f32", n_embd, n_tokens, name="x")
    y = x
    for w in ws:
        y = ops.mul_mat(ctx, w, y)
    g = Graph(4 * n_mats + 16).build_forward_expand(y)
    HostAllocation(cpu).alloc_graph(g)
    wn = [rng.standard_normal((n_embd, n_embd), dtype=np.float32) / np.float32(np.sqrt(n_embd))
          for _ in ws]
    for w, v in zip(ws, wn):
        tensor_array(w)[0, 0] = v.astype(tensor_array(w).dtype)
    xn = rng.standard_normal((n_tokens, n_embd), dtype=np.float32)
    tensor_array(x)[0, 0] = xn

    def direct():
        yy = xn
        for v in wn:
            yy = np.matmul(yy, v.T)
        return yy
    t_graph, t_numpy, ratio = paired_times(lambda: cpu.graph_compute(g), direct, reps)
    flops = 2.0 * n_embd * n_embd * n_tokens * n_mats
    return {"bench": "matmul", "shape": f"{n_mats} x [{n_embd}x{n_embd}] @ [{n_embd}x{n_tokens}]",
            "wtype": wtype, "graph_gflops": flops / t_graph / 1e9,
            "numpy_gflops": flops / t_numpy / 1e9, "ratio_vs_numpy": ratio}


# ---------------------------------------------------------------------------
# 4. where BLAS starts to beat the C kernels

def _square_mul_mat(wtype, k, n, m=None):
    ctx = Context("crossover")
    m = k if m is None else m
    w = ops.new_tensor_2d(ctx, wtype, k, m, name="w")
    x = ops.new_tensor_2d(ctx, "f32", k, n, name="x")
    g = Graph(16).build_forward_expand(ops.mul_mat(ctx, w, x))
    HostAllocation(CPUBackend(n_threads=1)).alloc_graph(g)
    rng = np.random.default_rng(0)
    tensor_array(w)[0, 0] = quants.from_f32(wtype, rng.standard_normal((m, k), np.float32), cpu=False)
    tensor_array(x)[0, 0] = rng.standard_normal((n, k), np.float32)
    return g


def bench_crossover(wtypes=("f32", "f16", "q8_0", "q4_0"), ks=(256, 512, 1024, 2048),
                    ns=(16, 32, 64, 128, 256, 512)):
    """BLAS time / C time per weight type, weight size and batch (1 thread each)."""
    c_kernels = CPUBackend(n_threads=1, blas_min_batch={})
    rows = []
    for wtype in wtypes:
        blas_backend = CPUBackend(n_threads=1, blas_min_batch={wtype: 1})
        for k in ks:
            ratios = {}
            for n in ns:
                g = _square_mul_mat(wtype, k, n)
                reps = max(3, int(2e7 / (k * k * n)))
                t_c, t_blas, _ = paired_times(lambda: c_kernels.graph_compute(g),
                                              lambda: blas_backend.graph_compute(g), reps)
                ratios[n] = t_blas / t_c
            first = next((n for n in ns if all(ratios[m] < 1.0 for m in ns if m >= n)), None)
            rows.append({"bench": "crossover", "wtype": wtype, "k": k, "blas_over_c": ratios,
                         "blas_from_batch": first})
    return rows


# ---------------------------------------------------------------------------
# 5. the q8_0 GEMM against the dot tiles and BLAS

def bench_gemm(shapes=((1024, 1024), (2816, 1024), (1024, 2816)), ns=(8, 16, 32, 128, 512)):
    """Time of the AVX2 dot tiles and of BLAS over the GEMM's, by weight shape (m x k) and
    batch (1 thread each; the C plan is made under AVX-512, so both C paths fit its buffer)."""
    if not isa_supported("avx512"):
        raise SystemExit("--gemm needs a CPU with AVX-512 VNNI")
    c_kernels = CPUBackend(n_threads=1, blas_min_batch={})
    blas_backend = CPUBackend(n_threads=1, blas_min_batch={"q8_0": 1})

    def on(level, fn):
        set_isa(level)
        fn()

    rows = []
    for m, k in shapes:
        for n in ns:
            g = _square_mul_mat("q8_0", k, n, m)
            gemm = lambda: on("avx512", lambda: c_kernels.graph_compute(g))
            reps = max(3, int(1e8 / (m * k * n)))
            t_gemm, t_tiles, r_tiles = paired_times(gemm, lambda: on("avx2", lambda: c_kernels.graph_compute(g)), reps)
            # (BLAS's plan made under AVX2, where no GEMM keeps the product in C)
            _, t_blas, r_blas = paired_times(gemm, lambda: on("avx2", lambda: blas_backend.graph_compute(g)), reps)
            rows.append({"bench": "gemm", "m": m, "k": k, "n": n, "gemm_ms": 1e3 * t_gemm,
                         "gmac_s": m * k * n / t_gemm / 1e9, "tiles_over_gemm": r_tiles,
                         "blas_over_gemm": r_blas})
    set_isa("avx512")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--json", action="store_true", help="one JSON object per result")
    ap.add_argument("--threads", type=int, default=1, help="CPU backend threads (default 1)")
    ap.add_argument("--crossover", action="store_true",
                    help="only the BLAS / C kernel crossover (1 thread each)")
    ap.add_argument("--gemm", action="store_true",
                    help="only the q8_0 GEMM against the dot tiles and BLAS (1 thread each)")
    a = ap.parse_args(argv)
    machine = announce(a.json)
    reps = 7 if a.quick else 25
    if a.gemm:
        rows = bench_gemm(ns=(8, 32, 128) if a.quick else (8, 16, 32, 128, 512))
    elif a.crossover:
        rows = bench_crossover(ks=(256, 1024) if a.quick else (256, 512, 1024, 2048))
    else:
        t = a.threads
        rows = [bench_dispatch(600 if a.quick else 3000, reps, t), bench_decode(reps, t),
                bench_matmul(1024, 128, 8, reps, n_threads=t),
                bench_matmul(512, 16, 8, reps, n_threads=t)]
    for r in rows:
        if a.json:
            print(with_machine(r, machine))
        elif r["bench"] == "crossover":
            ratios = " ".join(f"{n}:{v:.2f}" for n, v in r["blas_over_c"].items())
            print(f"crossover {r['wtype']} k={r['k']}: BLAS/C time by batch {ratios} -> BLAS "
                  f"from batch {r['blas_from_batch']}")
        elif r["bench"] == "gemm":
            print(f"gemm q8_0 [{r['m']} x {r['k']}] by {r['n']}: {r['gemm_ms']:.3f} ms "
                  f"({r['gmac_s']:.1f} GMAC/s); AVX2 dot tiles {r['tiles_over_gemm']:.2f}x its "
                  f"time, BLAS {r['blas_over_gemm']:.2f}x")
        elif r["bench"] == "dispatch":
            s = f", {r['sched_us_per_node']:.1f} us through Scheduler.graph_compute"
            print(f"dispatch: {r['n_nodes']} tiny nodes: {r['backend_us_per_node']:.1f} us/node "
                  f"on CPUBackend{s}; numpy directly {r['numpy_us_per_op']:.2f} us/op "
                  f"-> {r['overhead_us_per_node']:.1f} us/node of overhead")
        elif r["bench"] == "decode":
            print(f"decode step ({r['model']}, {r['n_nodes']} nodes): {r['step_ms']:.2f} ms "
                  f"per step with the kept graph ({r['step_rebuilt_ms']:.2f} ms building a new "
                  f"one: {r['reuse_speedup']:.1f}x; last step: build {r['step_build_us']:.0f} us, "
                  f"alloc + inputs {r['step_alloc_inputs_us']:.0f} us), compute {r['compute_ms']:.3f} ms, in kernels "
                  f"{r['kernels_ms']:.3f} ms; outside them: {r['n_inputs']} inputs + compute "
                  f"{r['kept_step_outside_kernels_us']:.1f} us (inputs {r['inputs_us']:.1f} us, "
                  f"compute {r['compute_outside_kernels_us']:.1f} us) -> "
                  f"{100 * r['outside_kernels_share']:.0f}% outside "
                  f"kernels ({100 * r['graph_alloc_share']:.0f}% graph build/alloc/inputs, "
                  f"{100 * r['dispatch_share']:.0f}% dispatch)")
        else:
            print(f"matmul {r['shape']} {r['wtype']}: graph {r['graph_gflops']:.1f} GFLOP/s, "
                  f"numpy {r['numpy_gflops']:.1f} GFLOP/s -> {r['ratio_vs_numpy']:.2f}x numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
