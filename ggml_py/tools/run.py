"""`ggml-py run MODEL.gguf`: a GGUF model on llama.cpp's graph of its architecture, as a
llama.cpp user runs one: the prompt (--tokens, or --prompt-len random ids) in batches of
-ub tokens, then -n decode steps of one token each, greedy (or teacher-forced by --feed);
prints the decode steps' tokens and llama-bench's two figures, prompt tokens/s (pp) and
decode tokens/s (tg). The decode graph is kept across steps (graph reuse), as llama.cpp
keeps its own. The layers go where --device / --rpc, -ngl and --tensor-split say.
-fa on|off|auto is llama.cpp's flash attention (default auto: on where every layer's
FLASH_ATTN_EXT runs on the layer's own device, as llama.cpp resolves it; on the CPU, on).

--logits-out FILE.npy writes one row of logits per prompt position and per decode step;
--json prints one object: tokens, graph_nodes ([prompt, decode], as llama.cpp's log
counts them), splits ([prompt, decode]: the scheduler's), flash_attn, pp_tok_s, tg_tok_s,
kv_cache_bytes. A model with sliding-window layers (gemma2, gemma3) gives them llama.cpp's
second, smaller KV cache (the window and a ubatch, padded to 256 cells) unless --swa-full.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ggml_py.tools import cli, demo

if TYPE_CHECKING:
    from ggml_py._backend import Backend
    from ggml_py.models.model import Model
    from ggml_py.models.session import Session

DEFAULTS = {"prompt_len": 16, "n": 16, "batch": 512, "ubatch": 512, "seed": 0}
FLASH_ATTN = ("on", "off", "auto")      # llama.cpp's -fa values
PLACEMENT = ("device", "rpc", "gpu_layers", "tensor_split")


def token_list(text: str) -> list[int]:
    """Token ids 'A,B,...' (at least one, none negative)."""
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of token ids such as "
                                         "1,2,3") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids are not negative, got {text}")
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("model", type=cli.input_file(".gguf"), metavar="MODEL.gguf",
                   help="the model (an architecture models.arch builds: llama, qwen2, qwen3, "
                        "qwen3moe, ...)")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--tokens", type=token_list, metavar="A,B,...",
                        help="the prompt's token ids")
    prompt.add_argument("--prompt-len", type=cli.count(1), metavar="N",
                        help=f"a prompt of N random token ids (--seed; default {d['prompt_len']})")
    p.add_argument("-n", "--n-predict", dest="n", type=cli.count(0), metavar="N",
                   help=f"decode steps (default {d['n']}, or as many as --feed gives)")
    p.add_argument("--feed", type=token_list, metavar="A,B,...",
                   help="feed these tokens as the decode steps instead of the greedy picks "
                        "(teacher forcing)")
    p.add_argument("--threads", type=cli.count(1), metavar="N",
                   help="CPU threads (default: the cores this process may use)")
    demo.add_placement_arguments(p, default_device="cpu")     # (llama.cpp without a GPU)
    p.add_argument("-c", "--ctx-size", dest="ctx", type=cli.count(1), metavar="N",
                   help="KV cache cells (default: the prompt and decode steps, rounded up "
                        "to 32)")
    p.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN, default="auto",
                   help="flash attention (default auto: on where every layer's device runs "
                        "it, as llama.cpp resolves it)")
    p.add_argument("-b", "--batch-size", dest="batch", type=cli.count(1), metavar="N",
                   help=f"prompt tokens per decode call (default {d['batch']})")
    p.add_argument("-ub", "--ubatch-size", dest="ubatch", type=cli.count(1), metavar="N",
                   help=f"prompt tokens per graph (default {d['ubatch']})")
    p.add_argument("--swa-full", action="store_true",
                   help="a full-size KV cache for the sliding-window layers too (default: "
                        "the window and a ubatch, padded to 256, as llama.cpp's)")
    p.add_argument("--seed", type=cli.count(0), metavar="N",
                   help=f"seed of the random prompt (default {d['seed']})")
    p.add_argument("--logits-out", type=cli.output_file(".npy"), metavar="FILE.npy",
                   help="write the logits: one row per prompt position and per decode step")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: tokens, graph_nodes [prompt, decode], "
                        "pp_tok_s, tg_tok_s")
    p.set_defaults(func=run)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse options that contradict each other, before the model is read; then fill in
    the defaults and the context size."""
    given = {k for k in (*PLACEMENT, "n", "prompt_len") if getattr(args, k) is not None}
    demo.check_placement(args, given)
    if args.feed is not None:
        if "n" in given and args.n != len(args.feed):
            raise cli.UsageError(f"-n {args.n} and --feed's {len(args.feed)} tokens disagree "
                                 "(-n may be left out)")
        args.n = len(args.feed)
    if args.tokens is not None and args.seed is not None:
        raise cli.UsageError("--seed makes a random prompt: it would be ignored with --tokens")
    for k, v in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.device = args.device or "cpu"
    n_prompt = len(args.tokens) if args.tokens is not None else args.prompt_len
    n_tokens = n_prompt + args.n
    if args.ctx is None:
        args.ctx = -(-n_tokens // 32) * 32
    elif n_tokens > args.ctx:
        raise cli.UsageError(f"the prompt's {n_prompt} tokens + {args.n} decode steps exceed "
                             f"the context (-c {args.ctx})")
    cfg = demo.gguf_config(args.model, graph="llama.cpp")
    bad = [t for t in (args.tokens or []) + (args.feed or []) if t >= cfg.n_vocab]
    if bad:
        raise cli.UsageError(f"token id {bad[0]} is not in {args.model}'s vocabulary "
                             f"(0..{cfg.n_vocab - 1})")


def load(args: argparse.Namespace, flash_attn: bool) -> Model:
    from ggml_py.models.gguf import GGUFError, load_gguf
    try:
        return load_gguf(args.model, n_ctx=args.ctx, graph="llama.cpp", flash_attn=flash_attn)
    except GGUFError as e:
        raise cli.UsageError(str(e)) from None


def flash_attn_off_layers(sess: Session) -> list[int]:
    """The layers whose flash attention would not run on the layer's own device, from a
    one-token graph of the session (placement.flash_attn_off_layers)."""
    from ggml_py.models.graph import build_forward
    from ggml_py.models.placement import flash_attn_off_layers as off_layers
    fw = build_forward(sess.model, sess.cache, [0], logits="last")
    return off_layers(sess.sched, fw.graph, sess.model.layer_backend)


def start_session(args: argparse.Namespace, model: Model, backends: list[Backend],
                  out: demo.Out) -> Session:
    """The model (loaded with flash attention unless -fa off) placed on `backends`, and its
    Session; with -fa auto loaded again without flash attention if a layer's device would
    not run it."""
    from ggml_py.models.placement import place_model
    from ggml_py.models.session import Session

    def session(model: Model) -> Session:
        # (llama.cpp's ubatch is at most its batch)
        return Session(place_model(model, backends, args.gpu_layers, args.tensor_split),
                       backends, n_ubatch=min(args.batch, args.ubatch), swa_full=args.swa_full)
    sess = session(model)
    off = flash_attn_off_layers(sess) if args.flash_attn == "auto" else []
    if off:
        out(f"   -fa auto: layer {off[0]}'s flash attention would not run on its device: off")
        sess = session(load(args, False))
    return sess


def generate(sess: Session, prompt: list[int], args: argparse.Namespace,
             bar: Any) -> dict[str, Any]:
    """The prompt in -ub batches, then the decode steps (greedy, or --feed's tokens):
    the tokens fed, the logits rows (when --logits-out wants them), the node counts
    and the seconds of each phase."""
    keep_all = args.logits_out is not None
    chunk = min(args.batch, args.ubatch)
    rows: list[np.ndarray] = []
    t0 = time.perf_counter()
    for i in range(0, len(prompt), chunk):
        rows.append(sess.forward(prompt[i:i + chunk], logits="all" if keep_all else "last"))
        bar.update(1)
    t1 = time.perf_counter()
    fed = []
    for step in range(args.n):
        tok = args.feed[step] if args.feed is not None else int(np.argmax(rows[-1][-1]))
        fed.append(tok)
        rows.append(sess.forward([tok], logits="last"))
        bar.update(1)
    t2 = time.perf_counter()
    decode = sess.history[-args.n:] if args.n else []
    return dict(tokens=fed, rows=rows, pp_s=t1 - t0, tg_s=t2 - t1,
                graph_nodes=[sess.history[0].n_nodes, decode[-1].n_nodes if decode else None],
                splits=[sess.history[0].n_splits, decode[-1].n_splits if decode else None],
                kept=sum(s.graph_reused and s.plan_reused for s in decode))


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    out = demo.say if not args.json else (lambda text: None)
    model = load(args, args.flash_attn != "off")
    out(f"ggml-py run {args.model}: {demo.describe_model(model)}")
    backends = demo.model_backends(args, out, n_threads=args.threads)
    sess = start_session(args, model, backends, out)
    cfg = sess.model.config
    if args.tokens is not None:
        prompt = list(args.tokens)
    else:
        prompt = np.random.default_rng(args.seed).integers(0, cfg.n_vocab, args.prompt_len).tolist()
    n_chunks = -(-len(prompt) // min(args.batch, args.ubatch))
    bar = demo.progress(1 + n_chunks + args.n, cfg.name)
    try:
        # an untimed pass first, as llama-bench warms up: start-up costs stay out of pp
        sess.forward(prompt[:1], logits="last")
        sess.reset()
        bar.update(1)
        r = generate(sess, prompt, args, bar)
    finally:
        bar.close()
    pp = len(prompt) / r["pp_s"]
    tg = args.n / r["tg_s"] if args.n else None
    if args.logits_out:
        np.save(args.logits_out, np.concatenate(r["rows"]).astype(np.float32))
    if args.json:
        print(json.dumps(dict(model=args.model, arch=cfg.arch, n_prompt=len(prompt),
                              n_decode=args.n, tokens=r["tokens"], graph_nodes=r["graph_nodes"],
                              splits=r["splits"], flash_attn=cfg.flash_attn,
                              pp_tok_s=pp, tg_tok_s=tg, kv_cache_bytes=sess.cache.nbytes,
                              decode_graph_kept=r["kept"])))
        return 0
    shown = prompt if len(prompt) <= 32 else prompt[:32] + ["..."]
    out(f"   prompt   {len(prompt)} tokens {shown}")
    out(f"   tokens   {r['tokens']}" + ("   (fed: --feed)" if args.feed is not None else ""))
    pp_nodes, tg_nodes = r["graph_nodes"]
    out(f"   graph nodes: prompt {pp_nodes}" + (f", decode {tg_nodes} (kept in {r['kept']} "
                                                 f"of {args.n} steps)" if args.n else "")
        + f"; scheduler splits: prompt {r['splits'][0]}"
        + (f", decode {r['splits'][1]}" if args.n else "")
        + f"; flash attention {'on' if cfg.flash_attn else 'off'}")
    out(f"   pp {pp:8.1f} tok/s ({len(prompt)} tokens)")
    if tg is not None:
        out(f"   tg {tg:8.1f} tok/s ({args.n} tokens)")
    if args.logits_out:
        out(f"   logits: {args.logits_out}")
    return 0
