"""Shared test fixtures: where the shared case files are, and which there are.

The shared folder (SCHED_CASES.md and cases/) is found through the
GGML_PY_SHARED environment variable, else the `shared` folder beside the
repository root. Tests that need it skip when it is missing.
"""

import os
import pathlib

import pytest
from hypothesis import settings

# CI machines are small and noisy: no per-example deadlines anywhere
settings.register_profile("ggml_py", deadline=None)
settings.load_profile("ggml_py")

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
CASE_SUBDIRS = ("", "random", "aborts")


def shared_path():
    """The shared folder (it may not exist)."""
    return pathlib.Path(os.environ.get("GGML_PY_SHARED", REPO_ROOT.parent / "shared"))


def case_files(subdirs=CASE_SUBDIRS):
    """Every *.case.json under shared/cases (named, random/, aborts/), sorted;
    empty when the folder is missing."""
    root = shared_path() / "cases"
    files = []
    for sub in subdirs:
        files.extend(sorted((root / sub).glob("*.case.json")))
    return files


@pytest.fixture(scope="session")
def shared_dir():
    path = shared_path()
    if not (path / "cases").is_dir():
        pytest.skip(f"shared case folder not found at {path} (set GGML_PY_SHARED)")
    return path


def pytest_generate_tests(metafunc):
    # a test taking `case_path` runs once per shared case file (skipped if none)
    if "case_path" in metafunc.fixturenames:
        files = case_files()
        root = shared_path() / "cases"
        ids = [str(f.relative_to(root)).removesuffix(".case.json") for f in files]
        metafunc.parametrize("case_path", files, ids=ids)
