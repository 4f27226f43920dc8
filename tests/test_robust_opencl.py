"""OpenCL device memory: what ggml_py has handed out on each device is tracked, and an
allocation past the device's memory (or set_memory_limit) or past its largest single
allocation is an AllocationError. Allocations are made real when they are made, so a
driver that allocates lazily (PoCL on the CPU) fails there, not at the first write
(where PoCL aborts the process)."""

import numpy as np
import pytest

from ggml_py._core import Context
from ggml_py._backend import set_buffer
from ggml_py.backends import opencl
from ggml_py.errors import AllocationError, ArgumentError, ArgumentTypeError
from conftest import require_opencl
from test_robust_api import run_python

require_opencl()

MiB = 1 << 20


@pytest.fixture
def ocl():
    b = opencl.OpenCLBackend(0)
    yield b
    opencl.set_memory_limit(0, None)


def test_memory_is_tracked_and_the_limit_refuses(ocl):
    """The limit is the device's global memory unless set lower (a budget, or, here, a
    device small enough to fill in a test)."""
    buft = ocl.buffer_type
    start = opencl.memory_in_use(0)
    a = buft.alloc_buffer(3 * MiB)
    assert opencl.memory_in_use(0) == start + 3 * MiB
    opencl.set_memory_limit(0, start + 4 * MiB)
    with pytest.raises(AllocationError, match=r"in use") as e:
        buft.alloc_buffer(2 * MiB)
    assert ocl.device["name"] in str(e.value)
    b = buft.alloc_buffer(MiB)                       # what fits still does
    del a
    assert opencl.memory_in_use(0) == start + MiB
    c = buft.alloc_buffer(3 * MiB)                   # the space came back
    del b, c
    assert opencl.memory_in_use(0) == start


def test_past_the_largest_single_allocation_is_refused(ocl):
    max_alloc = ocl.device["max_alloc"]
    with pytest.raises(AllocationError, match="largest single allocation"):
        ocl.buffer_type.alloc_buffer(max_alloc + 1)


def test_buffers_start_zeroed_and_a_released_one_refuses(ocl):
    buf = ocl.buffer_type.alloc_buffer(4096)
    ctx = Context()
    t = ctx.new_tensor("f32", (1024,), name="t")
    set_buffer(t, buf)
    assert ocl.get_tensor(t) == bytes(4096)
    buf.release()
    assert buf.mem is None
    with pytest.raises(Exception, match="released"):
        ocl.get_tensor(t)


def test_bad_arguments(ocl):
    for device in (None, 1.5, [0], True):
        with pytest.raises(ArgumentTypeError):
            opencl.OpenCLBackend(device)
    ctx = Context()
    t = ctx.new_tensor("f32", (16,), name="t")
    set_buffer(t, ocl.buffer_type.alloc_buffer(64))
    for offset, size in ((-1, None), (0, -4), (2**64, None), (60, 8)):
        with pytest.raises(ArgumentError, match="'t'"):
            ocl.get_tensor(t, offset, size)
    with pytest.raises(ArgumentError, match="'t'"):
        ocl.set_tensor(t, b"\0" * 8, -4)


LAZY = """
import os, resource
import numpy as np
from ggml_py._core import Context
from ggml_py._backend import set_buffer
from ggml_py.backends import opencl
from ggml_py.errors import AllocationError
ocl = opencl.OpenCLBackend(0)
size = 400 << 20
with open("/proc/self/status") as f:
    vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
# the address space holds one such buffer, not two
resource.setrlimit(resource.RLIMIT_AS, (vm + size + (150 << 20),) * 2)
first = ocl.buffer_type.alloc_buffer(size)
try:
    second = ocl.buffer_type.alloc_buffer(size)
    print("second allocated")
except AllocationError as e:
    print("refused:", e)
ctx = Context()
t = ctx.new_tensor("f32", (size // 4,), name="t")
set_buffer(t, first)
ocl.set_tensor(t, np.full(16, 7, np.float32).tobytes(), offset=size - 64)
print("written", np.frombuffer(ocl.get_tensor(t, size - 64, 64), np.float32)[0])
"""


def test_an_allocation_the_process_cannot_hold_fails_at_allocation():
    """The issue: two buffers past what the process can map both 'succeeded', then the
    first write aborted inside PoCL (SIGABRT)."""
    rc, out = run_python(LAZY)
    assert rc == 0, out
    assert "refused:" in out and "written 7.0" in out, out
