"""The supports_op rules of ggml_py._supports: one registry by name, the planner's device
kinds (cuda, metal, vulkan, opencl) answering as ggml 0.10.1's backends do, ggml_py's
OpenCL rule agreeing with its kernel dispatch, and GGUF plans on those devices.

Each kind's table is read from its backend's supports_op in ggml 0.10.1 (ggml-cuda.cu and
fattn.cu, ggml-metal-device.m, ggml-vulkan.cpp, ggml-opencl.cpp); the comment on a row
says why the answer is not the obvious one."""

import ast
import inspect
import json
import textwrap

import pytest

from ggml_py import ops
from ggml_py._core import Context
from ggml_py._supports import RULE_NAMES, rule_ops, use_rule
from ggml_py.backends.sim import SimBackend, SimBufferType
from ggml_py.errors import ArgumentError, UnknownNameError
from ggml_py.models.devices import KINDS, parse_devices

T = ops.new_tensor


def mm(a, b, ne=(256, 4), n=1):
    return lambda c: ops.mul_mat(c, T(c, a, ne), T(c, b, (ne[0], n)))


def mm_id(a):
    return lambda c: ops.mul_mat_id(c, T(c, a, (256, 4, 2)), T(c, "f32", (256, 1, 1)),
                                    T(c, "i32", (1, 1)))


def rows(a):
    return lambda c: ops.get_rows(c, T(c, a, (256, 4)), T(c, "i32", (2,)))


def set_rows(d):
    return lambda c: ops.set_rows(c, T(c, d, (256, 8)), T(c, "f32", (256, 2)), T(c, "i64", (2,)))


def cpy(a, d, ne=(256, 2)):
    return lambda c: ops.cpy(c, T(c, a, ne), T(c, d, ne))


def fa(kv, d=128, dv=None, mask=None):
    """Flash attention of 8 query heads over 2 KV heads (K and V of type `kv`, head sizes
    d and dv), optionally with a mask of type `mask`."""
    dv = d if dv is None else dv
    def build(c):
        m = T(c, mask, (256, 1)) if mask else None
        return ops.flash_attn_ext(c, T(c, "f32", (d, 1, 8)), T(c, kv, (d, 256, 2)),
                                  T(c, kv, (dv, 256, 2)), m, 0.125)
    return build


def unary(op, t="f32", permuted=False):
    def build(c):
        a = T(c, t, (4, 6, 2))
        return ops.unary(c, ops.permute(c, a, 0, 2, 1, 3) if permuted else a, op)
    return build


def glu(t):
    return lambda c: ops.glu(c, T(c, t, (16, 4)), "SWIGLU")


def argsort(n):
    return lambda c: ops.argsort(c, T(c, "f32", (n, 2)))


def top_k(n, k):
    return lambda c: ops.top_k(c, T(c, "f32", (n, 2)), k)


def rms_norm(n):
    return lambda c: ops.rms_norm(c, T(c, "f32", (n, 2)), 1e-5)


def add(a, b):
    return lambda c: ops.add(c, T(c, a, (8, 2)), T(c, b, (8, 2)))


HUGE = (1 << 30) + 16       # f32 elements: a tensor past 4 GiB


