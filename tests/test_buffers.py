"""The buffer interface: ggml's memory slots (set/get/memset/cpy/clear/init_tensor),
the public wrappers that check and dispatch them, and alloc_ctx_tensors_from_buft."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ggml_py import Context, ops
from ggml_py._core import memory_available
from ggml_py._backend import (Buffer, BufferType, fake_buffer, get_buffer, host_buffer,
                              is_written, tensor_copy, tensor_get, tensor_memset, tensor_set,
                              tensor_set_all, view_init)
from ggml_py.alloc import alloc_ctx_tensors_from_buft
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import (ArgumentError, ArgumentTypeError, BackendError, NotSupportedError,
                            ReleasedMemoryError)


def f32(ctx, n, name):
    return ops.new_tensor_1d(ctx, "f32", n, name=name)


def values(t):
    return np.frombuffer(tensor_get(t), np.float32)


def host_type_of(buffer_class):
    """A host buffer type whose buffers are of `buffer_class` (a Buffer with a slot)."""
    class HostType(BufferType):
        def alloc_buffer(self, size):
            mem = host_buffer(self, size)
            return buffer_class(self, size, mem.base, memory=mem.memory)
    return HostType


@pytest.fixture
def dev():
    with NumpyDeviceBackend() as d:
        yield d


def test_host_slots_through_the_wrappers():
    ctx = Context()
    a, b = f32(ctx, 8, "a"), f32(ctx, 8, "b")
    bufs = alloc_ctx_tensors_from_buft(ctx, CPUBackend().buffer_type)
    assert len(bufs) == 1 and bufs[0].size == 64 and not bufs[0].is_simulated
    tensor_set(a, np.arange(8, dtype=np.float32))
    tensor_set(a, np.float32([-1, -2]), 8)                  # at a byte offset
    assert values(a).tolist() == [0, 1, -1, -2, 4, 5, 6, 7]
    assert tensor_get(a, 4, 8) == np.float32([1, -1]).tobytes()
    tensor_copy(a, b)
    assert values(b).tolist() == values(a).tolist()
    tensor_memset(b, 0, 4, 8)
    assert values(b).tolist() == [0, 0, 0, -2, 4, 5, 6, 7]
    bufs[0].clear(0)
    assert not values(a).any() and not values(b).any()
    with pytest.raises(ArgumentError, match="exceed its 32 bytes"):
        tensor_set(a, np.zeros(9, np.float32))
    with pytest.raises(ArgumentError, match=r"\[0, 255\]"):
        tensor_memset(a, 256)


def test_simulated_buffers_refuse_bytes_and_clear_nothing():
    ctx = Context()
    a = f32(ctx, 4, "a")
    buf = fake_buffer(BufferType("GPU0"), 16)
    buf.tensor_alloc(a, 0)
    assert buf.is_simulated
    for call in (lambda: tensor_set(a, np.zeros(4, np.float32)), lambda: tensor_get(a),
                 lambda: tensor_memset(a, 0)):
        with pytest.raises(NotSupportedError, match="simulated GPU0 buffer"):
            call()
    buf.clear(0)                                            # nothing to clear


def test_device_slots_and_copies_between_memories(dev):
    ctx = Context()
    h, d, e = f32(ctx, 8, "h"), f32(ctx, 8, "d"), f32(ctx, 8, "e")
    host_bufs = alloc_ctx_tensors_from_buft([h], CPUBackend().buffer_type)
    dev_bufs = alloc_ctx_tensors_from_buft([d, e], dev.buffer_type, "weights")
    assert dev_bufs[0].usage == "weights" and not dev_bufs[0].is_simulated
    tensor_set(h, np.arange(8, dtype=np.float32))
    tensor_copy(h, d)                                       # host -> device: a set
    tensor_copy(d, e)                                       # device -> device: cpy_tensor
    tensor_memset(h, 0)
    tensor_copy(e, h)                                       # device -> host: a get
    assert values(h).tolist() == list(range(8))
    dev_bufs[0].clear(0)
    assert not values(d).any()
    with pytest.raises(BackendError, match="not in this device's memory"):
        CPUBackend().get_tensor(d)
    assert host_bufs and get_buffer(h) is host_bufs[0]


def test_alloc_ctx_tensors_splits_at_the_largest_buffer_and_inits_views():
    ctx = Context()
    ts = [f32(ctx, 16, f"t{i}") for i in range(5)]         # 64 bytes each
    view = ops.view_1d(ctx, ts[4], 4, 16)
    buft = BufferType("H", alignment=32, max_size=128, is_host=True)
    bufs = alloc_ctx_tensors_from_buft(ctx, buft)
    assert [b.size for b in bufs] == [128, 128, 64]
    assert [get_buffer(t) for t in ts] == [bufs[0], bufs[0], bufs[1], bufs[1], bufs[2]]
    assert get_buffer(view) is bufs[2] and view.data_address == ts[4].data_address + 16
    assert alloc_ctx_tensors_from_buft(ctx, buft) == []     # everything has memory


def test_init_tensor_slot_is_called_where_a_buffer_has_one():
    seen = []

    class Tracking(Buffer):
        def init_tensor(self, tensor):
            seen.append(tensor.name)

    ctx = Context()
    a, b = f32(ctx, 4, "a"), f32(ctx, 4, "b")
    ops.view_1d(ctx, a, 2, 0)
    alloc_ctx_tensors_from_buft(ctx, host_type_of(Tracking)("T", is_host=True))
    assert seen == ["a", "b"]                               # views are not initialised


def test_graph_allocator_resets_buffers_that_have_the_slot():
    from ggml_py import Graph
    from ggml_py.alloc import GraphAllocator
    resets = []

    class Resetting(Buffer):
        def reset(self):
            resets.append(self.size)

    ctx = Context()
    x = f32(ctx, 16, "x")
    x.set_input()
    y = ops.scale(ctx, ops.add(ctx, x, x), 2.0)
    g = Graph(16).build_forward_expand(y)
    ga = GraphAllocator([host_type_of(Resetting)("R", is_host=True)])
    ga.reserve(g)
    assert resets == []
    assert ga.alloc_graph(g) and len(resets) == 1          # ggml_gallocr_alloc_graph resets
    assert ga.alloc_graph(g) and len(resets) == 2


# ---------------------------------------------------------------------------
# memory the process can still take: Linux hands out memory it does not have and kills
# the process that fills it; host buffers are checked and taken when they are made

def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_memory_available_is_the_systems_or_the_tightest_cgroups(tmp_path):
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc / "meminfo", "MemTotal:  4000 kB\nMemFree:  100 kB\n"
                             "MemAvailable:    1000 kB\nSwapFree:  24 kB\n")
    assert memory_available(str(proc), str(cgroup)) == 1024 * 1024       # no cgroup files
    # cgroup v2: the process's own group has no limit, its parent does; the parent's
    # inactive page cache does not count as used (the kernel reclaims it first)
    _write(proc / "self" / "cgroup", "0::/a/b\n")
    _write(cgroup / "a" / "b" / "memory.max", "max\n")
    _write(cgroup / "a" / "b" / "memory.current", "1\n")
    _write(cgroup / "a" / "memory.max", "500000\n")
    _write(cgroup / "a" / "memory.current", "100000\n")
    _write(cgroup / "a" / "memory.stat", "anon 50000\ninactive_file 50000\n")
    assert memory_available(str(proc), str(cgroup)) == 450000
    # cgroup v1 (its "no limit" is a huge number), the group's own limit binding
    _write(proc / "self" / "cgroup", "5:cpu:/x\n4:memory:/x\n")
    _write(cgroup / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(cgroup / "memory" / "memory.usage_in_bytes", "900000\n")
    _write(cgroup / "memory" / "x" / "memory.limit_in_bytes", "300000\n")
    _write(cgroup / "memory" / "x" / "memory.usage_in_bytes", "250000\n")
    _write(cgroup / "memory" / "x" / "memory.stat", "total_inactive_file 10000\n")
    assert memory_available(str(proc), str(cgroup)) == 60000
    # a limit already passed leaves nothing; no /proc: nothing to say
    _write(cgroup / "memory" / "x" / "memory.usage_in_bytes", "400000\n")
    assert memory_available(str(proc), str(cgroup)) == 0
    assert memory_available(str(tmp_path / "none"), str(cgroup)) is None


def test_memory_available_here_is_below_the_machines_memory():
    room = memory_available()
    assert room is not None and 0 < room
    assert room <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + 2**40


def test_buffers_past_the_memory_available_are_refused_before_they_are_filled():
    """In a child process: were one filled, the out-of-memory killer would end it."""
    code = """if 1:
        from ggml_py._core import memory_available
        from ggml_py.backends.cpu import CPUBackend
        from ggml_py.backends.numpy_device import NumpyDeviceBackend
        from ggml_py.errors import AllocationError
        with NumpyDeviceBackend() as dev:
            for buft in (CPUBackend().buffer_type, dev.buffer_type):
                try:
                    buft.alloc_buffer(memory_available() + 2**26)
                except AllocationError as e:
                    print(e)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line, name in zip(lines, ("CPU", "NUMPY_DEV")):
        assert re.fullmatch(rf"buffer type '{name}': a buffer: cannot allocate \d+ bytes "
                            r"\(\d+\.\d GiB\), more than the \d+ bytes \(\d+\.\d GiB\) of "
                            r"memory available .*", line), line


