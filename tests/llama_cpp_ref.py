"""llama.cpp's side of tests/test_architectures.py, run in a child process: llama-cpp-python
loads its own ggml, whose symbols carry the same names as ggml 0.10.1's that other tests load
through ctypes (and fork into children), so the two never share a process.

    python tests/llama_cpp_ref.py logits GGUF OUT.npy PROMPT N_DECODE [FLASH_ATTN [OPTIONS]]
        the prompt then N_DECODE greedy steps (teacher forcing: each step feeds llama.cpp's
        own pick); writes every row's logits to OUT.npy and prints JSON
        {"pp_nodes", "tg_nodes", "fed"} (the graph node counts llama.cpp logged). OPTIONS
        (JSON): n_ctx, n_batch (default 64 each), n_ubatch (default n_batch), swa_full
        (default on, the C API's), swa_cells (true: "swa_cells" in the answer, the sliding
        layers' cache before each ubatch as llama_kv_cache::find_slot logs it with
        LLAMA_KV_CACHE_DEBUG=2: [head, [each cell's position, -1 when empty]])
    python tests/llama_cpp_ref.py names GGUF PROMPT SPLIT [FLASH_ATTN]
        the names of every node llama.cpp computes (its scheduler's eval callback, in graph
        order) for the prompt's first SPLIT tokens, then one decode step, and their op_params;
        prints JSON {"names": [prompt names, decode names], "op_params": [prompt's, decode's]}

    python tests/llama_cpp_ref.py load GGUF SERVERS OPTIONS
        loads GGUF with the RPC servers SERVERS (host:port,...) as its devices and the
        llama.cpp options OPTIONS (JSON: n_gpu_layers, split_mode, main_gpu, tensor_split,
        use_extra_bufts (false: --no-repack),
        n_ctx, n_batch, n_ubatch, type_k, type_v, offload_kqv, op_offload, flash_attn
        on|off|auto, swa_full (default off, as llama.cpp's common), n_seq_max (--parallel),
        kv_unified, use_mmap, tensor_overrides: [[REGEX, "CPU" | "RPC<i>" | BUFFER TYPE NAME], ...],
        -ot's rules in order, RPC<i> being the i-th server's device) and prints
        what it logged (JSON): {"free_mib": {device: MiB}, "buffers": [[device, kind,
        "MiB with 2 decimals"], ...], "graph_nodes": [pp, tg], "graph_splits": [pp, tg]}

PROMPT is a comma-separated list of token ids; FLASH_ATTN is on or off (the default: the
KQ / soft_max / KQV graph). Exit status 3: llama-cpp-python is not installed.
"""

import ctypes
import json
import os
import re
import sys

import numpy as np

# ggml_tensor's op_params (int32[16]) after type, buffer, ne[4], nb[4] and op; its name
# after op_params, flags, src[10], view_src, view_offs and data (ggml.h; x86-64 and
# aarch64 alike)
OP_PARAMS_OFFSET = 84
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


FLASH_ATTN = ("off", "on")


def logits(L, path, out, prompt, n_decode, flash_attn, options):
    n_batch = options.get("n_batch", 64)
    if options.get("swa_cells"):
        os.environ["LLAMA_KV_CACHE_DEBUG"] = "2"       # (read as the cache is made)
    with Log(L) as log:
        llm = L.Llama(model_path=path, logits_all=True, n_threads=1, n_threads_batch=1,
                      n_ctx=options.get("n_ctx", 64), n_batch=n_batch,
                      n_ubatch=options.get("n_ubatch", n_batch),
                      swa_full=options.get("swa_full", True), flash_attn=flash_attn,
                      verbose=False)
    pp_nodes, tg_nodes = log.graph_nodes()
    with Log(L) as log:
        llm.eval(prompt)
        fed = []
        for _ in range(n_decode):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            fed.append(tok)
            llm.eval([tok])
    np.save(out, np.array(llm.scores[:llm.n_tokens], dtype=np.float64))
    r = {"pp_nodes": pp_nodes, "tg_nodes": tg_nodes, "fed": fed}
    if options.get("swa_cells"):
        r["swa_cells"] = swa_cells(log.text)
    return r


