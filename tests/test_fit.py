"""`--fit` (models.fit): the -ngl and --tensor-split llama.cpp's fit (common/fit.cpp) would
choose for the devices' memories, found by planning.

On random f16 GGUFs and several device memories: the chosen placement fits every device
within its target (free memory less --fit-target) by the planner's own figures, and the
layer more that llama.cpp's back-to-front fill would have tried for each device does not;
with -c 0 the file's context shrinks first, to a size 256 cells short of not fitting.
Each trial is a plan as llama.cpp's fit measures it (a load without allocations); the
answers are held to llama.cpp's own llama-fit-params in tests/test_fit_llama_cpp.py.
"""

import dataclasses
import json
import time

import pytest
from test_plan_gguf import CTX, LLAMA_70B, write_model

from ggml_py.errors import ArgumentError, ModelError
from ggml_py.models.devices import parse_devices
from ggml_py.models.fit import _c_step, fit_gguf, margins_of
from ggml_py.models.model_plan import PlanOptions, cpu_moe_overrides, plan_gguf

pytest.importorskip("gguf")

OPTIONS = PlanOptions(**CTX, flash_attn="off")
MIB = 1 << 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("fit") / "llama.gguf", "llama")


def used(path, devices, options, counts):
    """Each device's bytes with `counts` layers per device (the fit's trial)."""
    plan = plan_gguf(path, devices, dataclasses.replace(
        options, n_gpu_layers=sum(counts),
        tensor_split=tuple(map(float, counts)) if len(counts) > 1 else None),
        as_fit_measures=True)
    return [plan.device_bytes(d.name) for d in devices if not d.is_cpu]


def assert_fit_is_llama_cpps(path, devices, options, fit):
    """For each device, as llama.cpp's fill left it (the devices after it as chosen, those
    before it empty): its layers fit within its target, and one layer more does not."""
    counts, targets = list(fit.layers), fit.targets
    n_layers = fit.plan.config.n_layer + 1
    assert fit.options.n_gpu_layers == sum(counts)
    assert fit.options.tensor_split == (tuple(map(float, counts)) if len(counts) > 1 else None)
    for d in range(len(counts)):
        assert used(path, devices, options, [0] * d + counts[d:])[d] <= targets[d]
        if counts[d] < n_layers - sum(counts[d + 1:]):
            more = [0] * d + [counts[d] + 1] + counts[d + 1:]
            assert used(path, devices, options, more)[d] > targets[d], (d, more)


@pytest.mark.parametrize("spec, margin, layers", [
    ("rpc:4MiB,cpu", (0,), (2,)),
    ("rpc:4.5MiB,cpu", (0,), (4,)),
    ("rpc:5MiB,cpu", (1,), (2,)),            # the margin takes a MiB
    ("rpc:3MiB,cpu", (0,), (1,)),            # the output layer alone, beside the compute
    ("rpc:0.3MiB,cpu", (0,), (0,)),          # not even the output layer fits
    ("rpc:3.8MiB,rpc:4.5MiB,cpu", (0,), (0, 4)),
    ("rpc:4MiB,rpc:4MiB,cpu", (0,), (2, 2)),
    ("rpc:5MiB,rpc:5MiB,rpc:4MiB,cpu", (0,), (0, 2, 2)),
])
def test_fit_fills_the_devices_back_to_front(model, spec, margin, layers):
    devices = parse_devices(spec)
    fit = fit_gguf(model, devices, OPTIONS, margin)
    assert fit.changed and fit.layers == layers
    assert_fit_is_llama_cpps(model, devices, OPTIONS, fit)
    assert all(fit.plan.device_bytes(d.name) <= t for d, t in zip(devices, fit.targets))
    assert not fit.plan.warnings


