"""`ggml-py run` against llama.cpp (llama-cpp-python 0.3.36) on the same GGUF files, one
CPU thread each, alternating, medians: llama-bench's two figures, prompt tokens/s (pp,
a prompt of --pp tokens in one batch) and decode tokens/s (tg, --tg greedy steps).

    python bench/bench_run.py [--reps N] [--pp N] [--tg N] [-fa on|off] [--models NAMES] [--json]

The models (issue 31), random weights written with the gguf package into a temporary
folder:
  llama     8 layers, n_embd 1024, 16 heads (4 KV), n_ff 2816, vocab 32000, Q8_0
  qwen3moe  the same width: 8 layers, n_embd 1024, 16 heads (4 KV), 16 experts of 704
            (top-4: the active FFN is llama's 2816), Q8_0

Each repetition runs both sides once, in a fresh process each, in alternating order:
`python -m ggml_py run FILE --prompt-len PP -n TG --threads 1 --device cpu -fa FA --json`,
and llama.cpp in a child process (n_threads = n_threads_batch = 1, the prompt in one
batch, then TG greedy steps; an untimed one-token pass first, as both sides warm up).
Both sides at the same -fa: on by default (llama.cpp's default on the CPU, where its
auto resolves to on), off for the KQ / soft_max / KQV graph. OpenBLAS is held to 1
thread. Ratios are ggml_py's tokens/s over llama.cpp's (of the medians, and the median of
each repetition's own ratio): above 1 ggml_py is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPE = dict(n_vocab=32000, n_ctx=256, n_embd=1024, n_head=16, n_head_kv=4, n_layer=8,
             n_ff=2816, wtype="q8_0")
MODELS = {
    "llama": dict(arch="llama"),
    "qwen3moe": dict(arch="qwen3moe", n_expert=16, n_expert_used=4, n_ff_exp=704),
}


def write_model(name: str, folder: str) -> str:
    from ggml_py.models.config import arch_config
    from ggml_py.models.gguf import save_gguf
    from ggml_py.models.transformer import Model
    kw = dict(MODELS[name])
    cfg = arch_config(kw.pop("arch"), **SHAPE, **kw)
    path = os.path.join(folder, f"{name}.gguf")
    save_gguf(Model.random(cfg, seed=0), path)
    return path


def env() -> dict[str, str]:
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def ours(path: str, pp: int, tg: int, fa: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, "-m", "ggml_py", "run", path, "--prompt-len", str(pp),
                        "-n", str(tg), "--threads", "1", "--device", "cpu", "-fa", fa,
                        "--json"],
                       capture_output=True, text=True, env=env(), cwd=ROOT, timeout=1800)
    if r.returncode:
        raise SystemExit(f"ggml-py run failed: {r.stderr.strip()}")
    out = json.loads(r.stdout.splitlines()[-1])
    return {"pp": out["pp_tok_s"], "tg": out["tg_tok_s"]}


def theirs(path: str, pp: int, tg: int, fa: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, __file__, "--llama-cpp", path, str(pp), str(tg), fa],
                       capture_output=True, text=True, env=env(), timeout=1800)
    if r.returncode:
        raise SystemExit(f"llama.cpp failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def llama_cpp_child(path: str, pp: int, tg: int, fa: bool) -> None:
    """llama.cpp's side, in its own process (its ggml must not meet ggml 0.10.1's)."""
    import numpy as np
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed: CMAKE_ARGS=\"-DGGML_RPC=ON\" "
                         "pip install llama-cpp-python==0.3.36 (builds llama.cpp, ~15 min)")
    llm = llama_cpp.Llama(model_path=path, n_threads=1, n_threads_batch=1, n_ctx=256,
                          n_batch=512, n_ubatch=512, flash_attn=fa, verbose=False)
    n_vocab = llm.n_vocab()
    prompt = np.random.default_rng(0).integers(0, n_vocab, pp).tolist()
    llm.eval(prompt[:1])            # untimed warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(tg):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    t2 = time.perf_counter()
    print(json.dumps({"pp": pp / (t1 - t0), "tg": tg / (t2 - t1)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-cpp":
        path, pp, tg, fa = sys.argv[2:6]
        llama_cpp_child(path, int(pp), int(tg), fa == "on")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("-fa", "--flash-attn", dest="fa", choices=("on", "off"), default="on",
                    help="flash attention on both sides (default on: llama.cpp's on the CPU)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from ggml_py.tools.machine import announce, with_machine
    machine = announce(args.json)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            path = write_model(name, folder)
            runs: dict[str, list[dict[str, float]]] = {"ggml_py": [], "llama.cpp": []}
            for rep in range(args.reps):
                sides = [("ggml_py", lambda: ours(path, args.pp, args.tg, args.fa)),
                         ("llama.cpp", lambda: theirs(path, args.pp, args.tg, args.fa))]
                for side, fn in sides[::1 if rep % 2 == 0 else -1]:
                    runs[side].append(fn())
            med = {side: {k: statistics.median(r[k] for r in rs) for k in ("pp", "tg")}
                   for side, rs in runs.items()}
            # each repetition's own ratio too: both sides of a pair ran under about the
            # same load, which drifts on a shared machine
            pairs = {k: statistics.median(a[k] / b[k] for a, b in zip(*runs.values()))
                     for k in ("pp", "tg")}
            row = {"model": name, "reps": args.reps, "pp_tokens": args.pp, "tg_tokens": args.tg,
                   "flash_attn": args.fa, "median_tok_s": med,
                   "all_tok_s": runs,
                   "ratio": {k: med["ggml_py"][k] / med["llama.cpp"][k] for k in ("pp", "tg")},
                   "median_pair_ratio": pairs}
            if args.json:
                print(with_machine(row, machine))
                continue
            print(f"{name}: pp{args.pp} ggml_py {med['ggml_py']['pp']:.1f} tok/s, llama.cpp "
                  f"{med['llama.cpp']['pp']:.1f} ({row['ratio']['pp']:.2f}x); tg{args.tg} "
                  f"ggml_py {med['ggml_py']['tg']:.1f}, llama.cpp {med['llama.cpp']['tg']:.1f} "
                  f"({row['ratio']['tg']:.2f}x)   [-fa {args.fa}, medians of {args.reps}, "
                  "alternating]")
            print(f"   median of the repetitions' own ratios: pp {pairs['pp']:.2f}x, "
                  f"tg {pairs['tg']:.2f}x")
            for side, rs in runs.items():
                print(f"   {side:<9} pp " + " ".join(f"{r['pp']:.0f}" for r in rs)
                      + "   tg " + " ".join(f"{r['tg']:.0f}" for r in rs))


if __name__ == "__main__":
    main()
