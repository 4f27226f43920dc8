"""Case files: loading, checking, writing back, and the simulated backends they describe."""

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from ggml_py import Backend, CaseFormatError, BackendError
from ggml_py._backend import get_buffer, set_buffer
from ggml_py.backends import SimBackend, SimBufferType, get_backend_class, available
from ggml_py.tools.cases import load_case, dump_case, format_case


# ---------------------------------------------------------------------------
# reference rules of SCHED_CASES.md, written out independently


def ref_batch(op, ne):
    if op == "GET_ROWS":
        return 0
    if op == "MUL_MAT":
        return ne[1]
    if op in ("MUL_MAT_ID", "ROPE", "ROPE_BACK"):
        return ne[2]
    return ne[1] * ne[2] * ne[3]


def ref_supports_op(b, op):
    return (b["supports_ops"] == "*" or op in b["supports_ops"]) and op not in b["unsupported_ops"]


def ref_offload_op(b, op, ne):
    return ((b["offload_ops"] == "*" or op in b["offload_ops"])
            and ref_batch(op, ne) >= b["offload_min_batch"])


# ---------------------------------------------------------------------------
# a small valid case to mutate


def backend_dict(name, device_type="gpu", buft=None, is_host=False, alignment=32, max_size=None,
                 supports_bufts=None, supports_ops="*", unsupported_ops=(), offload_ops=(),
                 offload_min_batch=0):
    buft = buft or name
    return {"name": name, "device_type": device_type, "buffer_type": buft,
            "buffer_type_is_host": is_host, "buffer_type_alignment": alignment,
            "buffer_type_max_size": max_size,
            "supports_buffer_types": [buft] if supports_bufts is None else list(supports_bufts),
            "supports_ops": supports_ops, "unsupported_ops": list(unsupported_ops),
            "offload_ops": offload_ops if offload_ops == "*" else list(offload_ops),
            "offload_min_batch": offload_min_batch}


def tensor_dict(i, name, op, type, ne, nb, src=(), view_src=None, view_offs=0, flags=None,
                buffer=None, backend=None):
    if flags is None:
        flags = [] if op == "NONE" else ["COMPUTE"]
    return {"id": i, "name": name, "op": op, "type": type, "ne": list(ne), "nb": list(nb),
            "src": list(src), "view_src": view_src, "view_offs": view_offs, "flags": flags,
            "buffer": buffer, "backend": backend}


def small_case():
    """A GPU weight, an input, a matmul, a view of it, a KV-cache-like buffer
    with a view into it and a CPY into that view (ggml_cpy's shape)."""
    cpu_any = {"buffer_type": "CPU", "usage": "any"}
    return {
        "format": "ggml-sched-case/1",
        "name": "small",
        "graph_size": 16,
        "parallel": False,
        "op_offload": True,
        "backends": [
            backend_dict("GPU0", alignment=64, max_size=4096, unsupported_ops=["ROPE"],
                         offload_ops="*", offload_min_batch=32),
            backend_dict("CPU", "cpu", is_host=True),
        ],
        "tensors": [
            tensor_dict(0, "w", "NONE", "f32", [8, 4, 1, 1], [4, 32, 128, 128],
                        buffer={"buffer_type": "GPU0", "usage": "weights"}),
            tensor_dict(1, "x", "NONE", "f32", [8, 2, 1, 1], [4, 32, 64, 64], flags=["INPUT"]),
            tensor_dict(2, "mm", "MUL_MAT", "f32", [4, 2, 1, 1], [4, 16, 32, 32], src=[0, 1]),
            tensor_dict(3, "row", "VIEW", "f32", [4, 1, 1, 1], [4, 16, 16, 16], src=[2],
                        view_src=2, view_offs=16),
            tensor_dict(4, "kv", "NONE", "f16", [4, 2, 1, 1], [2, 8, 16, 16], buffer=cpu_any),
            tensor_dict(5, "kv_row", "VIEW", "f16", [4, 1, 1, 1], [2, 8, 8, 8], src=[4],
                        view_src=4, view_offs=8, buffer=dict(cpu_any)),
            tensor_dict(6, "store", "CPY", "f16", [4, 1, 1, 1], [2, 8, 8, 8], src=[3, 5],
                        view_src=4, view_offs=8, flags=["OUTPUT", "COMPUTE"],
                        buffer=dict(cpu_any), backend="CPU"),
        ],
        "nodes": [2, 3, 5, 6],
        "leafs": [0, 1, 4],
    }


