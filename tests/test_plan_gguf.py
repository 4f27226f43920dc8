"""`ggml-py plan MODEL.gguf` (models.model_plan): a GGUF file planned on simulated devices as
llama.cpp would load it, from its metadata and tensor infos alone.

Held to llama.cpp itself: a random-weight GGUF of each architecture is loaded by llama.cpp
(llama-cpp-python 0.3.36, in a child process: tests/llama_cpp_ref.py load) on two of its
own protocol-7 RPC servers on localhost, with each option set; what it logs -- every model,
KV, compute and output buffer per device to its printed 0.01 MiB, and the graph nodes and
splits of the prompt ubatch and the decode token -- must be what the planner reports for
`--device rpc:<free>,rpc:<free>,cpu` with the free memory the servers reported. These
tests skip without llama-cpp-python unless GGML_PY_REQUIRE_LLAMA_CPP=1.
"""

import json
import os

import pytest
from conftest import require_ggml_rpc
from test_architectures import _llama_cpp

from ggml_py.errors import ArgumentError, ModelError
from ggml_py.models.config import arch_config
from ggml_py.models.devices import parse_devices
from ggml_py.models.model_plan import (FFN_EXPS_REGEX, PlanOptions, cpu_moe_overrides,
                                       parse_overrides, plan_gguf)
from ggml_py.models.transformer import Model

pytest.importorskip("gguf")

ARCHS = ("llama", "qwen2", "qwen3")
# the models with experts: qwen3moe, and llama with experts (Mixtral-style)
MOE_KINDS = {"qwen3moe": ("qwen3moe", {}),
             "llama-moe": ("llama", dict(ffn="moe_topk", n_expert=4, n_expert_used=2,
                                         n_ff_exp=256))}
# 32-wide heads: a q8_0 K cache can be viewed per head, and llama.cpp does not rotate it
SHAPE = dict(n_vocab=256, n_ctx=512, n_embd=128, n_head=4, n_head_kv=2, n_layer=4,
             n_ff=256)
CTX = dict(n_ctx=512, n_batch=256, n_ubatch=256)
# (id, llama.cpp's options beside CTX)
OPTION_SETS = [
    ("ngl-all", {}),
    ("ngl-half", {"n_gpu_layers": 3}),
    ("ngl-0", {"n_gpu_layers": 0}),
    ("tensor-split-3-1", {"tensor_split": [3, 1]}),
    ("q8_0-k", {"type_k": "q8_0", "n_ubatch": 128}),
    ("split-none-main-1", {"split_mode": "none", "main_gpu": 1}),
    ("no-kv-offload", {"offload_kqv": False, "n_gpu_layers": 4}),
    ("ubatch-64-ctx-300", {"n_ctx": 300, "n_ubatch": 64}),
    ("fa-on", {"flash_attn": "on"}),
    ("fa-auto-ngl-0", {"flash_attn": "auto", "n_gpu_layers": 0}),
    ("fa-on-q8_0-kv-ngl-half", {"flash_attn": "on", "type_k": "q8_0", "type_v": "q8_0",
                                "n_gpu_layers": 3}),
    ("fa-on-f32-kv-tensor-split", {"flash_attn": "on", "type_k": "f32", "type_v": "f32",
                                   "tensor_split": [1, 2]}),
    # -ot: two layers' up projections to the CPU, the output layer's weights to RPC0 (and
    # with the overrides llama.cpp turns pipeline parallelism off)
    ("ot-ffn-up-cpu-output-rpc0", {"tensor_overrides": [[r"blk\.[12]\.ffn_up\.", "CPU"],
                                                        [r"^output", "RPC0"]]}),
]
# (id, llama.cpp's options for a model with experts, expert weights the rules move) --
# --cpu-moe and --n-cpu-moe N are the tensor overrides common's options add
CPU_MOE = [FFN_EXPS_REGEX, "CPU"]
N_CPU_MOE_2 = [[rf"blk\.{il}{FFN_EXPS_REGEX}", "CPU"] for il in range(2)]
MOE_OPTION_SETS = [
    ("ngl-all", {}, 0),
    ("ngl-half", {"n_gpu_layers": 3}, 0),
    ("n-cpu-moe-2", {"tensor_overrides": N_CPU_MOE_2}, 6),
    ("cpu-moe", {"tensor_overrides": [CPU_MOE]}, 12),
    ("cpu-moe-ngl-half", {"tensor_overrides": [CPU_MOE], "n_gpu_layers": 3}, 12),
    # the first rule wins: layer 3's down experts stay on RPC1, the other experts of
    # layers 2 and 3 go to RPC0
    ("ot-first-rule-wins", {"tensor_overrides": [[r"blk\.3\.ffn_down_exps", "RPC1"],
                                                 [r"blk\.[23]\.ffn_.*_exps\.", "RPC0"]]}, 6),
    ("cpu-moe-fa-on-no-op-offload", {"tensor_overrides": [CPU_MOE], "flash_attn": "on",
                                     "op_offload": False}, 12),
    ("n-cpu-moe-2-tensor-split-1-3", {"tensor_overrides": N_CPU_MOE_2,
                                      "tensor_split": [1, 3]}, 6),
    ("cpu-moe-no-kv-offload-q8_0-k", {"tensor_overrides": [CPU_MOE], "offload_kqv": False,
                                      "type_k": "q8_0"}, 12),
]


