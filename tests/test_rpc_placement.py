"""Placing a model over RPC devices the way llama.cpp does (-ngl, --tensor-split, --rpc),
and endpoint lists. Plain functions: no server needed."""

import pytest

from ggml_py._rpc import parse_endpoint
from ggml_py.backends.rpc import parse_endpoints
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
    # the last two layers offloaded, the output stays on the CPU
    (2, [1, 1], (["cpu", "cpu", "d0", "d1"], "cpu")),
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