def view_of_huge(c):
    return ops.reshape_2d(c, T(c, "f32", (HUGE,)), HUGE // 16, 16)


TABLES = {
    "cuda": [
        (mm("q4_K", "f32"), True),
        (mm("f16", "f16"), True),
        (mm("q4_K", "f16"), False),        # an f16 src1 only with f16 weights
        (mm("tq1_0", "f32"), False),       # no CUDA kernel for the ternary types
        (mm("q8_K", "f32"), True),         # CUDA lists q8_K weights (Vulkan does not)
        (mm_id("q4_K"), True),
        (rows("q8_0"), True),
        (rows("q4_K"), False),             # get_rows reads floats and the legacy blocks only
        (cpy("f32", "q4_0"), True),
        (cpy("f32", "q4_K"), False),       # CPY quantizes to the legacy types and iq4_nl only
        (cpy("q4_1", "f32"), True),
        (cpy("i32", "f16"), False),
        (set_rows("q8_0"), True),
        (set_rows("q4_K"), False),
        (fa("f16"), True),
        (fa("q8_0"), True),
        (fa("q5_0"), False),               # q4_1/q5_x K and V need GGML_CUDA_FA_ALL_QUANTS
        (fa("f16", d=48), False),          # no kernel for head size 48
        (fa("f16", d=576, dv=512), False),  # the 576/512 (MLA) kernel needs a mask and GQA
        (unary("GELU"), True),
        (unary("GELU", permuted=True), False),     # the unary kernels need a contiguous source
        (argsort(4096), True),             # CUB sorts rows of any width
        (view_of_huge, True),
    ],
    "metal": [
        (mm("q4_K", "f32"), True),
        (mm("q4_K", "f16"), True),         # no src1 condition, unlike CUDA
        (mm_id("q6_K"), True),
        (rows("q4_K"), True),
        (cpy("f32", "q4_0"), True),
        (cpy("f32", "q4_K"), False),
        (cpy("f16", "q8_0"), False),       # Metal quantizes from f32 only
        (cpy("bf16", "f16"), False),
        (set_rows("q8_0"), True),
        (set_rows("q6_K"), False),
        (fa("f16"), True),
        (fa("f16", d=48), True),           # Metal has head size 48 (CUDA does not)
        (fa("f16", d=100), False),
        (fa("q5_1"), True),
        (glu("f32"), True),
        (glu("f16"), False),               # the GLU kernels are f32 only
        (add("f16", "f16"), False),        # the binary kernels need an f32 src0
        (add("f32", "f16"), True),
        (argsort(4096), True),
    ],
    "vulkan": [
        (mm("q4_K", "f32"), True),
        (mm("tq1_0", "f32"), False),
        (mm("q8_K", "f32"), False),        # no q8_K matrix pipeline (CUDA has one)
        (mm("bf16", "f16"), False),        # bf16 weights take no f16 src1
        (mm_id("q4_K"), True),
        (rows("q4_K"), True),
        (cpy("f32", "q4_0"), True),
        (cpy("f16", "q8_0"), False),       # quantizes from f32 only
        (cpy("q4_K", "q4_K"), True),       # a same-type contiguous copy of 2-byte-multiple blocks
        (set_rows("q8_0"), True),
        (fa("f16"), True),
        (fa("f16", d=72), True),
        (fa("f16", d=100), False),         # head sizes must be multiples of 8
        (fa("q5_1"), True),                # Vulkan reads q5_1 K/V (CUDA's default build not)
        (fa("f16", mask="f16"), True),
        (unary("GELU"), True),
        (unary("EXPM1"), False),           # no EXPM1 shader
        (top_k(4096, 10), True),
        (top_k(4096, 2000), False),        # the top-k pipelines keep fewer than 1024
        (view_of_huge, False),             # no tensor past maxStorageBufferRange, views too
    ],
    "opencl": [
        (mm("q4_K", "f32"), True),
        (mm("q5_0", "f32"), False),        # no kernel for q5_0 weights: they stay on the CPU
        (mm("q8_0", "f16"), False),
        (mm("f16", "f16"), True),
        (mm_id("q4_K"), False),            # MoE matrices only of q4_0, q8_0 and mxfp4
        (mm_id("q8_0"), True),
        (rows("q4_0"), False),             # the default build keeps q4_0 split (SOA_Q)
        (rows("f16"), True),
        (set_rows("f16"), True),
        (set_rows("q8_0"), False),
        (cpy("f32", "q8_0"), False),       # no quantizing copy
        (cpy("f32", "f16"), True),
        (fa("f16"), True),
        (fa("f16", d=72), False),
        (rms_norm(6), False),              # rows a multiple of 4
        (rms_norm(8), True),
        (add("f32", "f16"), False),        # sources of one type...
        (add("f16", "f32"), True),         # ...except ADD into f16
        (argsort(1024), True),
        (argsort(1025), False),            # a row padded to a power of two fits one work-group
    ],
}


@pytest.mark.parametrize("kind,build,expected",
                         [(k, b, e) for k, rows_ in TABLES.items() for b, e in rows_],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_each_kind_answers_as_its_ggml_backend(kind, build, expected):
    dev = KINDS[kind].backend("dev")
    assert dev.supports_op(build(Context())) is expected


def test_rules_are_found_by_name():
    assert set(RULE_NAMES) == {"cpu", "rpc-cpu-server", "opencl", "cuda", "metal", "vulkan",
                               "ggml-opencl"}
    # a view is always "yes" for CUDA; Vulkan's function checks even views' sizes
    assert rule_ops("cuda")["VIEW"] == "yes" and rule_ops("vulkan")["VIEW"] == "fn"
    assert "CONV_2D" not in rule_ops("metal")
    b = SimBackend("b", SimBufferType("B", 32, None, False))
    x = ops.scale(Context(), T(Context(), "f32", (4,)), 2.0)
    use_rule(b, "cpu", ["SCALE"])
    assert not b.supports_op(x)
    use_rule(b, "cpu")
    assert b.supports_op(x)
    with pytest.raises(UnknownNameError, match="no supports_op rule named 'rocm'.*cuda"):
        use_rule(b, "rocm")
    with pytest.raises(UnknownNameError, match="unknown op 'MATMUL'"):
        use_rule(b, "cpu", ["MATMUL"])


def test_opencl_rule_and_kernel_dispatch_agree():
    """Every op the OpenCL rule may say yes to has a branch in the backend's kernel
    dispatch (OpenCLBackend._compute_node), and the dispatch has no op the rule refuses."""
    from ggml_py.backends import opencl
    from ggml_py.backends.opencl import kernels as opencl_kernels
    src = textwrap.dedent(inspect.getsource(opencl.OpenCLBackend._compute_node))
    dispatched = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "o":
            for right in node.comparators:
                if isinstance(right, ast.Constant):
                    dispatched.add(right.value)
                elif isinstance(right, ast.Tuple):
                    dispatched.update(e.value for e in right.elts)
                elif isinstance(right, ast.Name):         # a table of codes by op name
                    dispatched.update(getattr(opencl_kernels, right.id))
    nothing_to_run = set(opencl.EMPTY_OPS)
    assert dispatched == set(rule_ops("opencl")) - nothing_to_run


def test_device_specs():
    devs = parse_devices("cuda0:24GiB,cuda1:24GiB,cpu:64GiB")
    assert [(d.name, d.kind, d.memory) for d in devs] == [
        ("CUDA0", "cuda", 24 << 30), ("CUDA1", "cuda", 24 << 30), ("CPU", "cpu", 64 << 30)]
    assert [d.name for d in parse_devices("vulkan,metal,opencl:8GiB,vulkan")] == [
        "Vulkan0", "MTL0", "GPUOpenCL", "Vulkan1", "CPU"]
    cuda = devs[0].backend.get_default_buffer_type()
    assert (cuda.name, cuda.alignment, cuda.is_host) == ("CUDA0", 128, False)
    ocl = parse_devices("opencl")[0].backend.get_default_buffer_type()
    assert (ocl.name, ocl.alignment, ocl.max_size) == ("OpenCL", 128, 1 << 30)
    vk = parse_devices("vulkan")[0].backend.get_default_buffer_type()
    assert vk.max_size == 1 << 30
    for bad, match in [("cuda1:24GiB", "cuda device 0 of the list, named CUDA0"),
                       ("cuda0,cuda0", "cuda device 1 of the list"),
                       ("opencl,opencl", "one opencl at most"),
                       ("opencl0", "opencl takes no index"),
                       ("cpu1", "cpu takes no index"),
                       ("rocm0:8GiB", "KIND one of cuda, metal, vulkan, opencl, rpc, cpu"),
                       ("cuda0:8XB", "unknown memory unit 'XB'"),
                       ("cuda0:", "expected KIND"),
                       ("cuda:-1GiB", "expected KIND")]:
        with pytest.raises(ArgumentError, match=match):
            parse_devices(bad)


# ---------------------------------------------------------------------------
# GGUF plans on the GPU kinds

def renamed(plan, names):
    d = plan.to_dict()
    return sorted((names.get(b["device"], b["device"]), b["kind"], b["bytes"]) for b in d["buffers"])


@pytest.mark.parametrize("spec,gpu", [("cuda0:24GiB,cpu", "CUDA0"), ("vulkan:8GiB,cpu", "Vulkan0"),
                                      ("metal,cpu", "MTL0"), ("opencl,cpu", "GPUOpenCL")])
def test_f16_model_fully_offloaded(tmp_path, spec, gpu):
    """An f16 llama with -ngl all: every kind runs every layer's op, so the plan is the
    single RPC device's (2 splits: the token embedding's GET_ROWS on the CPU, where
    llama.cpp keeps token_embd, then the GPU), with the GPU's name."""
    from test_plan_gguf import plan_options, write_model
    from ggml_py.models.model_plan import plan_gguf
    path = write_model(tmp_path / "m.gguf", "llama")
    plan = plan_gguf(path, parse_devices(spec), plan_options({}))
    rpc = plan_gguf(path, parse_devices("rpc:24GiB,cpu"), plan_options({}))
    assert plan.to_dict()["graph_splits"] == [2, 2]
    assert [s.device for s in plan.splits[1]] == ["CPU", gpu]
    assert renamed(plan, {}) == renamed(rpc, {"RPC0": gpu})
    assert ("CPU", "model", 256 * 128 * 2) in renamed(plan, {})      # token_embd alone


def test_cuda_pair_splits_the_layers(tmp_path, capsys):
    from test_plan_gguf import plan_options, write_model
    from ggml_py.models.model_plan import plan_gguf
    from ggml_py.tools.commands import main
    path = write_model(tmp_path / "m.gguf", "llama")
    devices = "cuda0:24GiB,cuda1:24GiB,cpu:64GiB"
    plan = plan_gguf(path, parse_devices(devices), plan_options({}))
    rpc = plan_gguf(path, parse_devices("rpc:24GiB,rpc:24GiB,cpu:64GiB"), plan_options({}))
    assert plan.layer_devices == ["CUDA0", "CUDA0", "CUDA0", "CUDA1"]
    assert renamed(plan, {}) == renamed(rpc, {"RPC0": "CUDA0", "RPC1": "CUDA1"})
    args = ["plan", path, "--device", devices, "-c", "512", "-b", "256", "-ub", "256"]
    assert main([*args, "-fa", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plan.to_dict()
    # 32-wide heads: fattn.cu has no kernel for them, so -fa auto turns flash attention off
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flash_attn"] is False
    assert main(["plan", path, "--device", "cuda1:24GiB"]) == 2
    assert "write cuda0 or cuda" in capsys.readouterr().err


def test_weights_a_device_cannot_use_stay_on_the_cpu(tmp_path):
    """q5_0 weights on ggml-opencl, which has no q5_0 matrix kernel: llama.cpp's loader
    keeps every such weight on the CPU (select_weight_buft), so each layer's matrix
    products run there and the rest (norms, rope, attention) on the GPU: 27 splits, each
    CPU one explained. CUDA runs q5_0: the same file plans in 2 splits there."""
    from test_plan_gguf import SHAPE, plan_options
    from ggml_py.models.config import arch_config
    from ggml_py.models.gguf import save_gguf
    from ggml_py.models.model_plan import plan_gguf
    from ggml_py.models.transformer import Model
    path = str(tmp_path / "q.gguf")
    save_gguf(Model.random(arch_config("llama", **SHAPE, wtype="q5_0"), seed=3), path)
    plan = plan_gguf(path, parse_devices("opencl,cpu"), plan_options({}))
    assert plan.to_dict()["graph_splits"] == [27, 27]
    norms = (2 * SHAPE["n_layer"] + 1) * SHAPE["n_embd"] * 4       # f32 vectors: on the GPU
    assert ("GPUOpenCL", "model", norms) in renamed(plan, {})
    cpu_splits = [s for s in plan.splits[1][1:] if s.device == "CPU"]
    assert len(cpu_splits) == 13
    assert {s.reason for s in cpu_splits} == {
        "MUL_MAT(q5_0, f32) -> f32 on CPU: GPUOpenCL can't run it"}
    assert plan_gguf(path, parse_devices("cuda0,cpu"), plan_options({})).to_dict()[
        "graph_splits"] == [2, 2]


def test_experts_ggml_opencl_cannot_multiply_stay_on_the_cpu(tmp_path):
    """f16 experts: ggml-opencl's MUL_MAT_ID takes q4_0, q8_0 and mxfp4 only, so llama.cpp
    keeps them on the CPU and each layer's expert product runs there (CUDA runs them)."""
    from test_plan_gguf import plan_options, write_model
    from ggml_py.models.model_plan import plan_gguf
    path = write_model(tmp_path / "m.gguf", "llama-moe")
    plan = plan_gguf(path, parse_devices("opencl,cpu"), plan_options({}))
    assert plan.to_dict()["graph_splits"] == [10, 10]
    assert {s.reason for s in plan.splits[1][1:] if s.device == "CPU"} == {
        "MUL_MAT_ID(f16, f32, i32) -> f32 on CPU: GPUOpenCL can't run it"}
    assert plan_gguf(path, parse_devices("cuda0,cpu"), plan_options({})).to_dict()[
        "graph_splits"] == [2, 2]