def write_model(path, arch, **shape):
    if arch in MOE_KINDS:
        arch, extra = MOE_KINDS[arch]
        shape = {**extra, **shape}
    from ggml_py.models.gguf import save_gguf
    save_gguf(Model.random(arch_config(arch, **{**SHAPE, **shape}, wtype="f16"), seed=3), path)
    return str(path)


def plan_options(llama: dict) -> PlanOptions:
    """llama.cpp's options (tests/llama_cpp_ref.py's names) as the planner's."""
    o = {**CTX, **llama}
    return PlanOptions(n_gpu_layers=o.get("n_gpu_layers", -1),
                       split_mode=o.get("split_mode", "layer"), main_gpu=o.get("main_gpu", 0),
                       tensor_split=tuple(o["tensor_split"]) if "tensor_split" in o else None,
                       n_ctx=o["n_ctx"], n_batch=o["n_batch"], n_ubatch=o["n_ubatch"],
                       cache_type_k=o.get("type_k", "f16"), cache_type_v=o.get("type_v", "f16"),
                       kv_offload=o.get("offload_kqv", True), op_offload=o.get("op_offload", True),
                       flash_attn=o.get("flash_attn", "off"), swa_full=o.get("swa_full", False),
                       n_parallel=o.get("n_seq_max", 1), kv_unified=o.get("kv_unified", False),
                       use_mmap=o.get("use_mmap", True), repack=o.get("use_extra_bufts", True),
                       tensor_overrides=tuple(map(tuple, o.get("tensor_overrides", ()))))


def mib_rows(plan):
    """The plan's buffers as llama.cpp prints them: (device, kind, MiB to 0.01)."""
    return sorted((b.device, b.kind, f"{b.bytes / 1024 / 1024:.2f}") for b in plan.buffers)


# ---------------------------------------------------------------------------
# without llama.cpp

def test_devices_are_named_as_llama_cpp_names_them():
    devs = parse_devices("rpc:24105MiB, rpc:1.5GiB,cpu:64GiB")
    assert [(d.name, d.kind, d.memory) for d in devs] == [
        ("RPC0", "rpc", 24105 << 20), ("RPC1", "rpc", 3 << 29), ("CPU", "cpu", 64 << 30)]
    # the CPU is always there, and last
    assert [d.name for d in parse_devices("cpu,rpc")] == ["RPC0", "CPU"]
    for bad in ("", "gpu:1GiB", "rpc:12XB", "cpu,cpu", "rpc:"):
        with pytest.raises(ArgumentError):
            parse_devices(bad)


def test_plan_reads_no_weight_bytes(tmp_path):
    """The weights' bytes are never read: a file whose tensor data is all zero bytes
    past the header plans the same as the model it was written from."""
    path = write_model(tmp_path / "m.gguf", "qwen2")
    devices = "rpc:24105MiB,rpc:24105MiB,cpu"
    want = plan_gguf(path, parse_devices(devices), plan_options({}))
    from ggml_py.models.gguf import read_tensor_infos
    _, infos = read_tensor_infos(path)
    start = min(i.offset for i in infos.values())
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(os.path.getsize(path) - start))
    got = plan_gguf(path, parse_devices(devices), plan_options({}))
    assert got.to_dict() == want.to_dict()
    assert got.layer_devices == ["RPC0", "RPC0", "RPC0", "RPC1"] and got.output_device == "RPC1"


