"""The planner on the GPU device kinds: --split-mode row on CUDA (ggml-cuda's split buffers)
and -fa auto on cuda, vulkan and metal.

There is no CUDA device here to hold llama.cpp's log against, so the split buffers are held
to sizes computed by hand from ggml-cuda.cu's rules (ggml 0.10.1), which are:
  - the split points: --tensor-split's shares summed in float32, each device's start the
    sum before it over the total (the default: the devices' memories);
  - a tensor of `nrows` rows (ne1 * ne2 * ne3) gives device i the rows [low_i, low_i+1):
    low_0 = 0, low_i = (int64)((float)nrows * point_i) rounded down to a multiple of 128
    (the matrix kernels' tile height), the last device's slice ending at nrows;
  - each device's slice takes its rows plus, where a row is not a multiple of 512
    elements (MATRIX_ROW_PADDING), the bytes of the missing elements of one row; a
    tensor's size in the buffer is the sum of its slices, aligned to 128;
  - the ordinary CUDA buffer pads a quantized tensor the same way, once;
  - llama.cpp puts a weight in its layer's device's CUDA<i>_Split when that device's
    MUL_MAT can read it from there: a 2-D matrix read by a MUL_MAT, of which device i holds
    some rows; every other weight stays in CUDA<i>.
"""

import json

import numpy as np
import pytest

from ggml_py import ops
from ggml_py._core import Context, row_size
from ggml_py.errors import ArgumentError
from ggml_py.models.devices import cuda, parse_devices
from ggml_py.models.model_plan import PlanOptions, plan_gguf

from test_plan_gguf import plan_options, write_model

F16_ROW_128 = 128 * 2           # an f16 row of 128 elements
PAD_128 = row_size("f16", 384)  # 768: it pads to 512 elements
PAD_256 = row_size("f16", 256)  # 512


def model_buffers(plan):
    return sorted((b.device, b.buffer, b.bytes) for b in plan.buffers if b.kind == "model")


# ---------------------------------------------------------------------------
# ggml-cuda's rules, by hand

def test_split_points_and_rows():
    assert cuda.split_points((3, 1), by_memory=False) == (0.0, 0.75)
    assert cuda.split_points((24 << 30, 8 << 30), by_memory=True) == (0.0, 0.75)
    thirds = cuda.split_points((1, 1, 1), by_memory=False)
    f32 = np.float32
    assert thirds == (0.0, float(f32(1) / f32(3)), float(f32(2) / f32(3)))
    # 1000 * 1/3 = 333 -> 256, 1000 * 2/3 = 666 -> 640; the last device takes the rest
    assert [cuda.row_range(1000, thirds, i) for i in range(3)] == [(0, 256), (256, 640),
                                                                   (640, 1000)]
    # 3:1 of 256 rows: 192 -> 128
    assert [cuda.row_range(256, (0.0, 0.75), i) for i in range(2)] == [(0, 128), (128, 256)]
    # a device whose share rounds to nothing holds no row
    assert [cuda.row_range(64, (0.0, 0.5), i) for i in range(2)] == [(0, 0), (0, 64)]
    # ggml's quirk: the last device ends at nrows whatever its share (1:0 of 200 rows)
    assert [cuda.row_range(200, (0.0, 1.0), i) for i in range(2)] == [(0, 128), (128, 200)]


def test_split_sizes_by_hand():
    split = cuda.CudaSplitBufferType("CUDA0", 0, (0.0, 0.75))
    # f16 [128, 256]: 128 rows each, each slice padded by 384 elements
    assert split.slices("f16", (128, 256)) == [128 * F16_ROW_128 + PAD_128] * 2
    # q8_0 [512, 300] (0.75 * 300 = 225 -> 128): rows of 512 elements are not padded
    assert split.slices("q8_0", (512, 300)) == [128 * 544, 172 * 544]
    # f16 [128, 64]: the main device has no row, so llama.cpp would not use the split buffer
    assert split.slices("f16", (128, 64)) == [0, 64 * F16_ROW_128 + PAD_128]
    assert not split.holds_rows("f16", (128, 64)) and split.holds_rows("f16", (128, 256))
    t = ops.new_tensor(Context(), "f16", (128, 256))
    assert split.get_alloc_size(t) == 2 * (128 * F16_ROW_128 + PAD_128)
    assert (split.name, split.alignment, split.is_host, split.device) == ("CUDA0_Split", 128,
                                                                         False, "CUDA0")


