"""The scheduler's compute runtime (ggml_py.runtime) with the numpy device.

Whole models of shared/ops/models run through a Scheduler over [NUMPY_DEV, CPU] in
several split layouts and must give ggml's reference results; the MoE expert copies,
the eval callback, async copies and events, kernel errors and repeated computes are
checked on the way.
"""

import json
import warnings

import numpy as np
import pytest

from conftest import shared_path
from ggml_py import ops
from ggml_py.tools import opscheck
from ggml_py._core import Context, Graph
from ggml_py.alloc import TensorAllocator
from ggml_py.backends import cpu
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import BackendError
from ggml_py.errors import (ArgumentError, ArgumentTypeError, ComputeError, OutOfRangeError,
                            SchedulerError)
from ggml_py.runtime import Runtime, Split, Status, _ranges
from ggml_py.sched import Scheduler


# ---------------------------------------------------------------------------
# models

_MODELS = {}


def load_model(name):
    path = shared_path() / "ops" / "models" / f"{name}.json"
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


def on_device(dev, prefixes=("",)):
    """place(): weights whose name starts with one of `prefixes` on `dev`, others on the CPU."""
    return lambda cpu_backend: (lambda name: dev if name.startswith(prefixes) else cpu_backend)


_CPU_RESULTS = {}


def cpu_results(name):
    """Results of the model on the CPU alone (one split, no copies)."""
    if name in _CPU_RESULTS:
        return _CPU_RESULTS[name]
    c = CPUBackend()
    m = Model(load_model(name), [c], lambda n: c)
    sched = Scheduler([c])
    _CPU_RESULTS[name] = run(m, sched)
    assert sched.n_splits == 1
    return _CPU_RESULTS[name]


# layout name -> (device kwargs, weights on the device, user assignments (node name prefix))
LAYOUTS = {
    # layer 0 on the device, which cannot ROPE: the splits alternate inside layer 0
    "layer0-no-rope": ({"unsupported_ops": ("ROPE",)}, ("blk.0.",), ()),
    # everything on the device but SOFT_MAX: two device/CPU round trips per layer
    "all-no-softmax": ({"unsupported_ops": ("SOFT_MAX",)}, ("",), ()),
    # every weight on the device: only the inputs and the outputs cross
    "all": ({}, ("",), ()),
    # weights on the CPU, layer 1's nodes assigned to the device: its weights are copied
    "assign-layer1": ({}, (), ("l1.",)),
}


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["llama_2L", "moe_2L"])
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_model_on_device_and_cpu(name, layout, parallel):
    dev_kw, prefixes, assigned = LAYOUTS[layout]
    with NumpyDeviceBackend(**dev_kw) as dev:
        c = CPUBackend()
        m = Model(load_model(name), [dev, c], on_device(dev, prefixes)(c))
        sched = Scheduler([dev, c], parallel=parallel)
        for t in m.graph.nodes:
            if t.name.startswith(assigned or ("\0",)):
                sched.set_tensor_backend(t, dev)
        r = run(m, sched)
        m.check(r)
        # the same kernels on the same data: the CPU alone gives the same bits
        ref = cpu_results(name)
        for k in ref:
            np.testing.assert_array_equal(r[k], ref[k], err_msg=k)
        backends = {s.backend.name for s in sched.splits}
        assert "NUMPY_DEV" in backends and (layout == "all" or "CPU" in backends)
        p = sched.profile
        assert p.bytes_by_pair.get(("CPU", "NUMPY_DEV"), 0) > 0
        assert len(p.splits) == sched.n_splits
        assert dev.stats["graph_computes"] >= sum(s.backend is dev for s in sched.splits)


def test_two_devices_copy_between_queues():
    """Layer 0 on one device, layer 1 on another: the copy between them is an async
    copy from queue to queue (an event of the source device waited for)."""
    with NumpyDeviceBackend("DEV0") as d0, NumpyDeviceBackend("DEV1") as d1:
        c = CPUBackend()
        place = lambda n: d0 if n.startswith("blk.0.") else d1 if n.startswith("blk.1.") else c  # noqa: E731
        m = Model(load_model("llama_2L"), [d0, d1, c], place)
        sched = Scheduler([d0, d1, c], parallel=True)
        m.check(run(m, sched))
        p = sched.profile
        assert p.bytes_by_pair.get(("DEV0", "DEV1"), 0) > 0
        assert d1.stats["async_copies"] > 0
        assert d0.stats["event_records"] > 0