def test_fit_checks_only_the_device_it_fills(model):
    """llama.cpp's fill checks the device it gives layers to, not the ones filled before:
    the first device's one layer completes the offload, which turns pipeline parallelism
    on, and the last device's compute buffer (one per copy) no longer fits."""
    devices = parse_devices("rpc:8MiB,rpc:5MiB,cpu")
    fit = fit_gguf(model, devices, OPTIONS, (1, 0))
    assert fit.layers == (1, 4) and fit.plan.n_copies > 1
    assert_fit_is_llama_cpps(model, devices, OPTIONS, fit)
    assert fit.plan.device_bytes("RPC1") > fit.targets[1]
    assert fit.plan.warnings == [f"RPC1 needs {fit.plan.device_bytes('RPC1') / MIB:.2f} MiB "
                                 "but has 5.00 MiB"]


def test_options_that_fit_are_kept(model):
    fit = fit_gguf(model, parse_devices("rpc:1040MiB,rpc:1040MiB,cpu"), OPTIONS)
    assert not fit.changed and fit.options == OPTIONS and fit.n_plans == 2
    assert fit.layers == (3, 2) and fit.args() == "-c 512 -ngl -1"


def test_c_step_is_llama_cpps_integer_arithmetic():
    assert _c_step(10, 5, 20) == 2            # 50 / 20, truncated
    assert _c_step(10, 1, 20) == 1            # at least one layer
    assert _c_step(10, 19, 20) == 9           # at most delta - 1
    assert _c_step(10, -5, 20) == 9           # -2 stored in a uint32: huge, then delta - 1


