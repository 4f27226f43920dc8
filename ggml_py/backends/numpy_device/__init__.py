"""A second executing backend that behaves like a GPU, on the CPU: the "numpy device".

It exists so that what the scheduler does between backends really happens on a
CPU-only machine:

  * its memory is not host memory: a NON-host buffer type whose bytes are kept off
    `Buffer.memory`, so the CPU backend (and its kernels on the caller's thread) cannot
    read it and the scheduler must copy split inputs in and out;
  * it runs asynchronously: one worker thread per device executes a FIFO queue (a CUDA
    stream); graph_compute, async copies, async sets and event records only enqueue,
    synchronize waits for the queue and re-raises the first error of the worker;
  * events are generations recorded in the queue (event_record), waited for by a
    queue (event_wait) or by the caller (event_synchronize).

Kernels are the CPU backend's (`cpu.compute_nodes`); the worker opens its own buffer
type with `cpu.open_device_memory` so they may run on device memory there.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ggml_py._backend import (Backend, Buffer, BufferType, allocated_buffer, byte_value,
                              get_buffer, graph_nodes, host_bytes, host_memory, mark_written,
                              tensor_span, OTHER_MEMORY_HINT)
from ggml_py._core import size_arg
from ggml_py.backends import cpu
from ggml_py.errors import ArgumentTypeError, BackendError

if TYPE_CHECKING:
    from typing_extensions import Self


DEVICE_ALIGNMENT = 256      # a GPU-like alignment, larger than the CPU's 32


class DeviceBuffer(Buffer):
    """A buffer of device memory. `device_memory` is the numpy byte array behind it;
    `memory` stays None so host code treats it as unreadable. Its byte slots read and
    write device_memory; reads wait for the device's queued work first."""

    device_memory = None

    def release(self):
        super().release()
        self.device_memory = None

    def region(self, tensor, offset=0, size=None):
        """The device bytes [offset, offset + size) of `tensor` (in this buffer), a numpy view."""
        if get_buffer(tensor) is not self:
            raise BackendError(f"tensor '{tensor.name}' is not in this {self.buffer_type.name} "
                               "buffer")
        start, n = tensor_span(tensor, offset, size)
        if self.device_memory is None:
            raise BackendError(f"the {self.buffer_type.name} buffer of tensor '{tensor.name}' "
                               "was released")
        return self.device_memory[start:start + n]

    def _synchronize(self):
        queue = self.buffer_type.queue
        if queue is not None:
            queue.join()

    def set_tensor(self, tensor, data, offset=0):
        """A blocking write, not ordered with the queue (ggml_backend_tensor_set; callers
        synchronize, as the scheduler does)."""
        self.region(tensor, offset, memoryview(data).nbytes)[...] = np.frombuffer(data, np.uint8)

    def get_tensor(self, tensor, offset=0, size=None):
        """A blocking read after the queued work is done."""
        self._synchronize()
        return self.region(tensor, offset, size).tobytes()

    def memset_tensor(self, tensor, value, offset=0, size=None):
        self._synchronize()
        self.region(tensor, offset, size)[...] = byte_value(value)

    def cpy_tensor(self, src, dst):
        """dst (here) = src when src is in a buffer of the same device."""
        sbuf = get_buffer(src)
        if not isinstance(sbuf, DeviceBuffer) or sbuf.buffer_type is not self.buffer_type:
            return False
        self._synchronize()
        self.region(dst)[...] = sbuf.region(src)
        return True

    def clear(self, value=0):
        self._synchronize()
        if self.device_memory is not None:
            self.device_memory[...] = byte_value(value)


class NumpyDeviceBufferType(BufferType):
    """The device's memory: is_host False, numpy-backed with an aligned base address.
    `queue` is the device's work queue (reads wait for it)."""

    queue = None

    def __init__(self, name, alignment=DEVICE_ALIGNMENT, max_size=None, device=None):
        super().__init__(name, alignment=alignment, max_size=max_size, is_host=False,
                         device=device)

    def alloc_buffer(self, size):
        size = size_arg(size, f"buffer type '{self.name}': size")
        memory, address = host_memory(size, self.alignment, f"buffer type '{self.name}': a buffer")
        buf = DeviceBuffer(self, size, address)
        buf.device_memory = memory
        return buf


def _gate():
    """A closed gate: a C lock, acquired. Waiting on it is acquiring it; opening it is
    releasing it.

    The caller's thread waits only on such gates. threading's Condition and Event are
    Python: a KeyboardInterrupt inside them can leave their lock held (the worker then
    blocks forever) or raise RuntimeError ('release unlocked lock') instead. A C lock's
    acquire is interrupted cleanly, and nothing is left to undo."""
    gate = threading.Lock()
    gate.acquire()
    return gate


