"""Shared test fixtures: where the reference data is, and which files there are.

The reference data (ggml 0.10.1's scheduling cases and op cases, copied
byte-identical from the project's shared folder) lives in tests/data, so a
fresh clone tests itself. GGML_PY_SHARED points the tests at another folder of
the same layout (cases/, ops/) for newer data.
"""

import os
import pathlib

import pytest
from hypothesis import settings

# CI machines are small and noisy: no per-example deadlines anywhere
settings.register_profile("ggml_py", deadline=None)
settings.load_profile("ggml_py")

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"
CASE_SUBDIRS = ("", "random", "aborts")


def shared_path() -> pathlib.Path:
    """The reference data folder: GGML_PY_SHARED, else tests/data."""
    override = os.environ.get("GGML_PY_SHARED")
    return pathlib.Path(override) if override else DATA_DIR


def ops_dir() -> pathlib.Path:
    """The op cases and model files (ops/, ops/models/)."""
    return shared_path() / "ops"


def case_files(subdirs=CASE_SUBDIRS):
    """Every *.case.json under cases/ (named, random/, aborts/), sorted."""
    root = shared_path() / "cases"
    files = []
    for sub in subdirs:
        files.extend(sorted((root / sub).glob("*.case.json")))
    if not files:
        raise RuntimeError(f"no scheduling cases under {root}: the reference data is missing")
    return files


def require_opencl():
    """At the top of a test module: skip it when no OpenCL device is there, or fail
    it when GGML_PY_REQUIRE_OPENCL=1 says one must be (CI with PoCL)."""
    from ggml_py.backends import opencl
    ok, reason = opencl.available()
    if not ok:
        if os.environ.get("GGML_PY_REQUIRE_OPENCL") == "1":
            pytest.fail(f"GGML_PY_REQUIRE_OPENCL=1 but OpenCL is unavailable: {reason}",
                        pytrace=False)
        pytest.skip(f"OpenCL unavailable: {reason}", allow_module_level=True)


@pytest.fixture(scope="session")
def shared_dir():
    return shared_path()


def pytest_generate_tests(metafunc):
    # a test taking `case_path` runs once per case file
    if "case_path" in metafunc.fixturenames:
        files = case_files()
        root = shared_path() / "cases"
        ids = [str(f.relative_to(root)).removesuffix(".case.json") for f in files]
        metafunc.parametrize("case_path", files, ids=ids)


# ---------------------------------------------------------------------------
# ggml's own RPC servers (tests/test_rpc*.py): protocol 4 (ggml 0.10.1's) and protocol 7
# (llama.cpp's, from llama-cpp-python 0.3.36)

RPC_PROTOCOLS = (4, 7)


def require_ggml_rpc(protocol=4):
    """Skip unless the libraries of the RPC server of `protocol` are installed (4: ggml
    0.10.1's, .ci/install-ggml-rpc; 7: llama-cpp-python's, .ci/install-llama-rpc);
    GGML_PY_REQUIRE_RPC=1 (CI) turns the skip into a failure."""
    from ggml_py.rpc_server import GgmlLibraryError, library_dir
    try:
        library_dir(protocol)
    except GgmlLibraryError as e:
        if os.environ.get("GGML_PY_REQUIRE_RPC") == "1":
            pytest.fail(f"GGML_PY_REQUIRE_RPC=1 but {e}", pytrace=False)
        pytest.skip(f"ggml's RPC server of protocol {protocol} is not installed: {e}",
                    allow_module_level=True)


@pytest.fixture(scope="session", params=RPC_PROTOCOLS, ids=lambda v: f"v{v}")
def rpc_protocol(request):
    """Each RPC server version in turn (a test taking it, or a server fixture, runs
    once per version); skipped where that server is not installed."""
    require_ggml_rpc(request.param)
    return request.param


@pytest.fixture(scope="session")
def rpc_servers(rpc_protocol):
    """Two ggml RPC servers (one thread each) of the protocol version at hand on free
    127.0.0.1 ports for the session, killed at its end."""
    from ggml_py.rpc_server import start_server
    servers = []
    try:
        for _ in range(2):
            servers.append(start_server(threads=1, protocol=rpc_protocol))
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def rpc_server_factory(rpc_protocol):
    """start(**kw) -> a fresh ggml RPC server of this test (one thread, the protocol
    version at hand), killed after it."""
    from ggml_py.rpc_server import start_server
    started = []

    def start(**kw):
        started.append(start_server(**{"threads": 1, "protocol": rpc_protocol, **kw}))
        return started[-1]
    yield start
    for s in started:
        s.stop()
