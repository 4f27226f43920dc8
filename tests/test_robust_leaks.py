"""Leaks: backends release their threads when dropped and close on leaving `with`;
split/alloc cycles and decode steps keep memory, threads and file descriptors flat
(a short run of bench/soak.py)."""

import gc
import os
import sys
import threading

import numpy as np
import pytest

import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import BackendError
from ggml_py.sched import Scheduler
from test_robust_lifetimes import Softmax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import soak  # noqa: E402

linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self")


def worker_threads(name=""):
    return [t for t in threading.enumerate() if t.name.startswith("ggml_py-" + name)]


def test_a_dropped_numpy_device_stops_its_thread():
    """The issue's churn: 75 of 75 devices used with parallel=True stayed alive."""
    gc.collect()
    cpu = CPUBackend()
    rng = np.random.default_rng(0)
    for _ in range(25):
        dev = NumpyDeviceBackend("CHURN", unsupported_ops=["SOFT_MAX"])
        sched = Scheduler([dev, cpu], graph_size=32, parallel=True)
        m = Softmax(0.5)
        got, ref = m.run(sched, dev, cpu, rng)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        del dev, sched, m          # no close()
    gc.collect()
    for t in worker_threads("CHURN"):
        t.join(timeout=10)
    assert worker_threads("CHURN") == []


def test_backends_close_on_leaving_with():
    with NumpyDeviceBackend("WITH") as dev:
        assert any(t.name == "ggml_py-WITH" for t in worker_threads())
    assert not any(t.name == "ggml_py-WITH" for t in worker_threads())
    with pytest.raises(BackendError, match="closed"):
        dev.graph_compute([])
    with CPUBackend() as cpu:                # the base's close: nothing to release
        assert cpu.name == "CPU"
    with gp.Backend("SIM", gp.BufferType("SIM")) as b:
        assert b.name == "SIM"


@linux_only
def test_short_soak_is_flat():
    split = soak.split_alloc_cycles(400, warmup=100)
    decode = soak.decode_steps(80, warmup=30)
    for row in (split, decode):
        assert row["threads"][1] <= row["threads"][0], row
        assert row["fds"][1] <= row["fds"][0], row
    # a scheduler's tables are ~20 kB, a session's ~100 kB: leaking either shows
    assert split["rss_kb_per_cycle"] < 2.0, split
    assert decode["rss_kb_per_cycle"] < 20.0, decode