def _resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_host_buffer_takes_its_memory_when_it_is_made():
    """So that the next check sees it gone (a lazily given buffer would not count)."""
    before = _resident_bytes()
    buf = CPUBackend().buffer_type.alloc_buffer(2**28)
    assert _resident_bytes() - before >= 2**28 * 0.95
    assert not buf.memory.any()


# ---------------------------------------------------------------------------
# tensor_set of a whole array (a graph's inputs, every step): one memcpy where the array
# is C-contiguous, of the tensor's stored dtype and exactly its bytes; the same bytes and
# the same refusals as the checked path

STORED = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i8": np.int8,
          "i16": np.int16, "i32": np.int32, "i64": np.int64, "bf16": np.uint16}


def host_tensors(type_name, n, count, buffer_type=None):
    ctx = Context()
    ts = [ops.new_tensor_1d(ctx, type_name, n, name=f"t{i}") for i in range(count)]
    bufs = alloc_ctx_tensors_from_buft(ctx, buffer_type or CPUBackend().buffer_type)
    return ts, bufs


@settings(max_examples=40, deadline=None)
@given(type_name=st.sampled_from(sorted(STORED)), n=st.integers(1, 300),
       seed=st.integers(0, 2**32 - 1))
def test_a_whole_array_is_written_as_the_checked_path_writes_its_bytes(type_name, n, seed):
    raw = np.random.default_rng(seed).integers(0, 256, n * np.dtype(STORED[type_name]).itemsize,
                                                dtype=np.uint8)
    data = raw.view(STORED[type_name])
    (whole, as_bytes, strided, readonly), _ = host_tensors(type_name, n, 4)
    tensor_set(whole, data)
    tensor_set(as_bytes, data.tobytes())                    # bytes: the checked path
    tensor_set(strided, np.repeat(data, 2)[::2])            # not contiguous: a copy first
    frozen = data.copy()
    frozen.flags.writeable = False
    tensor_set(readonly, frozen)
    for t in (whole, as_bytes, strided, readonly):
        assert tensor_get(t) == raw.tobytes() and is_written(t)