SLOT_LINE = re.compile(r"find_slot: stream\[0\], .* head = +(\d+), .* n_swa = +([1-9]\d*)")


def swa_cells(text):
    """[head, [each cell's position, -1 for an empty one]] of the sliding layers' cache at
    each find_slot: its header line, the cells' sequences, then their positions."""
    out = []
    for i, line in enumerate(text):
        m = SLOT_LINE.match(line)
        if m:
            cells = [-1 if c == "." else int(c) for c in text[i + 2].split() if c != "*"]
            out.append([int(m.group(1)), cells])
    return out


def names(L, path, prompt, split, flash_attn):
    seen = []

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, user_data):
        if ask:
            seen.append((ctypes.string_at(t + NAME_OFFSET).decode(),
                         list((ctypes.c_int32 * 16).from_address(t + OP_PARAMS_OFFSET))))
        return False

    with Log(L):       # (quiet)
        model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = (L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else L.LLAMA_FLASH_ATTN_TYPE_DISABLED)
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
    return {"names": [[name for name, _ in nodes] for nodes in out],
            "op_params": [[params for _, params in nodes] for nodes in out]}


# llama.cpp's log lines of a load: the devices, each buffer and the reserved graphs
DEVICE_LINE = re.compile(r"using device (\w+) \(([^)]*)\).* - (\d+) MiB free")
BUFFER_LINE = re.compile(r"^(load_tensors|llama_kv_cache|sched_reserve|llama_context): +(\S+) +"
                         r"(model|KV|compute|output) buffer size = +([\d.]+) MiB", re.M)
GRAPH_LINE = re.compile(r"graph[^:\n]*: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?")
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "iq4_nl": 20, "bf16": 30}


