"""The C-speed paths of `ggml-py plan` (ggml_py._caseio, Scheduler.plan_tables) against
the Python they stand in for: json.dumps with indent=1, json.loads, the case checks in
words, the tensor builder's API and the scheduler's per-tensor answers."""

import copy
import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from ggml_py._caseio import (document_tables, json_text, read_case_tables,
                             read_json_value)
from ggml_py._core import layout_is_current
from ggml_py.errors import ArgumentError
from ggml_py.tools import cases
from ggml_py.tools.cases import format_case, load_case
from ggml_py.tools.planning import plan_case

from conftest import case_files
from test_cases_io import small_case

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers() | st.booleans() | st.none(), inner,
                      max_size=4),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_json_text_is_json_dumps_indent_1(value):
    assert json_text(value) == json.dumps(value, indent=1)


def test_json_text_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        json_text({"a": [object()]})


def _checks_in_words(d):
    """The case checks of ggml_py.tools.cases, every one run in words."""
    buffer_types, backends = cases._check_header(d)
    tensors, names = d["tensors"], [b.name for b in backends]
    for i, t in enumerate(tensors):
        cases._check_tensor(i, t, len(tensors), buffer_types, names)
    cases._check_views(tensors)
    cases._check_acyclic(tensors)
    cases._check_graph_lists(d, len(tensors))
    return buffer_types, names


def _typed_checks(d, buffer_types, names):
    tables = document_tables(d["tensors"], d["nodes"], d["leafs"])
    return tables is not None and tables.check(buffer_types, names)


def test_typed_checks_pass_every_shared_case(case_path):
    d = json.loads(case_path.read_text())
    buffer_types, names = _checks_in_words(d)
    assert _typed_checks(d, buffer_types, names)


FIELDS = ("id", "name", "op", "type", "ne", "nb", "src", "view_src", "view_offs", "flags",
          "buffer", "backend")
odd_values = (json_scalars | st.sampled_from(["MUL_MAT", "VIEW", "f32", "q4_0", "INPUT", "CPU",
                                              "GPU0", "weights", "x" * 64])
              | st.lists(st.integers(-3, 2**64) | st.none() | st.sampled_from(["INPUT", "OUTPUT"]),
                         max_size=11)
              | st.fixed_dictionaries({"buffer_type": st.sampled_from(["CPU", "GPU0", "X"]),
                                       "usage": st.sampled_from(["any", "weights", "bad"])}))


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_typed_checks_never_clear_what_the_words_refuse(data):
    """The typed pass may doubt a sound file (the words then load it), never clear a
    faulty one: whatever it passes, every check in words passes too."""
    d = small_case()
    tensors = d["tensors"]
    for _ in range(data.draw(st.integers(1, 3))):
        t = tensors[data.draw(st.integers(0, len(tensors) - 1))]
        field = data.draw(st.sampled_from(FIELDS + ("-", "+")))
        if field == "-":
            del t[data.draw(st.sampled_from(sorted(t)))]
        elif field == "+":
            t["extra"] = 0
        elif isinstance(t.get(field), list) and t[field] and data.draw(st.booleans()):
            t[field][data.draw(st.integers(0, len(t[field]) - 1))] = data.draw(odd_values)
        else:
            t[field] = data.draw(odd_values)
    if data.draw(st.booleans()):
        d[data.draw(st.sampled_from(["nodes", "leafs"]))].append(data.draw(st.integers(-1, 9)))
    buffer_types = cases.buffer_types_from_dicts(d["backends"])
    names = [b["name"] for b in d["backends"]]
    if _typed_checks(d, buffer_types, names):
        _checks_in_words(copy.deepcopy(d))


def test_loaded_tensors_have_current_layouts_and_flags(case_path):
    d = json.loads(case_path.read_text())
    case = load_case(d)
    for t, td in zip(case.tensors, d["tensors"]):
        assert layout_is_current(t)
        assert sorted(t.flags) == sorted(td["flags"])