class DeviceEvent:
    """An event of a numpy device (ggml_backend_event). Each record is a new generation;
    a wait or a synchronize waits for the generation recorded last when it was called
    (as cudaStreamWaitEvent does), so a later record never blocks an earlier waiter.
    A never-recorded event counts as reached."""

    def __init__(self, device):
        self._device = weakref.ref(device)     # queued work holds events: never the device
        self._lock = threading.Lock()
        self._recorded = 0          # generations handed out by record (caller's thread)
        self._reached = 0           # the last generation the queue got to
        self._waiting = []          # (generation, gate) of the waits not yet reached

    def _reach(self, generation):
        with self._lock:
            self._reached = max(self._reached, generation)
            ready = [gate for g, gate in self._waiting if g <= self._reached]
            self._waiting = [(g, gate) for g, gate in self._waiting if g > self._reached]
        for gate in ready:
            gate.release()

    def _wait(self, generation):
        gate = _gate()
        with self._lock:
            if self._reached >= generation:
                return
            self._waiting.append((generation, gate))
        gate.acquire()

    @property
    def device(self):
        """The backend that made the event (None once it is gone)."""
        return self._device()

    @property
    def reached(self):
        """Has the queue got to the last record?"""
        with self._lock:
            return self._reached >= self._recorded


class _Queue:
    """The device's in-order work queue and its worker thread. Holds no reference to the
    backend, so a dropped backend is collected and its finalizer stops the thread.

    The caller's side is interrupt-safe: work goes in with one C call (SimpleQueue.put),
    so a KeyboardInterrupt on the caller's thread lands before or after it, never inside.
    (queue.Queue's put is Python: cut between queuing the work and waking the worker, it
    left the worker asleep beside the work, and the next synchronize waited forever.)
    Whether the queue is open is its own flag, set by stop."""

    def __init__(self, name, buffer_type):
        self.name = name
        self.items = queue.SimpleQueue()
        self.error = None               # first exception of the worker, until synchronize
        # (not thread.is_alive(): interrupted, it can mark a running thread as stopped)
        self.closed = False
        self.thread = threading.Thread(target=self._run, args=(buffer_type,),
                                       name=f"ggml_py-{name}", daemon=True)
        self.thread.start()

    def _run(self, buffer_type):
        cpu.open_device_memory(buffer_type)
        while True:
            item = self.items.get()
            if item is None:
                return
            work, always = item
            # after an error the queue drains without working, except for event
            # records, so that nobody waits forever on an event of a failed queue
            if self.error is None or always:
                try:
                    work()
                except BaseException as e:      # re-raised on the caller's thread
                    if self.error is None:
                        self.error = e
            # drop the work before waiting for more: what it holds (tensors, events,
            # staged bytes) must not live on while the queue is idle
            item = work = None

    def open_items(self):
        """The queue to put (work, always) in; BackendError once the device is closed."""
        if self.closed:
            raise BackendError(f"backend {self.name} is closed")
        return self.items

    def put(self, work, always=False):
        self.open_items().put((work, always))

    def join(self):
        """Wait until the work queued so far is done; raise (once) what the worker raised."""
        if not self.closed:
            drained = _gate()
            self.items.put((drained.release, True))
            drained.acquire()
        err, self.error = self.error, None
        if err is not None:
            if isinstance(err, BackendError):
                raise err
            raise BackendError(f"backend {self.name}: {type(err).__name__}: {err}") from err

    def stop(self):
        if not self.closed:
            self.closed = True
            self.items.put(None)
            if threading.current_thread() is not self.thread:
                self.thread.join()


