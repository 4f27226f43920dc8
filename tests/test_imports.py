"""The library imports each name from the module that defines it, never through a module
that re-exports it (ggml_py/__init__.py, models/transformer.py, a package's __init__
gathering its modules): the import graph then shows which module uses which. Tests and
users may keep the public names."""

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ggml_py"


def _source(module):
    """A ggml_py module's Python source; True for a compiled one (src/ggml_py/**/*.pyx) or a
    stub-only one (ggml_py/_types.pyi); None when there is no such module."""
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return (ROOT / "src").joinpath(*module.split(".")).with_suffix(".pyx").exists() \
        or path.with_suffix(".pyi").exists() or None


def _top_level(tree):
    """The statements of a module body in order, into its top-level if / try blocks."""
    todo = list(reversed(tree.body))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("finalbody", "orelse", "handlers", "body"):
                todo.extend(reversed(getattr(node, field, [])))


def _bindings(path):
    """{name: how the module binds it: 'def', 'import' or 'alias' (NAME = an imported name)}."""
    bound = {}
    for node in _top_level(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = "def"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            how = ("alias" if isinstance(node.value, ast.Name)
                   and bound.get(node.value.id) == "import" else "def")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        bound[n.id] = how
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.setdefault((a.asname or a.name).split(".")[0], "import")
    return bound


def test_library_modules_import_names_from_where_they_are_defined():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "ggml_py"):
                continue
            source = _source(node.module)
            assert source is not None, (path, node.module)
            if source is True:
                continue
            bound = _bindings(source)
            for a in node.names:
                if bound.get(a.name) != "def" and _source(f"{node.module}.{a.name}") is None:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} from "
                                 f"{node.module} ({bound.get(a.name, 'not defined there')})")
    assert not found, "\n".join(found)


def test_the_check_sees_re_exports_and_aliases():
    assert _bindings(PACKAGE / "__init__.py")["Context"] == "import"      # the facade
    ops = _bindings(PACKAGE / "ops.py")
    assert ops["PRECS"] == "alias" and ops["mul_mat"] == "def" and ops["_BUILDERS"] == "def"


# The compiled modules sit below the builders: they learn op and type ids from _core's
# tables (the vocabulary header) and make the tensors they need through _core's Context,
# never through ops.py (which imports them: a compiled import of it would be a cycle).
_IMPORTS_OPS = re.compile(r"^\s*(?:from\s+ggml_py\.ops\s+c?import\b|import\s+ggml_py\.ops\b"
                          r"|from\s+ggml_py\s+c?import\s+\(?[\w\s,]*\bops\b)", re.M)


def _lines_importing_ops(text):
    return [text.count("\n", 0, m.start()) + 1 for m in _IMPORTS_OPS.finditer(text)]


def test_no_compiled_module_imports_ops():
    sources = sorted(p for ext in ("pyx", "pxd") for p in (ROOT / "src").rglob(f"*.{ext}"))
    # the device kinds' modules too, in their packages
    assert ROOT / "src/ggml_py/backends/rpc/_protocol.pyx" in sources
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sources
             for line in _lines_importing_ops(p.read_text())]
    assert not found, found


def test_the_ops_import_check_sees_each_spelling():
    for text in ("        from ggml_py import ops\n", "from ggml_py import arrays, ops, quants\n",
                 "import ggml_py.ops\n", "from ggml_py.ops import mul_mat\n",
                 "from ggml_py import (quants,\n                     ops)\n"):
        assert _lines_importing_ops(text) == [1], text
    assert _lines_importing_ops("from ggml_py import opsx\nfrom ggml_py.errors import ops\n"
                                "import ggml_py.opsx\n") == []


def test_each_compiled_module_is_installed_in_the_package_of_its_source():
    # src/ggml_py/backends/cpu/_executor.pyx is ggml_py.backends.cpu._executor, built into
    # ggml_py/backends/cpu/ (CMakeLists.txt's install destination), beside its stub
    sources = sorted((ROOT / "src").rglob("*.pyx"))
    assert len(sources) >= 14
    for pyx in sources:
        name = ".".join(pyx.relative_to(ROOT / "src").with_suffix("").parts)
        module = importlib.import_module(name)
        assert module.__name__ == name
        package = pyx.parent.relative_to(ROOT / "src").parts     # ("ggml_py", "backends", "cpu")
        assert Path(module.__file__).parent.parts[-len(package):] == package, module.__file__
        assert (ROOT.joinpath(*name.split(".")).with_suffix(".pyi")).exists(), name