@pytest.mark.parametrize("path", case_files(("", "random")), ids=lambda p: p.name)
def test_plan_tables_answer_as_the_scheduler_does(path):
    """Every table of the plan read in bulk equals the scheduler's answer per tensor."""
    case = load_case(path)
    sched, plan = plan_case(case, alloc=not case.parallel)
    tok = sched.token
    bname = lambda b: None if b is None else b.name  # noqa: E731
    nodes, leafs = case.graph.nodes, case.graph.leafs
    assert plan.node_backends == [bname(sched.get_tensor_backend(n)) for n in nodes]
    assert plan.leaf_backends == [bname(sched.get_tensor_backend(t)) for t in leafs]
    assert plan.node_srcs == [[tok(s) for s in n.src] for n in nodes]
    assert plan.causes == [sched.get_cause(n) for n in nodes]
    gnodes, gnb, gleafs, glb = sched.graph_copy
    assert plan.graph_copy == {"nodes": [tok(t) for t in gnodes],
                               "node_backends": [bname(b) for b in gnb],
                               "leafs": [tok(t) for t in gleafs],
                               "leaf_backends": [bname(b) for b in glb]}
    if sched.is_alloc:
        assert plan.alloc["graph_copy_nodes"] == [list(sched.tensor_location(t)) for t in gnodes]
        assert plan.alloc["graph_copy_leafs"] == [list(sched.tensor_location(t)) for t in gleafs]
    for explain in (False, True):
        assert plan.to_json(explain) == json.dumps(plan.to_dict(explain), indent=1)


def test_strides_past_int64_are_refused_as_the_builder_refuses_them():
    """The case checks take strides up to SIZE_MAX; the tensor builder refuses those
    past INT64_MAX (an ArgumentError) -- with the typed build as before it."""
    d = small_case()
    t = next(t for t in d["tensors"] if t["ne"][3] == 1)
    t["nb"][3] = 2**63
    with pytest.raises(ArgumentError, match="nb must be in"):
        load_case(d)


# ---------------------------------------------------------------------------
# the typed reader against json.loads

def _loads(data):
    """json.loads as read_json reads a file: UTF-8 text, a BOM allowed."""
    return json.loads(data.decode("utf-8-sig"))