def test_cuda_buffer_pads_quantized_rows():
    buft = parse_devices("cuda0,cpu")[0].backend.get_default_buffer_type()
    ctx = Context()
    q = ops.new_tensor(ctx, "q8_0", (128, 4))
    assert buft.get_alloc_size(q) == 4 * 136 + row_size("q8_0", 384)
    for t in (ops.new_tensor(ctx, "q8_0", (512, 4)), ops.new_tensor(ctx, "f16", (128, 4))):
        assert buft.get_alloc_size(t) == t.nbytes


@pytest.mark.parametrize("type_name,ne0", [("f16", 128), ("f32", 96), ("q8_0", 96),
                                           ("q8_0", 512), ("q4_K", 256), ("q4_K", 1024)])
@pytest.mark.parametrize("nrows", [64, 129, 1000, 4096])
@pytest.mark.parametrize("shares", [(1, 1), (3, 1), (1, 0), (0, 1), (1, 2, 3), (5, 1, 1, 1)])
def test_split_slices_invariants(type_name, ne0, nrows, shares):
    """The slices cover the rows once, each device's start within 128 rows below its share
    of them, and add one padded row's worth per slice held."""
    points = cuda.split_points(shares, by_memory=False)
    ranges = [cuda.row_range(nrows, points, i) for i in range(len(shares))]
    assert ranges[0][0] == 0 and ranges[-1][1] == nrows
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for (low, high), start in zip(ranges, points):
        assert low % 128 == 0 and 0 <= start * nrows - low < 128 + 1e-3 * nrows
    split = cuda.CudaSplitBufferType("CUDA0", 0, points)
    slices = split.slices(type_name, (ne0, nrows))
    pad = row_size(type_name, 512 - ne0 % 512) if ne0 % 512 else 0
    held = sum(1 for low, high in ranges if high > low)
    assert sum(slices) == row_size(type_name, ne0) * nrows + held * pad
    assert [s > 0 for s in slices] == [high > low for low, high in ranges]


# ---------------------------------------------------------------------------
# --split-mode row plans

