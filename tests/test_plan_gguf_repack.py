"""ggml-cpu's extra buffer type CPU_REPACK in `ggml-py plan MODEL.gguf`: the CPU's weights
whose type ggml-cpu re-lays out for its matrix kernels (on x86: q4_0, q4_K, iq4_nl, mxfp4
with AVX2, q2_K with AVX-512; rows a multiple of 8) and that a MUL_MAT or MUL_MAT_ID reads
go to a CPU_REPACK model buffer beside CPU_Mapped, unless --no-repack. q8_0 is repacked on
Arm only, so on x86 it stays mapped.

Held to llama.cpp itself as tests/test_plan_gguf.py does (its helpers): every buffer to
0.01 MiB, nodes and splits, at -ngl 0 / half / all, with and without --no-repack (llama.cpp's
use_extra_bufts), on q4_0, q4_K and q8_0 files (tensor infos only: the weights are zeros).
"""

import dataclasses
import platform

import pytest
from test_plan_gguf import SHAPE, held_to_llama_cpp, servers  # noqa: F401 (a fixture)

from ggml_py.errors import ModelError
from ggml_py.models.config import arch_config
from ggml_py.models.devices import cpu, parse_devices
from ggml_py.models.gguf import save_gguf_layout
from ggml_py.models.model_plan import PlanOptions, cpu_moe_overrides, plan_gguf

pytest.importorskip("gguf")

# K-quant rows are 256 wide
WIDE = dict(SHAPE, n_embd=256, n_ff=512)
X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and "avx2" in (cpu._x86_flags() or ())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("repack")
    out = {}
    for wtype in ("q4_0", "q4_K", "q8_0"):
        out[wtype] = str(root / f"llama-{wtype}.gguf")
        save_gguf_layout(arch_config("llama", **WIDE, wtype=wtype), out[wtype])
    out["moe-q4_0"] = str(root / "qwen3moe-q4_0.gguf")
    save_gguf_layout(arch_config("qwen3moe", **WIDE, wtype="q4_0"), out["moe-q4_0"])
    return out


def cpu_model_buffers(plan):
    return sorted(b.bytes for b in plan.buffers if b.device == "CPU" and b.kind == "model")