# ---------------------------------------------------------------------------
# shared cases


def test_shared_cases_present(shared_dir):
    from conftest import case_files
    assert len(case_files([""])) >= 10
    assert case_files(["random"]) and case_files(["aborts"])


def test_round_trip(case_path):
    """Every shared case loads and writes back identical, as data and as text."""
    text = case_path.read_text()
    d = json.loads(text)
    case = load_case(case_path)
    assert case.to_dict() == d
    assert format_case(case.to_dict()) == text


def test_loaded_objects_match_file(case_path):
    d = json.loads(case_path.read_text())
    case = load_case(d)
    assert case.name == d["name"] and case.graph_size == d["graph_size"]
    assert (case.parallel, case.op_offload) == (d["parallel"], d["op_offload"])
    assert [b.name for b in case.backends] == [b["name"] for b in d["backends"]]
    assert len(case.tensors) == len(case.context) == len(d["tensors"])
    for i, (t, td) in enumerate(zip(case.tensors, d["tensors"])):
        assert t.id == i and case.context[i] == t
        assert (t.name, t.op, t.type) == (td["name"], td["op"], td["type"])
        assert list(t.ne) == td["ne"] and list(t.nb) == td["nb"]
        assert [None if s is None else s.id for s in t.src] == td["src"]
        if td["view_src"] is None:
            assert t.view_src is None
        else:
            assert t.view_src.id == td["view_src"] and t.view_offs == td["view_offs"]
        buf = get_buffer(t)
        if td["buffer"] is None:
            assert buf is None and t.data_address == 0
        else:
            # a dummy buffer of its own, of the right type and usage
            assert buf.buffer_type is case.buffer_types[td["buffer"]["buffer_type"]]
            assert buf.usage == td["buffer"]["usage"]
            offs = td["view_offs"] if td["view_src"] is not None else 0
            assert t.data_address == buf.base + offs
            assert buf.size >= max(offs + t.nbytes, 1)
    bufs = [get_buffer(t) for t in case.tensors if get_buffer(t) is not None]
    assert len({id(b) for b in bufs}) == len(bufs) == len(case.buffers)
    assert [t.id for t in case.graph.nodes] == d["nodes"]
    assert [t.id for t in case.graph.leafs] == d["leafs"]
    # the graph holds what it lists; graph_size sizes the scheduler
    assert case.graph.size == max(len(d["nodes"]), len(d["leafs"]), 1)
    assert [(t.id, name) for t, name in case.assignments] == \
        [(td["id"], td["backend"]) for td in d["tensors"] if td["backend"] is not None]


def test_backend_tables_follow_the_rules(case_path):
    """supports_op / offload_op / supports_buft of every backend on every tensor
    of the case agree with the rules of SCHED_CASES.md."""
    d = json.loads(case_path.read_text())
    case = load_case(d)
    for b, bd in zip(case.backends, d["backends"]):
        assert type(b).supports_op is Backend.supports_op     # answered from the C table
        assert b.buffer_type is case.buffer_types[bd["buffer_type"]]
        assert b.device_type == bd["device_type"]
        for t, td in zip(case.tensors, d["tensors"]):
            assert b.supports_op(t) == ref_supports_op(bd, td["op"]), (b.name, td["name"])
            assert b.offload_op(t) == ref_offload_op(bd, td["op"], td["ne"]), (b.name, td["name"])
        for name, buft in case.buffer_types.items():
            assert b.supports_buft(buft) == (name in bd["supports_buffer_types"])


def test_offload_batch_rule_on_named_case(shared_dir):
    """op-offload-batch64: the GPU offloads exactly the nodes whose batch reaches its minimum."""
    case = load_case(shared_dir / "cases" / "op-offload-batch64.case.json")
    gpu = case.backend("GPU0")
    offloaded = [t for t in case.graph.nodes if gpu.offload_op(t)]
    assert offloaded and len(offloaded) < case.graph.n_nodes
    for t in case.graph.nodes:
        assert gpu.offload_op(t) == (ref_batch(t.op, t.ne) >= 32)
    assert not any(case.backend("CPU").offload_op(t) for t in case.graph.nodes)


# ---------------------------------------------------------------------------
# backends and buffer types