def test_row_split_model_buffers_by_hand(tmp_path, capsys):
    """The test llama (128 wide, 4 layers, f16) on two CUDA devices of equal memory: layers
    0-2 on CUDA0, 3 and the output on CUDA1 (as layer), rows cut at half. Only ffn_gate and
    ffn_up (256 rows: 128 each) give CUDA0 rows, so CUDA0_Split holds those of layers 0-2;
    CUDA1 holds all the rows of every 128- and 64-row matrix, so CUDA1_Split holds every
    matrix of layer 3 and the output. Nodes and splits are layer's (the MUL_MATs run on
    the main devices), without pipeline parallelism (llama.cpp's is for layer alone)."""
    path = write_model(tmp_path / "m.gguf", "llama")
    devices = parse_devices("cuda0:24GiB,cuda1:24GiB,cpu:64GiB")
    row = plan_gguf(path, devices, plan_options({"split_mode": "row"}))
    layer = plan_gguf(path, devices, plan_options({}))
    gate_up = 2 * (128 * F16_ROW_128 + PAD_128)                       # 67072, either
    norms = 2 * 128 * 4
    cuda0 = 3 * (norms + (128 + 64 + 64 + 128) * F16_ROW_128 + 128 * 256 * 2)
    cuda1_split = (3 * gate_up                                        # gate, up, output
                   + 2 * (128 * F16_ROW_128 + PAD_128)                # q, o: 128 rows
                   + 2 * (64 * F16_ROW_128 + PAD_128)                 # k, v: 64 rows
                   + 128 * 256 * 2 + PAD_256)                         # down: 256 wide
    assert model_buffers(row) == sorted([
        ("CPU", "CPU_Mapped", 256 * F16_ROW_128),                     # token_embd
        ("CUDA0", "CUDA0", cuda0), ("CUDA0", "CUDA0_Split", 6 * gate_up),
        ("CUDA1", "CUDA1", norms + 128 * 4), ("CUDA1", "CUDA1_Split", cuda1_split)])
    assert (cuda0, 6 * gate_up, cuda1_split) == (494592, 402432, 368640)
    # the split buffers hold the layer plan's weights, each slice padded
    def on(plan, device):
        return sum(b[2] for b in model_buffers(plan) if b[0] == device)
    assert {d: on(row, d) for d in ("CUDA0", "CUDA1")} == {d: on(layer, d) + pads for d, pads in
                          (("CUDA0", 6 * 2 * PAD_128), ("CUDA1", 3 * 2 * PAD_128
                                                        + 4 * PAD_128 + PAD_256))}
    assert row.layer_devices == layer.layer_devices == ["CUDA0", "CUDA0", "CUDA0", "CUDA1"]
    assert (row.graph_nodes, row.graph_splits) == (layer.graph_nodes, layer.graph_splits)
    assert [[s.device for s in g] for g in row.splits] == [[s.device for s in g]
                                                           for g in layer.splits]
    assert (row.n_copies, layer.n_copies) == (1, 4)
    assert [b for b in row.buffers if b.kind == "kv"] == [b for b in layer.buffers
                                                         if b.kind == "kv"]
    from ggml_py.tools.commands import main
    assert main(["plan", path, "--device", "cuda0:24GiB,cuda1:24GiB,cpu:64GiB", "-c", "512",
                 "-b", "256", "-ub", "256", "-fa", "off", "--split-mode", "row"]) == 0
    out = capsys.readouterr().out
    assert "CUDA0_Split 0.38 MiB" in out and "CUDA1_Split 0.35 MiB" in out


def test_row_split_follows_tensor_split(tmp_path):
    """--tensor-split 3,1 cuts the layers 3:1 (layers 0-3 on CUDA0) and each matrix's rows
    3:1 where the 128-row rounding allows: a 1024-row ffn_up gives CUDA0 rows 0-767."""
    path = write_model(tmp_path / "m.gguf", "llama", n_ff=1024)
    devices = parse_devices("cuda0:24GiB,cuda1:24GiB,cpu")
    plan = plan_gguf(path, devices, plan_options({"split_mode": "row", "tensor_split": [3, 1]}))
    assert plan.layer_devices == ["CUDA0"] * 4 and plan.output_device == "CUDA1"
    points = cuda.split_points((3, 1), by_memory=False)
    assert [cuda.row_range(1024, points, i) for i in range(2)] == [(0, 768), (768, 1024)]
    split = cuda.CudaSplitBufferType("CUDA0", 0, points)
    ffn = split.slices("f16", (128, 1024))
    assert ffn == [768 * F16_ROW_128 + PAD_128, 256 * F16_ROW_128 + PAD_128]
    # CUDA0_Split: each layer's gate and up (1024 rows); down (128 rows) gives CUDA0 none
    assert ("CUDA0", "CUDA0_Split", 4 * 2 * sum(ffn)) in model_buffers(plan)
    # CUDA1_Split: the output (256 rows: 192 -> 128 each)
    assert ("CUDA1", "CUDA1_Split", 2 * (128 * F16_ROW_128 + PAD_128)) in model_buffers(plan)