def repack_bytes(path, names):
    """The CPU_REPACK buffer of these weights: their bytes, each aligned to 32."""
    from ggml_py.models.gguf import read_tensor_infos
    infos = read_tensor_infos(path)[1]
    return sum(-(-infos[n].nbytes // 32) * 32 for n in names)


def cpu_matrices(ngl):
    """The matrices llama.cpp leaves on the CPU at -ngl `ngl` (the output layer counting as
    the last): the first layers', and the output's at -ngl 0."""
    n_layer = WIDE["n_layer"]
    n_cpu = 0 if ngl < 0 else n_layer + 1 - ngl
    names = [f"blk.{il}.{w}.weight" for il in range(min(n_cpu, n_layer))
             for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                       "ffn_down")]
    return names + (["output.weight"] if n_cpu > n_layer else [])


@pytest.mark.skipif(not X86_AVX2, reason="the CPU_REPACK rules planned are x86's with AVX2")
@pytest.mark.parametrize("ngl", [0, 3, -1], ids=["ngl-0", "ngl-half", "ngl-all"])
@pytest.mark.parametrize("repack", [True, False], ids=["repack", "no-repack"])
@pytest.mark.parametrize("wtype", ["q4_0", "q4_K", "q8_0"])
def test_repack_buffer_matches_llama_cpp(files, servers, wtype, repack, ngl):  # noqa: F811
    plan = held_to_llama_cpp(files[wtype], servers, {"n_gpu_layers": ngl,
                                                     "use_extra_bufts": repack})
    repacked = cpu_matrices(ngl) if repack and wtype != "q8_0" else []
    if repacked:        # CPU_REPACK beside CPU_Mapped (the token embeddings, read by get_rows)
        assert repack_bytes(files[wtype], repacked) in cpu_model_buffers(plan)
        assert len(cpu_model_buffers(plan)) == 2
    else:
        assert len(cpu_model_buffers(plan)) == 1


@pytest.mark.skipif(not X86_AVX2, reason="the CPU_REPACK rules planned are x86's with AVX2")
@pytest.mark.parametrize("repack", [True, False], ids=["repack", "no-repack"])
def test_experts_sent_to_the_cpu_are_repacked_as_llama_cpp(files, servers, repack):  # noqa: F811
    """--cpu-moe: llama.cpp considers the CPU's extra buffer types for an override to the
    CPU, and repacks the 3-D q4_0 experts (read by MUL_MAT_ID)."""
    from test_plan_gguf import CPU_MOE
    plan = held_to_llama_cpp(files["moe-q4_0"], servers, {"tensor_overrides": [CPU_MOE],
                                                          "use_extra_bufts": repack})
    assert len(cpu_model_buffers(plan)) == (2 if repack else 1)


@pytest.mark.parametrize("flags, type_name, rows, repacked", [
    ({"avx2"}, "q4_0", 8, True), ({"avx2"}, "q4_0", 12, False), ({"avx2"}, "q4_K", 16, True),
    ({"avx2"}, "iq4_nl", 8, True), ({"avx2"}, "mxfp4", 8, True), ({"avx2"}, "q8_0", 8, False),
    ({"avx2"}, "q2_K", 8, False), ({"avx2", "avx512f"}, "q2_K", 8, True),
    ({"avx2"}, "q5_K", 8, False), ({"avx2"}, "f16", 8, False), (set(), "q4_0", 8, False)])
def test_repack_rule(monkeypatch, flags, type_name, rows, repacked):
    """repack.cpp's choice on x86: the type, the instruction set, rows a multiple of 8."""
    monkeypatch.setattr(cpu, "_x86_flags", lambda: frozenset(flags))
    assert cpu.repacks("w", type_name, (256, rows)) == repacked


def test_no_repack_keeps_the_cpu_weights_mapped(files, monkeypatch):
    """--no-repack: every CPU weight in one buffer; with repacking, the token embeddings
    (GET_ROWS) and the norms stay there beside CPU_REPACK (without mmap, to count bytes:
    mapped, the CPU's buffer is the span of the file its weights lie in)."""
    monkeypatch.setattr(cpu, "_x86_flags", lambda: frozenset({"avx2"}))
    devices = parse_devices("rpc:1GiB,cpu")
    options = PlanOptions(n_gpu_layers=0, n_ctx=512, flash_attn="off", use_mmap=False)
    with_repack = plan_gguf(files["q4_0"], devices, options)
    without = plan_gguf(files["q4_0"], devices, dataclasses.replace(options, repack=False))
    assert cpu_model_buffers(with_repack) == sorted([
        repack_bytes(files["q4_0"], cpu_matrices(0)),
        sum(cpu_model_buffers(without)) - repack_bytes(files["q4_0"], cpu_matrices(0))])
    assert len(cpu_model_buffers(without)) == 1
    assert with_repack.graph_splits == without.graph_splits


def test_off_x86_repackable_weights_are_refused(monkeypatch, files):
    monkeypatch.setattr(cpu, "_x86_flags", lambda: None)
    devices = parse_devices("rpc:1GiB,cpu")
    with pytest.raises(ModelError, match=r"blk\.0\.attn_q\.weight \(q4_0\) may go to "
                                         "ggml-cpu's CPU_REPACK buffer"):
        plan_gguf(files["q4_0"], devices, PlanOptions(n_gpu_layers=0, n_ctx=512))
    plan_gguf(files["q4_0"], devices, PlanOptions(n_gpu_layers=0, n_ctx=512, repack=False))
    plan_gguf(files["moe-q4_0"], devices, PlanOptions(n_ctx=512,
                                                      tensor_overrides=cpu_moe_overrides(),
                                                      repack=False))
