"""Placing a model over RPC devices the way llama.cpp does (-ngl, --tensor-split, --rpc),
endpoint lists, and plans for simulated RPC devices. No server needed."""

import json

import pytest
from conftest import shared_path

from ggml_py.backends.rpc._protocol import parse_endpoint
from ggml_py.backends.rpc import parse_endpoints
from ggml_py.errors import CaseFormatError
from ggml_py.models.placement import split_layers


class Dev:
    def __init__(self, name, free=None):
        self.name = name
        self.free = free

    def device_memory(self):
        if self.free is None:
            raise AttributeError("no memory report")
        return self.free, self.free

    def __repr__(self):
        return self.name


D0, D1, CPU = Dev("d0"), Dev("d1"), Dev("cpu")


def names(layers, out):
    return [b.name for b in layers], out.name


@pytest.mark.parametrize("n_gpu,split,want", [
    # every layer and the output offloaded, halves: llama.cpp's upper_bound over the
    # cumulative shares of n_layer + 1 offloaded layers
    (None, [1, 1], (["d0", "d0", "d0", "d1"], "d1")),
    (5, [1, 1], (["d0", "d0", "d0", "d1"], "d1")),
    # -ngl counts the output layer as the last of n_layer + 1 (llama.cpp 0.3.36's
    # load_tensors): 2 offloads layer 3 and the output, 4 layers 1..3 and the output
    (2, [1, 1], (["cpu", "cpu", "cpu", "d0"], "d1")),
    (4, [1, 1], (["cpu", "d0", "d0", "d1"], "d1")),
    (-1, [1, 1], (["d0", "d0", "d0", "d1"], "d1")),
    (0, [1, 1], (["cpu"] * 4, "cpu")),
    (None, [3, 1], (["d0", "d0", "d0", "d0"], "d1")),
    (None, [0, 1], (["d1"] * 4, "d1")),
])
def test_split_layers_as_llama_cpp(n_gpu, split, want):
    assert names(*split_layers(4, [D0, D1], CPU, n_gpu, split)) == want


def test_split_layers_defaults():
    # shares from the devices' free memory ...
    assert names(*split_layers(4, [Dev("a", 300), Dev("b", 100)], CPU)) == (["a"] * 4, "b")
    # ... or equal when a device reports none
    assert names(*split_layers(4, [D0, D1], CPU)) == (["d0", "d0", "d0", "d1"], "d1")
    assert names(*split_layers(3, [], CPU)) == (["cpu"] * 3, "cpu")
    for bad in ([1], [1, -1], [0, 0]):
        with pytest.raises(ValueError, match="tensor_split"):
            split_layers(4, [D0, D1], CPU, None, bad)


def test_endpoints():
    assert parse_endpoints(" a:1, b.example:50052,") == ["a:1", "b.example:50052"]
    assert parse_endpoints(["h:2"]) == ["h:2"]
    assert parse_endpoint("[::1]:50052") == ("::1", 50052)
    assert parse_endpoints("[::1]:7,h:1") == ["[::1]:7", "h:1"]
    for bad in ("", ",", "a", "a:0", "a:x", "a:1,a:1"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


# ---------------------------------------------------------------------------
# plans for RPC devices, simulated (no server)

def _gpu_unsupported_case(**gpu):
    with open(shared_path() / "cases" / "llama-2L-gpu-unsupported.case.json") as f:
        d = json.load(f)
    d["backends"][0].update(gpu)
    return d


def test_simulated_rpc_device_plans_like_ggml():
    """A case's device that says supports_ops "rpc-cpu-server" plans by the rule of a ggml
    RPC server on a CPU: every op of this llama is one it runs in f32, so with ROPE and
    SOFT_MAX kept local the plan is ggml's own for the case, and the entry writes back
    as it was read."""
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import plan_case
    d = _gpu_unsupported_case(supports_ops="rpc-cpu-server")
    case = load_case(d)
    assert case.to_dict()["backends"][0] == d["backends"][0]
    _, plan = plan_case(case)
    with open(shared_path() / "cases" / "llama-2L-gpu-unsupported.plan.json") as f:
        golden = json.load(f)
    ours = plan.to_dict()
    for key in ("n_splits", "splits", "node_backends", "leaf_backends", "node_srcs"):
        assert ours[key] == golden[key], key


def test_simulated_rpc_device_follows_the_server_rule():
    """Without the list, ROPE and SOFT_MAX go to the device too; a rule the server refuses
    (an op outside its table, here through unsupported_ops) stays on the CPU."""
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import plan_case
    sched, _ = plan_case(load_case(_gpu_unsupported_case(supports_ops="rpc-cpu-server",
                                                         unsupported_ops=[])))
    assert sched.n_splits == 2          # the inputs on the CPU, then everything on GPU0
    with pytest.raises(CaseFormatError, match="supports_ops"):
        load_case(_gpu_unsupported_case(supports_ops="rpc-gpu-server"))
