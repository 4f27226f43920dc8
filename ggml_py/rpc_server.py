"""Start ggml's own RPC server (ggml 0.10.1, protocol 4.0.0) on this machine's CPU.

    python -m ggml_py.rpc_server [--host 127.0.0.1] [--port 50052] [--threads N] [--cache DIR]

ggml_py does not contain the server: it calls ggml_backend_rpc_start_server of ggml's
libraries through ctypes, on the CPU device. The libraries come from the `ggml`
package of ggml-py 0.10.1 built with RPC:

    pip install "ggml-py==0.10.1" -C cmake.define.GGML_RPC=ON      (or .ci/install-ggml-rpc)

or from the folder GGML_PY_GGML_LIB names (libggml-base.so, libggml.so, libggml-rpc.so).
The server serves one client at a time until it is killed; it trusts its clients (ggml
says: never expose it to an open network). `start_server` runs one in a child process
and returns once it accepts connections (tests, benchmarks, scripts).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref

from ggml_py._core import int_arg
from ggml_py._cpu import MAX_THREADS, default_threads
from ggml_py.errors import BackendError, GgmlPyError

DEFAULT_PORT = 50052            # rpc-server's default
LIBRARIES = ("libggml-base.so", "libggml.so", "libggml-rpc.so")    # load order
GGML_BACKEND_DEVICE_TYPE_CPU = 0


class GgmlLibraryError(BackendError):
    """ggml's libraries (with RPC) are not installed or cannot be loaded; says where it looked."""


def library_dir() -> str:
    """The folder holding ggml 0.10.1's libraries: GGML_PY_GGML_LIB, else the `lib` folder of
    the installed `ggml` package. GgmlLibraryError says what is missing."""
    override = os.environ.get("GGML_PY_GGML_LIB")
    if override:
        where, path = "GGML_PY_GGML_LIB", override
    else:
        spec = importlib.util.find_spec("ggml")       # found, not imported
        if spec is None or not spec.submodule_search_locations:
            raise GgmlLibraryError(
                "ggml's libraries are not installed: pip install \"ggml-py==0.10.1\" "
                "-C cmake.define.GGML_RPC=ON (or set GGML_PY_GGML_LIB=/path/to/lib)")
        where, path = "the ggml package", os.path.join(spec.submodule_search_locations[0], "lib")
    missing = [n for n in LIBRARIES if not os.path.exists(os.path.join(path, n))]
    if missing:
        hint = (" (build ggml-py with -C cmake.define.GGML_RPC=ON)"
                if missing == ["libggml-rpc.so"] else "")
        raise GgmlLibraryError(f"{', '.join(missing)} not found in {path} ({where}){hint}")
    return path


def load_libraries(path: str | None = None) -> dict:
    """ggml's libraries loaded with ctypes (RTLD_GLOBAL, base first), by file name."""
    path = path or library_dir()
    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = ctypes.CDLL(os.path.join(path, name), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise GgmlLibraryError(f"cannot load {name} from {path}: {e}") from None
    base, ggml, rpc = (libs[n] for n in LIBRARIES)
    base.ggml_op_name.restype = ctypes.c_char_p
    base.ggml_op_name.argtypes = [ctypes.c_int]
    base.ggml_type_name.restype = ctypes.c_char_p
    base.ggml_type_name.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                 ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    return libs


def _server_args(port, threads):
    """(port, threads) checked before they reach ggml, which aborts (or tries a million
    threads) on what it does not expect; threads None: default_threads()."""
    port = int_arg(port, "port", 1, 65535)
    return port, int_arg(default_threads() if threads is None else threads, "threads", 1,
                         MAX_THREADS)


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, threads: int | None = None,
          cache_dir: str | None = None) -> None:
    """Run ggml's RPC server on the CPU device in this process; returns only if the server
    cannot start (it serves until the process is killed)."""
    port, threads = _server_args(port, threads)
    libs = load_libraries()
    dev = libs["libggml.so"].ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not dev:
        raise GgmlLibraryError("ggml found no CPU device")
    devices = (ctypes.c_void_p * 1)(dev)
    endpoint = f"{host}:{port}".encode()
    cache = os.fsencode(cache_dir) if cache_dir else None
    # the server never returns to Python: let Ctrl-C end the process the C way
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libs["libggml-rpc.so"].ggml_backend_rpc_start_server(endpoint, cache, threads, 1, devices)
    raise BackendError(f"ggml's RPC server on {host}:{port} stopped (port in use?)")


# ---------------------------------------------------------------------------
# servers in child processes

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _reap(proc, log_path):
    """Kill a server process (it has no other way to stop), reap it, drop its log."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    try:
        os.unlink(log_path)
    except OSError:
        pass


class ServerProcess:
    """A ggml RPC server in a child process (start_server). A context manager; stop()
    kills it, and so does the end of this interpreter at the latest. `endpoint` is
    HOST:PORT; output() what it printed."""

    def __init__(self, proc, host, port, log_path):
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self._reaper = weakref.finalize(self, _reap, proc, log_path)

    @property
    def endpoint(self) -> str:
        """'host:port' to give rpc_backends."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Is the server process still running?"""
        return self.proc.poll() is None

    def output(self) -> str:
        """What the server has printed so far (its log)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the server and reap it."""
        self._reaper()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self):
        return f"<ggml RPC server {self.endpoint} pid {self.pid}{'' if self.alive() else ' (exited)'}>"


def _accepts(host, port, timeout=0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_server(port: int | None = None, host: str = "127.0.0.1", threads: int = 1,
                 cache_dir: str | None = None, timeout: float = 30.0) -> ServerProcess:
    """Start `python -m ggml_py.rpc_server` in a child process (a free port when `port` is
    None) and wait until it accepts connections. GgmlLibraryError when ggml's libraries
    are missing; BackendError (with the server's output) when it does not come up."""
    library_dir()                          # fail here, not in the child
    _server_args(port or DEFAULT_PORT, threads)
    for attempt in range(3):
        p = port or free_port(host)
        fd, log_path = tempfile.mkstemp(prefix="ggml-rpc-", suffix=".log")
        cmd = [sys.executable, "-m", "ggml_py.rpc_server", "--host", host, "--port", str(p),
               "--threads", str(threads)] + (["--cache", cache_dir] if cache_dir else [])
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        server = ServerProcess(proc, host, p, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and server.alive():
            if _accepts(host, p):
                return server
            time.sleep(0.02)
        out = server.output()
        server.stop()
        if port is None and "Failed to create server socket" in out and attempt < 2:
            continue                       # someone took the free port meanwhile
        state = "exited" if proc.returncode is not None else f"did not accept within {timeout:g} s"
        raise BackendError(f"ggml RPC server on {host}:{p} {state}; its output:\n{out[-2000:]}")
    raise AssertionError("unreachable")


def main(argv=None) -> int:
    """`python -m ggml_py.rpc_server`: serve until stopped; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m ggml_py.rpc_server",
                                 description="Run ggml 0.10.1's RPC server on this machine's CPU.")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; the server trusts its clients)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--cache", metavar="DIR", default=None,
                    help="keep tensors over 10 MiB here, so clients can skip sending them again")
    a = ap.parse_args(argv)
    if a.cache:
        os.makedirs(a.cache, exist_ok=True)
    try:
        serve(a.host, a.port, a.threads, a.cache)
    except GgmlPyError as e:
        print(f"rpc_server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
