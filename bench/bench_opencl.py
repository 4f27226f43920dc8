"""Time the OpenCL backend's kernels against the numpy CPU backend.

    python bench/bench_opencl.py [--reps N] [--json]

Each case builds one op, computes it on both backends (inputs already on the device,
so transfers are not timed; the OpenCL time includes the queue finish) and reports
the median over N runs after a warm-up run, the ratio cpu/opencl, and the NMSE
between the two results. On PoCL (OpenCL on the CPU) the point is correctness; the
speed says little about a GPU.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

from ggml_py import ops
from ggml_py.tools import opscheck
from ggml_py._core import Context
from ggml_py.backends import opencl
from ggml_py.backends.cpu import CPUBackend
from ggml_py.tools.machine import describe, summary


def _mul_mat(wtype, k, m, n):
    def build(ctx, rng):
        w = ops.new_tensor(ctx, wtype, [k, m], name="w")
        x = ops.new_tensor(ctx, "f32", [k, n], name="x")
        wv = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        from ggml_py import quants
        wdata = quants.from_f32(wtype, wv) if wtype != "f32" else wv
        return ops.mul_mat(ctx, w, x), [(w, wdata), (x, rng.uniform(-1, 1, (n, k)).astype(np.float32))]
    return f"mul_mat {wtype} {m}x{k} @ {k}x{n}", build, 2.0 * k * m * n


def _rms_norm(n, rows):
    def build(ctx, rng):
        a = ops.new_tensor(ctx, "f32", [n, rows], name="a")
        return ops.rms_norm(ctx, a, 1e-5), [(a, rng.uniform(-10, 10, (rows, n)).astype(np.float32))]
    return f"rms_norm {rows}x{n}", build, None


def _soft_max(n, rows, heads):
    def build(ctx, rng):
        a = ops.new_tensor(ctx, "f32", [n, rows, heads], name="a")
        m = ops.new_tensor(ctx, "f16", [n, rows], name="mask")
        mask = np.triu(np.full((rows, n), -np.inf, np.float32), 1).astype(np.float16)
        return (ops.soft_max_ext(ctx, a, m, 0.125, 0.0),
                [(a, rng.uniform(-1, 1, (heads, rows, n)).astype(np.float32)), (m, mask)])
    return f"soft_max {heads}x{rows}x{n} +mask", build, None


CASES = [
    _mul_mat("f32", 256, 256, 32),
    _mul_mat("f16", 256, 256, 32),
    _mul_mat("q8_0", 256, 256, 32),
    _mul_mat("f32", 1024, 1024, 1),
    _mul_mat("q8_0", 1024, 1024, 1),
    _mul_mat("f32", 1024, 512, 128),
    _rms_norm(4096, 64),
    _soft_max(256, 256, 8),
]


def _prepare(backend, build, seed):
    ctx = Context()
    out, feeds = build(ctx, np.random.default_rng(seed))
    g, alloc = opscheck.prepare(backend, out, feeds)
    return ctx, g, out, alloc


def _time(backend, g, reps):
    backend.graph_compute(g)                       # warm-up (PoCL compiles on first launch)
    backend.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.graph_compute(g)
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(reps=5):
    ocl = opencl.OpenCLBackend()
    ocl.build()
    cpu = CPUBackend()
    rows = []
    for name, build, flops in CASES:
        keep = []
        res = {}
        for key, backend in (("cpu", cpu), ("opencl", ocl)):
            ctx, g, out, alloc = _prepare(backend, build, 0)
            keep.append((ctx, alloc))
            res[key] = (_time(backend, g, reps), np.frombuffer(backend.get_tensor(out), np.float32))
        (tc, rc), (to, ro) = res["cpu"], res["opencl"]
        ok = np.isfinite(rc)
        err = float(np.sum((rc[ok] - ro[ok]) ** 2) / max(np.sum(rc[ok] ** 2), 1e-30))
        row = {"case": name, "cpu_ms": tc * 1e3, "opencl_ms": to * 1e3, "cpu_over_opencl": tc / to,
               "nmse": err}
        if flops:
            row["opencl_gflops"] = flops / to / 1e9
            row["cpu_gflops"] = flops / tc / 1e9
        rows.append(row)
    return ocl.device["name"], rows


def decode_steps(ocl, cpu, steps=16):
    """Median decode step (ms) of the demo llama: every layer on OpenCL (CPU last), and
    on the CPU alone; plus the NMSE between their last logits."""
    from ggml_py.models.transformer import Model, Session, llama_config
    out = {}
    logits = {}
    for key, backends in (("opencl", [ocl, cpu]), ("cpu", [cpu])):
        model = Model.random(llama_config(), seed=0).place(backends[0], host=cpu)
        sess = Session(model, backends)
        sess.forward(list(range(1, 9)), logits="last")
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            logits[key] = sess.forward([10 + i], logits="last")
            times.append(time.perf_counter() - t0)
        out[key] = statistics.median(times) * 1e3
    ref, got = logits["cpu"], logits["opencl"]
    out["nmse"] = float(np.sum((ref - got) ** 2) / np.sum(ref ** 2))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    ok, why = opencl.available()
    if not ok:
        print(f"OpenCL unavailable: {why}", file=sys.stderr)
        return 2
    device, rows = run(args.reps)
    decode = decode_steps(opencl.OpenCLBackend(), CPUBackend())
    if args.json:
        print(json.dumps({"machine": describe(), "device": device, "results": rows,
                          "decode_step": decode}, indent=1))
        return 0
    print(f"machine: {summary()}")
    print(f"device: {device}   (median of {args.reps}; ratio = cpu time / opencl time)")
    print(f"{'case':34s} {'cpu ms':>9s} {'ocl ms':>9s} {'ratio':>7s} {'ocl GF/s':>9s} {'nmse':>9s}")
    for r in rows:
        gf = f"{r['opencl_gflops']:9.2f}" if "opencl_gflops" in r else " " * 9
        print(f"{r['case']:34s} {r['cpu_ms']:9.3f} {r['opencl_ms']:9.3f} "
              f"{r['cpu_over_opencl']:7.3f} {gf} {r['nmse']:9.2e}")
    print(f"demo llama decode step: OpenCL+CPU {decode['opencl']:.2f} ms, CPU alone "
          f"{decode['cpu']:.2f} ms (ratio {decode['cpu'] / decode['opencl']:.2f}), "
          f"logits NMSE {decode['nmse']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
