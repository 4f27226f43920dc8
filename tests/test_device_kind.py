"""A device kind added from the README's recipe alone ("Add a device kind", in the layout
section), and the slot tables that recipe points to: the README lists every slot of
BACKEND_SLOTS, BUFFER_SLOTS and BUFFER_TYPE_SLOTS with its default, and filled_slots says
which slots a class fills without comparing its methods to the base's."""

import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ggml_py import Context, Graph, Scheduler, backends, ops, tensors_from_arrays
from ggml_py._backend import (BACKEND_SLOTS, BUFFER_SLOTS, BUFFER_TYPE_SLOTS, Backend, Buffer,
                              BufferType, filled_slots)
from ggml_py.backends.cpu import CPUBackend
from ggml_py.errors import ArgumentError, ArgumentTypeError
from ggml_py.tools import demo

README = Path(__file__).resolve().parent.parent / "README.md"

# the package the recipe's step 1 and 2 ask for, as a user would write it
DUMMY_KIND = '''
import numpy as np
from ggml_py._backend import (Backend, BufferType, Buffer, get_buffer, graph_nodes,
                              host_memory, tensor_ndarray)

class DummyBufferType(BufferType):
    def alloc_buffer(self, size):
        memory, base = host_memory(size, self.alignment, "a dummy buffer")
        return Buffer(self, size, base, memory=memory)

def f32(t):
    return tensor_ndarray(t, get_buffer(t).memory, np.float32)

class DummyBackend(Backend):
    def __init__(self):
        super().__init__("DUMMY", DummyBufferType("DUMMY"), device_type="gpu",
                         supports_ops=["NONE", "ADD", "MUL"])

    def graph_compute(self, graph):
        for t in graph_nodes(graph):
            f32(t)[...] = {"ADD": np.add, "MUL": np.multiply}[t.op](f32(t.src[0]), f32(t.src[1]))

def first_dummy():
    return DummyBackend()
'''


def readme_recipe():
    """The recipe's lines: the numbered list after 'Add a device kind'."""
    text = README.read_text()
    start = text.index("**Add a device kind**")
    lines = text[start:].splitlines()[1:]
    return [ln for ln in lines[:next(i for i, ln in enumerate(lines) if not ln.strip())]]


def test_the_recipe_fits_in_five_lines():
    recipe = readme_recipe()
    assert 1 <= len(recipe) <= 5, recipe
    assert all(re.match(r"\d\. ", ln) for ln in recipe)


