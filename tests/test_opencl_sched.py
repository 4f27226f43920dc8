"""Whole models through the scheduler with OpenCL + CPU: full and partial offload,
parallel on and off, against ggml's reference and the CPU-only logits.

Skipped without an OpenCL device, unless GGML_PY_REQUIRE_OPENCL=1 (CI with PoCL)."""

import numpy as np
import pytest

from ggml_py.backends import opencl
from ggml_py.backends.cpu import CPUBackend
from ggml_py.sched import Scheduler
from conftest import require_opencl
from test_runtime import Model, cpu_results, load_model, on_device, run

require_opencl()

# layout -> weights on the device (name prefixes)
OFFLOAD = {"full": ("",), "partial": ("blk.0.",)}


@pytest.fixture(scope="module")
def ocl():
    return opencl.OpenCLBackend()


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("offload", list(OFFLOAD))
@pytest.mark.parametrize("name", ["llama_2L", "moe_2L"])
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_model_on_opencl_and_cpu(ocl, name, offload, parallel):
    c = CPUBackend()
    m = Model(load_model(name), [ocl, c], on_device(ocl, OFFLOAD[offload])(c))
    sched = Scheduler([ocl, c], parallel=parallel)
    r = run(m, sched)
    m.check(r)                                  # ggml's reference, the model's tolerance
    # OpenCL keeps src1 of q8_0 products in f32 where ggml's CPU quantises it: ~1e-5
    ref = cpu_results(name)
    for k in ref:
        err = np.sum((r[k] - ref[k]) ** 2) / np.sum(ref[k] ** 2)
        assert err < 1e-4, f"{k}: NMSE {err:.3g} against CPU-only"
    names = {s.backend.name for s in sched.splits}
    assert ocl.name in names
    if offload == "partial":
        assert "CPU" in names                   # the layers left on the host
    else:
        assert names == {ocl.name}              # every op of both models (TOP_K too) runs there
    assert sched.profile.bytes_by_pair.get(("CPU", ocl.name), 0) > 0