@pytest.mark.parametrize("options, match", [
    (dict(n_gpu_layers=5), "-ngl 5 is set"),
    (dict(tensor_split=(1.0, 1.0)), "--tensor-split is set"),
    (dict(tensor_overrides=cpu_moe_overrides()), "tensor overrides"),
    (dict(split_mode="none"), "--split-mode none"),
])
def test_fit_refusals(model, options, match):
    with pytest.raises((ArgumentError, ModelError), match=match):
        fit_gguf(model, parse_devices("rpc:3MiB,rpc:3MiB,cpu"),
                 dataclasses.replace(OPTIONS, **options), (0,))


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A file trained for 4096 tokens: 6 MiB more on the devices per 1024 cells."""
    return write_model(tmp_path_factory.mktemp("fit") / "long.gguf", "llama", n_ctx=4096)


@pytest.mark.parametrize("spec, n_ctx", [
    ("rpc:20MiB,cpu", 3072), ("rpc:10MiB,cpu", 1280), ("rpc:5MiB,cpu", 512)])
def test_fit_shrinks_the_files_context_on_one_device(long_model, spec, n_ctx):
    """-c 0 with one device: the context shrinks, all layers stay; the memory being linear
    in the context here, 256 cells more would not fit."""
    devices = parse_devices(spec)
    fit = fit_gguf(long_model, devices, dataclasses.replace(OPTIONS, n_ctx=0), (0,), 512)
    assert fit.args() == f"-c {n_ctx} -ngl -1" and fit.changed and fit.n_plans == 3
    assert fit.plan.device_bytes("RPC0") <= fit.targets[0]
    if n_ctx > 512:
        more = plan_gguf(long_model, devices, dataclasses.replace(OPTIONS, n_ctx=n_ctx + 256))
        assert more.device_bytes("RPC0") > fit.targets[0]


@pytest.mark.parametrize("spec, fit_ctx, args", [
    ("rpc:3MiB,cpu", 512, "-c 512 -ngl 1"),             # the least context, then the layers
    ("rpc:10MiB,cpu", 4096, "-c 4096 -ngl 1"),          # no shrinking below --fit-ctx
    ("rpc:12MiB,rpc:12MiB,cpu", 512, "-c 1024 -ngl 5 -ts 0,5"),   # shrunk, then the layers
])
def test_fit_fills_the_layers_at_the_shrunk_context(long_model, spec, fit_ctx, args):
    devices = parse_devices(spec)
    fit = fit_gguf(long_model, devices, dataclasses.replace(OPTIONS, n_ctx=0), (0,), fit_ctx)
    assert fit.args() == args
    at = dataclasses.replace(OPTIONS, n_ctx=fit.options.n_ctx)
    assert_fit_is_llama_cpps(long_model, devices, at, fit)


def test_fit_needs_sizes_and_margins_per_device(model, tmp_path):
    with pytest.raises(ArgumentError, match="RPC1 has none"):
        fit_gguf(model, parse_devices("rpc:3MiB,rpc,cpu"), OPTIONS)
    with pytest.raises(ArgumentError, match="2 values for 3 devices"):
        margins_of((1, 2), 3)
    with pytest.raises(ArgumentError, match=">= 0"):
        margins_of((-1,), 3)
    with pytest.raises(ArgumentError, match="--fit-ctx must be a positive integer"):
        fit_gguf(model, parse_devices("rpc:3MiB,cpu"), OPTIONS, (0,), 0)
    assert margins_of((1, 2), 2) == [MIB, 2 * MIB]


def test_command_line(model, capsys):
    from ggml_py.tools.commands import main
    argv = ["plan", model, "--device", "rpc:4MiB,rpc:5MiB", "-c", "512", "-b", "256",
            "-ub", "256", "-fa", "off", "--fit", "on", "--fit-target", "0,1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("fit: -c 512 -ngl 4 -ts 2,2\n  RPC0       2 layers")
    assert ("placement: layers 0..0 CPU, layers 1..2 RPC0, layers 3..3 RPC1, output RPC1"
            in out)
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fit"]["args"] == "-c 512 -ngl 4 -ts 2,2"
    assert [d["layers"] for d in report["fit"]["devices"]] == [2, 2]
    assert report["layers"] == ["CPU", "RPC0", "RPC0", "RPC1"]


def test_command_line_shrinks_the_context(long_model, capsys):
    from ggml_py.tools.commands import main
    assert main(["plan", long_model, "--device", "rpc:20MiB", "-c", "0", "-b", "256", "-ub",
                 "256", "-fa", "off", "--fit", "on", "--fit-target", "0", "--fit-ctx",
                 "512"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fit: -c 3072 -ngl -1\n  RPC0       5 layers")
    assert "n_ctx 3072" in out


def test_70b_shaped_fit(tmp_path):
    """A Llama-3-70B-shaped file in q5_K (which ggml-cpu does not repack on x86), fitted in
    a few plans."""
    from ggml_py.models.config import arch_config
    from ggml_py.models.gguf import save_gguf_layout
    path = str(tmp_path / "70b.gguf")
    save_gguf_layout(arch_config("llama", **{**LLAMA_70B, "wtype": "q5_K"}), path)
    devices = parse_devices("rpc:16GiB,rpc:24GiB,cpu")
    options = PlanOptions(n_ctx=8192)
    t0 = time.perf_counter()
    fit = fit_gguf(path, devices, options)
    seconds = time.perf_counter() - t0
    assert fit.n_plans <= 12 and seconds < 10, (fit.n_plans, seconds)
    assert_fit_is_llama_cpps(path, devices, options, fit)
    assert fit.layers[1] > fit.layers[0] > 0 and sum(fit.layers) < 81
    assert all(fit.plan.device_bytes(d.name) <= t for d, t in zip(devices, fit.targets))


@pytest.mark.parametrize("extra, message", [
    (["--fit", "on", "--device", "rpc"], "--fit needs each device's memory"),
    (["--fit", "on", "--fit-target", "1,x"], "'x' is not a whole number"),
    (["--fit", "on", "--fit-target", "1,2", "--device", "rpc:1GiB"], "2 values for 1 devices"),
    (["--fit", "on", "--device", "rpc:1MiB", "-ngl", "4"], "-ngl 4 is set"),
    (["--fit", "maybe"], "invalid choice: 'maybe'"),
    (["--fit", "on", "--fit-ctx", "0"], "must be positive"),
])
def test_command_line_refusals(model, capsys, extra, message):
    from ggml_py.tools.commands import main
    assert main(["plan", model, *extra]) == 2
    assert message in capsys.readouterr().err


def test_case_file_refuses_fit(capsys):
    from conftest import shared_path
    from ggml_py.tools.commands import main
    case = str(shared_path() / "cases" / "mlp-cpu-only.case.json")
    assert main(["plan", case, "--fit", "on"]) == 2
    assert "--fit applies to a model file" in capsys.readouterr().err
