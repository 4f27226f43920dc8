"""Threads: calls on one scheduler take turns (its lock), a sequence held under
`sched.lock` is never interleaved, and without the lock a thread gets a right result
or a clear GgmlPyError, never a wrong one. Separate schedulers run side by side."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ggml_py as gp
from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import GgmlPyError
from ggml_py.sched import Scheduler
from test_robust_lifetimes import Softmax

N_THREADS = 3


@pytest.fixture(scope="module")
def backends():
    dev = NumpyDeviceBackend("DEV_T", unsupported_ops=["SOFT_MAX"])
    yield dev, CPUBackend()
    dev.close()


def run_threads(work, n=N_THREADS):
    """work(k) in n threads; the exceptions they raised (None where none)."""
    errors = [None] * n

    def body(k):
        try:
            work(k)
        except BaseException as e:      # noqa: BLE001 -- reported to the test
            errors[k] = e
    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread hangs"
    return errors


@pytest.mark.parametrize("parallel", [False, True])
def test_sequences_under_the_lock_are_always_right(backends, parallel):
    dev, cpu = backends
    sched = Scheduler([dev, cpu], graph_size=32, parallel=parallel)
    models = [Softmax(0.5 + k) for k in range(N_THREADS)]
    results = [[] for _ in range(N_THREADS)]

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(25):
            with sched.lock:
                results[k].append(models[k].run(sched, dev, cpu, rng))
    assert run_threads(work) == [None] * N_THREADS
    for res in results:
        assert len(res) == 25
        for got, ref in res:
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    sched.close()


def test_without_the_lock_results_are_right_or_errors_are_clean(backends):
    dev, cpu = backends
    sched = Scheduler([dev, cpu], graph_size=32)
    models = [Softmax(0.5 + k) for k in range(N_THREADS)]
    outcomes = [[] for _ in range(N_THREADS)]

    def work(k):
        rng = np.random.default_rng(10 + k)
        for _ in range(40):
            try:
                got, ref = models[k].run(sched, dev, cpu, rng)
            except GgmlPyError as e:
                outcomes[k].append(type(e).__name__)
                continue
            outcomes[k].append(bool(np.allclose(got, ref, rtol=1e-5, atol=1e-6)))
    errors = run_threads(work)
    assert errors == [None] * N_THREADS, errors          # nothing but GgmlPyErrors
    flat = [o for out in outcomes for o in out]
    assert False not in flat                             # never a wrong result
    assert flat.count(True) > 0
    # and the scheduler works on afterwards
    got, ref = models[0].run(sched, dev, cpu, np.random.default_rng(0))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    sched.close()


def test_concurrent_splits_give_the_single_thread_plans():
    from conftest import shared_path
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import scheduler_for_case
    names = ["llama-2L-gpu-unsupported", "llama-4L-partial-offload", "moe-2L-experts-on-cpu"]
    cases = [load_case(shared_path() / "cases" / f"{n}.case.json") for n in names]
    refs = []
    for case in cases:
        s = scheduler_for_case(case)
        s.split_graph(case.graph)
        refs.append(s.plan(case.name).to_dict())
        s.close()
    # one scheduler per case, shared by all threads; each split and read under the lock
    scheds = [scheduler_for_case(case) for case in cases]
    bad = []

    def work(k):
        for i in range(60):
            j = (i + k) % len(cases)
            with scheds[j].lock:
                scheds[j].reset()
                for t, b in cases[j].assignments:
                    scheds[j].set_tensor_backend(t, b)
                scheds[j].split_graph(cases[j].graph)
                if scheds[j].plan(cases[j].name).to_dict() != refs[j]:
                    bad.append((k, i, j))
    assert run_threads(work) == [None] * N_THREADS
    assert bad == []


def test_separate_schedulers_compute_side_by_side():
    """Each thread its own scheduler and graph (BLAS matmuls release the GIL)."""
    cpu = CPUBackend()
    n = 256

    def work(k):
        ctx = gp.Context()
        a = ctx.new_tensor("f32", (n, n), name="a").set_input()
        b = ctx.new_tensor("f32", (n, n), name="b").set_input()
        y = gp.ops.mul_mat(ctx, a, b).set_output()
        g = gp.Graph(8).build_forward_expand(y)
        sched = Scheduler([cpu], graph_size=16)
        rng = np.random.default_rng(k)
        for _ in range(10):
            av = rng.standard_normal((n, n), dtype=np.float32)
            bv = rng.standard_normal((n, n), dtype=np.float32)
            sched.reset()
            sched.alloc_graph(g)
            cpu.set_tensor(a, av)
            cpu.set_tensor(b, bv)
            sched.graph_compute(g)
            got = np.frombuffer(cpu.get_tensor(y), np.float32).reshape(n, n)
            # ggml's mul_mat(a, b) = b @ a.T in numpy order
            np.testing.assert_allclose(got, bv @ av.T, rtol=1e-3, atol=1e-3)
        sched.close()
    assert run_threads(work) == [None] * N_THREADS


def _user(m, sched, dev, cpu, rng, results):
    """One user's reset / assign / alloc / set / compute / read loop, a call per next()."""
    while True:
        xv = rng.random((4, 16), dtype=np.float32)
        try:
            sched.reset()
            yield
            sched.set_tensor_backend(m.s, dev)
            yield
            sched.alloc_graph(m.graph)
            yield
            cpu.set_tensor(m.x, xv)
            yield
            sched.graph_compute(m.graph)
            yield
            got = np.frombuffer(cpu.get_tensor(m.y), np.float32).reshape(4, 16)
        except GgmlPyError:
            results.append("error")
            yield
            continue
        z = xv * m.scale
        e = np.exp(z - z.max(1, keepdims=True))
        results.append(bool(np.allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)))
        yield


@settings(max_examples=40)
@given(st.lists(st.integers(0, 2), min_size=10, max_size=80), st.booleans())
def test_any_interleaving_of_three_users_gives_right_results_or_errors(order, parallel):
    """What threads without the lock can do, call by call and reproducibly: three users
    of one scheduler interleaved in any order."""
    dev, cpu = _BACKENDS
    sched = Scheduler([dev, cpu], graph_size=32, parallel=parallel)
    results = []
    users = [_user(Softmax(0.5 + k), sched, dev, cpu, np.random.default_rng(k), results)
             for k in range(3)]
    for k in order:
        next(users[k])
    assert False not in results
    sched.close()


_BACKENDS = (NumpyDeviceBackend("DEV_I", unsupported_ops=["SOFT_MAX"]), CPUBackend())


def teardown_module():
    _BACKENDS[0].close()