def test_moe_copies_only_used_experts():
    """Expert weights in host memory, MUL_MAT_ID offloaded to the device (op_offload):
    each MUL_MAT_ID split copies only the experts its ids use."""
    spec = load_model("moe_2L")
    with NumpyDeviceBackend(offload_ops=("MUL_MAT_ID",)) as dev:
        c = CPUBackend()
        m = Model(spec, [dev, c], lambda n: c if "_exps" in n else dev)
        sched = Scheduler([dev, c], op_offload=True)
        with warnings.catch_warnings():
            # the kernel dequantises every expert, also those not copied (any bytes)
            warnings.simplefilter("ignore", RuntimeWarning)
            r = run(m, sched)
        m.check(r)
        p = sched.profile
        experts = [m.env[w["name"]] for w in spec["weights"] if "_exps" in w["name"]]
        whole = sum(t.nbytes for t in experts)
        assert len(p.moe_experts_used) == len(experts)
        assert 0 < p.moe_bytes_copied < whole
        assert p.moe_bytes_saved == whole - p.moe_bytes_copied > 0
        # the bytes follow ggml's rule: consecutive experts together, plus up to 512
        # bytes after a range that does not end the tensor
        by_name = {t.name: t for t in experts}
        want = 0
        for tname, used in p.moe_experts_used:
            t = by_name[tname]
            for first, last in _ranges(used):
                want += (last - first + 1) * t.nb[2] + (min(t.nb[2], 512) if last < t.ne[2] - 1 else 0)
        assert p.moe_bytes_copied == want
        assert any(len(used) < 8 for _, used in p.moe_experts_used)
        assert dev.stats["async_sets"] > 0
        # the ids come from the device's own TOP_K: both MUL_MAT_IDs of a layer agree
        used = dict(p.moe_experts_used)
        assert used["blk.0.ffn_up_exps"] == used["blk.0.ffn_gate_exps"] == used["blk.0.ffn_down_exps"]


def test_ranges():
    assert _ranges([0, 1, 2, 5, 7, 8]) == [(0, 2), (5, 5), (7, 8)]
    assert _ranges([3]) == [(3, 3)]
    assert _ranges([]) == []


def _layout0(parallel=False, **dev_kw):
    dev = NumpyDeviceBackend(**({"unsupported_ops": ("ROPE",)} | dev_kw))
    c = CPUBackend()
    m = Model(load_model("llama_2L"), [dev, c], on_device(dev, ("blk.0.",))(c))
    return dev, c, m, Scheduler([dev, c], parallel=parallel)


def test_eval_callback_observes_every_node():
    dev, c, m, sched = _layout0()
    with dev:
        seen = []
        checkpoints = {tg["name"]: tg for tg in m.targets}

        def cb(t, ask):
            if ask:
                return True
            seen.append(t.name)
            if t.name in checkpoints:
                # the node is computed when it is shown
                tg = checkpoints[t.name]
                got = np.frombuffer(sched.get_tensor_backend(t).get_tensor(t), dtype=np.float32)
                ref = opscheck.decode(tg["type"], tg["ne"], tg["data"]).reshape(-1)
                assert opscheck.nmse(ref, got)[0] < 2e-3, t.name
            return True

        sched.set_eval_callback(cb)
        r = run(m, sched)
        m.check(r)
        assert seen == [t.name for t in m.graph.nodes]


def test_eval_callback_batches_unobserved_nodes():
    """Only the asked-for nodes are shown; the nodes between are computed together."""
    dev, c, m, sched = _layout0()
    with dev:
        shown = []
        sched.set_eval_callback(lambda t, ask: t.name.endswith(".out") if ask else
                                shown.append(t.name) or True)
        m.check(run(m, sched))
        assert shown == ["l0.out", "l1.out"]
        dev_splits = [s for s in sched.splits if s.backend is dev]
        assert len(dev_splits) <= dev.stats["graph_computes"] < sum(s.i_end - s.i_start
                                                                   for s in dev_splits)


