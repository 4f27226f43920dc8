"""ggml 0.10.1's own type conversions and dot products, called through ctypes: the
reference that ggml_py's block types are checked against (tests/test_block_types.py) and
timed against (bench/bench_quants.py).

    ref = GgmlQuants()                        # finds ggml as bench_vs_ggml does
    ref.to_float("q4_K", raw)                 # dequantize_row_q4_K
    ref.quantize_ref("q4_K", x)               # quantize_row_q4_K_ref
    ref.quantize_chunk("iq4_nl", x)           # ggml_quantize_chunk (what GGUF writers use)
    ref.from_float("q8_K", x)                 # ggml-cpu's from_float (CPU quantiser)
    ref.vec_dot("q4_K", raw_x, raw_y, n)      # ggml-cpu's vec_dot (y in the vec_dot type)
    ref.vec_dot_type("q4_K")                  # 'q8_K'

Rows are the last axis of the numpy arrays; raw blocks are uint8 arrays.
"""

import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_ggml import find_ggml  # noqa: E402

TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
            "q8_1": 9, "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14,
            "q8_K": 15, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30, "mxfp4": 39}
TYPE_NAMES = {v: k for k, v in TYPE_IDS.items()}

_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class _TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


class GgmlQuants:
    """ggml's type traits (ggml.h) and CPU type traits (ggml-cpu.h) for each type."""

    def __init__(self, lib_dir=None):
        lib_dir = find_ggml(lib_dir)
        if lib_dir is None:
            raise RuntimeError("ggml 0.10.1 not found ($GGML_PY_GGML_LIB, or pip install ggml-py==0.10.1)")
        load = lambda name: ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)  # noqa: E731
        self.base = load("libggml-base.so")
        self.cpu = load("libggml-cpu.so")
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.base.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self.cpu.ggml_cpu_init()
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                  ctypes.c_void_p]

    def traits(self, type_name):
        return self.base.ggml_get_type_traits(TYPE_IDS[type_name]).contents

    def block(self, type_name):
        """(elements, bytes) of one block."""
        t = self.traits(type_name)
        return int(t.blck_size), int(t.type_size)

    def vec_dot_type(self, type_name):
        return TYPE_NAMES[self.cpu.ggml_get_type_traits_cpu(TYPE_IDS[type_name]).contents.vec_dot_type]

    def _raw_shape(self, type_name, shape):
        qk, size = self.block(type_name)
        if shape[-1] % qk:
            raise ValueError(f"{type_name} rows need a multiple of {qk} values, got {shape[-1]}")
        return (*shape[:-1], shape[-1] // qk * size)

    def _rows(self, fn_ptr, x, type_name):
        if not fn_ptr:
            raise ValueError(f"ggml has no such conversion into {type_name}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(self._raw_shape(type_name, x.shape), np.uint8)
        fn = _FROM_FLOAT(fn_ptr)
        rows_in, rows_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1])
        for r in range(rows_in.shape[0]):
            fn(rows_in[r].ctypes.data, rows_out[r].ctypes.data, x.shape[-1])
        return out

    def quantize_ref(self, type_name, x):
        return self._rows(self.traits(type_name).from_float_ref, x, type_name)

    def from_float(self, type_name, x):
        return self._rows(self.cpu.ggml_get_type_traits_cpu(TYPE_IDS[type_name]).contents.from_float,
                          x, type_name)

    def quantize_chunk(self, type_name, x, imatrix=None):
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows = x.reshape(-1, x.shape[-1])
        out = np.zeros(self._raw_shape(type_name, x.shape), np.uint8)
        im = None if imatrix is None else np.ascontiguousarray(imatrix, np.float32)
        self.base.ggml_quantize_chunk(TYPE_IDS[type_name], rows.ctypes.data, out.ctypes.data, 0,
                                      rows.shape[0], rows.shape[1],
                                      None if im is None else im.ctypes.data)
        return out

    def to_float(self, type_name, raw):
        if not self.traits(type_name).to_float:
            raise ValueError(f"ggml has no to_float for {type_name}")
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        qk, size = self.block(type_name)
        n = raw.shape[-1] // size * qk
        out = np.zeros((*raw.shape[:-1], n), np.float32)
        fn = _TO_FLOAT(self.traits(type_name).to_float)
        rows_in, rows_out = raw.reshape(-1, raw.shape[-1]), out.reshape(-1, n)
        for r in range(rows_in.shape[0]):
            fn(rows_in[r].ctypes.data, rows_out[r].ctypes.data, n)
        return out

    def vec_dot(self, type_name, x, y, n):
        """ggml-cpu's vec_dot of one row x (type_name) with one row y (its vec_dot type)."""
        x = np.ascontiguousarray(x, dtype=np.uint8)
        y = np.ascontiguousarray(y, dtype=np.uint8)
        s = np.zeros(1, np.float32)
        fn = _VEC_DOT(self.cpu.ggml_get_type_traits_cpu(TYPE_IDS[type_name]).contents.vec_dot)
        fn(n, s.ctypes.data, 0, x.ctypes.data, 0, y.ctypes.data, 0, 1)
        return float(s[0])