def test_row_split_overridden_weights_stay_in_the_ordinary_buffer(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama")
    devices = parse_devices("cuda0:24GiB,cuda1:24GiB,cpu")
    opts = plan_options({"split_mode": "row",
                         "tensor_overrides": [[r"blk\.0\.ffn_up\.", "CUDA0"]]})
    plan = plan_gguf(path, devices, opts)
    gate_up = 2 * (128 * F16_ROW_128 + PAD_128)
    assert ("CUDA0", "CUDA0_Split", 5 * gate_up) in model_buffers(plan)
    assert plan.overridden == {"blk.0.ffn_up.weight": "CUDA0"}


@pytest.mark.parametrize("spec,refused", [("cuda0,rpc,cpu", "RPC0"), ("vulkan,cpu", "Vulkan0"),
                                          ("metal,cpu", "MTL0"), ("opencl,cpu", "GPUOpenCL")])
def test_row_split_is_refused_without_split_buffers(tmp_path, spec, refused):
    """llama.cpp asks every device for its split buffer type: only ggml-cuda has one."""
    path = write_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(ArgumentError, match=f"--split-mode row: device {refused} does not "
                                            "support split buffers"):
        plan_gguf(path, parse_devices(spec), PlanOptions(split_mode="row"))


# ---------------------------------------------------------------------------
# -fa auto

# (kind, head size, whether its backend has a flash attention kernel for it)
FA_CASES = [
    ("cuda0", 32, False),       # fattn.cu: 40, 64, 72, 80, 96, 112, 128, 256, ...
    ("cuda0", 64, True),
    ("cuda0", 24, False),
    ("metal", 32, True),        # ggml-metal: 32, 40, 48, 64, ...
    ("metal", 24, False),
    ("vulkan", 24, True),       # ggml-vulkan: any multiple of 8
    ("vulkan", 12, False),
]


def heads(size):
    return dict(n_embd=4 * size, n_head=4, n_head_kv=2)


@pytest.mark.parametrize("kind,head,runs", FA_CASES)
def test_fa_auto_follows_each_layers_device(tmp_path, kind, head, runs):
    """-fa auto keeps flash attention where every layer's FLASH_ATTN_EXT runs on its
    device: then its plan is -fa on's. Where one does not, it is off, over the V cache
    laid out for it: -fa off's graph but for V (set by rows, copied out transposed, a
    v_cont per layer) and the same buffers of weights and cache."""
    path = write_model(tmp_path / "m.gguf", "llama", **heads(head))
    devices = parse_devices(f"{kind}:24GiB,cpu")
    auto, on, off = (plan_gguf(path, devices, plan_options({"flash_attn": fa}))
                     for fa in ("auto", "on", "off"))
    assert (auto.flash_attn, on.flash_attn, off.flash_attn) == (runs, True, False)
    if runs:
        assert auto.to_dict() == on.to_dict()
        return
    # per layer, V by rows is a view + set_rows and a transpose + cont before kqv where the
    # transposed V is reshape, reshape, reshape + set_rows: as many nodes
    assert auto.graph_nodes == off.graph_nodes
    assert auto.graph_splits == off.graph_splits
    assert [b for b in auto.buffers if b.kind in ("model", "kv")] == \
        [b for b in off.buffers if b.kind in ("model", "kv")]
    # (the V cell ids: a token's row, not each of its n_embd_gqa elements)
    assert auto.device_bytes("CPU") < off.device_bytes("CPU")


def test_fa_auto_with_layers_on_the_cpu(tmp_path):
    """-ngl 2: two layers on the CPU, which runs flash attention for any head, and two on
    CUDA0, which has no kernel for 32-wide heads: off, as the CUDA layers decide."""
    path = write_model(tmp_path / "m.gguf", "llama")
    devices = parse_devices("cuda0:24GiB,cpu")
    plan = plan_gguf(path, devices, plan_options({"flash_attn": "auto", "n_gpu_layers": 2}))
    assert plan.layer_devices == ["CPU", "CPU", "CPU", "CUDA0"] and not plan.flash_attn
    cpu = plan_gguf(path, devices, plan_options({"flash_attn": "auto", "n_gpu_layers": 0}))
    assert cpu.flash_attn


def test_fa_auto_quantized_v_turns_it_on(tmp_path):
    """llama.cpp turns -fa auto on for a quantized V cache (it needs flash attention) before
    any check: the plan is -fa on's, even where CUDA has no kernel for the heads."""
    path = write_model(tmp_path / "m.gguf", "llama")
    devices = parse_devices("cuda0:24GiB,cpu")
    auto, on = (plan_gguf(path, devices, plan_options({"flash_attn": fa, "type_k": "q8_0",
                                                       "type_v": "q8_0"}))
                for fa in ("auto", "on"))
    assert auto.flash_attn and auto.to_dict() == on.to_dict()
    assert json.loads(json.dumps(auto.to_dict()))["flash_attn"] is True


def test_attention_without_flash_over_v_rows(tmp_path, monkeypatch):
    """The graph of -fa auto turned off (llama.cpp's build_attn_mha over a V cache that is
    not transposed): V is written by rows (a SET_ROWS of [n_embd_gqa, tokens] at the
    tokens' cells), and read for the kqv product through a transposed copy, v_cont-il."""
    from ggml_py.models import model_plan
    path = write_model(tmp_path / "m.gguf", "llama")
    graphs = []
    real = model_plan._reserve_graph

    def keep(*args):
        graphs.append((args[5:], real(*args)))
        return graphs[-1][1]
    monkeypatch.setattr(model_plan, "_reserve_graph", keep)
    plan = plan_gguf(path, parse_devices("cuda0:24GiB,cpu"), plan_options({"flash_attn": "auto"}))
    assert not plan.flash_attn
    (probe, _), *rest = graphs
    assert probe == (True, True)          # the -fa auto check: flash attention, V by rows
    assert [flags for flags, _ in rest] == [(False, True)] * 3
    nodes = rest[0][1].nodes
    assert not any(n.op == "FLASH_ATTN_EXT" for n in nodes)
    v_cont = [n for n in nodes if n.name.startswith("v_cont-")]
    assert [n.name for n in v_cont] == [f"v_cont-{il}" for il in range(4)]
    assert all(n.op == "CONT" and n.src[0].op == "TRANSPOSE" for n in v_cont)
    v_writes = [n for n in nodes if n.op == "SET_ROWS" and n.name.startswith("cache_v")]
    assert [(tuple(n.src[0].ne[:2]), n.src[1].ne[0]) for n in v_writes] == [((64, 256), 256)] * 4


def test_fit_refuses_row_split_over_devices(tmp_path):
    """common/fit.cpp gives up on --split-mode row with more than one device."""
    from ggml_py.models.fit import fit_gguf
    path = write_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(ArgumentError, match="--fit with --split-mode row"):
        fit_gguf(path, parse_devices("cuda0:1MiB,cuda1:1MiB,cpu"),
                 plan_options({"split_mode": "row"}), (0,))


def test_quantized_kv_cache_on_cuda_is_padded(tmp_path):
    """A q8_0 K cache on CUDA: each layer's K ([64, 512 cells], 68-byte rows) takes the
    padding of a row of 64 elements to 512 (448 elements, 476 bytes), aligned to 128;
    V (f16) takes none."""
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices("cuda0:24GiB,cpu"),
                     plan_options({"type_k": "q8_0", "flash_attn": "on"}))
    k = -(-(512 * 68 + row_size("q8_0", 448)) // 128) * 128
    assert (row_size("q8_0", 448), k) == (476, 35328)
    assert [(b.device, b.bytes) for b in plan.buffers if b.kind == "kv"] == [
        ("CUDA0", 4 * (k + 512 * 64 * 2))]