def test_eval_callback_cancel_aborts_and_scheduler_runs_again():
    dev, c, m, sched = _layout0(parallel=True)
    with dev:
        shown = []

        def cancel_at_l0_out(t, ask):
            if ask:
                return True
            shown.append(t.name)
            return t.name != "l0.out"

        sched.set_eval_callback(cancel_at_l0_out)
        sched.alloc_graph(m.graph)
        m.set_inputs(sched)
        assert sched.graph_compute(m.graph) == Status.ABORTED
        names = [t.name for t in m.graph.nodes]
        assert shown == names[:names.index("l0.out") + 1]
        # the splits after the cancelled one never ran
        assert len(sched.profile.splits) < sched.n_splits
        # again, on the same allocation, without the callback
        sched.set_eval_callback(None)
        assert sched.graph_compute(m.graph) == Status.SUCCESS
        m.check(m.results(sched))
        # and after a reset, split and allocated anew
        sched.reset()
        m.check(run(m, sched))


def test_async_copies_and_events_used_when_parallel():
    dev, c, m, sched = _layout0(parallel=True)
    with dev:
        m.check(run(m, sched))
        p = sched.profile
        assert sched.n_copies > 1
        assert p.n_async_copies > 0 and p.n_sync_copies > 0
        assert p.n_event_records > 0 and p.n_event_waits > 0
        assert dev.stats["event_records"] == p.n_event_records
        assert dev.stats["event_waits"] == p.n_event_waits
        assert sum(s.n_async for s in p.splits) == p.n_async_copies
        assert p.bytes_copied == sum(s.bytes_copied for s in p.splits)


def test_kept_plan_hands_the_runtime_the_same_split_records():
    """The split records a compute runs are made once per plan and copy slot: computes of
    a kept plan run the very same records, the next copy slot (pipeline parallelism) and
    a new split get their own, and every record says what the scheduler's table says."""
    dev, c, m, sched = _layout0(parallel=True)
    with dev:
        core = sched._core

        def records_of_the_table():
            splits = core.get_splits()
            for k, s in enumerate(sched._splits()):
                assert s.backend is sched.backends[s.backend_id]
                assert (s.backend_id, s.i_start, s.i_end) == splits[k][:3]
                assert s.inputs == tuple(splits[k][3]) == sched.splits[k].inputs
                assert s.copies == tuple(core.get_split_copies(k))
            return sched._splits()

        m.check(run(m, sched))
        first = records_of_the_table()
        assert any(s.copies for s in first)
        m.set_inputs(sched)
        assert sched.graph_compute(m.graph) == Status.SUCCESS
        assert sched._splits() is first                 # same plan, same slot: kept
        slot = core.cur_copy
        sched.reset()
        m.check(run(m, sched))                          # the kept plan, next copy slot
        assert sched.n_graph_reuses >= 1 and core.cur_copy != slot
        second = records_of_the_table()
        assert [s.copies for s in second] != [s.copies for s in first]
        sched.reset()
        sched.set_tensor_backend(m.graph.nodes[-1], c)  # a new split
        m.check(run(m, sched))
        assert records_of_the_table() is not second


