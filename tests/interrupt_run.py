"""Ctrl-C at random moments of a model's decode (run by test_robust_interrupts.py).

Run as a script, in a subprocess, so that a hang or a crash fails the test instead of
the test run: a timer raises KeyboardInterrupt at a seeded random moment of
`Session.generate` over the numpy device (its worker thread, queue and events), OpenCL
or a ggml RPC server, round after round. A round that is not cut must give the reference
tokens; after a cut one, a new session on the same backends must give them too, or raise
a GgmlPyError (an RPC connection cut mid-command is lost), after which new backends must.

    python tests/interrupt_run.py device|opencl|rpc [--endpoint HOST:PORT] [--rounds N] [--seed S]

prints one `SUMMARY {json}` line (rounds, interrupted, clean_errors, the distinct errors)
and exits 1 on a
wrong result.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys

from ggml_py.backends.cpu import CPUBackend
from ggml_py.errors import GgmlPyError
from ggml_py.models.placement import place_model
from ggml_py.models.transformer import Model, Session, llama_config

PROMPT, STEPS = [1, 2, 3, 4], 6


def interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["device", "opencl", "rpc"])
    ap.add_argument("--endpoint")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGALRM, interrupt)
    cpu = CPUBackend()
    weights = Model.random(llama_config(), seed=0)

    def new_backends():
        if args.kind == "device":
            from ggml_py.backends.numpy_device import NumpyDeviceBackend
            devices = [NumpyDeviceBackend()]
        elif args.kind == "opencl":
            from ggml_py.backends.opencl import OpenCLBackend
            devices = [OpenCLBackend()]
        else:
            from ggml_py.backends.rpc import rpc_backends
            devices = rpc_backends(args.endpoint)
        backends = [*devices, cpu]
        return backends, place_model(weights, backends, n_gpu_layers=None)

    def generate(backends, model):
        return Session(model, backends).generate(PROMPT, STEPS)

    backends, model = new_backends()
    reference = generate(backends, model)
    rng = random.Random(args.seed)
    counts = {"rounds": args.rounds, "interrupted": 0, "clean_errors": 0, "errors": []}
    for k in range(args.rounds):
        try:
            # (armed inside the try: a short timer can fire before the next statement)
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0002, 0.015))
            tokens = generate(backends, model)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            signal.setitimer(signal.ITIMER_REAL, 0)
            counts["interrupted"] += 1
            try:
                tokens = generate(backends, model)
            except GgmlPyError as e:
                counts["clean_errors"] += 1
                error = f"{type(e).__name__}: {e}"[:300]
                if error not in counts["errors"]:
                    counts["errors"].append(error)
                backends, model = new_backends()
                tokens = generate(backends, model)
        if tokens != reference:
            print(f"round {k}: tokens {tokens}, expected {reference}", flush=True)
            return 1
    print("SUMMARY " + json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