def test_plan_report(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices("rpc:4MiB,rpc:24105MiB,cpu"), plan_options({}))
    d = plan.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["graph_nodes"] == [150, 150] and d["graph_splits"] == [3, 3]
    assert {b["kind"] for b in d["buffers"]} == {"model", "kv", "compute", "output"}
    assert {b["device"] for b in d["buffers"]} == {"RPC0", "RPC1", "CPU"}
    # RPC0 has 4 MiB for about 5: the one warning, in the text too
    assert len(d["warnings"]) == 1 and d["warnings"][0].startswith("RPC0 needs ")
    assert "warning: RPC0 needs" in plan.text()


def test_bytes_copied_per_token_counted_by_hand(tmp_path):
    """-ngl all on two devices: the decode token's only copies are the hidden state at the
    layer boundary (RPC0 -> RPC1), the embedded token (its get_rows runs on the CPU, where
    token_embd is) and the graph inputs each device reads from the CPU."""
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices("rpc,rpc,cpu"), plan_options({}))
    E, G, C = SHAPE["n_embd"], SHAPE["n_embd"] // SHAPE["n_head"] * SHAPE["n_head_kv"], 512
    # positions (i32), K and V cache rows to write (i64: a cell; a cell per V element
    # without flash attention), the mask over the cells (f32)
    inputs = [("CPU", 4), ("CPU", 8), ("CPU", 8 * G), ("CPU", 4 * C)]
    want = [("CPU", 0, 1, ()),
            ("RPC0", 1, 109, (("CPU", 4 * E), *inputs)),
            ("RPC1", 109, 150, (("RPC0", 4 * E), *inputs, ("CPU", 4)))]   # + the output row
    got = plan.splits[1]
    assert [(s.device, s.i_start, s.i_end, s.copies) for s in got] == want
    assert plan.copy_bytes[1] == 2 * (4 * E + 12 + 8 * G + 4 * C) + 4 == 6172
    # the prompt ubatch copies the same tensors, 256 tokens wide
    n = CTX["n_ubatch"]
    assert plan.copy_bytes[0] == 2 * (4 * E * n + 12 * n + 8 * G * n + 4 * C * n) + 4 * n
    # each split after the first is there because llama.cpp pins the layer's first norm
    assert [s.reason for s in got] == ["", "RMS_NORM on RPC0: assigned by the user",
                                       "RMS_NORM on RPC1: assigned by the user"]
    d = plan.to_dict()
    assert d["copy_bytes"] == list(plan.copy_bytes)
    assert d["splits"][1][2] == {"device": "RPC1", "nodes": [109, 150], "copy_bytes": 3088,
                                 "copies": [{"from": dev, "bytes": b} for dev, b in want[2][3]],
                                 "reason": "RMS_NORM on RPC1: assigned by the user"}
    assert "bytes copied between devices: 1,580,032 / 6,172 (prompt ubatch / decode token)" \
        in plan.text()
    assert "\n    2 RPC1     nodes 109..149, 3,088 bytes in; RMS_NORM on RPC1: assigned by " \
        "the user" in plan.text()


def test_split_reasons_with_layers_on_the_cpu(tmp_path):
    """-ngl 3: layers 0 and 1 on the CPU, 2 and 3 on RPC0, the output on RPC1. Layer 1's
    residual ADD follows its neighbours to RPC0, so both its operands cross; the output
    norm's MUL runs where its weight is, on RPC1, so the normed row crosses."""
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices("rpc,rpc,cpu"), plan_options({"n_gpu_layers": 3}))
    E, G, C = SHAPE["n_embd"], SHAPE["n_embd"] // SHAPE["n_head"] * SHAPE["n_head_kv"], 512
    got = plan.splits[1]
    assert [s.device for s in got] == ["CPU", "RPC0", "RPC1"]
    assert got[1].copies == (("CPU", 4 * E), ("CPU", 4 * E), ("CPU", 4), ("CPU", 8),
                             ("CPU", 8 * G), ("CPU", 4 * C), ("CPU", 4))
    assert got[2].copies == (("RPC0", 4 * E),)
    assert got[1].reason == "ADD on RPC0: it follows its neighbours there"
    assert got[2].reason == "MUL on RPC1: it runs where its weight is"
    assert got[2].brief == "MUL [1.wgt1]"


