"""Graph reuse is correct only where its fingerprint covers what the split reads.

The passes (src/ggml_py/_sched.pyx) declare, function by function, the ggml_tensor fields
they read (TENSOR_READS), directly or through the helpers of other modules they hand a
tensor to (CALLEE_READS). Graph reuse (src/ggml_py/_reuse.pyx) compares a rebuilt graph
with the plan's fingerprint (fp_record describes, fp_tensor_matches / fp_matches
compare) and names the fields it does not compare tensor by tensor, with the reason each cannot change
the plan (NOT_COMPARED). These tests hold both declarations to the source: a read a pass
adds without declaring it fails, and so does a declared read the fingerprint does not
cover.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggml_py import _reuse, _sched

SRC = Path(__file__).resolve().parent.parent / "src" / "ggml_py"


def tensor_fields() -> set[str]:
    """The fields of ggml_tensor, from the one struct header."""
    text = (SRC / "ggml-py-types.h").read_text()
    body = text[text.index("typedef struct __attribute__((aligned(64))) ggml_tensor {"):]
    body = body[:body.index("} ggml_tensor;")]
    return set(re.findall(r"^\s+[\w ]+?\**\s+\**(\w+)(?:\[\w+\])?;", body, re.M))


FIELDS = tensor_fields()


def functions(source: str) -> dict[str, str]:
    """{name: text} of the module-level cdef functions of a .pyx source."""
    out = {}
    for chunk in re.split(r"\n(?=\S)", source):
        m = re.match(r"cdef (?:inline )?[\w\s*]+?\b(\w+)\(", chunk)
        if m and not chunk.startswith("cdef class"):
            out[m.group(1)] = chunk
    return out


def direct_reads(text: str) -> set[str]:
    """The ggml_tensor fields a function's text names (`x.field`), but for its own
    state (s.*: SchedCore's groups hold no ggml_tensor fields); a tensor's first 8
    bytes read as one word are its op and flags."""
    code = re.sub(r'"""[\s\S]*?"""|#[^\n]*', "", text)      # docstrings and comments
    reads = {f for f in re.findall(r"(?<!\bs)\.(\w+)\b", code) if f in FIELDS}
    if re.search(r"\(<(?:const )?uint64_t \*>\w+\)\[0\]", code):
        reads |= {"op", "flags"}
    return reads


def scanned_reads(text: str, callees: dict[str, tuple[str, ...]]) -> set[str]:
    reads = direct_reads(text)
    code = re.sub(r'"""[\s\S]*?"""|#[^\n]*', "", text)
    for name, fields in callees.items():
        if re.search(rf"\b{name}\(", code):
            reads |= set(fields)
    return reads


def undeclared_reads(source: str, declared: dict[str, tuple[str, ...]],
                     callees: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """{function: fields it reads but does not declare, or declares but does not read}."""
    out = {}
    funcs = functions(source)
    for name, text in funcs.items():
        diff = scanned_reads(text, callees) ^ set(declared.get(name, ()))
        if diff:
            out[name] = diff
    for name in set(declared) - set(funcs):
        out[name] = {"(no such function)"}
    return out


def compared_fields(source: str) -> set[str]:
    """What the fingerprint describes and compares of every tensor of the graph: the
    fields both fp_record (which describes the plan's tensor) and fp_tensor_matches
    (which compares a rebuilt graph's with the description) read."""
    funcs = functions(source)
    fields = (scanned_reads(funcs["fp_record"], _sched.CALLEE_READS)
              & scanned_reads(funcs["fp_tensor_matches"], _sched.CALLEE_READS))
    if "ne" in fields:
        # ne, nb and op_params are compared as one block from &t.ne[0] (FP_LAYOUT_WORDS,
        # laid out side by side: fp_check_layout refuses to import otherwise)
        fields |= {"nb", "op_params"}
    return fields


def uncovered(declared: dict[str, tuple[str, ...]], compared: set[str],
              exempt: dict[str, str]) -> set[str]:
    read = set().union(*map(set, declared.values()))
    return read - compared - set(exempt)


SCHED = (SRC / "_sched.pyx").read_text()
REUSE = (SRC / "_reuse.pyx").read_text()


def test_fields_parsed():
    assert {"op", "flags", "src", "view_src", "buffer", "data", "ne", "nb", "op_params",
            "name", "order", "src_mask", "layout", "view_offs", "type"} <= FIELDS


def test_every_read_of_the_passes_is_declared():
    assert undeclared_reads(SCHED, _sched.TENSOR_READS, _sched.CALLEE_READS) == {}


def test_the_fingerprint_covers_every_declared_read():
    compared = compared_fields(REUSE)
    assert uncovered(_sched.TENSOR_READS, compared, _reuse.NOT_COMPARED) == set()
    # an exemption stands only for a field that is not compared
    assert not set(_reuse.NOT_COMPARED) & compared


@pytest.mark.parametrize("field", ["extra", "written", "gen"])
def test_a_new_read_in_a_pass_fails(field):
    """A pass that starts reading a field nobody declared (here pass 3, in a copy of the
    source) is found, and once declared, the fingerprint's gap is."""
    anchor = "cdef int pass3_upgrade(SchedCore s, ggml_cgraph * graph) except -1:\n"
    assert anchor in SCHED
    body = SCHED[SCHED.index(anchor) + len(anchor):]
    doc_end = body.index('"""', body.index('"""') + 3) + 3
    mutated = SCHED.replace(anchor + body[:doc_end],
                            anchor + body[:doc_end] + f"\n    cdef object x = graph.nodes[0].{field}")
    assert undeclared_reads(mutated, _sched.TENSOR_READS, _sched.CALLEE_READS) == {
        "pass3_upgrade": {field}}
    declared = dict(_sched.TENSOR_READS)
    declared["pass3_upgrade"] = (*declared.get("pass3_upgrade", ()), field)
    assert undeclared_reads(mutated, declared, _sched.CALLEE_READS) == {}
    assert uncovered(declared, compared_fields(REUSE), _reuse.NOT_COMPARED) == {field}


def test_a_helper_call_counts_as_its_reads():
    """Handing a tensor to a helper of another module reads what the helper reads."""
    anchor = "cdef int pass3_upgrade(SchedCore s, ggml_cgraph * graph) except -1:\n"
    mutated = SCHED.replace(anchor, anchor + "    tensor_name(graph.nodes[0])\n")
    assert undeclared_reads(mutated, _sched.TENSOR_READS, _sched.CALLEE_READS)[
        "pass3_upgrade"] == set(_sched.CALLEE_READS["tensor_name"]) - set(
        _sched.TENSOR_READS.get("pass3_upgrade", ()))


def test_a_comparison_dropped_from_the_fingerprint_fails():
    """fp_tensor_matches forgetting a view's offset (in a copy of the source) leaves the
    passes' reads of it uncovered, though fp_record still describes it."""
    line = "        diff |= <uint64_t>t.view_offs ^ <uint64_t>r.view_offs\n"
    assert line in REUSE
    weaker = REUSE.replace(line, "        pass\n")
    assert "view_offs" in direct_reads(functions(weaker)["fp_record"])
    assert uncovered(_sched.TENSOR_READS, compared_fields(weaker),
                     _reuse.NOT_COMPARED) == {"view_offs"}
