"""Time `ggml-py plan MODEL.gguf` on a 70B-shaped file (issue 32's target: <= 1 s, <= 300 MB).

    python bench/bench_plan_gguf.py [--runs N]

Writes the Llama-3-70B-shaped file of tests/test_plan_gguf.py (80 layers, q4_K, tensor
infos only: the weights a hole in a sparse file), then runs, each in a fresh interpreter,
the command's work -- read the metadata and tensor infos, place, build the prompt and
decode graphs, reserve them three times as llama.cpp does -- on two 24 GiB RPC devices and
the CPU, -c 8192 (-fa auto: on, after its one-token probe). Prints the median wall time of
plan_gguf, of the whole command (imports and interpreter start included) and the peak RSS.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICES = "rpc:24GiB,rpc:24GiB,cpu"


def one_run(path):
    t = time.perf_counter()
    from ggml_py.models.devices import parse_devices
    from ggml_py.models.model_plan import PlanOptions, plan_gguf
    t_import = time.perf_counter() - t
    t = time.perf_counter()
    plan_gguf(path, parse_devices(DEVICES), PlanOptions(n_ctx=8192))
    t_plan = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{t_import} {t_plan} {rss}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--one", metavar="GGUF", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one_run(args.one)
        return
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from test_plan_gguf import write_70b
    with tempfile.TemporaryDirectory() as tmp:
        path = write_70b(os.path.join(tmp, "70b.gguf"))
        rows = []
        for _ in range(args.runs):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--one", path], check=True,
                                 capture_output=True, text=True, cwd=tmp).stdout.split()
            rows.append((time.perf_counter() - t, *map(float, out)))
    wall, imp, plan, rss = (statistics.median(c) for c in zip(*rows))
    print(f"70B-shaped (80 layers, {DEVICES}, -c 8192), medians of {args.runs} runs: "
          f"plan_gguf {plan:.3f} s, imports {imp:.3f} s, whole process {wall:.3f} s, "
          f"peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