def test_split_map_of_a_model(tmp_path, capsys):
    """--map FILE draws the decode token's split map there and the prompt ubatch's in
    FILE-prompt.EXT; the maps hold the plan's splits."""
    pytest.importorskip("matplotlib")
    from ggml_py.tools.commands import main
    from ggml_py.tools.splitmap import SplitMap
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices("rpc,rpc,cpu"), plan_options({"n_gpu_layers": 3}))
    for graph in (0, 1):
        m = SplitMap.from_model_plan(plan, graph)
        assert m.lanes == ("RPC0", "RPC1", "CPU") and m.cpu_lanes == ("CPU",)
        assert m.bytes_in == plan.copy_bytes[graph]
        assert [(b.backend, b.i_start, b.i_end, b.reason) for b in m.blocks] == \
            [(s.device, s.i_start, s.i_end, s.reason) for s in plan.splits[graph]]
    assert SplitMap.from_model_plan(plan, 1).title == "m.gguf, decode token"
    out = tmp_path / "map.svg"
    assert main(["plan", path, "--device", "rpc,rpc,cpu", "--map", str(out)]) == 0
    capsys.readouterr()
    for f in (out, tmp_path / "map-prompt.svg"):
        assert f.read_bytes().startswith(b"<?xml")
    assert b"decode token" in out.read_bytes()
    assert b"prompt ubatch of 512 tokens" in (tmp_path / "map-prompt.svg").read_bytes()


@pytest.mark.parametrize("options,match", [
    ({"flash_attn": "maybe"}, "-fa must be"),
    ({"flash_attn": "on", "kv_offload": False}, "--no-kv-offload"),
    ({"flash_attn": "auto", "kv_offload": False}, "--no-kv-offload"),
    ({"cache_type_v": "q8_0", "flash_attn": "off"}, "flash attention"),
    ({"split_mode": "row"}, "--split-mode"),
    ({"cache_type_k": "q3_K"}, "--cache-type-k"),
    ({"n_ubatch": 0}, "-ub"),
    ({"main_gpu": 2, "split_mode": "none"}, "--main-gpu"),
    ({"tensor_split": (1.0, 1.0, 1.0)}, "--tensor-split"),
])
def test_plan_refusals(tmp_path, options, match):
    path = write_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(ArgumentError, match=match):
        plan_gguf(path, parse_devices("rpc,rpc,cpu"), PlanOptions(**options))


def test_rotated_k_cache_is_refused(tmp_path):
    """A quantized K cache of 64-wide heads gets llama.cpp's Hadamard rotation, which the
    planner does not build: refused by name rather than planned wrong."""
    path = write_model(tmp_path / "m.gguf", "llama", n_head=2, n_head_kv=1)
    with pytest.raises(ModelError, match="rotation"):
        plan_gguf(path, parse_devices("rpc,cpu"), PlanOptions(cache_type_k="q8_0"))


def test_override_rules():
    """-ot's value splits as common splits it; --cpu-moe and --n-cpu-moe N are common's
    rules, which match the expert matrices (of the first N layers) and nothing else."""
    assert parse_overrides(r"blk\.[0-3]\.ffn_.*_exps\.=CPU,^output=RPC1") == (
        (r"blk\.[0-3]\.ffn_.*_exps\.", "CPU"), ("^output", "RPC1"))
    assert parse_overrides("a=b=c") == (("a", "b=c"),)       # the first '=' ends the regex
    with pytest.raises(ArgumentError, match="expected REGEX=BUFFER_TYPE"):
        parse_overrides("blk=CPU,output")
    names = [f"blk.{il}.{t}.weight" for il in (0, 1, 2, 10)
             for t in ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps", "ffn_gate_up_exps",
                       "ffn_up_chexps", "ffn_gate_inp", "ffn_up", "attn_q")]
    import re

    def matched(rules):
        return {n for n in names if any(re.search(r, n) for r, _ in rules)}
    experts = {n for n in names if "exps" in n}
    assert matched(cpu_moe_overrides()) == experts
    assert matched(cpu_moe_overrides(2)) == {n for n in experts if n.startswith(("blk.0.",
                                                                                 "blk.1."))}
    assert cpu_moe_overrides(0) == ()