def test_a_split_table_is_checked_against_the_graph_and_backends_it_runs_on():
    """Split records check their own fields when made; the runtime checks a table against
    the graph and its backends, again when the graph is another or has grown."""
    c = CPUBackend(n_threads=1)
    ctx = Context("table")
    a = ops.new_tensor_1d(ctx, "f32", 4, name="a")
    y = ops.scale(ctx, a, 2.0)
    z = ops.scale(ctx, y, 3.0)
    talloc = TensorAllocator(c.buffer_type.alloc_buffer(256))
    for t in (a, y, z):
        talloc.alloc(t)
    c.set_tensor(a, np.ones(4, np.float32).tobytes())
    g = Graph(16).build_forward_expand(y)
    rt = Runtime([c], 1)
    with pytest.raises(ArgumentError, match="Split.i_end"):
        Split(c, 0, 0, -1)
    with pytest.raises(ArgumentTypeError, match="Split.backend"):
        Split("CPU", 0, 0, 1)
    with pytest.raises(SchedulerError, match="not this runtime's backend 0"):
        rt.compute_splits(g, (Split(CPUBackend(n_threads=1), 0, 0, 1),), 0)
    with pytest.raises(OutOfRangeError, match="backend"):
        rt.compute_splits(g, (Split(c, 1, 0, 1),), 0)
    past_the_end = (Split(c, 0, 0, 2),)
    with pytest.raises(OutOfRangeError, match=r"\[0, 2\) are not in the graph's 1 nodes"):
        rt.compute_splits(g, past_the_end, 0)
    with pytest.raises(ArgumentError, match="copy slot"):
        rt.compute_splits(g, (Split(c, 0, 0, 1),), 1)
    table = (Split(c, 0, 0, 1),)
    assert rt.compute_splits(g, table, 0) == rt.compute_splits(g, table, 0) == Status.SUCCESS
    smaller = Graph(16).build_forward_expand(a)                 # no nodes: checked anew
    with pytest.raises(OutOfRangeError, match="split nodes .* are not in the graph's 0 nodes"):
        rt.compute_splits(smaller, table, 0)
    g.build_forward_expand(z)                                   # grown: checked anew
    assert rt.compute_splits(g, past_the_end, 0) == Status.SUCCESS
    assert np.frombuffer(c.get_tensor(z), np.float32).tolist() == [6.0] * 4


def test_no_events_without_parallel():
    dev, c, m, sched = _layout0(parallel=False)
    with dev:
        m.check(run(m, sched))
        p = sched.profile
        assert p.n_event_records == p.n_event_waits == p.n_event_syncs == 0
        assert p.n_backend_syncs > 0
        assert p.n_async_copies > 0     # async copies need no events


@pytest.mark.parametrize("where", ["device", "cpu"])
def test_failing_kernel_names_node_and_scheduler_recovers(where, monkeypatch):
    # the device cannot ROPE in this layout, so ROPE fails on the CPU; RMS_NORM of layer 0
    # runs on the device
    op, node, backend = ("RMS_NORM", "l0.attn_norm_raw", "NUMPY_DEV") if where == "device" \
        else ("ROPE", "l0.Kcur_rope", "CPU")
    dev, c, m, sched = _layout0()
    with dev:
        def broken(t):
            raise ValueError("broken kernel")
        monkeypatch.setitem(cpu.KERNELS, op, broken)
        sched.alloc_graph(m.graph)
        m.set_inputs(sched)
        with pytest.raises(ComputeError, match=f"backend {backend}: node '{node}'") as e:
            sched.graph_compute(m.graph)
        assert e.value.node == node and e.value.backend == backend
        monkeypatch.undo()
        # the same allocation computes again
        assert sched.graph_compute(m.graph) == Status.SUCCESS
        m.check(m.results(sched))
        sched.reset()
        m.check(run(m, sched))


def test_repeated_compute_reuses_allocation():
    dev, c, m, sched = _layout0(parallel=True)
    with dev:
        first = run(m, sched)
        n = sched.n_reallocs
        copies = []
        for _ in range(2):      # without reset: the same split and allocation
            assert sched.graph_compute(m.graph) == Status.SUCCESS
            again = m.results(sched)
            assert all(np.array_equal(first[k], again[k]) for k in first)
        for _ in range(5):      # reset: split again, on the next copy slot
            sched.reset()
            again = run(m, sched)
            copies.append(sched._core.cur_copy)
            assert all(np.array_equal(first[k], again[k]) for k in first)
        # the async form leaves the device's work queued until synchronize
        sched.reset()
        sched.alloc_graph(m.graph)
        m.set_inputs(sched)
        assert sched.graph_compute_async(m.graph) == Status.SUCCESS
        sched.synchronize()
        again = m.results(sched)
        assert all(np.array_equal(first[k], again[k]) for k in first)
        copies.append(sched._core.cur_copy)
        assert sched.n_reallocs == n
        assert copies == [1, 2, 3, 0, 1, 2]
        assert sched.profile.n_computes == 9


