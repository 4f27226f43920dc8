"""Element-conversion benchmark: the C kernels of ggml_py._quants against the numpy
versions they replaced (tests/quants_ref.py), on one weight matrix (4096 x 4096 by
default).

    python bench/bench_quants.py [--rows 4096] [--cols 4096] [--reps 11] [--json]
    python bench/bench_quants.py --vs-ggml [--types q4_K,q6_K,...] [--rows 1024]

--vs-ggml times every block type's conversions against ggml 0.10.1's own, called through
ctypes on the same rows (bench/ggml_quants_ref.py; needs `pip install ggml-py==0.10.1`),
alternating, medians: dequantisation (to_float), the reference quantiser
(ggml_quantize_chunk) and the CPU quantiser (from_float); ratio = ggml_py / ggml, lower is
better. ggml_quantize_chunk takes all rows in one call, as ggml_py does; ggml's to_float and
from_float are reached through ctypes a row at a time (about a microsecond a call), so
those two ratios flatter ggml_py where a row converts in microseconds. The MUL_MAT
microbenchmark per type is `bench_vs_ggml.py --mul-mat all`.

For each kernel: median wall time of the kernel writing a new array (as the CPU
backend calls it), of the kernel writing into a preallocated out= array (no page
faults for a fresh result), and of the numpy version; GB/s counts the bytes read
plus the bytes written once. This machine has few, noisy cores: read ratios, not
absolute numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import numpy as np

from ggml_py import _quants as C
from ggml_py.tools.machine import describe, summary

HERE = os.path.dirname(os.path.abspath(__file__))


def _numpy_reference():
    """tests/quants_ref.py, the numpy versions the kernels replaced: a test helper, loaded
    from its file (the package under test is the installed one)."""
    path = os.path.join(HERE, "..", "tests", "quants_ref.py")
    spec = importlib.util.spec_from_file_location("quants_ref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


R = _numpy_reference()


def median_s(fn, reps):
    fn()                                            # warm up (and first-touch)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def kernels(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    h = C.f32_to_f16(x)
    bf = C.f32_to_bf16(x)
    q8 = C.quantize_q8_0(x)
    q4 = C.quantize_q4_0(x)
    f = np.empty_like(x)
    hu = np.empty(x.shape, np.uint16)
    o8 = np.empty_like(q8)
    o4 = np.empty_like(q4)
    # name: (c kernel, c kernel with out=, numpy, bytes in, bytes out)
    return {
        "f16 -> f32": (lambda: C.f16_to_f32(h), lambda: C.f16_to_f32(h, out=f),
                       lambda: R.f16_to_f32(h.view(np.uint16)), h.nbytes, x.nbytes),
        "f32 -> f16": (lambda: C.f32_to_f16(x), lambda: C.f32_to_f16(x, out=hu),
                       lambda: R.f32_to_f16(x), x.nbytes, h.nbytes),
        "bf16 -> f32": (lambda: C.bf16_to_f32(bf), lambda: C.bf16_to_f32(bf, out=f),
                        lambda: R.bf16_to_f32(bf), bf.nbytes, x.nbytes),
        "f32 -> bf16": (lambda: C.f32_to_bf16(x), lambda: C.f32_to_bf16(x, out=hu),
                        lambda: R.f32_to_bf16(x), x.nbytes, bf.nbytes),
        "round f16": (lambda: C.round_f16(x), lambda: C.round_f16(x, out=f),
                      lambda: R.round_f16(x), x.nbytes, x.nbytes),
        "round bf16": (lambda: C.round_bf16(x), lambda: C.round_bf16(x, out=f),
                       lambda: R.round_bf16(x), x.nbytes, x.nbytes),
        "q8_0 dequantise": (lambda: C.dequantize_q8_0(q8), lambda: C.dequantize_q8_0(q8, out=f),
                            lambda: R.dequantize_q8_0(q8), q8.nbytes, x.nbytes),
        "q8_0 quantise ref": (lambda: C.quantize_q8_0(x), lambda: C.quantize_q8_0(x, out=o8),
                              lambda: R.quantize_q8_0(x), x.nbytes, q8.nbytes),
        "q8_0 quantise cpu": (lambda: C.quantize_q8_0(x, cpu=True),
                              lambda: C.quantize_q8_0(x, cpu=True, out=o8),
                              lambda: R.quantize_q8_0(x, cpu=True), x.nbytes, q8.nbytes),
        "q8_0 round (src1)": (lambda: C.round_q8_0(x), lambda: C.round_q8_0(x, out=f),
                              lambda: R.round_q8_0(x), x.nbytes, x.nbytes),
        "q4_0 dequantise": (lambda: C.dequantize_q4_0(q4), lambda: C.dequantize_q4_0(q4, out=f),
                            lambda: R.dequantize_q4_0(q4), q4.nbytes, x.nbytes),
        "q4_0 quantise": (lambda: C.quantize_q4_0(x), lambda: C.quantize_q4_0(x, out=o4),
                          lambda: R.quantize_q4_0(x), x.nbytes, q4.nbytes),
    }


def vs_ggml(types, rows, cols, reps):
    """Per type and conversion: (ggml ms, ggml_py ms), alternating, medians."""
    sys.path.insert(0, HERE)
    from ggml_quants_ref import GgmlQuants
    from ggml_py import quants
    g = GgmlQuants()
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    out = []
    for t in types:
        raw = quants.quantize(t, x, cpu=False)
        pairs = {"dequantise": (lambda: g.to_float(t, raw), lambda: quants.dequantize(t, raw)),
                 "quantise ref": (lambda: g.quantize_chunk(t, x),
                                  lambda: quants.quantize(t, x, cpu=False)),
                 "quantise cpu": (lambda: g.from_float(t, x), lambda: quants.quantize(t, x, cpu=True))}
        if t in ("q8_1", "q8_K"):
            pairs = {"quantise cpu": pairs["quantise cpu"]}
        for what, (ggml_fn, ours) in pairs.items():
            tg, tp = [], []
            ggml_fn(), ours()
            for _ in range(reps):
                t0 = time.perf_counter()
                ggml_fn()
                t1 = time.perf_counter()
                ours()
                tp.append(time.perf_counter() - t1)
                tg.append(t1 - t0)
            out.append({"type": t, "conversion": what, "ggml_ms": statistics.median(tg) * 1e3,
                        "ggml_py_ms": statistics.median(tp) * 1e3})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096, help="a multiple of 32")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--only", default="", help="run the kernels whose name contains this")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--vs-ggml", action="store_true",
                    help="every block type's conversions against ggml 0.10.1's own")
    ap.add_argument("--types", default="", help="--vs-ggml's types (default: all block types)")
    args = ap.parse_args(argv)
    if args.cols % (256 if args.vs_ggml else 32):
        ap.error(f"--cols must be a multiple of {256 if args.vs_ggml else 32}")
    if args.vs_ggml:
        from ggml_py import quants
        types = args.types.split(",") if args.types else list(quants.BLOCKS)
        rows = vs_ggml(types, min(args.rows, 1024), args.cols, args.reps)
        if args.json:
            for r in rows:
                print(json.dumps({**r, "machine": describe()}))
            return 0
        print(f"machine: {summary()}")
        print(f"{min(args.rows, 1024)} rows x {args.cols} values, medians of {args.reps}, "
              "alternating; lower is better")
        print(f"{'type':8s} {'conversion':14s} {'ggml ms':>9s} {'ggml_py ms':>11s} {'ratio':>6s}")
        for r in rows:
            print(f"{r['type']:8s} {r['conversion']:14s} {r['ggml_ms']:9.2f} {r['ggml_py_ms']:11.2f} "
                  f"{r['ggml_py_ms'] / r['ggml_ms']:6.2f}")
        return 0
    results = []
    for name, (c_new, c_out, ref, nin, nout) in kernels(args.rows, args.cols).items():
        if args.only and args.only not in name:
            continue
        t_new = median_s(c_new, args.reps)
        t_out = median_s(c_out, args.reps)
        t_np = median_s(ref, max(3, args.reps // 3))
        gb = (nin + nout) / 1e9
        results.append({"kernel": name, "c_ms": t_new * 1e3, "c_out_ms": t_out * 1e3,
                        "numpy_ms": t_np * 1e3, "c_gbs": gb / t_new, "c_out_gbs": gb / t_out,
                        "numpy_gbs": gb / t_np, "speedup": t_np / t_new,
                        "speedup_out": t_np / t_out})
    if args.json:
        json.dump({"machine": describe(), "rows": args.rows, "cols": args.cols,
                   "results": results}, sys.stdout, indent=1)
        print()
        return 0
    print(f"machine: {summary()}")
    print(f"{args.rows} x {args.cols} float32 weights, medians of {args.reps}")
    print(f"{'kernel':20s} {'C ms':>8s} {'GB/s':>6s} {'C out= ms':>10s} {'GB/s':>6s} "
          f"{'numpy ms':>9s} {'GB/s':>6s} {'x new':>6s} {'x out=':>7s}")
    for r in results:
        print(f"{r['kernel']:20s} {r['c_ms']:8.2f} {r['c_gbs']:6.1f} {r['c_out_ms']:10.2f} "
              f"{r['c_out_gbs']:6.1f} {r['numpy_ms']:9.2f} {r['numpy_gbs']:6.1f} "
              f"{r['speedup']:6.1f} {r['speedup_out']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