@pytest.mark.parametrize("rules,match", [
    ([("blk.(0", "CPU")], r"-ot blk.\(0=CPU: not a regular expression"),
    ([("output", "CUDA0")], "-ot output=CUDA0: unknown buffer type .the model's: RPC0, CPU"),
    ([("output", "RPC1")], "not used by the model with --split-mode none"),
])
def test_override_refusals(tmp_path, rules, match):
    path = write_model(tmp_path / "m.gguf", "qwen3moe")
    with pytest.raises(ArgumentError, match=match):
        plan_gguf(path, parse_devices("rpc,rpc,cpu"),
                  PlanOptions(split_mode="none", tensor_overrides=tuple(rules)))


def test_command_line(tmp_path, capsys):
    from ggml_py.tools.commands import main
    path = write_model(tmp_path / "m.gguf", "qwen3")
    args = ["plan", path, "--device", "rpc:24105MiB,rpc:24105MiB,cpu", "-c", "512", "-b",
            "256", "-ub", "256", "-ngl", "3", "-ctk", "q8_0"]
    want = plan_gguf(path, parse_devices(args[3]), plan_options({"n_gpu_layers": 3,
                                                                 "type_k": "q8_0",
                                                                 "flash_attn": "auto"}))
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want.to_dict()
    assert main(args) == 0
    assert capsys.readouterr().out == want.text() + "\n"
    assert want.layer_devices == ["CPU", "CPU", "RPC0", "RPC0"] and want.output_device == "RPC1"


