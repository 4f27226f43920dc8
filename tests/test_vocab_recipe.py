"""The vocabulary's one header, ggml-py-vocab.h, and the README's "Add a unary op" recipe.

The Python tables (_core's names, which test_op_metadata.py holds to ggml 0.10.1's) are the
header's lists as the C compiler reads them. The recipe, followed for a dummy op on a copy of
the C sources: its first step, one line in the header, grows every table the vocabulary feeds
(names, count, the op's id, the C kernels' enum) consistently; its second, the C kernel, is
needed: ops.c does not compile while the op has no kernel."""

import json
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

from conftest import REPO_ROOT
from ggml_py import ops
from ggml_py._core import GLU_OP_NAMES, OP_NAMES_LIST, TYPE_NAMES, UNARY_OP_NAMES

README = REPO_ROOT / "README.md"
SRC = REPO_ROOT / "src"
KERNELS = Path("ggml_py", "backends", "cpu", "kernels")  # the CPU kernels, below src/

# prints the vocabulary as a C file including the header sees it: each list's names by id,
# and the enum value of each list's last entry
PROBE = r"""
#include <stdio.h>
#include "ggml_py/ggml-py-vocab.h"
#define LAST_OP_(NAME)    last = GGML_PY_OP_##NAME;
#define LAST_UNARY_(NAME) last = GGML_PY_UNARY_OP_##NAME;
#define LAST_GLU_(NAME)   last = GGML_PY_GLU_OP_##NAME;
#define TYPE_NAME_(ID, id, name, blck, size, vdt) type_names[id] = name;

static void list(const char * key, const char * const * names, int n, int last) {
    printf("\"%s\": {\"last_id\": %d, \"names\": [", key, last);
    for (int i = 0; i < n; i++)
        printf("%s\"%s\"", i ? ", " : "", names[i] ? names[i] : "");
    printf("]}, ");
}

int main(void) {
    int last = -1;
    const char * type_names[GGML_PY_TYPE_COUNT] = {0};
    GGML_PY_TYPES(TYPE_NAME_)
    printf("{");
    GGML_PY_OPS(LAST_OP_)
    list("ops", ggml_py_op_names, GGML_PY_OP_COUNT, last);
    GGML_PY_UNARY_OPS(LAST_UNARY_)
    list("unary", ggml_py_unary_op_names, GGML_PY_UNARY_OP_COUNT, last);
    GGML_PY_GLU_OPS(LAST_GLU_)
    list("glu", ggml_py_glu_op_names, GGML_PY_GLU_OP_COUNT, last);
    list("types", type_names, GGML_PY_TYPE_COUNT, -1);
    printf("\"end\": 0}\n");
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
    return subprocess.run([_cc(), "-std=c11", "-fsyntax-only", "-I", str(src_root / KERNELS),
                           str(path)], capture_output=True, text=True)


def _copy_sources(tmp_path):
    """The C headers and kernels, laid out as in src/."""
    copy = tmp_path / "src"
    shutil.copytree(SRC / "ggml_py", copy / "ggml_py", ignore=shutil.ignore_patterns("*.pyx", "*.pxd"))
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
    # the names _core has (held to ggml 0.10.1's by test_op_metadata.py) are the C enums'
    seen = _compile_and_run(tmp_path, SRC)
    assert tuple(seen["ops"]["names"]) == OP_NAMES_LIST
    assert tuple(seen["unary"]["names"]) == UNARY_OP_NAMES == ops.UNARY_OPS
    assert tuple(seen["glu"]["names"]) == GLU_OP_NAMES == ops.GLU_OPS
    assert seen["types"]["names"] == [n or "" for n in TYPE_NAMES]
    for key in ("ops", "unary", "glu"):
        assert seen[key]["last_id"] == len(seen[key]["names"]) - 1, key


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
    before = _compile_and_run(tmp_path, copy)["unary"]
    h = copy / header
    h.write_text(_add_to_list(h.read_text(), macro, line))

    # every table of the vocabulary grew by the one op, at the end, with the next id
    after = _compile_and_run(tmp_path, copy)["unary"]
    assert after["names"] == before["names"] + ["DUMMY"]
    assert after["last_id"] == len(before["names"])

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
    ops_c = copy / KERNELS / "ops.c"
    text = ops_c.read_text()
    at = text.index("        case ", text.index("static void unary_row("))
    ops_c.write_text(text[:at] + "        case U_DUMMY: break;\n" + text[at:])
    r = _syntax_check(ops_c, copy)
    assert r.returncode != 0 and "U_DUMMY" in r.stderr, r.stderr
