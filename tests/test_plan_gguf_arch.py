"""`ggml-py plan MODEL.gguf` for the architectures with llama.cpp's own quirks, held to
llama.cpp itself as tests/test_plan_gguf.py holds llama's (its helpers, servers and
option names):

- gemma2 and gemma3 with a sliding window: llama_kv_cache_iswa, a cache for the global
  layers and a smaller one for the sliding layers (its window plus a ubatch, padded to
  256; --swa-full: full size), each with its own cell ids and mask in the graph;
- gemma3 without a window: one cache, as llama's;
- phi3: no window (llama.cpp turns a file's off), its rope factors copied to every device
  that holds a layer.

The models have a 64-token window in a 1024-token context, so the sliding layers' cache
(512 cells) is smaller than the global one's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_plan_gguf import CTX as PLAN_CTX
from test_plan_gguf import OPTION_SETS as DENSE_OPTION_SETS
from test_plan_gguf import held_to_llama_cpp, plan_options, servers, write_model  # noqa: F401

from ggml_py.errors import ArgumentError
from ggml_py.models.devices import parse_devices
from ggml_py.models.model_plan import PlanOptions, plan_gguf

pytest.importorskip("gguf")

CTX = {"n_ctx": 1024}
# (kind, write_model's architecture and its shape beyond test_plan_gguf's SHAPE)
KINDS = {"gemma2": ("gemma2", dict(n_swa=64)),
         "gemma3": ("gemma3", dict(n_swa=64, swa_pattern=3, n_layer=6)),
         "gemma3-no-window": ("gemma3", dict(n_swa=0)),
         "phi3": ("phi3", dict(rope_factors=True, n_ctx_orig=512))}
# (id, llama.cpp's options beside test_plan_gguf's CTX and this file's): test_plan_gguf's
# sets, and the sliding layers' and --parallel's
OPTION_SETS = [
    *DENSE_OPTION_SETS,
    ("swa-full", {"swa_full": True}),
    # the CPU's weights in a buffer of their own: a tied head there is the embeddings'
    ("no-mmap-ngl-0", {"use_mmap": False, "n_gpu_layers": 0}),
    ("no-mmap-ngl-half", {"use_mmap": False, "n_gpu_layers": 3}),
    # --parallel: a KV stream per sequence (llama.cpp's default), or one for all
    ("parallel-2", {"n_seq_max": 2}),
    ("parallel-3-fa-on-ngl-half", {"n_seq_max": 3, "flash_attn": "on", "n_gpu_layers": 3}),
    ("parallel-4-kv-unified", {"n_seq_max": 4, "kv_unified": True}),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan-arch-models")
    return {kind: write_model(root / f"{kind}.gguf", arch, **shape)
            for kind, (arch, shape) in KINDS.items()}


def kv_buffers(plan, device):
    return sorted(b.bytes for b in plan.buffers if b.device == device and b.kind == "kv")


def test_sliding_layers_have_their_own_smaller_cache(models):
    """gemma2 (layers 0 and 2 slide): each device holds the global layers' cache (1024
    cells) and the sliding layers' (64 + 256 cells padded to 512); --swa-full makes the
    second full size; with 512-token ubatches it is full size anyway."""
    devices = parse_devices("rpc,rpc,cpu")
    plan = plan_gguf(models["gemma2"], devices, plan_options(CTX))
    row = 2 * 2 * 64        # K and V of 2 heads of 32, f16: bytes per cell of a layer
    assert plan.layer_devices == ["RPC0", "RPC0", "RPC0", "RPC1"]
    assert kv_buffers(plan, "RPC0") == sorted([1024 * row, 2 * 512 * row])   # 1 global, 2 sliding
    assert kv_buffers(plan, "RPC1") == [1024 * row]                        # layer 3: global
    full = plan_gguf(models["gemma2"], devices, plan_options({**CTX, "swa_full": True}))
    assert kv_buffers(full, "RPC0") == sorted([1024 * row, 2 * 1024 * row])
    assert full.graph_nodes == plan.graph_nodes
    big_ubatch = plan_gguf(models["gemma2"], devices,
                           plan_options({"n_ctx": 512, "n_batch": 512, "n_ubatch": 512}))
    assert kv_buffers(big_ubatch, "RPC0") == sorted([512 * row, 2 * 512 * row])


def test_command_line_swa_full(models, capsys):
    import json

    from ggml_py.tools.commands import main
    devices = "rpc:24105MiB,rpc:24105MiB,cpu"
    for extra, swa_full in (([], False), (["--swa-full"], True)):
        want = plan_gguf(models["gemma3"], parse_devices(devices),
                         PlanOptions(n_ctx=1024, swa_full=swa_full))
        assert main(["plan", models["gemma3"], "--device", devices, "-c", "1024", *extra,
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == want.to_dict()
    assert kv_buffers(want, "CPU") == []


def test_command_line_parallel(models, capsys):
    """--parallel 3 in a 1024-token context: a stream of 512 cells (1024 / 3, padded) per
    sequence, a logits row each; --kv-unified: one stream of 1024."""
    import json

    from ggml_py.tools.commands import main
    devices = "rpc:24105MiB,cpu"
    for extra, unified in ((["-np", "3"], False), (["--parallel", "3", "-kvu"], True)):
        want = plan_gguf(models["gemma3-no-window"], parse_devices(devices),
                         PlanOptions(n_ctx=1024, n_parallel=3, kv_unified=unified))
        assert main(["plan", models["gemma3-no-window"], "--device", devices, "-c", "1024",
                     *extra, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got == want.to_dict()
        assert got["n_ctx"] == (1024 if unified else 1536)
        row = 2 * 2 * 64                    # K and V of 2 heads of 32, f16: bytes per cell
        assert kv_buffers(want, "RPC0") == [4 * got["n_ctx"] * row]
        assert [b["bytes"] for b in got["buffers"] if b["kind"] == "output"] == [3 * 4 * 256]
    assert main(["plan", models["gemma3-no-window"], "-np", "257"]) == 2
    assert "must be at most 256" in capsys.readouterr().err


def test_rope_factors_are_copied_to_each_layer_device(models):
    """phi3's rope factors (long and short, 16 f32 each) are in every device's model
    buffer that holds a layer, and each layer reads its own device's copy: no split is
    made for them."""
    devices = parse_devices("rpc,rpc,cpu")
    with_factors = plan_gguf(models["phi3"], devices, plan_options(CTX))
    assert with_factors.graph_splits == (3, 3)
    model = {b.device: b.bytes for b in with_factors.buffers if b.kind == "model"}
    plain = write_model(models["phi3"] + ".plain.gguf", "phi3", n_ctx_orig=512)
    without = {b.device: b.bytes for b in plan_gguf(plain, devices, plan_options(CTX)).buffers
               if b.kind == "model"}
    factors = 2 * 16 * 4
    assert model["RPC0"] - without["RPC0"] == model["RPC1"] - without["RPC1"] == factors


# every model with every option set (--swa-full with a window only)
CASES = [(kind, name, options) for kind, (_, shape) in KINDS.items()
         for name, options in OPTION_SETS if shape.get("n_swa") or "swa_full" not in options]


@pytest.mark.parametrize("kind,options", [(k, o) for k, _, o in CASES],
                         ids=[f"{k}-{n}" for k, n, _ in CASES])
def test_plan_matches_llama_cpp(models, servers, kind, options):  # noqa: F811
    held_to_llama_cpp(models[kind], servers, {**CTX, **options})


def llama_cpp_refusal(path, servers, options):
    """What llama.cpp says refusing to load `path` with `options` (tests/llama_cpp_ref.py
    load, which exits with its log)."""
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "llama_cpp_ref.py"),
                        "load", path, servers, json.dumps({**PLAN_CTX, **options})],
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 3 and os.environ.get("GGML_PY_REQUIRE_LLAMA_CPP") != "1":
        pytest.skip("llama-cpp-python is not installed (GGML_PY_REQUIRE_LLAMA_CPP=1 makes "
                    "this a failure)")
    assert r.returncode == 1, r.stdout + r.stderr
    return r.stderr


def test_split_mode_row_is_refused_as_llama_cpp_refuses_it(models, servers):  # noqa: F811
    """--split-mode row asks each device for its split buffer type; an RPC device has none,
    and llama.cpp stops there: the planner refuses it with llama.cpp's reason. With the CPU
    alone there is no device to ask, and row plans as layer."""
    said = llama_cpp_refusal(models["gemma2"], servers, {"split_mode": "row"})
    assert "device RPC0 does not support split buffers" in said
    with pytest.raises(ArgumentError, match="--split-mode row: device RPC0 does not support "
                                            "split buffers"):
        plan_gguf(models["gemma2"], parse_devices("rpc,rpc,cpu"), PlanOptions(split_mode="row"))
    cpu_only = [plan_gguf(models["gemma2"], parse_devices("cpu"), PlanOptions(split_mode=mode))
                for mode in ("row", "layer")]
    assert cpu_only[0].to_dict() == cpu_only[1].to_dict()


def test_overrides_take_llama_cpp_buffer_type_names(models, servers):  # noqa: F811
    """-ot's buffer types by llama.cpp's own names on live servers: a server's device's is
    RPC0[HOST:PORT] (its index on that server), so the second server's is RPC0[its
    endpoint] and is the planner's RPC1; both sides place the weights alike."""
    second = servers.split(",")[1]
    rules = [[r"blk\.[01]\.ffn_(up|down)\.", f"RPC0[{second}]"], [r"^output\.", "CPU"]]
    plan = held_to_llama_cpp(models["phi3"], servers, {**CTX, "tensor_overrides": rules},
                             live=True)
    assert plan.overridden == {**{f"blk.{il}.ffn_{m}.weight": "RPC1" for il in (0, 1)
                                  for m in ("up", "down")}, "output.weight": "CPU"}
    with pytest.raises(ArgumentError, match=r"unknown buffer type \(the model's: RPC0, "
                                            r"RPC0\[.*\], RPC1, RPC0\[.*\], CPU\)"):
        plan_gguf(models["phi3"],
                  parse_devices(",".join(f"rpc:{ep}" for ep in servers.split(",")) + ",cpu"),
                  PlanOptions(tensor_overrides=(("output", "RPC1[x]"),)))