def _same(a, b):
    """Equal JSON values of the same kinds (True is not 1, 1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _reads_as_json_loads(data):
    """read_json_value(data) is json.loads's value, or a ValueError where the reader
    leaves the text to json.loads; the reader never takes what json.loads refuses."""
    try:
        expected = _loads(data)
    except (ValueError, RecursionError):
        expected = None
        with pytest.raises(ValueError):
            read_json_value(data)
        return False
    try:
        got = read_json_value(data)
    except ValueError:
        return False
    assert _same(got, expected)
    return True


json_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    [r"\ud83d\ude00", r"\ud800", r"\udc00x", r"\ud800\u0041", r"a\u00e9\n\t\\\"\/",
     r"\u0000", r"\uD834\uDD1E", r"\ud83d\ude0", r"\x", "\ud800", "\u00e9", "\x01"])
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=4),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(plain_values, st.booleans(), st.sampled_from([None, 0, 2, "\t"]),
       st.sampled_from([(", ", ": "), (",", ":"), (" ,\r\n", " :\t")]), st.booleans())
def test_the_reader_reads_json_as_json_loads(value, ascii, indent, separators, bom):
    text = json.dumps(value, ensure_ascii=ascii, indent=indent, separators=separators)
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode()
    assert _reads_as_json_loads(data)       # and takes every such document


@settings(max_examples=400, deadline=None)
@given(st.lists(json_texts | st.sampled_from(
    ["0", "-0", "01", "1.", ".5", "1e5", "1E+2", "2e", "-", "--1", "1.5e-3", "NaN", "-Infinity",
     "true", "tru", "null", "nul", "[", "]", "{", "}", ",", ":", "\"", " ", "\n", "\x00",
     "\x7f", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "\u00e9"]), max_size=12),
    st.binary(max_size=3))
def test_the_reader_never_takes_what_json_loads_refuses(pieces, noise):
    """Texts near JSON (tokens strung at random, stray bytes, escapes, surrogates):
    where json.loads refuses, so does the reader; where both read, the values agree."""
    for data in ("".join(pieces).encode("utf-8", "surrogatepass"),
                 ("[" + ",".join(pieces) + "]").encode("utf-8", "surrogatepass") + noise,
                 ('"' + "".join(pieces) + '"').encode("utf-8", "surrogatepass")):
        _reads_as_json_loads(data)


def test_the_reader_leaves_deep_nesting_to_json_loads():
    assert _reads_as_json_loads(b"[" * 100 + b"]" * 100)
    assert not _reads_as_json_loads(b"[" * 101 + b"]" * 101)
    with pytest.raises(ValueError, match="byte 3: a value"):
        read_json_value(b"[1,")


def _typed_read_agrees(data):
    """read_case_tables(data) either refuses (ValueError) or reads what json.loads and
    document_tables read: the same header, the same tables."""
    try:
        header, tables = read_case_tables(data)
    except ValueError:
        return False
    d = _loads(data)
    assert _same(header, {k: v for k, v in d.items() if k not in ("tensors", "nodes", "leafs")})
    expected = document_tables(d["tensors"], d["nodes"], d["leafs"])
    assert expected is not None and tables.rows() == expected.rows()
    return True


def test_the_case_reader_reads_every_shared_case(case_path):
    assert _typed_read_agrees(case_path.read_bytes())


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_the_case_reader_reads_a_changed_case_as_json_loads_does(data):
    """A case file's text with a piece cut, doubled or replaced: the typed reader
    refuses it or reads it as json.loads and the typed checks of the parsed case do."""
    text = format_case(small_case())
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, min(len(text), start + 12)))
    piece = data.draw(st.sampled_from(["", text[start:end] * 2, "1", "-1", "null", "[]", "{}",
                                       '"x"', "\\u0041", "\u00e9", ",", '"id": 0, ', "1e3",
                                       "18446744073709551616", "9223372036854775808"]))
    _typed_read_agrees((text[:start] + piece + text[end:]).encode())


def test_a_file_the_reader_leaves_loads_as_its_dict(tmp_path):
    """An escape in an enumerated field is JSON, but not the typed reader's: json.loads
    and the checks in words load the file, to the same case as its dict."""
    d = small_case()
    text = format_case(d).replace('"op": "NONE"', '"op": "N\\u004fNE"', 1)
    path = tmp_path / "escaped.case.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="an escape in an enumerated field"):
        read_case_tables(path.read_bytes())
    assert load_case(str(path)).to_dict() == load_case(d).to_dict()


@pytest.mark.parametrize("change", [
    lambda t: t.update(id=7), lambda t: t.update(ne=[1, 2, 3]), lambda t: t.update(src=[99]),
    lambda t: t.update(flags=["INPUT", "INPUT"]), lambda t: t.update(backend="GPU9"),
    lambda t: t.update(buffer={"buffer_type": "nowhere", "usage": "any"}),
    lambda t: t.update(name="x" * 64), lambda t: t.update(view_offs=-1)])
def test_a_faulty_file_is_refused_as_its_dict(tmp_path, change):
    d = small_case()
    change(d["tensors"][1])
    path = tmp_path / "faulty.case.json"
    path.write_text(format_case(d))
    with pytest.raises(cases.CaseFormatError) as from_dict:
        load_case(copy.deepcopy(d))
    with pytest.raises(cases.CaseFormatError) as from_file:
        load_case(str(path))
    assert str(from_file.value) == str(from_dict.value)


def test_the_reader_takes_utf8_as_pythons_strict_decoder_does():
    """Every string of 1-4 bytes drawn from the edges of UTF-8's ranges (overlong forms,
    surrogates, past U+10FFFF, cut sequences): the reader takes it where bytes.decode
    does."""
    edges = [0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC1, 0xC2, 0xDF, 0xE0, 0xED,
             0xEF, 0xF0, 0xF4, 0xF5]
    for k in range(1, 5):
        for seq in itertools.product(edges, repeat=k):
            b = bytes(seq)
            try:
                b.decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            assert _reads_as_json_loads(b'"' + b + b'"') == valid, b