BATCH_CASES = [
    ("GET_ROWS", [8, 100, 100, 100], False),
    ("MUL_MAT", [8, 32, 1, 1], True),
    ("MUL_MAT", [8, 31, 4, 4], False),
    ("MUL_MAT_ID", [8, 1, 32, 1], True),
    ("MUL_MAT_ID", [8, 100, 31, 1], False),
    ("ROPE", [8, 1, 32, 1], True),
    ("ROPE", [8, 100, 1, 100], False),
    ("ROPE_BACK", [8, 1, 40, 1], True),
    ("ADD", [8, 4, 4, 2], True),
    ("ADD", [8, 4, 4, 1], False),
    ("SOFT_MAX", [8, 1, 1, 32], True),
]


def _one_node_case(op, ne, gpu):
    t = tensor_dict(0, "t", op, "f32", ne, [4, 4 * ne[0], 4 * ne[0] * ne[1],
                                            4 * ne[0] * ne[1] * ne[2]])
    return {"format": "ggml-sched-case/1", "name": "one", "graph_size": 4, "parallel": False,
            "op_offload": True, "backends": [gpu, backend_dict("CPU", "cpu", is_host=True)],
            "tensors": [t], "nodes": [0], "leafs": []}


@pytest.mark.parametrize("op, ne, expected", BATCH_CASES)
def test_offload_batch_rule(op, ne, expected):
    gpu = backend_dict("GPU0", offload_ops="*", offload_min_batch=32)
    case = _one_node_case(op, ne, gpu)
    assert load_case(case).backend("GPU0").offload_op(load_case(case).tensors[0]) is expected


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(["GET_ROWS", "MUL_MAT", "MUL_MAT_ID", "ROPE", "ROPE_BACK", "ADD",
                           "CPY", "SOFT_MAX", "RMS_NORM"]),
       ne=st.lists(st.integers(1, 70), min_size=4, max_size=4),
       min_batch=st.integers(0, 80),
       offload=st.sampled_from(["*", [], ["MUL_MAT"], ["ROPE", "ADD"]]),
       supports=st.sampled_from(["*", ["MUL_MAT", "ADD"], []]),
       unsupported=st.sampled_from([[], ["ROPE"], ["MUL_MAT", "GET_ROWS"]]))
def test_backend_tables_match_rules(op, ne, min_batch, offload, supports, unsupported):
    gpu = backend_dict("GPU0", supports_ops=supports, unsupported_ops=unsupported,
                       offload_ops=offload, offload_min_batch=min_batch)
    case = load_case(_one_node_case(op, ne, gpu))
    b, t = case.backend("GPU0"), case.tensors[0]
    assert b.supports_op(t) == ref_supports_op(gpu, op)
    assert b.offload_op(t) == ref_offload_op(gpu, op, ne)
    assert b.to_dict() == gpu


def test_buffer_types_are_shared_and_defaulted():
    d = small_case()
    gpu1 = backend_dict("GPU1", buft="GPU0", alignment=64, max_size=4096,
                        supports_bufts=["GPU0", "HOST_PINNED"])
    d["backends"].insert(1, gpu1)
    case = load_case(d)
    assert case.backend("GPU0").buffer_type is case.backend("GPU1").buffer_type
    assert set(case.buffer_types) == {"GPU0", "CPU", "HOST_PINNED"}
    gpu0 = case.buffer_types["GPU0"]
    assert (gpu0.alignment, gpu0.max_size, gpu0.is_host) == (64, 4096, False)
    assert case.buffer_types["CPU"].is_host
    # named only in supports_buffer_types: alignment 32, unbounded, not host
    pinned = case.buffer_types["HOST_PINNED"]
    assert isinstance(pinned, SimBufferType)
    assert (pinned.alignment, pinned.max_size, pinned.is_host) == (32, None, False)
    assert case.backend("GPU1").supports_buft(pinned)
    assert not case.backend("GPU0").supports_buft(pinned)
    assert case.to_dict() == d


def test_missing_alignment_and_max_size_mean_defaults():
    d = small_case()
    for b in d["backends"]:
        del b["buffer_type_alignment"], b["buffer_type_max_size"]
    case = load_case(d)
    for buft in case.buffer_types.values():
        assert (buft.alignment, buft.max_size) == (32, None)
    assert case.to_dict() == d          # written back without the two fields


def test_sim_buffers_are_fake_and_aligned():
    case = load_case(small_case())
    gpu = case.buffer_types["GPU0"]
    buf = gpu.alloc_buffer(1000)
    assert buf.base != 0 and buf.base % gpu.alignment == 0
    assert buf.size == 1000 and buf.memory is None and buf.buffer_type is gpu
    other = gpu.alloc_buffer(1000)
    assert other.base >= buf.base + 1000 or buf.base >= other.base + 1000


