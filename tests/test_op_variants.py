"""ggml_py's kernels against ggml's own on op variants that no reference file holds.

Each op case of tests/data/ops is varied (op_variants.py: other shapes, arguments and
data), ggml 0.10.1 computes each variant with its CPU kernels on an RPC server, and
each of ggml_py's executing backends (the CPU, the numpy device, OpenCL) must match
that under the case's comparison rule. The reference files fix one shape and one set
of parameters per case; this covers the others the held-out cases may use.
GGML_PY_VARIANT_SEED=S draws another set (for exploring).
"""

import os
import zlib

import numpy as np
import pytest

from conftest import ops_dir, require_ggml_rpc, require_opencl
from op_variants import variants, with_reference
from ggml_py.backends.rpc import RPCBackend
from ggml_py.tools import opscheck

require_ggml_rpc()

VARIANTS_PER_CASE = 12
OP_FILES = sorted(p.name for p in ops_dir().glob("*.json"))


@pytest.fixture(scope="module")
def ggml_cpu():
    """ggml 0.10.1's CPU kernels (a protocol 4 server): ggml_py's reference."""
    from ggml_py.rpc_server import start_server
    with start_server(threads=1) as server:
        yield RPCBackend(server.endpoint)


@pytest.fixture(scope="module", params=["cpu", "numpy_device", "opencl"])
def backend(request):
    if request.param == "opencl":
        require_opencl()
    return opscheck.make_backend(request.param)


@pytest.mark.parametrize("fname", OP_FILES)
def test_op_variants_match_ggml(ggml_cpu, backend, fname):
    seed = zlib.crc32(fname.encode()) + int(os.environ.get("GGML_PY_VARIANT_SEED", "0"))
    rng = np.random.default_rng(seed)
    bad, made, compared = [], 0, 0
    for _, case in opscheck.load_cases(str(ops_dir() / fname)):
        for k, v in enumerate(variants(case, rng, VARIANTS_PER_CASE)):
            v["name"] = f"{case['name']}~{k}"
            made += 1
            ref = with_reference(v, case, ggml_cpu)
            if ref is None:
                continue            # shapes or arguments the op (ggml's and ours) refuses
            compared += 1
            res = opscheck.run_case(ref, backend)
            if not res["passed"]:
                shapes = [s and s["ne"] for s in v["inputs"]]
                bad.append(f"{v['name']} args {v['args']} inputs {shapes}: "
                           f"{res['message'] or 'nmse'} err={res['error']}")
    assert not bad, f"seed {seed}:\n" + "\n".join(bad)
    assert compared >= 0.5 * made, f"only {compared} of {made} variants could be built"


def test_variants_vary_shapes_arguments_and_data():
    """The generator is not idle: over the files, most variants change the data, and
    many the shapes or the arguments, and a variant keeps the case's op."""
    rng = np.random.default_rng(0)
    shaped = moved = redrawn = total = 0
    for fname in OP_FILES:
        for _, case in opscheck.load_cases(str(ops_dir() / fname)):
            for v in variants(case, rng, 4):
                total += 1
                assert v["call"] == case["call"] and "output" not in v
                pairs = [(a, b) for a, b in zip(v["inputs"], case["inputs"]) if a and b]
                shaped += any(a["ne"] != b["ne"] for a, b in pairs)
                redrawn += any(a["data"] != b["data"] for a, b in pairs)
                moved += v["args"] != case.get("args", {})
    assert redrawn > 0.7 * total and shaped > 0.4 * total and moved > 0.2 * total, \
        (total, shaped, moved, redrawn)
