"""Start ggml's own RPC server on this machine's CPU: ggml 0.10.1's (protocol 4.0.0) or
llama.cpp's of today (protocol 7.0.0, the one in llama-cpp-python 0.3.36).

    python -m ggml_py.rpc_server [--protocol 4|7] [--host 127.0.0.1] [--port 50052]
                                 [--threads N] [--cache DIR]

ggml_py does not contain the servers: it calls ggml_backend_rpc_start_server (the same
signature in both) of ggml's libraries through ctypes, on the CPU device. Protocol 4's
libraries come from the `ggml` package of ggml-py 0.10.1 built with RPC:

    pip install "ggml-py==0.10.1" -C cmake.define.GGML_RPC=ON      (or .ci/install-ggml-rpc)

or from the folder GGML_PY_GGML_LIB names (libggml-base.so, libggml.so, libggml-rpc.so);
protocol 7's from the `lib` folder of the llama_cpp package of llama-cpp-python 0.3.36
built with RPC:

    CMAKE_ARGS="-DGGML_RPC=ON" pip install llama-cpp-python==0.3.36 --no-binary llama-cpp-python

(or .ci/install-llama-rpc), or from the folder GGML_PY_LLAMA_LIB names.
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
from ggml_py.backends.cpu._executor import MAX_THREADS, default_threads
from ggml_py.errors import BackendError, GgmlPyError

DEFAULT_PORT = 50052            # rpc-server's default
LIBRARIES = ("libggml-base.so", "libggml.so", "libggml-rpc.so")    # load order
GGML_BACKEND_DEVICE_TYPE_CPU = 0
# where each protocol version's server comes from: (environment override, Python package
# whose lib folder holds the libraries, how to install it)
SERVERS = {
    4: ("GGML_PY_GGML_LIB", "ggml",
        'pip install "ggml-py==0.10.1" -C cmake.define.GGML_RPC=ON'),
    7: ("GGML_PY_LLAMA_LIB", "llama_cpp",
        'CMAKE_ARGS="-DGGML_RPC=ON" pip install llama-cpp-python==0.3.36 '
        '--no-binary llama-cpp-python'),
}
PROTOCOLS = tuple(SERVERS)


class GgmlLibraryError(BackendError):
    """ggml's libraries (with RPC) are not installed or cannot be loaded; says where it looked."""


def _protocol(protocol) -> int:
    if isinstance(protocol, bool) or protocol not in SERVERS:
        raise GgmlLibraryError(f"no RPC server of protocol {protocol!r}: ggml_py starts "
                               f"protocol {' or '.join(map(str, PROTOCOLS))}")
    return protocol


def library_dir(protocol: int = 4) -> str:
    """The folder holding the libraries of the server of `protocol`: 4, ggml 0.10.1's
    (GGML_PY_GGML_LIB, else the `lib` folder of the installed `ggml` package); 7,
    llama.cpp's of llama-cpp-python 0.3.36 (GGML_PY_LLAMA_LIB, else the `lib` folder of
    the installed `llama_cpp` package). GgmlLibraryError says what is missing."""
    env, package, install = SERVERS[_protocol(protocol)]
    override = os.environ.get(env)
    if override:
        where, path = env, override
    else:
        spec = importlib.util.find_spec(package)       # found, not imported
        if spec is None or not spec.submodule_search_locations:
            raise GgmlLibraryError(
                f"the libraries of ggml's RPC server of protocol {protocol} are not installed: "
                f"{install} (or set {env}=/path/to/lib)")
        where = f"the {package} package"
        path = os.path.join(spec.submodule_search_locations[0], "lib")
    missing = [n for n in LIBRARIES if not os.path.exists(os.path.join(path, n))]
    if missing:
        hint = (f" (build it with RPC: {install})" if missing == ["libggml-rpc.so"] else "")
        raise GgmlLibraryError(f"{', '.join(missing)} not found in {path} ({where}){hint}")
    return path


def load_libraries(path: str | None = None, protocol: int = 4) -> dict:
    """ggml's libraries (of the server of `protocol`, or in `path`) loaded with ctypes
    (RTLD_GLOBAL, base first), by file name."""
    path = path or library_dir(protocol)
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
          cache_dir: str | None = None, protocol: int = 4) -> None:
    """Run ggml's RPC server of `protocol` (4 or 7) on the CPU device in this process;
    returns only if the server cannot start (it serves until the process is killed)."""
    port, threads = _server_args(port, threads)
    libs = load_libraries(protocol=protocol)
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
    HOST:PORT; `protocol` the version it speaks; output() what it printed."""

    def __init__(self, proc, host, port, log_path, protocol=4):
        self.protocol = protocol
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
        return (f"<ggml RPC server {self.endpoint} protocol {self.protocol} pid {self.pid}"
                f"{'' if self.alive() else ' (exited)'}>")


def _accepts(host, port, timeout=0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_server(port: int | None = None, host: str = "127.0.0.1", threads: int = 1,
                 cache_dir: str | None = None, timeout: float = 30.0,
                 protocol: int = 4) -> ServerProcess:
    """Start `python -m ggml_py.rpc_server` (the server of `protocol`, 4 or 7) in a child
    process (a free port when `port` is None) and wait until it accepts connections.
    GgmlLibraryError when its libraries are missing; BackendError (with the server's
    output) when it does not come up."""
    library_dir(protocol)                  # fail here, not in the child
    _server_args(port or DEFAULT_PORT, threads)
    for attempt in range(3):
        p = port or free_port(host)
        fd, log_path = tempfile.mkstemp(prefix="ggml-rpc-", suffix=".log")
        cmd = [sys.executable, "-m", "ggml_py.rpc_server", "--protocol", str(protocol),
               "--host", host, "--port", str(p), "--threads", str(threads)] \
            + (["--cache", cache_dir] if cache_dir else [])
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        server = ServerProcess(proc, host, p, log_path, protocol)
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
                                 description="Run ggml's RPC server on this machine's CPU: ggml "
                                             "0.10.1's (protocol 4) or llama.cpp's of "
                                             "llama-cpp-python 0.3.36 (protocol 7).")
    ap.add_argument("--protocol", type=int, choices=PROTOCOLS, default=4,
                    help="4: ggml 0.10.1's server (default); 7: llama.cpp's")
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
        serve(a.host, a.port, a.threads, a.cache, a.protocol)
    except GgmlPyError as e:
        print(f"rpc_server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