def test_command_line_overrides_keep_their_order(tmp_path, capsys):
    """-ot, --n-cpu-moe and --cpu-moe add their rules in command-line order: here layer 0's
    experts go to RPC1 by the first rule, layer 1's to the CPU by the second, the rest to
    the CPU by the third."""
    from ggml_py.tools.commands import main
    path = write_model(tmp_path / "m.gguf", "llama-moe")
    devices = "rpc:24105MiB,rpc:24105MiB,cpu"
    rules = ((r"blk\.0\.ffn_.*_exps", "RPC1"), *cpu_moe_overrides(2), *cpu_moe_overrides())
    want = plan_gguf(path, parse_devices(devices), PlanOptions(tensor_overrides=rules))
    assert main(["plan", path, "--device", devices, "-ot", r"blk\.0\.ffn_.*_exps=RPC1",
                 "--n-cpu-moe", "2", "--cpu-moe", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == want.to_dict()
    assert got["tensor_overrides"] == {f"blk.{il}.ffn_{m}_exps.weight": "RPC1" if il == 0
                                       else "CPU" for il in range(4)
                                       for m in ("gate", "up", "down")}
    assert "tensor overrides: 3 weights to RPC1, 9 weights to CPU" in want.text()


@pytest.mark.parametrize("extra,message", [
    (["-ot", "blk(=CPU"], "-ot blk(=CPU: not a regular expression"),
    (["-ot", "output=GPU0"], "-ot output=GPU0: unknown buffer type (the model's: CPU)"),
    (["-ot", "output"], "-ot 'output': expected REGEX=BUFFER_TYPE"),
    (["--n-cpu-moe", "-1"], "must be at least 0"),
    (["-fa", "on", "-nkvo"], "-fa on with --no-kv-offload"),
    (["--dot", "x.dot"], "--dot applies to a case file"),
    (["--explain"], "--explain applies to a case file"),
    (["-ngl", "x"], "not a layer count"),
    (["--device", "tpu"], "expected KIND[:MEMORY]"),
])
def test_command_line_refusals(tmp_path, capsys, extra, message):
    from ggml_py.tools.commands import main
    path = write_model(tmp_path / "m.gguf", "llama")
    assert main(["plan", path, *extra]) == 2
    assert message in capsys.readouterr().err


def test_case_file_refuses_model_options(capsys):
    from conftest import shared_path
    from ggml_py.tools.commands import main
    case = str(shared_path() / "cases" / "mlp-cpu-only.case.json")
    assert main(["plan", case, "-ngl", "2"]) == 2
    assert "--n-gpu-layers applies to a model file" in capsys.readouterr().err
    assert main(["plan", case, "--cpu-moe"]) == 2
    assert "--override-tensor/--cpu-moe/--n-cpu-moe applies to a model file" in \
        capsys.readouterr().err


# ---------------------------------------------------------------------------
# live RPC servers asked for their memory

@pytest.fixture(scope="module")
def server_of_each_protocol():
    """ggml 0.10.1's RPC server (protocol 4) and llama.cpp's (protocol 7) on localhost."""
    require_ggml_rpc(4)
    require_ggml_rpc(7)
    from ggml_py.rpc_server import start_server
    started = []
    try:
        for protocol in (4, 7):
            started.append(start_server(threads=1, protocol=protocol))
        yield [f"{s.host}:{s.port}" for s in started]
    finally:
        for s in started:
            s.stop()


def test_live_rpc_servers_are_asked_for_their_memory(tmp_path, server_of_each_protocol):
    """rpc:HOST:PORT is each server's device with the free memory it reports (a CPU
    server's: ggml-cpu reports the host's physical memory as free), planned like the
    simulated device given that memory."""
    v4, v7 = server_of_each_protocol
    devices = parse_devices(f"rpc:{v4},rpc:{v7},cpu")
    assert [(d.name, d.kind) for d in devices] == [("RPC0", "rpc"), ("RPC1", "rpc"),
                                                   ("CPU", "cpu")]
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert [d.memory for d in devices] == [physical, physical, None]
    path = write_model(tmp_path / "m.gguf", "llama")
    options = plan_options({})
    live = plan_gguf(path, devices, options)
    spec = ",".join(f"rpc:{d.memory}B" for d in devices[:2])
    assert live.to_dict() == plan_gguf(path, parse_devices(spec), options).to_dict()


def test_unreachable_rpc_server_is_named(tmp_path, capsys):
    from ggml_py.errors import RPCError
    from ggml_py.rpc_server import free_port
    from ggml_py.tools.commands import main
    ep = f"127.0.0.1:{free_port('127.0.0.1')}"
    with pytest.raises(RPCError, match=f"--device rpc:{ep}: RPC server {ep}: connect: "
                                       "cannot connect"):
        parse_devices(f"rpc:{ep},cpu")
    path = write_model(tmp_path / "m.gguf", "llama")
    assert main(["plan", path, "--device", f"rpc:{ep}"]) != 0
    assert f"--device rpc:{ep}: RPC server {ep}: connect: cannot connect" in \
        capsys.readouterr().err


# ---------------------------------------------------------------------------
# held to llama.cpp itself

@pytest.fixture(scope="module")
def servers():
    """Two of llama.cpp's own RPC servers (protocol 7) on localhost."""
    require_ggml_rpc(7)
    from ggml_py.rpc_server import start_server
    started = []
    try:
        for _ in range(2):
            started.append(start_server(threads=1, protocol=7))
        yield ",".join(f"{s.host}:{s.port}" for s in started)
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan-models")
    return {kind: write_model(root / f"{kind}.gguf", kind) for kind in (*ARCHS, *MOE_KINDS)}


def held_to_llama_cpp(path, servers, options, live=False):
    """The plan of `path` with llama.cpp's `options` equals what llama.cpp logs loading it;
    returns the plan. The devices: the servers' free memory as llama.cpp logs it, or with
    `live` the servers themselves (--device rpc:HOST:PORT asks them)."""
    theirs = _llama_cpp("load", path, servers, json.dumps({**CTX, **options}))
    # (with --split-mode none llama.cpp reports the main device alone; the servers' are alike)
    free = theirs["free_mib"]
    spec = ",".join(f"rpc:{free.get(f'RPC{i}', max(free.values()))}MiB" for i in range(2))
    if live:
        spec = ",".join(f"rpc:{ep}" for ep in servers.split(","))
    spec += ",cpu"
    plan = plan_gguf(path, parse_devices(spec), plan_options(options))
    print(path, options, plan.text(), sep="\n")
    assert list(plan.graph_nodes) == theirs["graph_nodes"]
    assert list(plan.graph_splits) == theirs["graph_splits"]
    assert mib_rows(plan) == sorted(map(tuple, theirs["buffers"]))
    return plan


@pytest.mark.parametrize("options", [o for _, o in OPTION_SETS], ids=[i for i, _ in OPTION_SETS])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_matches_llama_cpp(models, servers, arch, options):
    held_to_llama_cpp(models[arch], servers, options)


def test_plan_on_live_servers_matches_llama_cpp(models, servers):
    """--device rpc:HOST:PORT,rpc:HOST:PORT on llama.cpp's own servers: the memory they
    report places the layers as llama.cpp placed them."""
    plan = held_to_llama_cpp(models["llama"], servers, {"n_gpu_layers": 3}, live=True)
    assert plan.layer_devices == ["CPU", "CPU", "RPC0", "RPC0"]


@pytest.mark.parametrize("options,n_moved", [o[1:] for o in MOE_OPTION_SETS],
                         ids=[o[0] for o in MOE_OPTION_SETS])
@pytest.mark.parametrize("kind", MOE_KINDS)
def test_moe_plan_matches_llama_cpp(models, servers, kind, options, n_moved):
    plan = held_to_llama_cpp(models[kind], servers, options)
    assert len(plan.overridden) == n_moved
    assert all("_exps." in n for n in plan.overridden)


# ---------------------------------------------------------------------------
# a 70B-shaped file: tensor infos only (bench/bench_plan_gguf.py times it)

LLAMA_70B = dict(n_vocab=128256, n_ctx=8192, n_embd=8192, n_head=64, n_head_kv=8, n_layer=80,
                 n_ff=28672, wtype="q4_K", rope_freq_base=500000.0)


def write_70b(path):
    """A Llama-3-70B-shaped GGUF (q4_K matrices, a q6_K output) with no weight data."""
    from ggml_py.models.gguf import save_gguf_layout
    save_gguf_layout(arch_config("llama", **LLAMA_70B), path, {"output.weight": "q6_K"})
    return str(path)


def test_layout_file_refusals(tmp_path):
    from ggml_py.errors import ArgumentTypeError
    from ggml_py.models.gguf import GGUFError, save_gguf_layout
    cfg = arch_config("llama", **SHAPE, wtype="f16")
    with pytest.raises(ArgumentTypeError, match="path"):
        save_gguf_layout(cfg, 3)
    for types in ({"nope.weight": "f16"}, {"output.weight": "q9_9"}):
        with pytest.raises(GGUFError, match="types"):
            save_gguf_layout(cfg, tmp_path / "m.gguf", types)


def test_70b_shaped_file_plan(tmp_path):
    path = write_70b(tmp_path / "70b.gguf")
    assert os.stat(path).st_blocks * 512 < 1 << 20      # a hole where the weights would be
    plan = plan_gguf(path, parse_devices("rpc:24GiB,rpc:24GiB,cpu"), PlanOptions(n_ctx=8192))
    # 81 layers with the output, halved by equal memories: 0..40, then 41..79 and the output
    assert plan.layer_devices == ["RPC0"] * 41 + ["RPC1"] * 39 and plan.output_device == "RPC1"
    # -fa auto (llama.cpp's default) is on: 31 nodes a layer, 5 fewer than without it
    assert plan.graph_nodes == (31 * 80 + 6,) * 2 and plan.graph_splits == (3, 3)
    assert plan.n_copies == 4
    E, F, G, V = 8192, 28672, 1024, 128256         # q4_K: 144 bytes per 256 weights
    layer = (E * E * 2 + E * G * 2 + E * F * 3) // 256 * 144 + 2 * E * 4   # + the 2 norms
    kv_layer = 2 * G * 8192 * 2
    got = {(b.device, b.kind): b.bytes for b in plan.buffers}
    assert got[("RPC0", "model")] == 41 * layer
    assert got[("RPC1", "model")] == 39 * layer + E * 4 + E * V // 256 * 210   # + output
    assert got[("CPU", "model")] == E * V // 256 * 144                      # token_embd
    assert (got[("RPC0", "kv")], got[("RPC1", "kv")]) == (41 * kv_layer, 39 * kv_layer)
    assert got[("CPU", "output")] == 4 * V
    assert not plan.warnings
    # without flash attention the prompt's scores (kq of 64 heads, f32) fill each device's
    # compute buffer; with it they are never materialised
    off = plan_gguf(path, parse_devices("rpc:24GiB,rpc:24GiB,cpu"),
                    PlanOptions(n_ctx=8192, flash_attn="off"))
    assert off.graph_nodes == (36 * 80 + 6,) * 2
    scores = 8192 * 512 * 64 * 4
    for d in ("RPC0", "RPC1"):
        compute = {b.kind: b.bytes for b in off.buffers if b.device == d}["compute"]
        assert compute > scores > 2 * got[(d, "compute")]
