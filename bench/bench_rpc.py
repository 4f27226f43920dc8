"""Benchmark of the RPC backend: the demo models' decode steps on ggml RPC servers.

    python bench/bench_rpc.py [--steps N] [--threads N] [--json]

Starts ggml 0.10.1 RPC servers on localhost (python -m ggml_py.rpc_server; needs ggml's
libraries, see .ci/install-ggml-rpc) and, per demo model (llama and the three MoE
kinds):

1. decode: one decode step (build graph, alloc_graph, set inputs, compute, read the
   logits) with every layer and the output on one server, [rpc, CPU], against the
   CPU-only step measured alternately with it; and the same over two servers,
   [rpc0, rpc1, CPU] (layers split evenly, as llama.cpp's --tensor-split 1,1);
2. transfers: the share of a [rpc, CPU] step spent moving tensor data to and from the
   server (SET_TENSOR / GET_TENSOR / COPY_TENSOR round trips on the connection,
   measured with each split waited for, so that a read does not absorb the server's
   compute), and the bytes per step each way (graphs included);
3. serialise: the cost of turning a split into GRAPH_COMPUTE's payload, per node.

Medians. This machine has 2 noisy cores shared with other work: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from ggml_py.backends.rpc import _protocol
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.rpc import RPCBackend
from ggml_py.models.placement import place_model
from ggml_py.models.transformer import (Model, Session, build_forward,
                                        llama_config, moe_config)
from ggml_py.rpc_server import start_server
from ggml_py.sched import Scheduler
from ggml_py.tools.machine import describe, summary
from bench_compute import paired_times

MODELS = {"llama": llama_config(), **{k: moe_config(k) for k in ("moe_dense", "moe_topk",
                                                                 "moe_shared")}}
PROMPT = [1, 2, 3, 4]


class Stepper:
    """Decode steps of one session, restarting the prompt before the cache is full."""

    def __init__(self, session):
        self.sess = session
        self.tok = 5
        self.restart()

    def restart(self):
        self.sess.reset()
        self.sess.forward(PROMPT, logits="last")

    def __call__(self):
        if self.sess.cache.n_past + 1 >= self.sess.model.config.n_ctx:
            self.restart()
        self.sess.forward([self.tok], logits="last")
        self.tok = (self.tok * 7 + 3) % self.sess.model.config.n_vocab


def session(cfg, backends, **kw):
    model = Model.random(cfg, seed=0)
    if len(backends) == 1:
        model.place(backends[0])
    else:
        place_model(model, backends, tensor_split=[1.0] * (len(backends) - 1))
    return Session(model, backends, **kw)


TRANSFERS = ("SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR")


def _link_totals(conn):
    """(seconds in data commands, bytes sent, bytes received) so far on a connection."""
    st = conn.stats
    secs = sum(st[c][3] for c in TRANSFERS if c in st)
    return secs, sum(v[1] for v in st.values()), sum(v[2] for v in st.values())


def transfer_share(cfg, rpc, cpu, steps):
    """Share of a [rpc, CPU] step spent moving tensor data to and from the server, and
    the bytes per step each way. Each split is waited for (the session's profile_splits),
    so a read does not absorb the server's compute."""
    st = Stepper(session(cfg, [rpc, cpu], profile_splits=True))
    shares, sent, received = [], [], []
    for _ in range(steps):
        s0, b0, r0 = _link_totals(rpc.conn)
        t0 = time.perf_counter()
        st()
        wall = time.perf_counter() - t0
        s1, b1, r1 = _link_totals(rpc.conn)
        shares.append((s1 - s0) / wall)
        sent.append(b1 - b0)
        received.append(r1 - r0)
    return statistics.median(shares), {"sent": statistics.median(sent),
                                       "received": statistics.median(received)}


def serialise_cost(rpc, cpu, reps):
    """µs per node of serialize_graph over the RPC splits of a 32-layer llama prompt."""
    cfg = llama_config(n_layer=32, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256)
    model = place_model(Model.random(cfg, seed=0), [rpc, cpu])
    sess = Session(model, [rpc, cpu])
    fw = build_forward(model, sess.cache, PROMPT)
    sched: Scheduler = sess.sched
    sched.alloc_graph(fw.graph)
    nodes = fw.graph.nodes
    parts = [nodes[s.i_start:s.i_end] for s in sched.splits if s.backend is rpc]
    n = sum(len(p) for p in parts)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for p in parts:
            _protocol.serialize_graph(rpc, 0, p, rpc.conn)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / n * 1e6, n


def run(steps, threads):
    servers = [start_server(threads=threads) for _ in range(2)]
    try:
        r0, r1 = (RPCBackend(s.endpoint) for s in servers)
        cpu = CPUBackend()
        rows = []
        for name, cfg in MODELS.items():
            cpu_step = Stepper(session(cfg, [cpu]))
            one = Stepper(session(cfg, [r0, cpu]))
            two = Stepper(session(cfg, [r0, r1, cpu]))
            t_cpu, t_one, ratio_one = paired_times(cpu_step, one, steps)
            t_cpu2, t_two, ratio_two = paired_times(cpu_step, two, steps)
            share, links = transfer_share(cfg, r0, cpu, max(4, steps // 2))
            rows.append({"model": name, "cpu_ms": 1e3 * statistics.median([t_cpu, t_cpu2]),
                         "rpc_cpu_ms": 1e3 * t_one, "ratio": ratio_one,
                         "rpc2_cpu_ms": 1e3 * t_two, "ratio2": ratio_two,
                         "transfer_share": share, "bytes_per_step": links})
        us_per_node, n_nodes = serialise_cost(r0, cpu, max(5, steps // 2))
        link = r0.conn.link
        return rows, {"serialise_us_per_node": us_per_node, "nodes": n_nodes,
                      "round_trip_us": 1e6 * _round_trip(r0)}, link
    finally:
        for s in servers:
            s.stop()


def _round_trip(rpc, reps=200):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rpc.conn.device_count()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="decode steps per measurement")
    ap.add_argument("--threads", type=int, default=1, help="threads of each server")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows, ser, link = run(a.steps, a.threads)
    if a.json:
        print(json.dumps({"machine": describe(), "decode": rows, "serialise": ser,
                          "link": link}))
        return 0
    print(f"machine: {summary()}")
    print(f"decode step, medians of {a.steps} (servers: {a.threads} thread(s) each)")
    print(f"{'model':11} {'CPU':>8} {'rpc+CPU':>9} {'ratio':>6} {'2rpc+CPU':>9} {'ratio':>6} "
          f"{'transfers':>9}  bytes/step to / from the server")
    for r in rows:
        print(f"{r['model']:11} {r['cpu_ms']:7.2f}ms {r['rpc_cpu_ms']:8.2f}ms {r['ratio']:5.2f}x "
              f"{r['rpc2_cpu_ms']:8.2f}ms {r['ratio2']:5.2f}x {100 * r['transfer_share']:8.1f}%  "
              + f"{r['bytes_per_step']['sent']:.0f} / {r['bytes_per_step']['received']:.0f}")
    print(f"serialise: {ser['serialise_us_per_node']:.3f} µs/node ({ser['nodes']} nodes); "
          f"round trip (DEVICE_COUNT): {ser['round_trip_us']:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
