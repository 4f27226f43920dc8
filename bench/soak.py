"""Soak: memory, threads and file descriptors stay flat over many cycles.

    python bench/soak.py [--cycles 10000] [--steps 1000] [--json]

Two loops, each after a warm-up:
  * split/alloc cycles: a shared scheduling case is split and allocated over and over
    (reset, assignments, alloc_graph, plan), and every 100 cycles the scheduler is
    dropped for a new one without close();
  * decode steps: a small llama on [numpy device, CPU] (parallel scheduler, so events
    and the device's worker thread are in play) decodes token after token, and every
    100 steps the session, its scheduler and its numpy device are dropped without
    close() and made anew.
Printed per loop: RSS growth per cycle (kB, after the warm-up), over all cycles and over
the second half (a leak grows in both, the heap settling in only in the first), threads
and open file descriptors at the start and the end. Linux only (/proc/self). Before each
RSS reading the C heap's free pages go back to the system (glibc's malloc_trim): what
stays is what is held, not the heap's fragmentation (graphs of tensor arenas come and go).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASE = os.path.join(HERE, "..", "tests", "data", "cases", "llama-2L-gpu-unsupported.case.json")


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def n_fds():
    return len(os.listdir("/proc/self/fd"))


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return lambda pad: 0


malloc_trim = _malloc_trim()


def snapshot():
    gc.collect()
    malloc_trim(0)
    return {"rss_kb": rss_kb(), "threads": threading.active_count(), "fds": n_fds()}


def measure(name, step, n, warmup):
    """Run step(i) warmup times, then n times: RSS growth per cycle over all n and over
    the second half (a leak grows in both; the heap settling in only in the first),
    and the threads and fds left."""
    for i in range(warmup):
        step(i)
    start = snapshot()
    t0 = time.perf_counter()
    for i in range(n // 2):
        step(warmup + i)
    wall = time.perf_counter() - t0
    half = snapshot()
    t0 = time.perf_counter()
    for i in range(n // 2, n):
        step(warmup + i)
    wall += time.perf_counter() - t0
    end = snapshot()
    return {"loop": name, "cycles": n, "seconds": round(wall, 2),
            "rss_kb_per_cycle": round((end["rss_kb"] - start["rss_kb"]) / max(n, 1), 4),
            "rss_kb_per_cycle_2nd_half": round((end["rss_kb"] - half["rss_kb"])
                                               / max(n - n // 2, 1), 4),
            "rss_kb": [start["rss_kb"], half["rss_kb"], end["rss_kb"]],
            "threads": [start["threads"], end["threads"]], "fds": [start["fds"], end["fds"]]}


def split_alloc_cycles(n, warmup=200):
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import scheduler_for_case
    case = load_case(CASE)
    state = {"sched": scheduler_for_case(case)}

    def step(i):
        if i % 100 == 0:
            state["sched"] = scheduler_for_case(case)     # the old one dropped, not closed
        sched = state["sched"]
        sched.reset()
        for t, b in case.assignments:
            sched.set_tensor_backend(t, b)
        sched.alloc_graph(case.graph)
        sched.plan(case.name)
    return measure("split/alloc", step, n, warmup)


def decode_steps(n, warmup=40):
    import numpy as np
    from ggml_py.backends.cpu import CPUBackend
    from ggml_py.backends.numpy_device import NumpyDeviceBackend
    from ggml_py.models.transformer import Model, ModelConfig, Session
    from ggml_py.sched import Scheduler
    from ggml_py.models.transformer import graph_size
    cfg = ModelConfig(n_vocab=64, n_ctx=64, n_embd=32, n_head=4, n_head_kv=2, n_layer=2,
                      n_ff=64, kv_pad=16, wtype="f32", cache_type="f32")
    cpu = CPUBackend()
    state = {}

    def new_session():
        dev = NumpyDeviceBackend("SOAK_DEV", unsupported_ops=["SOFT_MAX", "ROPE"])
        model = Model.random(cfg, seed=0).place([dev, dev], host=cpu, output_backend=cpu)
        sched = Scheduler([dev, cpu], graph_size=graph_size(cfg), parallel=True)
        state["session"] = Session(model, [dev, cpu], scheduler=sched)
        state["token"] = int(np.argmax(state["session"].forward([1, 2, 3], logits="last")[-1]))

    def step(i):
        if i % 100 == 0 or state["session"].cache.n_past >= cfg.n_ctx - 1:
            new_session()       # the old session, scheduler and device dropped, not closed
        logits = state["session"].forward([state["token"]], logits="last")
        state["token"] = int(np.argmax(logits[-1]))
    return measure("decode", step, n, warmup)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not os.path.isdir("/proc/self/fd"):
        sys.exit("the soak reads /proc/self: Linux only")
    for row in (split_alloc_cycles(args.cycles), decode_steps(args.steps)):
        print(json.dumps(row) if args.json else
              f"{row['loop']:<12} {row['cycles']:>6} cycles in {row['seconds']:7.1f} s: "
              f"RSS {row['rss_kb_per_cycle']:+.3f} kB/cycle, second half "
              f"{row['rss_kb_per_cycle_2nd_half']:+.3f} ({' -> '.join(map(str, row['rss_kb']))} kB), "
              f"threads {row['threads'][0]} -> {row['threads'][1]}, "
              f"fds {row['fds'][0]} -> {row['fds'][1]}", flush=True)


if __name__ == "__main__":
    main()
