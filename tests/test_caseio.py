"""The C-speed paths of `ggml-py plan` (ggml_py._caseio, Scheduler.plan_tables) against
the Python they stand in for: json.dumps with indent=1, the case checks in words,
the tensor builder's API and the scheduler's per-tensor answers."""

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from ggml_py._caseio import case_tensors_ok, json_text
from ggml_py._core import layout_is_current
from ggml_py.errors import ArgumentError
from ggml_py.tools import cases
from ggml_py.tools.cases import load_case
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
    buffer_types, backends = cases._check_case(d)
    tensors, names = d["tensors"], [b.name for b in backends]
    for i, t in enumerate(tensors):
        cases._check_tensor(i, t, len(tensors), buffer_types, names)
    cases._check_views(tensors)
    cases._check_acyclic(tensors)
    cases._check_graph_lists(d, len(tensors))
    return buffer_types, names


def test_typed_checks_pass_every_shared_case(case_path):
    d = json.loads(case_path.read_text())
    buffer_types, names = _checks_in_words(d)
    assert case_tensors_ok(d["tensors"], d["nodes"], d["leafs"], buffer_types, names)


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
    if case_tensors_ok(d["tensors"], d["nodes"], d["leafs"], buffer_types, names):
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