@pytest.fixture
def dummy_kind(tmp_path, monkeypatch):
    """Steps 1-3 of the recipe: the package, its function for auto, one registry entry."""
    (tmp_path / "dummy_kind").mkdir()
    (tmp_path / "dummy_kind" / "__init__.py").write_text(textwrap.dedent(DUMMY_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    backends.register("dummy", "dummy_kind", "DummyBackend", auto=1, auto_backend="first_dummy")
    for name, rank in (("opencl", 2), ("numpy_device", 3)):
        backends._REGISTRY[name] = backends._REGISTRY[name]._replace(auto=rank)
    yield sys.modules.get("dummy_kind")
    sys.modules.pop("dummy_kind", None)


def test_a_dummy_kind_from_the_recipe_is_seen_by_auto_and_device(dummy_kind):
    assert backends.auto_order() == ["dummy", "opencl", "numpy_device"]
    backend, why = backends.choose_auto()
    assert type(backend).__name__ == "DummyBackend"
    assert why == "dummy (DUMMY), the first of dummy, opencl, numpy_device that works here"
    import argparse
    p = argparse.ArgumentParser()
    demo.add_placement_arguments(p)
    assert p.parse_args(["--device", "dummy"]).device == "dummy"
    [made] = demo.device_backends("dummy")
    assert made.name == "DUMMY" and "dummy" in backends.available(computes=True)


def test_a_dummy_kind_from_the_recipe_computes_its_split_of_a_graph(dummy_kind):
    dev = backends.create("dummy")
    cpu = CPUBackend(n_threads=1)
    ws = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    w = tensors_from_arrays({"w": ws}, dev)["w"]       # a weight in the dummy's memory
    ctx = Context()
    x = ctx.new_tensor(np.float32, (3, 8), name="x").set_input()
    a = ops.add(ctx, x, w)                      # the dummy's: its weight is there
    s = ops.scale(ctx, a, 0.5)                  # the CPU's: the dummy has no SCALE
    y = ops.mul(ctx, s, w).set_output()         # the dummy's again
    graph = Graph(16).build_forward_expand(y)
    sched = Scheduler([dev, cpu])
    xs = np.arange(24, dtype=np.float32).reshape(3, 8) - 7
    out = sched.run(graph, {x: xs}, y)
    assert [sp.backend.name for sp in sched.splits] == ["DUMMY", "CPU", "DUMMY"]
    np.testing.assert_array_equal(out, (xs + ws) * 0.5 * ws)


def test_auto_calls_the_function_the_entry_names_and_register_wants_both_or_neither(dummy_kind):
    assert backends._REGISTRY["dummy"].auto_backend == "first_dummy"    # not a naming rule
    for rank, fn in ((1, ""), (0, "first_dummy")):
        with pytest.raises(ArgumentError, match="auto rank and its auto_backend function"):
            backends.register("half", "dummy_kind", "DummyBackend", auto=rank, auto_backend=fn)
    with pytest.raises(ArgumentTypeError, match="auto_backend must be a string"):
        backends.register("half", "dummy_kind", "DummyBackend", auto=1, auto_backend=len)
    assert "half" not in backends.available()
    backends.register("renamed", "dummy_kind", "DummyBackend", auto=1, auto_backend="nothing")
    for name, rank in (("dummy", 2), ("opencl", 3), ("numpy_device", 4)):
        backends._REGISTRY[name] = backends._REGISTRY[name]._replace(auto=rank)
    backend, why = backends.choose_auto()
    assert type(backend).__name__ == "DummyBackend"
    assert why.startswith("dummy (DUMMY); skipped renamed: ") and "'nothing'" in why


# ---------------------------------------------------------------------------
# the slot tables

def readme_slot_rows():
    """(slot, ggml's slot, what it does, default) of every row of the README's slot tables."""
    rows = []
    for ln in README.read_text().splitlines():
        m = re.match(r"\| `(\w+)` \| (`\w+`|-) \| (.+) \| (.+) \|$", ln)
        if m:
            rows.append((m[1], None if m[2] == "-" else m[2].strip("`"), m[3], m[4]))
    return rows


def test_the_readme_lists_every_slot_with_what_it_does_and_its_default():
    declared = [tuple(s) for s in (*BUFFER_TYPE_SLOTS, *BUFFER_SLOTS, *BACKEND_SLOTS)]
    assert readme_slot_rows() == declared


def test_every_slot_is_on_its_class():
    for cls, table in ((Backend, BACKEND_SLOTS), (Buffer, BUFFER_SLOTS),
                       (BufferType, BUFFER_TYPE_SLOTS)):
        for slot in table:
            assert hasattr(cls, slot.name), (cls, slot.name)


def test_filled_slots_reads_null_slots_and_slot_defaults():
    null = {"init_tensor", "reset", "set_tensor_async"}
    table_answered = {"supports_op", "supports_buft", "offload_op"}
    assert not (null | table_answered | {"set_tensor", "get_alloc_size"}) & (
        filled_slots(Backend) | filled_slots(Buffer) | filled_slots(BufferType))
    assert Buffer.init_tensor is None and Buffer.reset is None and Backend.set_tensor_async is None

    class Picky(Backend):
        def supports_op(self, op):
            return op.op != "SCALE" and super().supports_op(op)

    class Device(Buffer):
        def init_tensor(self, tensor):
            pass

        def set_tensor(self, tensor, data, offset=0):
            pass

    assert filled_slots(Picky) - filled_slots(Backend) == {"supports_op"}
    class Padded(BufferType):
        def get_alloc_size(self, tensor):
            return tensor.nbytes + 64

    assert filled_slots(Device) - filled_slots(Buffer) == {"init_tensor", "set_tensor"}
    assert filled_slots(Padded) - filled_slots(BufferType) == {"get_alloc_size"}
    from ggml_py.backends.numpy_device import NumpyDeviceBackend
    assert "set_tensor_async" in filled_slots(NumpyDeviceBackend)
    assert "supports_op" not in filled_slots(CPUBackend)        # its C table answers
    with pytest.raises(ArgumentTypeError, match="filled_slots"):
        filled_slots(int)
