"""The README keeps its promises: its Python examples type-check under `mypy --strict`
and run, and its two set-up commands are the ones CI reads."""

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile

import pytest
from conftest import REPO_ROOT, require_ggml_rpc

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLES = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 3


def test_readme_examples_pass_mypy_strict(tmp_path):
    files = []
    for k, code in enumerate(EXAMPLES):
        f = tmp_path / f"readme_example_{k}.py"
        f.write_text(code)
        files.append(str(f))
    # from the repository root mypy reads the package and its stubs (ggml_py/**/_*.pyi);
    # errors inside the package are not the examples' (silent), their types are
    # the cache lives in build/ (ignored by git): warm, the check takes a second
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(REPO_ROOT / "build" / "mypy-cache"), *files],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_stubs_pass_mypy_strict():
    # a plain `pip install .` ships the stubs, and mypy then checks them as they are:
    # an editable install's silent imports hid a bare generic in one (issue 33)
    stubs = sorted(str(p) for p in (REPO_ROOT / "ggml_py").rglob("_*.pyi"))
    assert len(stubs) >= 10
    # (the modules they import are checked by their own tests: silent here)
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(REPO_ROOT / "build" / "mypy-cache"), *stubs],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


# modules held to `mypy --strict` as a whole (the rest type their public API, which the
# README examples and the stubs check): the package's face and its Scheduler
STRICT_MODULES = ["ggml_py", "ggml_py.sched", "ggml_py.runtime", "ggml_py.plan", "ggml_py.errors"]


def test_the_scheduler_modules_pass_mypy_strict():
    modules = [arg for m in STRICT_MODULES for arg in ("-m", m)]
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(REPO_ROOT / "build" / "mypy-cache"), *modules],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_scheduler_is_exported_and_imported_on_first_use():
    # `import ggml_py` does not load the scheduler's modules; `ggml_py.Scheduler` does
    code = ("import sys, ggml_py; assert 'ggml_py.sched' not in sys.modules; "
            "from ggml_py import Scheduler, tensors_from_arrays; import ggml_py.sched; "
            "assert Scheduler is ggml_py.sched.Scheduler and 'Scheduler' in ggml_py.__all__; "
            "assert tensors_from_arrays is ggml_py.alloc.tensors_from_arrays; "
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("k", range(len(EXAMPLES)))
def test_readme_example_runs(k, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "ggml_py.rpc_server" in EXAMPLES[k]:
        require_ggml_rpc()              # the example starts ggml's own RPC servers
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(EXAMPLES[k], f"README example {k}", "exec"), {"__name__": "__readme__"})
    assert out.getvalue().strip()       # every example shows something


def test_ci_reads_the_two_setup_commands():
    r = subprocess.run([sys.executable, str(REPO_ROOT / ".ci" / "readme_commands.py"),
                        str(REPO_ROOT / "README.md")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    main, tests = r.stdout.splitlines()
    assert main.startswith("pip install .") and "ggml-py demo" in main
    assert tests.startswith("pip install -e") and "pytest" in tests
    # .ci/run takes them from the README rather than holding copies
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert main not in ci and tests not in ci and "readme_commands.py" in ci


def test_import_from_source_tree_says_what_to_do(tmp_path):
    """A source tree without compiled modules (a fresh clone after `pip install .`):
    importing ggml_py there raises an ImportError that says what to do."""
    tree = tmp_path / "clone"
    (tree / "ggml_py").mkdir(parents=True)
    (tree / "src" / "ggml_py").mkdir(parents=True)
    (tree / "src" / "ggml_py" / "_core.pyx").write_text("")
    for f in ("__init__.py", "errors.py"):
        (tree / "ggml_py" / f).write_text((REPO_ROOT / "ggml_py" / f).read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-S", "-c", "import ggml_py"], cwd=tree,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert "ImportError: ggml_py is being imported from its source tree" in r.stderr
    assert "pip install -e ." in r.stderr