class TensorOverride(ctypes.Structure):
    """llama_model_tensor_buft_override (llama.h); llama-cpp-python's binding types the
    buffer type as an int."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def ggml_libs(L):
    lib = os.path.join(os.path.dirname(L.__file__), "lib")

    def opened(name):
        # the file libllama loaded (its NEEDED soname, libggml.so.0): a wheel holds the
        # unversioned name as a copy, not a link, and that copy would be a second ggml
        # with a registry of its own that llama.cpp never reads
        for file in (f"libggml{name}.so.0", f"libggml{name}.so"):
            if os.path.exists(os.path.join(lib, file)):
                return ctypes.CDLL(os.path.join(lib, file))
        raise SystemExit(f"no libggml{name}.so in {lib}")
    return {name: opened(name) for name in ("", "-rpc", "-cpu")}


def add_rpc_servers(L, servers):
    """Register each server's devices (common's add_rpc_devices): llama.cpp then uses them.
    Returns {"RPC<i>": the i-th server's device's buffer type, "CPU": the CPU's}, and the
    same by their buffer types' own names (RPC0[HOST:PORT])."""
    libs = ggml_libs(L)
    ggml, rpc = libs[""], libs["-rpc"]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for fn in ("ggml_backend_reg_dev_get", "ggml_backend_dev_buffer_type"):
        getattr(ggml, fn).restype = ctypes.c_void_p
    ggml.ggml_backend_buft_name.restype = ctypes.c_char_p
    ggml.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    libs["-cpu"].ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    bufts = {"CPU": libs["-cpu"].ggml_backend_cpu_buffer_type()}
    for i, endpoint in enumerate(servers):
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
        ggml.ggml_backend_register(reg)
        bufts[f"RPC{i}"] = ggml.ggml_backend_dev_buffer_type(ggml.ggml_backend_reg_dev_get(reg, 0))
    # and by the names llama.cpp's -ot takes (ggml_backend_buft_name: CPU, RPC0[HOST:PORT])
    bufts.update({ggml.ggml_backend_buft_name(b).decode(): b for b in list(bufts.values())})
    return bufts


def load(L, path, servers, options):
    bufts = add_rpc_servers(L, servers)
    mp = L.llama_model_default_params()
    rules = options.get("tensor_overrides", [])
    overrides = (TensorOverride * (len(rules) + 1))(
        *[TensorOverride(pattern.encode(), bufts[buft]) for pattern, buft in rules])
    if rules:
        mp.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    mp.n_gpu_layers = options.get("n_gpu_layers", -1)
    if not options.get("use_mmap", True):      # --no-mmap: llama.cpp's load mode none
        mp.load_mode = L.LLAMA_LOAD_MODE_NONE
    mp.split_mode = {"none": 0, "layer": 1, "row": 2}[options.get("split_mode", "layer")]
    mp.main_gpu = options.get("main_gpu", 0)
    mp.use_extra_bufts = options.get("use_extra_bufts", True)      # --no-repack clears it
    split = (ctypes.c_float * 16)(*options.get("tensor_split", []))
    mp.tensor_split = split
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = options["n_ctx"], options["n_batch"], options["n_ubatch"]
    cp.n_seq_max = options.get("n_seq_max", 1)
    cp.kv_unified = options.get("kv_unified", False)
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = GGML_TYPES[options.get("type_k", "f16")]
    cp.type_v = GGML_TYPES[options.get("type_v", "f16")]
    cp.offload_kqv = options.get("offload_kqv", True)
    cp.op_offload = options.get("op_offload", True)
    cp.swa_full = options.get("swa_full", False)        # (common's default; the C API's is on)
    cp.flash_attn_type = {"on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                          "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO}[options.get("flash_attn", "off")]
    with Log(L) as log:
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise SystemExit("llama.cpp could not load the model:\n" + "".join(log.text))
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp could not make the context:\n" + "".join(log.text))
    L.llama_free(ctx)
    L.llama_model_free(model)
    text = "".join(log.text)
    # RPC buffer types are named RPC0[endpoint] whatever the device: the endpoint says which
    devices = {m[2]: (m[1], int(m[3])) for m in DEVICE_LINE.finditer(text)}

    def device(buffer_name):
        m = re.fullmatch(r"\w+\[(.*)\]", buffer_name)
        return devices[m[1]][0] if m else buffer_name.split("_")[0]

    nodes_pp, nodes_tg, splits_pp, splits_tg = GRAPH_LINE.findall(text)[-1]
    return {"free_mib": {name: mib for name, mib in devices.values()},
            "buffers": [[device(m[2]), m[3].lower(), m[4]] for m in BUFFER_LINE.finditer(text)],
            "graph_nodes": [int(nodes_pp), int(nodes_tg or nodes_pp)],
            "graph_splits": [int(splits_pp), int(splits_tg or splits_pp)]}


def main(argv):
    try:
        import llama_cpp
    except ImportError as e:
        print(f"llama-cpp-python is not installed: {e}", file=sys.stderr)
        return 3
    mode, path, *rest = argv
    flash_attn, options = False, {}
    if mode == "logits" and len(rest) == 5:
        options = json.loads(rest.pop())
    if mode in ("logits", "names") and rest[-1] in FLASH_ATTN:
        flash_attn = rest.pop() == "on"
    if mode == "logits":
        out, prompt, n_decode = rest
        r = logits(llama_cpp, path, out, [int(t) for t in prompt.split(",")], int(n_decode),
                   flash_attn, options)
    elif mode == "load":
        servers, options = rest
        r = load(llama_cpp, path, servers.split(","), json.loads(options))
    else:
        prompt, split = rest
        r = names(llama_cpp, path, [int(t) for t in prompt.split(",")], int(split), flash_attn)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
