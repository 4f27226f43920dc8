"""The one source of op metadata (_core.OP_NAMES_LIST, TYPE_NAMES, ops.UNARY_OPS / GLU_OPS,
VIEW_OPS / EMPTY_OPS) is ggml 0.10.1's enums. The RPC backend sends these numbers over
the wire, so a changed list must fail here, everywhere: the digests below were taken
from lists that test_rpc.py compares with ggml's own libraries (ggml_op_name, ...). The C
enums are the same lists (one header; test_vocab_recipe.py compiles it)."""

import hashlib

from ggml_py import ops
from ggml_py._core import (EMPTY_OPS, OP_IDS, OP_NAMES_LIST, PRECS, ROPE_TYPES, TYPE_IDS,
                           TYPE_NAMES, VIEW_OPS)
from ggml_py.backends.cpu import SUPPORTED_OPS

# (count, first 16 hex digits of sha256 of the comma-joined names) in ggml 0.10.1
GGML_0_10_1 = {"ggml_op": (96, "c7f469a238a46d3e"), "ggml_type": (42, "a8ce914861c3c83d"),
               "ggml_unary_op": (22, "53297ef0c8282b2d"), "ggml_glu_op": (6, "5a03ca75dbde0a8b")}


def _digest(names):
    names = [n or "" for n in names]        # removed types keep their number, without a name
    return len(names), hashlib.sha256(",".join(names).encode()).hexdigest()[:16]


def test_enums_are_ggml_0_10_1s():
    got = {"ggml_op": _digest(OP_NAMES_LIST), "ggml_type": _digest(TYPE_NAMES),
           "ggml_unary_op": _digest(ops.UNARY_OPS), "ggml_glu_op": _digest(ops.GLU_OPS)}
    assert got == GGML_0_10_1
    # ggml.h's GGML_ROPE_TYPE_*, enum ggml_prec and enum ggml_sort_order; the rope modes and
    # precisions are ggml-py-vocab.h's tables, which the C code reads too (llama.cpp's own
    # precision values: test_architectures.py's node comparison)
    assert ops.ROPE_TYPES == {"NORMAL": 0, "NEOX": 2, "MROPE": 8, "VISION": 24, "IMROPE": 40}
    assert ops.PRECS == {"DEFAULT": 0, "F32": 10} and ops.SORT_ORDERS == ("ASC", "DESC")
    assert ops.ROPE_TYPES is ROPE_TYPES and ops.PRECS is PRECS


def test_numbers_ggml_code_relies_on():
    # a few anchors, so that a failure above says where a list moved
    assert OP_IDS["MUL_MAT"] == 29 and OP_IDS["CPY"] == 34 and OP_IDS["GET_ROWS"] == 40
    assert OP_IDS["ROPE"] == 48 and OP_IDS["FLASH_ATTN_EXT"] == 73 and OP_IDS["GLU"] == 95
    assert TYPE_IDS["f32"] == 0 and TYPE_IDS["q8_0"] == 8 and TYPE_IDS["bf16"] == 30


def test_view_and_empty_ops_have_one_meaning_each():
    assert set(VIEW_OPS) == {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}    # ggml_is_view_op
    assert set(EMPTY_OPS) == {"NONE"} | set(VIEW_OPS)                    # ggml_op_is_empty
    assert ops.VIEW_OPS is VIEW_OPS and ops.EMPTY_OPS is EMPTY_OPS
    assert set(EMPTY_OPS) <= set(SUPPORTED_OPS)        # the CPU needs no kernel for them
