"""`--fit` held to llama.cpp's own `llama-fit-params` (tools/fit-params, common/fit.cpp of the
llama.cpp that llama-cpp-python 0.3.36 vendors, built against its libraries by
.ci/install-llama-fit-params).

Both see the same devices: three of llama.cpp's protocol-7 RPC servers on localhost, each
reporting the host's physical memory as free. --fit-target's margin carves each device's
budget out of it: `budget` MiB (plus the part of a MiB the host's memory has beyond whole
MiB). llama-fit-params prints `-c N -ngl N [-ts ...] [-ot "..."]`, which must be exactly what
ggml_py's fit prints for `--device rpc:HOST:PORT,...` with the same margin. The files hold
tensor infos only (llama.cpp's fit loads without allocating, and so reads no weight); the
budgets are where the answer is the same over the whole MiB, so the answers are also written
down here. These tests skip without llama-fit-params unless GGML_PY_REQUIRE_LLAMA_CPP=1.
"""

import os
import re
import shutil
import subprocess
import sysconfig

import pytest
from conftest import require_ggml_rpc
from test_plan_gguf import SHAPE

from ggml_py.errors import ModelError
from ggml_py.models.config import arch_config
from ggml_py.models.devices import parse_devices
from ggml_py.models.fit import fit_gguf
from ggml_py.models.gguf import save_gguf_layout
from ggml_py.models.model_plan import PlanOptions

pytest.importorskip("gguf")

MIB = 1 << 20
# 6 layers of about 4 MiB (f16): each MiB of budget is a clear step
WIDE = dict(SHAPE, n_embd=512, n_head=8, n_head_kv=2, n_layer=6, n_ff=1536)
MODELS = {"llama": ("llama", {}), "qwen3moe": ("qwen3moe", {"n_ff_exp": 512}),
          # trained for 16384 tokens: -c 0's context is worth shrinking
          "llama-long": ("llama", {"n_ctx": 16384}),
          "qwen3moe-long": ("qwen3moe", {"n_ff_exp": 512, "n_ctx": 16384})}
FIT_CTX = 512           # --fit-ctx of the -c 0 cases

# llama-fit-params' -ot rules for a partial layer: what of its FFN leaves the device
PART = {"attn": r"\.ffn_(gate|up|gate_up|down).*", "up": r"\.ffn_(gate|gate_up|down).*",
        "gate": r"\.ffn_down.*", "moe": r"\.ffn_(up|down|gate_up|gate)_(ch|)exps"}


def ot(*rules):
    """-ot "RULE,..." of (layer, PART key, device) rules."""
    return ' -ot "' + ",".join(rf"blk\.{il}{PART[part]}={dev}" for il, part, dev in rules) + '"'


def experts_on_cpu(*layers):
    return [(il, "moe", "CPU") for il in layers]


# (model, devices, budget MiB per device, -c, llama-fit-params' answer)
CASES = [
    # dense: -ngl from 0 (not even the output layer) to all (as given), filled back to front
    ("llama", 1, 0, 512, "-c 512 -ngl 0"),
    ("llama", 1, 20, 512, "-c 512 -ngl 3"),
    ("llama", 1, 48, 512, "-c 512 -ngl -1"),
    ("llama", 2, 4, 512, "-c 512 -ngl 1 -ts 0,1"),
    ("llama", 2, 16, 512, "-c 512 -ngl 3 -ts 1,2"),
    ("llama", 2, 28, 512, "-c 512 -ngl 6 -ts 2,4"),
    ("llama", 3, 20, 512, "-c 512 -ngl 6 -ts 1,2,3"),
    ("llama", 3, 28, 512, "-c 512 -ngl 7 -ts 1,2,4"),
    # experts: partial layers (experts on the CPU), then whole ones front to back, and one
    # more partial layer keeping attention (+ up, + gate) with the rest on the next device
    ("qwen3moe", 1, 24, 512, "-c 512 -ngl 4" + ot((4, "attn", "CPU"), *experts_on_cpu(5, 6))),
    ("qwen3moe", 2, 28, 512, "-c 512 -ngl 7 -ts 1,6" + ot((2, "attn", "CPU"),
                                                           *experts_on_cpu(3, 4, 5, 6))),
    ("qwen3moe", 2, 40, 512, "-c 512 -ngl 7 -ts 3,4" + ot((2, "up", "RPC1"), (4, "gate", "CPU"),
                                                           *experts_on_cpu(5, 6))),
    ("qwen3moe", 2, 64, 512, "-c 512 -ngl 7 -ts 5,2" + ot((4, "attn", "RPC1"))),
    ("qwen3moe", 3, 24, 512, "-c 512 -ngl 7 -ts 2,1,4" + ot((1, "attn", "RPC1"),
                                                             *experts_on_cpu(2, 4, 5, 6))),
    ("qwen3moe", 3, 32, 512, "-c 512 -ngl 7 -ts 2,2,3" + ot((1, "gate", "RPC1"), (3, "up", "RPC2"),
                                                             (5, "attn", "CPU"),
                                                             *experts_on_cpu(6))),
    ("qwen3moe", 3, 40, 512, "-c 512 -ngl 7 -ts 3,2,2" + ot((2, "up", "RPC1"),
                                                             (4, "gate", "RPC2"))),
    # -c 0: the file's 16384 shrinks (to --fit-ctx 512 at least) before the layers are fitted
    ("llama-long", 1, 32, 0, "-c 512 -ngl 5"),
    ("llama-long", 1, 48, 0, "-c 768 -ngl -1"),
    ("llama-long", 2, 96, 0, "-c 5120 -ngl 7 -ts 1,6"),
    ("llama-long", 3, 48, 0, "-c 2048 -ngl 7 -ts 0,2,5"),
    ("qwen3moe-long", 1, 128, 0, "-c 3840 -ngl -1"),
    ("qwen3moe-long", 2, 64, 0, "-c 1024 -ngl 7 -ts 4,3" + ot((3, "gate", "RPC1"))),
    # the last device keeps the output layer alone, and llama.cpp's step 4 takes a partial
    # layer from it (which it does not have): its unsigned counts wrap, the third device
    # ends with no layer, and a rule names layer 6, which the model lacks
    ("qwen3moe-long", 3, 96, 0, "-c 4608 -ngl 7 -ts 4,3" + ot((3, "attn", "RPC1"),
                                                               (6, "gate", "RPC2"))),
]