def test_sim_backend_cannot_compute():
    case = load_case(small_case())
    with pytest.raises(BackendError, match="GPU0"):
        case.backend("GPU0").graph_compute(case.graph)


def test_registry():
    assert "sim" in available()
    assert get_backend_class("sim") is SimBackend
    with pytest.raises(KeyError, match="nope"):
        get_backend_class("nope")


def test_sim_backend_from_dict_alone():
    d = backend_dict("GPU0", supports_bufts=["GPU0", "CPU"], offload_ops=["MUL_MAT"],
                     offload_min_batch=8)
    b = SimBackend.from_dict(d)
    assert b.to_dict() == d
    assert [x.name for x in b.supported_buffer_types] == ["GPU0", "CPU"]


# ---------------------------------------------------------------------------
# loading details


def test_small_case_round_trips(tmp_path):
    d = small_case()
    case = load_case(d)
    assert case.to_dict() == d
    path = tmp_path / "small.case.json"
    dump_case(case, path)
    assert json.loads(path.read_text()) == d
    assert load_case(path).to_dict() == d


def test_views_keep_file_view_src_and_own_buffer():
    case = load_case(small_case())
    kv, kv_row, store = case.tensors[4], case.tensors[5], case.tensors[6]
    assert store.view_src == kv and store.view_offs == 8
    # each pre-allocated view sits in a buffer of its own at its view_offs
    assert get_buffer(kv_row) is not get_buffer(kv)
    assert kv_row.data_address == get_buffer(kv_row).base + 8
    # a computed view has neither buffer nor data: the allocator places it
    row = case.tensors[3]
    assert get_buffer(row) is None and row.data_address == 0
    assert case.assignments == [(store, "CPU")]


def test_flags_are_kept_exactly():
    d = small_case()
    d["tensors"][2]["flags"] = []                     # a node without COMPUTE is kept as is
    d["tensors"][1]["flags"] = ["INPUT", "PARAM", "LOSS"]
    case = load_case(d)
    assert case.tensors[2].flags == []
    assert case.tensors[1].flags == ["INPUT", "PARAM", "LOSS"]
    assert case.to_dict() == d


def test_forward_references_and_nulls_in_src():
    """Tensors may name later ids; inner nulls stay, and trailing nulls are
    written back as the file had them."""
    d = small_case()
    d["tensors"][0] = tensor_dict(0, "late_user", "SCALE", "f32", [4, 2, 1, 1],
                                  [4, 16, 32, 32], src=[2])
    d["tensors"][2]["src"] = [None, 1, None]
    d["nodes"] = [2, 0, 3, 5, 6]
    d["leafs"] = [1, 4]
    case = load_case(d)
    assert case.tensors[0].src == [case.tensors[2]]
    assert case.tensors[2].src == [None, case.tensors[1]]
    assert case.to_dict() == d


def test_graph_size_smaller_than_graph_still_loads():
    # hash-set-too-small cases: the scheduler, not the loader, refuses them
    d = small_case()
    d["graph_size"] = 2
    case = load_case(d)
    assert case.graph_size == 2 and case.graph.n_nodes == 4


def test_zero_size_view_may_start_anywhere():
    # ggml checks a view's extent only when it has data (data_size != 0)
    d = small_case()
    d["tensors"][3]["ne"] = [0, 1, 1, 1]
    d["tensors"][3]["view_offs"] = 10**6
    assert load_case(d).tensors[3].view_offs == 10**6


def test_empty_backend_list_loads():
    d = small_case()
    d["backends"] = []
    for t in d["tensors"]:
        t["buffer"] = t["backend"] = None
    case = load_case(d)
    assert case.backends == [] and case.buffer_types == {}


def test_to_dict_refuses_foreign_sources():
    case = load_case(small_case())
    other = load_case(small_case())
    case.tensors[2].set_src(0, other.tensors[0])
    with pytest.raises(ValueError, match="tensor 2 'mm' src"):
        case.to_dict()


def test_bad_json_names_the_file(tmp_path):
    path = tmp_path / "broken.case.json"
    path.write_text("{not json")
    with pytest.raises(CaseFormatError, match="broken.case.json"):
        load_case(path)


# ---------------------------------------------------------------------------
# malformed input: each mutation of the small case must be refused with a
# message that names the offending tensor, backend or field


