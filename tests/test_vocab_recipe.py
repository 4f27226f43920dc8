"""The README's "Add a unary op" recipe, followed for a dummy op on a copy of the C sources.

Its first step, one line in ggml-py-vocab.h, must grow every table the vocabulary feeds
(names, count, the op's id, the C kernels' enum) consistently; its second, the C kernel,
must be needed: ops.c does not compile while the op has no kernel. The Python tables
(_core.UNARY_OP_NAMES, ops.UNARY_OPS) are the header's, as the C compiler reads it."""

import json
import re
import shutil
import subprocess
import sysconfig

from conftest import REPO_ROOT
from ggml_py import ops
from ggml_py._core import UNARY_OP_NAMES

README = REPO_ROOT / "README.md"
SRC = REPO_ROOT / "src"

# prints the unary ops as a C file including the header sees them
PROBE = r"""
#include <stdio.h>
#include "ggml_py/ggml-py-vocab.h"
#define LAST_(NAME) last = GGML_PY_UNARY_OP_##NAME;
int main(void) {
    int last = -1;
    GGML_PY_UNARY_OPS(LAST_)
    printf("{\"count\": %d, \"last_id\": %d, \"names\": [", (int)GGML_PY_UNARY_OP_COUNT, last);
    for (int i = 0; i < GGML_PY_UNARY_OP_COUNT; i++)
        printf("%s\"%s\"", i ? ", " : "", ggml_py_unary_op_names[i]);
    printf("]}\n");
    return 0;
}
"""


def _recipe():
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Add a unary op"))
    steps = []
    for line in lines[start + 1:]:
        if not re.match(r"\d+\. ", line):
            break
        steps.append(line)
    return [lines[start]] + steps


def _cc():
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or "gcc"


def _compile_and_run(tmp_path, src_root):
    c = tmp_path / "probe.c"
    c.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run([_cc(), "-std=c11", "-I", str(src_root), str(c), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True,
                                     text=True).stdout)


def _syntax_check(path, src_root):
    return subprocess.run([_cc(), "-std=c11", "-fsyntax-only", "-I", str(src_root / "ggml-py-cpu"),
                           str(path)], capture_output=True, text=True)


def _copy_sources(tmp_path):
    """The C headers and kernels, laid out as in src/."""
    copy = tmp_path / "src"
    shutil.copytree(SRC / "ggml_py", copy / "ggml_py", ignore=shutil.ignore_patterns("*.pyx", "*.pxd"))
    shutil.copytree(SRC / "ggml-py-cpu", copy / "ggml-py-cpu")
    return copy


def _add_to_list(text, macro, entry):
    """`entry` at the end of the X-macro list `macro` (its last line has no backslash)."""
    start = text.index(f"#define {macro}(X)")
    end = text.index("\n", start)
    while text[end - 1] == "\\":
        end = text.index("\n", end + 1)
    return text[:end] + f" {entry}" + text[end:]


def test_the_recipe_fits_in_five_lines():
    assert len(_recipe()) <= 5


def test_the_python_tables_are_the_headers(tmp_path):
    seen = _compile_and_run(tmp_path, SRC)
    assert tuple(seen["names"]) == UNARY_OP_NAMES == ops.UNARY_OPS
    assert seen["count"] == len(UNARY_OP_NAMES) and seen["last_id"] == seen["count"] - 1


def test_a_dummy_unary_op_from_the_recipe_alone(tmp_path):
    step_header, step_kernel = _recipe()[1:3]
    # step 1: the header line, as the recipe says it
    entry = re.search(r"`(X\(NAME\))` at the end of `(\w+)` \(`src/([^`]+)`\)", step_header)
    assert entry, step_header
    line, macro, header = entry.group(1).replace("NAME", "DUMMY"), entry.group(2), entry.group(3)
    # step 2: the C kernel, as a case of the function the recipe names, in its file
    kernel = re.search(r"`(case U_NAME:)` in `(\w+)` \(`src/([^`]+)`", step_kernel)
    assert kernel, step_kernel
    case, function, c_file = kernel.group(1).replace("NAME", "DUMMY"), kernel.group(2), kernel.group(3)

    copy = _copy_sources(tmp_path)
    before = _compile_and_run(tmp_path, copy)
    h = copy / header
    h.write_text(_add_to_list(h.read_text(), macro, line))

    # every table of the vocabulary grew by the one op, at the end, with the next id
    after = _compile_and_run(tmp_path, copy)
    assert after["names"] == before["names"] + ["DUMMY"]
    assert after["count"] == before["count"] + 1 and after["last_id"] == before["count"]

    # the C kernels' enum grew with it, and without its kernel the CPU executor does not build
    kernels = copy / c_file
    r = _syntax_check(kernels, copy)
    assert r.returncode != 0 and "U_DUMMY" in r.stderr, r.stderr
    text = kernels.read_text()
    body = text.index(f"static void {function}(")
    at = text.index("        case ", body)
    kernels.write_text(text[:at] + f"        {case} for (int64_t i = 0; i < n; i++) y[i] = x[i]; "
                       "break;\n" + text[at:])
    r = _syntax_check(kernels, copy)
    assert r.returncode == 0, r.stderr


def test_a_kernel_for_an_op_the_header_lacks_does_not_build(tmp_path):
    # the other way round: the C kernels name ops by the header's ids only
    copy = _copy_sources(tmp_path)
    ops_c = copy / "ggml-py-cpu" / "ops.c"
    text = ops_c.read_text()
    at = text.index("        case ", text.index("static void unary_row("))
    ops_c.write_text(text[:at] + "        case U_DUMMY: break;\n" + text[at:])
    r = _syntax_check(ops_c, copy)
    assert r.returncode != 0 and "U_DUMMY" in r.stderr, r.stderr
