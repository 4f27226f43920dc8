"""Misuse of the public API: never a crash, never an exception but a GgmlPyError
(or Python's own TypeError for None / a wrong type in a typed parameter).

The sweeps run in a subprocess, so that a segmentation fault is a failed test that
names the call, not a dead test run."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import ggml_py as gp
from ggml_py import ops
from ggml_py.backends.cpu import CPUBackend
from ggml_py.errors import (ArgumentError, ArgumentTypeError, BackendError, GgmlPyError,
                            GraphError)
from ggml_py.sched import Scheduler

HERE = os.path.dirname(os.path.abspath(__file__))


def run_python(code_or_args, timeout=600):
    """A fresh interpreter running `code_or_args` (code, or a script's argv): its
    return code and output."""
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str)
                               else list(code_or_args))
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    return p.returncode, p.stdout + p.stderr


def test_every_public_callable_survives_hostile_arguments():
    """None, negative numbers, numbers past the C limits, floats, strings, empty lists
    and plain objects in every position of every public callable."""
    rc, out = run_python([os.path.join(HERE, "api_sweep.py"), "--values", "all"])
    calls = [line for line in out.splitlines() if line.startswith("calling ")]
    assert rc == 0, f"the sweep died (rc {rc}) at: {calls[-1] if calls else '?'}\n{out[-3000:]}"
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM ")]
    summary = [line for line in out.splitlines() if line.startswith("SUMMARY ")]
    assert summary, out[-3000:]
    assert not problems, "\n".join(problems[:40])
    assert len(calls) > 5000            # the sweep reached everything


# the calls the issue found crashing or accepting None, checked one by one in a child
ISSUE_CALLS = """
import numpy as np
import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.sched import Scheduler
from ggml_py.errors import GgmlPyError
cpu = CPUBackend()
ctx = gp.Context()
x = ctx.new_tensor("f32", (4, 8), name="x")
b = gp.host_buffer(cpu.buffer_type, 256)
gp.set_buffer(x, b)
sched = Scheduler([cpu], graph_size=16)
g = gp.Graph(8).build_forward_expand(gp.ops.scale(ctx, x, 2.0))
sched.alloc_graph(g)
calls = [
    lambda: gp.Graph(8).build_forward_expand(None),
    lambda: gp.Graph.from_lists([None], []),
    lambda: ctx.view(None, (4,)), lambda: ctx.reshape(None, (4,)),
    lambda: ctx.permute(None, (1, 0)), lambda: ctx.transpose(None),
    lambda: gp.get_buffer(None), lambda: gp.set_buffer(None, b), lambda: gp.set_buffer(x, None),
    lambda: gp.view_init(None), lambda: b.tensor_alloc(None, 0),
    lambda: cpu.buffer_type.get_alloc_size(None), lambda: cpu.supports_op(None),
    lambda: cpu.offload_op(None), lambda: cpu.set_tensor(None, b""), lambda: cpu.get_tensor(None),
    lambda: sched.tensor_location(None), lambda: sched.set_tensor_backend(None, cpu),
    lambda: sched.get_tensor_backend(None), lambda: sched.get_cause(None),
    lambda: sched.describe(None), lambda: gp.fake_buffer(None, 64),
    lambda: gp.Buffer(None, 64, 4096), lambda: gp.host_buffer(None, 64),
    lambda: Scheduler([cpu], graph_size=2**31),
]
for k, call in enumerate(calls):
    try:
        call()
    except (GgmlPyError, TypeError):
        continue
    except BaseException as e:
        print(f"call {k}: {type(e).__name__}: {e}")
        continue
    print(f"call {k}: accepted")
print("done")
"""


def test_the_calls_of_the_issue_refuse_none_cleanly():
    rc, out = run_python(ISSUE_CALLS)
    assert rc == 0 and out.strip().endswith("done"), out
    assert "call " not in out, out


def test_op_builders_check_their_context_and_tensors_once_at_the_boundary():
    """Every checked function of ops (the builders and the set_prec / add_sinks setters)
    refuses a non-Context or non-Tensor in each such argument before its body runs:
    an ArgumentTypeError naming the function and the argument (no builder checks again)."""
    ctx = gp.Context()
    t = ctx.new_tensor("f32", (4,))
    checked = {name: fn for name, fn in vars(ops).items()
               if callable(fn) and hasattr(fn, "__wrapped__") and fn.__module__ == ops.__name__}
    assert set(ops._BUILDERS) <= set(checked) and len(ops._BUILDERS) > 100
    kinds = {"Context": ctx, "Tensor": t, "Tensor | None": t}
    n = 0
    for fn in checked.values():
        params = inspect.signature(fn).parameters.values()
        valid = {p.name: kinds.get(p.annotation) for p in params}
        for p in params:
            if p.annotation not in kinds:
                continue
            with pytest.raises(ArgumentTypeError) as e:
                fn(**{**valid, p.name: 1.5})
            cls = "Context" if p.annotation == "Context" else "Tensor"
            assert str(e.value).startswith(f"{fn.__name__}: {p.name} must be a {cls}"), e.value
            n += 1
    assert n > 200, n


def _cpu_tensor():
    cpu = CPUBackend()
    ctx = gp.Context()
    t = ctx.new_tensor("f32", (4, 8), name="t")
    gp.set_buffer(t, gp.host_buffer(cpu.buffer_type, 128))
    cpu.set_tensor(t, np.arange(32, dtype=np.float32))
    return cpu, t


@pytest.mark.parametrize("offset, size", [(-1, None), (0, -1), (-8, 4), (2**64, None),
                                          (0, 2**64), (120, 16), (0, 129), (129, None)])
def test_bad_read_offsets_are_refused_on_the_cpu(offset, size):
    # numpy's negative indexing used to wrap these to the tensor's first bytes
    cpu, t = _cpu_tensor()
    with pytest.raises(ArgumentError, match="'t'"):
        cpu.get_tensor(t, offset, size)


@pytest.mark.parametrize("offset, nbytes", [(-1, 4), (-8, 4), (2**64, 4), (124, 8), (0, 132)])
def test_bad_write_offsets_are_refused_on_the_cpu(offset, nbytes):
    cpu, t = _cpu_tensor()
    with pytest.raises(ArgumentError, match="'t'"):
        cpu.set_tensor(t, b"\xff" * nbytes, offset)
    assert np.frombuffer(cpu.get_tensor(t), np.float32).tolist() == list(range(32))


def test_scheduler_arguments_are_checked_before_anything_is_made():
    cpu = CPUBackend()
    for bad in (2**31, 0, -1):
        with pytest.raises(ArgumentError, match="graph_size"):
            Scheduler([cpu], graph_size=bad)
    with pytest.raises(ArgumentTypeError):
        Scheduler([cpu], graph_size=1.5)
    with pytest.raises(ArgumentTypeError):
        Scheduler(None)
    with pytest.raises(ArgumentTypeError):
        Scheduler([cpu, None])


def test_scheduler_tables_past_the_machine_are_refused():
    cpu = CPUBackend()
    from ggml_py._schedcore import SchedCore
    with pytest.raises(gp.AllocationError,
                       match=r"its tables: cannot allocate \d+ bytes .* of memory available"):
        SchedCore([cpu] * 16, [cpu.buffer_type] * 16, 2**31 - 1, True, False, 30, 30, 4096)


def test_set_tensor_backend_names_the_object_mixup():
    dev, cpu = CPUBackend("DEV"), CPUBackend()
    ctx = gp.Context()
    t = ops.scale(ctx, ctx.new_tensor("f32", (4,)), 2.0)
    sched = Scheduler([cpu], graph_size=8)
    with pytest.raises(BackendError) as e:
        sched.set_tensor_backend(t, CPUBackend())     # another object named CPU
    msg = str(e.value)
    assert "not one of this scheduler's backends" in msg and "sched.backends[0]" in msg
    with pytest.raises(BackendError, match="not one of this scheduler's backends"):
        sched.set_tensor_backend(t, dev)
    with pytest.raises(BackendError, match="out of range"):
        sched.set_tensor_backend(t, 3)
    with pytest.raises(BackendError, match="unknown backend 'GPU'"):
        sched.set_tensor_backend(t, "GPU")
    with pytest.raises(ArgumentTypeError):
        sched.set_tensor_backend(t, 1.0)
    sched.set_tensor_backend(t, "CPU")
    assert sched.get_tensor_backend(t) is cpu


def test_out_of_range_numbers_never_reach_c():
    ctx = gp.Context()
    for call in (lambda: gp._core.type_name(100000), lambda: gp._core.op_name(-1000),
                 lambda: gp.Graph(2**31), lambda: gp.HashSet(-1), lambda: ctx[2**70],
                 lambda: ctx.new_tensor("f32", (2**40, 2**40)),
                 lambda: ctx.new_tensor("f32", (4,)).set_op_params([2**40]),
                 lambda: gp.host_buffer(CPUBackend().buffer_type, 2**64 - 1),
                 lambda: gp.Buffer(gp.BufferType("B"), 2**64 - 1, 4096)):
        with pytest.raises(GgmlPyError):
            call()


def test_tensor_names_and_strides_are_checked():
    ctx = gp.Context()
    t = ctx.new_tensor("f32", (4, 8), name="t")
    with pytest.raises(ArgumentError, match="Unicode"):
        t.name = "\ud800"
    with pytest.raises(ArgumentError, match="63 bytes"):
        t.name = "x" * 64
    with pytest.raises(GraphError, match="span"):
        t.nb = (4, 2**62, 4, 4)       # a byte extent past 2**62 would wrap size_t sums
    with pytest.raises(GraphError, match="reaches past"):
        ctx.new_op("VIEW", [t], "f32", (8, 8), view_of=t, nb=(4, 32, 256, 256))
    assert t.nb == (4, 32, 128, 128)
