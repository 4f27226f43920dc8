"""llama.cpp's side of tests/test_architectures.py, run in a child process: llama-cpp-python
loads its own ggml, whose symbols carry the same names as ggml 0.10.1's that other tests load
through ctypes (and fork into children), so the two never share a process.

    python tests/llama_cpp_ref.py logits GGUF OUT.npy PROMPT N_DECODE
        the prompt then N_DECODE greedy steps (teacher forcing: each step feeds llama.cpp's
        own pick); writes every row's logits to OUT.npy and prints JSON
        {"pp_nodes", "tg_nodes", "fed"} (the graph node counts llama.cpp logged)
    python tests/llama_cpp_ref.py names GGUF PROMPT SPLIT
        the names of every node llama.cpp computes (its scheduler's eval callback, in graph
        order) for the prompt's first SPLIT tokens, then one decode step; prints JSON
        {"names": [prompt names, decode names]}

PROMPT is a comma-separated list of token ids. Exit status 3: llama-cpp-python is not
installed.
"""

import ctypes
import json
import re
import sys

import numpy as np

# ggml_tensor's name field: after type, buffer, ne[4], nb[4], op, op_params[16], flags,
# src[10], view_src, view_offs and data (ggml.h; x86-64 and aarch64 alike)
NAME_OFFSET = 256


class Log:
    """llama.cpp's log lines while it is set (llama_log_set), restored on exit."""

    def __init__(self, llama_cpp):
        self.llama_cpp = llama_cpp
        self.text = []

        @llama_cpp.llama_log_callback
        def cb(level, text, user_data):
            self.text.append(text.decode("utf-8", "replace"))
        self.cb = cb

    def __enter__(self):
        self.llama_cpp.llama_log_set(self.cb, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc):
        from llama_cpp import _logger
        self.llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))

    def graph_nodes(self):
        """(prompt graph nodes, decode graph nodes) from 'graph...: nodes = N[ / M]'."""
        m = re.findall(r"graph[^:\n]*: nodes = (\d+)(?: / (\d+))?", "".join(self.text))
        if not m:
            raise SystemExit("llama.cpp logged no graph node count")
        pp, tg = m[-1]
        return int(pp), int(tg or pp)


def logits(L, path, out, prompt, n_decode):
    with Log(L) as log:
        llm = L.Llama(model_path=path, logits_all=True, n_threads=1, n_threads_batch=1,
                      n_ctx=64, n_batch=64, flash_attn=False, verbose=False)
    pp_nodes, tg_nodes = log.graph_nodes()
    llm.eval(prompt)
    fed = []
    for _ in range(n_decode):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        fed.append(tok)
        llm.eval([tok])
    np.save(out, np.array(llm.scores[:llm.n_tokens], dtype=np.float64))
    return {"pp_nodes": pp_nodes, "tg_nodes": tg_nodes, "fed": fed}


def names(L, path, prompt, split):
    seen = []

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, user_data):
        if ask:
            seen.append(ctypes.string_at(t + NAME_OFFSET).decode())
        return False

    with Log(L):       # (quiet)
        model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.cb_eval = cb
        ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(64, 0, 1)
    out = []
    try:
        for start, toks in ((0, prompt[:split]), (split, prompt[split:split + 1])):
            for i, t in enumerate(toks):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, 1
            batch.n_tokens = len(toks)
            seen.clear()
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            out.append(list(seen))
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return {"names": out}


def main(argv):
    try:
        import llama_cpp
    except ImportError as e:
        print(f"llama-cpp-python is not installed: {e}", file=sys.stderr)
        return 3
    mode, path, *rest = argv
    if mode == "logits":
        out, prompt, n_decode = rest
        r = logits(llama_cpp, path, out, [int(t) for t in prompt.split(",")], int(n_decode))
    else:
        prompt, split = rest
        r = names(llama_cpp, path, [int(t) for t in prompt.split(",")], int(split))
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