def test_a_whole_array_into_a_view_writes_its_view_src_at_the_offset():
    (base,), _ = host_tensors("f32", 8, 1)
    ctx = Context()
    view = ops.view_1d(ctx, base, 3, 4 * 4)
    view_init(view)
    tensor_set(base, np.zeros(8, np.float32))
    tensor_set(view, np.float32([1, 2, 3]))
    assert values(base).tolist() == [0, 0, 0, 0, 1, 2, 3, 0]
    assert is_written(view) and is_written(base)


def test_whole_arrays_still_get_the_checked_paths_refusals():
    (a, zero_later), bufs = host_tensors("f32", 8, 2)
    with pytest.raises(ArgumentTypeError, match="reinterpreted bit for bit"):
        tensor_set(a, np.zeros(8, np.float64))
    with pytest.raises(ArgumentTypeError, match="reinterpreted bit for bit"):
        tensor_set(a, np.zeros(8, ">f4"))                   # f32 values, other byte order
    with pytest.raises(ArgumentError, match="exceed its 32 bytes"):
        tensor_set(a, np.zeros(9, np.float32))
    with pytest.raises(ArgumentTypeError, match="bytes-like, got NoneType"):
        tensor_set(a, None)
    with pytest.raises(TypeError):
        tensor_set(None, np.zeros(8, np.float32))
    tensor_set(a, np.float32([5, 6]))                       # fewer bytes: written at the start
    assert values(a).tolist()[:2] == [5, 6]
    unplaced = f32(Context(), 8, "unplaced")
    with pytest.raises(BackendError, match="'unplaced'.*not allocated"):
        tensor_set(unplaced, np.zeros(8, np.float32))
    bufs[0].release()
    with pytest.raises(ReleasedMemoryError, match="released"):
        tensor_set(a, np.zeros(8, np.float32))
    sim = f32(Context(), 4, "sim")
    fake_buffer(BufferType("GPU0"), 16).tensor_alloc(sim, 0)
    with pytest.raises(NotSupportedError, match="simulated GPU0 buffer"):
        tensor_set(sim, np.zeros(4, np.float32))