def _set(path, value):
    def mutate(d):
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


def _del(path):
    def mutate(d):
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return mutate


def _append(path, value):
    def mutate(d):
        obj = d
        for key in path:
            obj = obj[key]
        obj.append(value)
    return mutate


def _dup_backend(d):
    d["backends"].insert(1, copy.deepcopy(d["backends"][0]))


def _conflicting_buft(d):
    d["backends"].insert(1, backend_dict("GPU1", buft="GPU0", alignment=128, max_size=4096))


T = "tensors"
MALFORMED = [
    ("wrong format", _set(["format"], "ggml-sched-case/2"), ["format", "ggml-sched-case/2"]),
    ("no format", _del(["format"]), ["missing key", "'format'"]),
    ("missing nodes", _del(["nodes"]), ["missing key", "'nodes'"]),
    ("unknown top key", _set(["extra"], 1), ["unknown key", "'extra'"]),
    ("missing tensor key", _del([T, 2, "op"]), ["tensor 2 'mm'", "'op'"]),
    ("unknown tensor key", _set([T, 2, "colour"], "red"), ["tensor 2 'mm'", "'colour'"]),
    ("unknown op", _set([T, 2, "op"], "MATMUL"), ["tensor 2 'mm'", "op", "MATMUL"]),
    ("unknown type", _set([T, 1, "type"], "f8"), ["tensor 1 'x'", "type", "'f8'"]),
    ("unknown flag", _set([T, 1, "flags"], ["INPUTS"]), ["tensor 1 'x'", "flag", "INPUTS"]),
    ("flag twice", _set([T, 1, "flags"], ["INPUT", "INPUT"]), ["tensor 1 'x'", "twice"]),
    ("unknown device type", _set(["backends", 0, "device_type"], "tpu"),
     ["backend 'GPU0'", "device_type", "tpu"]),
    ("bad buffer usage", _set([T, 0, "buffer", "usage"], "scratch"),
     ["tensor 0 'w'", "usage", "scratch"]),
    ("buffer without usage", _del([T, 0, "buffer", "usage"]), ["tensor 0 'w'", "'usage'"]),
    ("id not index", _set([T, 3, "id"], 7), ["tensor 3 'row'", "id 7", "position 3"]),
    ("src out of range", _set([T, 2, "src"], [0, 99]), ["tensor 2 'mm'", "src[1]", "99"]),
    ("negative src", _set([T, 2, "src"], [-1, 1]), ["tensor 2 'mm'", "src[0]", "-1"]),
    ("src not an int", _set([T, 2, "src"], [0, "1"]), ["tensor 2 'mm'", "src[1]", "'1'"]),
    ("src is a bool", _set([T, 2, "src"], [True]), ["tensor 2 'mm'", "src[0]", "True"]),
    ("self-reference", _set([T, 2, "src"], [0, 2]), ["tensor 2 'mm'", "src[1]", "itself"]),
    ("view_src self", _set([T, 3, "view_src"], 3), ["tensor 3 'row'", "view_src", "itself"]),
    ("view_src out of range", _set([T, 3, "view_src"], 12), ["tensor 3 'row'", "view_src", "12"]),
    ("cycle", _set([T, 2, "src"], [0, 3]), ["cycle", "2 -> 3 -> 2"]),
    ("too many src", _set([T, 2, "src"], [0, 1] * 5 + [0]), ["tensor 2 'mm'", "at most 10"]),
    ("node twice", _append(["nodes"], 2), ["nodes[4]", "tensor 2 'mm'", "nodes[0]"]),
    ("node and leaf", _append(["leafs"], 3), ["leafs[3]", "tensor 3 'row'", "nodes[1]"]),
    ("node out of range", _set(["nodes", 0], 40), ["nodes[0]", "40", "out of range"]),
    ("leaf not an int", _set(["leafs", 1], None), ["leafs[1]", "None"]),
    ("ne has 3 dims", _set([T, 1, "ne"], [8, 2, 1]), ["tensor 1 'x'", "ne", "4 non-negative"]),
    ("negative ne", _set([T, 1, "ne"], [8, -2, 1, 1]), ["tensor 1 'x'", "ne"]),
    ("nb not ints", _set([T, 1, "nb"], [4, 32.0, 64, 64]), ["tensor 1 'x'", "nb"]),
    ("block size", _set([T, 1, "type"], "q8_0"), ["tensor 1 'x'", "ne[0] = 8", "block size 32"]),
    ("unknown assigned backend", _set([T, 6, "backend"], "GPU7"),
     ["tensor 6 'store'", "backend", "GPU7"]),
    ("unknown buffer type", _set([T, 0, "buffer", "buffer_type"], "NPU"),
     ["tensor 0 'w'", "buffer type", "'NPU'"]),
    ("duplicate backend", _dup_backend, ["backends[1]", "duplicate backend name 'GPU0'"]),
    ("alignment not power of two", _set(["backends", 0, "buffer_type_alignment"], 48),
     ["backend 'GPU0'", "alignment", "power of two", "48"]),
    ("alignment zero", _set(["backends", 0, "buffer_type_alignment"], 0),
     ["backend 'GPU0'", "alignment"]),
    ("conflicting buffer type", _conflicting_buft,
     ["buffer type 'GPU0'", "GPU1", "alignment=128", "alignment=64"]),
    ("unknown supported op", _set(["backends", 0, "supports_ops"], ["ADD", "MATMUL"]),
     ["backend 'GPU0'", "supports_ops", "MATMUL"]),
    ("unknown unsupported op", _set(["backends", 0, "unsupported_ops"], ["ROPE", 3]),
     ["backend 'GPU0'", "unsupported_ops", "3"]),
    ("unsupported_ops star", _set(["backends", 0, "unsupported_ops"], "*"),
     ["backend 'GPU0'", "unsupported_ops", "list"]),
    ("missing backend key", _del(["backends", 1, "supports_ops"]),
     ["backend 'CPU'", "'supports_ops'"]),
    ("is_host not bool", _set(["backends", 1, "buffer_type_is_host"], 1),
     ["backend 'CPU'", "buffer_type_is_host"]),
    ("graph_size zero", _set(["graph_size"], 0), ["graph_size", ">= 1"]),
    ("graph_size too big", _set(["graph_size"], 2**31), ["graph_size", "<= 2147483647"]),
    ("offload_min_batch not int", _set(["backends", 0, "offload_min_batch"], 1.5),
     ["backend 'GPU0'", "offload_min_batch", "1.5"]),
    ("view_offs too big", _set([T, 3, "view_offs"], 2**64), ["tensor 3 'row'", "view_offs"]),
    ("graph_size string", _set(["graph_size"], "16"), ["graph_size", "'16'"]),
    ("graph_size bool", _set(["graph_size"], True), ["graph_size", "True"]),
    ("parallel not bool", _set(["parallel"], "yes"), ["parallel", "'yes'"]),
    ("name too long", _set([T, 1, "name"], "n" * 64), ["tensor 1", "name", "63 bytes"]),
    ("view_src is a view", _set([T, 6, "view_src"], 5), ["tensor 6 'store'", "itself a view"]),
    ("view does not fit", _set([T, 3, "view_offs"], 24),
     ["tensor 3 'row'", "16 bytes", "view_offs 24", "view_src 2 'mm'", "32 bytes"]),
    ("negative view_offs", _set([T, 3, "view_offs"], -8), ["tensor 3 'row'", "view_offs"]),
    ("backends not a list", _set(["backends"], {}), ["backends", "list"]),
]


@pytest.mark.parametrize("mutate, expected", [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_case_is_refused(mutate, expected):
    d = small_case()
    load_case(copy.deepcopy(d))                     # the unmutated case is fine
    mutate(d)
    with pytest.raises(CaseFormatError) as info:
        load_case(d)
    assert isinstance(info.value, ValueError)
    for part in expected:
        assert part in str(info.value), (part, str(info.value))


def test_restore_undoes_rewiring_and_placement():
    d = small_case()
    case = load_case(d)
    uses = [case.graph.use_count(t) for t in case.tensors]
    assert uses == [1, 1, 1, 1, 1, 1, 0]
    mm, row, kv = case.tensors[2], case.tensors[3], case.tensors[4]
    # what a split and an allocation do: rewrite sources, flags, placements
    mm.set_src(0, None)
    mm.set_src(5, row)
    row.flags = ["OUTPUT"]
    row.set_view_src(None, 0)
    set_buffer(row, case.buffer_types["CPU"].alloc_buffer(64), 0)
    case.restore()
    assert case.to_dict() == d
    assert row.data_address == 0 and get_buffer(row) is None
    assert get_buffer(kv) is case.buffers[1] and kv.data_address == case.buffers[1].base