def fit_params_binary():
    """llama-fit-params: $GGML_PY_LLAMA_FIT_PARAMS, else on the PATH, else beside this
    Python (where .ci/install-llama-fit-params puts it)."""
    found = (os.environ.get("GGML_PY_LLAMA_FIT_PARAMS") or shutil.which("llama-fit-params")
             or shutil.which("llama-fit-params", path=sysconfig.get_path("scripts")))
    if found:
        return found
    if os.environ.get("GGML_PY_REQUIRE_LLAMA_CPP") == "1":
        pytest.fail("GGML_PY_REQUIRE_LLAMA_CPP=1 but llama-fit-params is not installed "
                    "(.ci/install-llama-fit-params builds it)", pytrace=False)
    pytest.skip("llama-fit-params is not installed (.ci/install-llama-fit-params)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def fit_params():
    return fit_params_binary()


@pytest.fixture(scope="module")
def servers():
    """Three of llama.cpp's own RPC servers (protocol 7) on localhost."""
    require_ggml_rpc(7)
    from ggml_py.rpc_server import start_server
    started = []
    try:
        for _ in range(3):
            started.append(start_server(threads=1, protocol=7))
        yield [f"{s.host}:{s.port}" for s in started]
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit-models")
    paths = {}
    for name, (arch, extra) in MODELS.items():
        paths[name] = str(root / f"{name}.gguf")
        save_gguf_layout(arch_config(arch, **{**WIDE, **extra}, wtype="f16"), paths[name])
    return paths


def llama_fit_params(binary, path, endpoints, n_ctx, margin_mib):
    """What llama-fit-params prints, its RPC buffer types (RPC0[HOST:PORT], each server's
    first device) named as the devices are (RPC<i>, the i-th server); None where it fails."""
    r = subprocess.run([binary, "-m", path, "--rpc", ",".join(endpoints), "-c", str(n_ctx),
                        "--fit-ctx", str(FIT_CTX), "-b", "256", "-ub", "256", "-fa", "off",
                        "--fit-target", str(margin_mib)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        assert "failed to fit" in r.stderr, r.stderr[-3000:]
        return None
    index = {ep: i for i, ep in enumerate(endpoints)}
    return re.sub(r"RPC0\[([^\]]+)\]", lambda m: f"RPC{index[m[1]]}", r.stdout.strip())


def ggml_py_fit(path, endpoints, n_ctx, margin_mib):
    devices = parse_devices(",".join(f"rpc:{ep}" for ep in endpoints) + ",cpu")
    options = PlanOptions(n_ctx=n_ctx, n_batch=256, n_ubatch=256, flash_attn="off")
    return fit_gguf(path, devices, options, (margin_mib,), FIT_CTX)


def margin_for(endpoints, budget_mib):
    """The --fit-target leaving `budget_mib` MiB (and the host's odd part of one) free."""
    from ggml_py.models.devices.rpc import free_memory
    free = free_memory(endpoints[0])[0]
    return free // MIB - budget_mib


@pytest.mark.parametrize("model, n_devices, budget, n_ctx, answer", CASES,
                         ids=[f"{c[0]}-{c[1]}dev-{c[2]}MiB-c{c[3]}" for c in CASES])
def test_fit_is_llama_fit_params(fit_params, servers, models, model, n_devices, budget,
                                 n_ctx, answer):
    endpoints = servers[:n_devices]
    margin = margin_for(endpoints, budget)
    theirs = llama_fit_params(fit_params, models[model], endpoints, n_ctx, margin)
    ours = ggml_py_fit(models[model], endpoints, n_ctx, margin)
    print(theirs, ours.text(), sep="\n")
    assert ours.args() == theirs == answer