def test_a_whole_array_goes_through_a_buffers_own_set_tensor(dev):
    calls = []

    class Recording(Buffer):
        def set_tensor(self, tensor, data, offset=0):
            calls.append((tensor.name, bytes(data), offset))
            super().set_tensor(tensor, data, offset)
    (a,), _ = host_tensors("f32", 4, 1, host_type_of(Recording)("REC"))
    tensor_set(a, np.float32([1, 2, 3, 4]))
    assert calls == [("t0", np.float32([1, 2, 3, 4]).tobytes(), 0)]
    assert values(a).tolist() == [1, 2, 3, 4]
    (d,), _ = host_tensors("f32", 4, 1, dev.buffer_type)  # device memory: its slot
    tensor_set(d, np.float32([4, 3, 2, 1]))
    assert values(d).tolist() == [4, 3, 2, 1]


def test_tensor_set_all_writes_and_refuses_as_tensor_set_does_pair_by_pair():
    (a, b, c), _ = host_tensors("f32", 4, 3)
    (i,), _ = host_tensors("i32", 2, 1)
    pairs = [(a, np.float32([1, 2, 3, 4])), (b, np.float32([5, 6, 7, 8]).tobytes()),
             (c, np.float32([9, 9, 9, 9, 9, 9, 9, 9])[::2]), (i, np.int32([-1, 7]))]
    tensor_set_all(iter(pairs))                             # any iterable of pairs
    assert [values(t).tolist() for t in (a, b, c)] == [[1, 2, 3, 4], [5, 6, 7, 8], [9] * 4]
    assert np.frombuffer(tensor_get(i), np.int32).tolist() == [-1, 7]
    assert all(is_written(t) for t in (a, b, c, i))
    tensor_set_all([])
    with pytest.raises(ArgumentTypeError, match="reinterpreted bit for bit"):
        tensor_set_all([(a, np.zeros(4, np.float32)), (b, np.zeros(4, np.float64))])
    assert not values(a).any()                              # the pairs before are written
    with pytest.raises(ArgumentTypeError, match=r"pairs\[1\] must be a \(tensor, data\) pair"):
        tensor_set_all([(a, np.zeros(4, np.float32)), (a,)])
    with pytest.raises(ArgumentTypeError, match="pairs must be a sequence, got NoneType"):
        tensor_set_all(None)
    with pytest.raises(TypeError):
        tensor_set_all([(None, np.zeros(4, np.float32))])


def test_a_sessions_decode_steps_set_every_input_whole(monkeypatch):
    """Session's kept decode step (issue 34: its Python overhead) writes each input by
    the whole-array path: none falls back to tensor_set's checked path."""
    from ggml_py import _backend
    from ggml_py.models.transformer import Model, ModelConfig, Session
    cfg = ModelConfig(n_vocab=96, n_ctx=32, n_embd=64, n_head=4, n_head_kv=2, n_layer=2,
                      n_ff=96, kv_pad=8)
    cpu = CPUBackend()
    sess = Session(Model.random(cfg).place(cpu), [cpu])
    sess.forward([5, 17, 3], logits="last")
    sess.forward([7], logits="last")                        # the decode graph, kept from here
    checked = []
    monkeypatch.setattr(_backend, "tensor_set", lambda t, data, offset=0: checked.append(t.name))
    for token in (8, 9, 10):
        sess.forward([token], logits="last")
    assert checked == [] and all(h.graph_reused and h.plan_reused for h in sess.history[2:])
    (a,), _ = host_tensors("f32", 4, 1)                    # bytes: the checked path
    tensor_set_all([(a, bytes(16))])
    assert checked == ["t0"]