class NumpyDeviceBackend(Backend):
    """A GPU-like backend (device type 'gpu') computing with the CPU kernels on its own
    non-host memory, asynchronously on a worker thread.

    unsupported_ops: op names the device claims not to support (to make the scheduler
        alternate splits, e.g. ("ROPE", "SOFT_MAX")).
    offload_ops, offload_min_batch: ops the device asks to run even when their weights
        are in host memory (the scheduler's op_offload), like a GPU's offload_op.
    """

    def __init__(self, name: str = "NUMPY_DEV", unsupported_ops: Iterable[str] = (),
                 offload_ops: Iterable[str] = (), offload_min_batch: int = 0,
                 alignment: int = DEVICE_ALIGNMENT) -> None:
        buft = NumpyDeviceBufferType(name, alignment=alignment, device=name)
        super().__init__(name, buft, device_type="gpu", supports_ops=cpu.SUPPORTED_OPS,
                         unsupported_ops=tuple(unsupported_ops), offload_ops=tuple(offload_ops),
                         offload_min_batch=offload_min_batch)
        self._queue = buft.queue = _Queue(name, buft)
        self._finalizer = weakref.finalize(self, self._queue.stop)
        # what went through the queue, for tests and profiles
        self.stats = {"graph_computes": 0, "nodes": 0, "async_copies": 0, "async_sets": 0,
                      "event_records": 0, "event_waits": 0}

    # --- lifetime ---

    def close(self) -> None:
        """Stop the worker thread (after the queued work). The backend is unusable after.
        A backend dropped without close() stops its thread when it is collected."""
        self._finalizer()

    # --- memory ---

    def _device_region(self, tensor, offset, size):
        """The device bytes [offset, offset + size) of `tensor`, a numpy view."""
        buf = allocated_buffer(tensor)
        if buf.buffer_type is not self.buffer_type:
            raise BackendError(f"backend {self.name}: tensor '{tensor.name}' is in buffer type "
                               f"'{buf.buffer_type.name}', not in this device's memory"
                               f"{OTHER_MEMORY_HINT}")
        return buf.region(tensor, offset, size)

    @staticmethod
    def _snapshot(data):
        """A private copy of the caller's bytes (a staging buffer): the caller may reuse
        its memory as soon as an async call returns."""
        return np.array(np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8))

    def set_tensor_async(self, tensor, data, offset=0):
        """Write bytes in queue order (ggml_backend_tensor_set_async)."""
        region = self._device_region(tensor, offset, memoryview(data).nbytes)
        staged = self._snapshot(data)

        def write():
            region[...] = staged
        self._queue.put(write)
        mark_written(tensor)
        self.stats["async_sets"] += 1

    def cpy_tensor_async(self, backend_src, src, dst):
        """Copy `src` into `dst` (in this device's memory) in queue order. Host sources
        are staged now; another numpy device's tensor is read after that device's queued
        work (an event recorded there is waited for here). False for other sources."""
        dst_region = self._device_region(dst, 0, None)
        src_buf = get_buffer(src)
        if src_buf is None or src.nbytes != dst.nbytes:
            return False
        if src_buf.is_host:
            src_bytes = host_bytes(src)
            if src_bytes is None:
                return False
            staged = np.array(src_bytes)

            def copy():
                dst_region[...] = staged
        elif isinstance(backend_src, NumpyDeviceBackend) and \
                src_buf.buffer_type is backend_src.buffer_type:
            src_region = backend_src._device_region(src, 0, None)
            ready = backend_src.event_new()
            backend_src.event_record(ready)
            generation = ready._recorded

            def copy():
                ready._wait(generation)
                dst_region[...] = src_region
        else:
            return False
        self._queue.put(copy)
        self.stats["async_copies"] += 1
        return True

    # --- compute ---

    def graph_compute(self, graph):
        """Enqueue the graph's nodes and return (ggml_backend_graph_compute_async); a
        failing kernel is raised by the next synchronize, naming the node."""
        nodes = graph_nodes(graph)
        name = self.name

        def run():
            cpu.compute_nodes(nodes, name)
        self._queue.put(run)
        self.stats["graph_computes"] += 1
        self.stats["nodes"] += len(nodes)
        return True

    def synchronize(self):
        """Wait for the queue; raise the worker's first error, if any (then cleared)."""
        self._queue.join()

    # --- events ---

    def event_new(self):
        return DeviceEvent(self)

    def event_record(self, event):
        """Mark `event` as reached when the queue gets to this point."""
        ev = _event(event)
        items = self._queue.open_items()
        # queued before it is counted: an interrupt between the two leaves a generation
        # the queue reaches and no one waits for, never one waited for and never queued
        generation = ev._recorded + 1
        items.put((lambda: ev._reach(generation), True))
        ev._recorded = generation
        self.stats["event_records"] += 1

    def event_wait(self, event):
        """Make this device's queue wait for the last record of `event` (of any numpy
        device)."""
        generation = _event(event)._recorded
        self._queue.put(lambda: event._wait(generation))
        self.stats["event_waits"] += 1

    def event_synchronize(self, event):
        """Block the caller until the last record of `event` is reached."""
        _event(event)._wait(event._recorded)


def auto_backend() -> NumpyDeviceBackend:
    """`--device auto`'s numpy device (the registry's fallback after OpenCL)."""
    return NumpyDeviceBackend()


def _event(event):
    if not isinstance(event, DeviceEvent):
        raise ArgumentTypeError(f"expected a numpy-device event (event_new), got "
                                f"{type(event).__name__}")
    return event
