"""KeyboardInterrupt at any moment of a decode leaves the backends usable: no hang (the
numpy device's queue), no OpenCL state left half-made, no stream out of step (an RPC
connection cut mid-command is closed and says so), and right tokens after
(tests/interrupt_run.py, in a subprocess)."""

import json
import os
import subprocess
import sys

from conftest import require_ggml_rpc, require_opencl

HERE = os.path.dirname(os.path.abspath(__file__))


def run_interrupts(*args):
    out = subprocess.run([sys.executable, os.path.join(HERE, "interrupt_run.py"), *args],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout.rsplit("SUMMARY ", 1)[1])
    # (the timer must have cut runs, or nothing was tested)
    assert summary["interrupted"] >= 50, summary
    return summary


def test_interrupted_decodes_on_the_numpy_device():
    run_interrupts("device", "--rounds", "300", "--seed", "1")


def test_interrupted_decodes_on_opencl():
    require_opencl()
    run_interrupts("opencl", "--rounds", "100", "--seed", "3")


def test_interrupted_decodes_over_rpc():
    require_ggml_rpc()
    from ggml_py.rpc_server import start_server
    # a server of its own: a ggml server serves one client at a time, and the session's
    # servers may still be held by connections of earlier tests
    server = start_server()
    try:
        summary = run_interrupts("rpc", "--endpoint", server.endpoint, "--rounds", "300",
                                 "--seed", "2")
    finally:
        server.stop()
    # a connection cut mid-command is closed at once and says so (read on, its stream
    # would hand one command's reply to the next, or wait out the socket's timeout)
    assert summary["clean_errors"] > 0, summary
    for error in summary["errors"]:
        assert "the connection was lost earlier" in error, error
        assert "interrupted (KeyboardInterrupt)" in error, error
