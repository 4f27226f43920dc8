"""The scheduler's compute runtime (ggml_py.runtime) with the numpy device.

Whole models of shared/ops/models run through a Scheduler over [NUMPY_DEV, CPU] in
several split layouts and must give ggml's reference results; the MoE expert copies,
the eval callback, async copies and events, kernel errors and repeated computes are
checked on the way.
"""

import json

import numpy as np
import pytest

from conftest import shared_path
from ggml_py import ops, opscheck
from ggml_py._core import Context, Graph
from ggml_py.alloc import TensorAllocator
from ggml_py.backends import cpu
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import BackendError
from ggml_py.runtime import ComputeError, Status
from ggml_py.sched import Scheduler


# ---------------------------------------------------------------------------
# models

_MODELS = {}


def load_model(name):
    path = shared_path() / "ops" / "models" / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"model file {path} not found (set GGML_PY_SHARED)")
    if name not in _MODELS:
        _MODELS[name] = json.loads(path.read_text())
    return _MODELS[name]


def alloc_weights(backend, tensors, data):
    """Place `tensors` in one weights buffer of `backend` and upload their data."""
    buft = backend.buffer_type
    align = buft.alignment
    size = sum((buft.get_alloc_size(t) + align - 1) // align * align for t in tensors) + align
    buf = buft.alloc_buffer(size)
    buf.usage = "weights"
    talloc = TensorAllocator(buf)
    for t in tensors:
        talloc.alloc(t)
        backend.set_tensor(t, data[t.name])
    return buf


class Model:
    """A model file built into a graph whose weights live where `place(weight name)`
    says (a backend), its inputs marked INPUT and its output and checkpoints OUTPUT."""

    def __init__(self, spec, backends, place):
        self.spec = spec
        self.ctx = Context(spec["name"])
        self.env = {}
        self.data = {}
        groups = {}
        for w in spec["weights"]:
            t = ops.new_tensor(self.ctx, w["type"], w["ne"], name=w["name"][:63])
            self.env[w["name"]] = t
            self.data[t.name] = opscheck.decode(w["type"], w["ne"], w["data"]).tobytes()
            groups.setdefault(id(place(w["name"])), (place(w["name"]), []))[1].append(t)
        self.buffers = [alloc_weights(b, ts, self.data) for b, ts in groups.values()]
        self.inputs = []
        for s in spec["inputs"]:
            t = ops.new_tensor(self.ctx, s["type"], s["ne"], name=s["name"])
            t.set_input()
            self.env[s["name"]] = t
            self.inputs.append((t, opscheck.decode(s["type"], s["ne"], s["data"]).tobytes()))
        for c in spec["calls"]:
            ins = [None if n is None else self.env[n] for n in c["inputs"]]
            t = opscheck._call(self.ctx, c["call"], ins, c.get("args", {}))
            t.name = c["result"][:63]
            self.env[c["result"]] = t
        self.targets = [spec["output"]] + list(spec.get("checkpoints", []))
        self.graph = Graph(max(64, 4 * len(spec["calls"])))
        for tg in self.targets:
            self.env[tg["name"]].set_output()
            self.graph.build_forward_expand(self.env[tg["name"]])

    def set_inputs(self, sched):
        for t, raw in self.inputs:
            sched.get_tensor_backend(t).set_tensor(t, raw)

    def results(self, sched):
        out = {}
        for tg in self.targets:
            t = self.env[tg["name"]]
            raw = sched.get_tensor_backend(t).get_tensor(t)
            out[tg["name"]] = np.frombuffer(raw, dtype=np.float32).reshape(
                opscheck.decode(tg["type"], tg["ne"], tg["data"]).shape).copy()
        return out

    def check(self, results):
        tol = float(self.spec.get("tolerance", 2e-3))
        for tg in self.targets:
            ref = opscheck.decode(tg["type"], tg["ne"], tg["data"])
            ok, err, msg = opscheck.compare(self.spec.get("compare", "nmse"), tg["type"], ref,
                                            results[tg["name"]], tol)
            assert ok, f"{self.spec['name']} {tg['name']}: nmse {err:.3g} {msg}"


def run(model, sched):
    """alloc_graph, set the inputs, graph_compute; the results."""
    sched.alloc_graph(model.graph)
    model.set_inputs(sched)
    assert sched.graph_compute(model.graph) == Status.SUCCESS
    return model.results(sched)