def test_backend_failure_status():
    """A backend whose graph_compute returns False: graph_compute returns FAILED."""
    dev, c, m, sched = _layout0()
    with dev:
        dev.graph_compute = lambda graph: False
        sched.alloc_graph(m.graph)
        m.set_inputs(sched)
        assert sched.graph_compute(m.graph) == Status.FAILED


def test_alloc_failed_status():
    dev, c, m, sched = _layout0()
    with dev:
        def no_memory(size):
            from ggml_py.errors import AllocationError
            raise AllocationError(f"no {size} bytes")
        dev.buffer_type.alloc_buffer = no_memory
        assert sched.graph_compute(m.graph) == Status.ALLOC_FAILED
        assert not sched.is_alloc


# ---------------------------------------------------------------------------
# the numpy device on its own

def test_device_memory_is_not_host_memory():
    with NumpyDeviceBackend() as dev:
        c = CPUBackend()
        assert not dev.buffer_type.is_host and dev.device_type == "gpu"
        assert not c.supports_buft(dev.buffer_type)
        assert not dev.supports_buft(c.buffer_type)
        ctx = Context("t")
        t = ops.new_tensor(ctx, "f32", [8, 2])
        buf = alloc_weights(dev, [t], {t.name: np.arange(16, dtype=np.float32).tobytes()})
        assert buf.usage == "weights"       # (the test holds the buffer: tensors do not)
        assert t.data_address % dev.buffer_type.alignment == 0
        with pytest.raises(BackendError, match="no host memory"):
            cpu.tensor_array(t)
        assert np.array_equal(np.frombuffer(dev.get_tensor(t), np.float32), np.arange(16))
        with pytest.raises(BackendError):
            c.get_tensor(t)


def test_device_runs_asynchronously_and_events_order_queues():
    with NumpyDeviceBackend() as dev:
        ctx = Context("t")
        a = ops.new_tensor(ctx, "f32", [4])
        b = ctx.new_op("SQR", [a], "f32", [4], name="b")
        buf = alloc_weights(dev, [a, b], {a.name: np.full(4, 3, np.float32).tobytes(),
                                          b.name: np.zeros(4, np.float32).tobytes()})
        assert buf.usage == "weights"
        gate = dev.event_new()
        generation = gate._recorded = 1     # recorded, reached only when the test says
        dev.event_wait(gate)                # the queue stops here
        assert dev.graph_compute(Graph.from_lists([b], [a])) is True    # returns at once
        done = dev.event_new()
        dev.event_record(done)
        assert not done.reached
        gate._reach(generation)
        dev.event_synchronize(done)
        assert done.reached
        assert np.array_equal(np.frombuffer(dev.get_tensor(b), np.float32), np.full(4, 9))


def test_device_error_raised_on_synchronize_then_cleared(monkeypatch):
    with NumpyDeviceBackend() as dev:
        ctx = Context("t")
        a = ops.new_tensor(ctx, "f32", [4])
        b = ctx.new_op("SQR", [a], "f32", [4], name="sq")
        buf = alloc_weights(dev, [a, b], {a.name: bytes(16), b.name: bytes(16)})
        assert buf.usage == "weights"
        monkeypatch.setitem(cpu.KERNELS, "SQR", lambda t: 1 / 0)
        dev.graph_compute(Graph.from_lists([b], [a]))
        with pytest.raises(ComputeError, match="node 'sq'"):
            dev.synchronize()
        dev.synchronize()       # the error is reported once


def test_device_close_stops_thread():
    from ggml_py.backends import get_backend_class
    dev = get_backend_class("numpy_device")("DEVX")
    thread = dev._queue.thread
    assert thread.is_alive() and thread.daemon
    dev.close()
    assert not thread.is_alive()
    with pytest.raises(BackendError, match="closed"):
        dev.graph_compute(Graph.from_lists([], []))
