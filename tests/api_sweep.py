"""Misuse of every public callable of ggml_py (run by test_robust_api.py).

Run as a script, in a subprocess, so that a crash is a test failure and not a
dead test run: every public function, class and method of the extension modules
and of the Python API -- and every property with a setter -- is called with a
valid argument list in which one argument at a time is replaced by a hostile
value. Each call must return, or raise a GgmlPyError (or the TypeError / ValueError
of Python's own argument checks), within a few seconds.

    python tests/api_sweep.py [--values none|all] [--only SUBSTRING]

prints `calling NAME` before each call (so that the parent can name the call that
killed the process), one `PROBLEM {json}` line per bad outcome and a final
`SUMMARY {json}` line.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import os
import signal
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# the modules swept: the extension modules and the Python API. The command line and
# its helpers (__main__, demo, planning, opscheck, dot) are not in the list: they are
# the next owner's (issue 9) and are exercised through the CLI tests. Of the CPU
# backend's module only the backend class is swept (its module functions are the
# kernels' building blocks, see CLASSES_ONLY).
MODULES = [
    "ggml_py._core", "ggml_py._backend", "ggml_py._schedcore", "ggml_py._schedtime",
    "ggml_py._alloc", "ggml_py.backends.opencl._shim", "ggml_py._supports", "ggml_py._quants",
    "ggml_py._caseio",
    "ggml_py.errors", "ggml_py.sched", "ggml_py.plan", "ggml_py.runtime", "ggml_py.tools.cases",
    "ggml_py.alloc", "ggml_py._validate", "ggml_py.ops", "ggml_py.quants", "ggml_py.backends",
    "ggml_py.backends.sim", "ggml_py.backends.numpy_device", "ggml_py.backends.cpu",
    "ggml_py.backends.cpu.backend", "ggml_py.backends.cpu._executor", "ggml_py.backends.opencl",
    "ggml_py.backends.rpc", "ggml_py.backends.rpc._protocol", "ggml_py.models.config",
    "ggml_py.models.model",
    "ggml_py.models.graph", "ggml_py.models.session", "ggml_py.models.reference",
    "ggml_py.models.gguf", "ggml_py.models.synthetic", "ggml_py.models.decode_graph",
    "ggml_py.models.placement", "ggml_py.arrays",
]

CLASSES_ONLY = {"ggml_py.backends.cpu"}

NONE = [None]
HOSTILE = [None, -1, 2**31, 2**64, -(2**63) - 1, 1.5, float("nan"), "x", [], object()]

# dunder methods worth calling; the others are Python's protocol
DUNDERS = ("__getitem__", "__contains__", "__call__", "__enter__", "__exit__", "__eq__")

# a call that takes longer hangs; a 2 GiB numpy-device buffer (2**31 is a hostile size
# that the device accepts) took over 10 s at a load of 6 on 2 cores
CALL_TIMEOUT_S = 30


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


# ---------------------------------------------------------------------------
# a world of valid objects, made fresh for every callable

class Env:
    """Valid arguments, made on first use. close() stops what has threads."""

    def __init__(self):
        self._made = {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._made:
            self._made[name] = getattr(self, "make_" + name)()
        return self._made[name]

    def close(self):
        for obj in self._made.values():
            close = getattr(obj, "close", None)
            if close is not None and type(obj).__name__ in ("NumpyDeviceBackend", "Scheduler"):
                try:
                    close()
                except Exception:
                    pass
        self._made.clear()

    # --- core ---
    def make_ctx(self):
        from ggml_py import Context
        return Context("sweep")

    def make_buft(self):
        return self.cpu.buffer_type

    def make_buf(self):
        from ggml_py import host_buffer
        return host_buffer(self.buft, 4096)

    def _placed(self, name, shape, offset, typ="f32"):
        from ggml_py import set_buffer
        t = self.ctx.new_tensor(typ, shape, name=name)
        set_buffer(t, self.buf, offset)
        return t

    def make_a(self):
        return self._placed("a", (4, 8), 0)

    def make_b(self):
        return self._placed("b", (4, 8), 256)

    def make_c(self):
        return self._placed("c", (8,), 512)

    def make_ids(self):
        t = self._placed("ids", (4,), 1024, "i32")
        self.cpu.set_tensor(t, np.arange(4, dtype=np.int32))
        return t

    def make_node(self):
        from ggml_py import ops
        return ops.add(self.ctx, self.a, self.b)

    def make_graph(self):
        from ggml_py import Graph
        return Graph(16).build_forward_expand(self.node)

    def make_hashset(self):
        from ggml_py import HashSet
        return HashSet(16)

    # --- backends ---
    def make_cpu(self):
        from ggml_py.backends.cpu import CPUBackend
        return CPUBackend()

    def make_dev(self):
        from ggml_py.backends.numpy_device import NumpyDeviceBackend
        return NumpyDeviceBackend(unsupported_ops=["SOFT_MAX"])

    def make_dev_buf(self):
        return self.dev.buffer_type.alloc_buffer(4096)

    def make_dev_tensor(self):
        from ggml_py import set_buffer
        t = self.ctx.new_tensor("f32", (4, 8), name="d")
        set_buffer(t, self.dev_buf, 0)
        return t

    def make_event(self):
        return self.dev.event_new()

    def make_backend(self):
        from ggml_py import Backend
        return Backend("GPU", self.sim_buft, "gpu")

    def make_sim_buft(self):
        from ggml_py.backends.sim import SimBufferType
        return SimBufferType("SIM", 32)

    def make_sim(self):
        from ggml_py.backends.sim import SimBackend
        return SimBackend("SIM", self.sim_buft, "gpu")

    def make_backend_dict(self):
        return self.case.backends[0].to_dict()

    def make_ocl(self):
        from ggml_py.backends import opencl
        if not opencl.available()[0]:
            return None
        return opencl.OpenCLBackend(0)

    def make_ocl_ctx(self):
        from ggml_py.backends.opencl import _shim
        return _shim.DeviceContext(0)

    def make_mem(self):
        return self.ocl_ctx.alloc(256)

    def make_program(self):
        return self.ocl_ctx.build("__kernel void k(__global float * a) { a[0] = 1.0f; }")

    def make_kernel(self):
        k = self.program.kernel("k")
        k.set_args([self.mem])
        return k

    def make_cl_event(self):
        return self.ocl_ctx.marker()

    # --- scheduler, allocator, runtime ---
    def make_sched(self):
        from ggml_py.sched import Scheduler
        s = Scheduler([self.dev, self.cpu], graph_size=64, parallel=True)
        s.alloc_graph(self.graph)
        return s

    def make_galloc(self):
        from ggml_py.alloc import GraphAllocator
        return GraphAllocator([self.buft])

    def make_talloc(self):
        from ggml_py.alloc import TensorAllocator
        from ggml_py import host_buffer
        return TensorAllocator(host_buffer(self.buft, 4096))

    def make_snapshot(self):
        from ggml_py._schedtime import GraphSnapshot
        return GraphSnapshot(self.graph)

    def make_plan(self):
        return self.sched.plan("sweep")

    def make_case(self):
        from ggml_py.tools.cases import load_case
        return load_case(os.path.join(HERE, "data", "cases", "llama-2L-gpu-unsupported.case.json"))

    def make_case_dict(self):
        return self.case.to_dict()

    # --- models ---
    def make_config(self):
        from ggml_py.models.transformer import ModelConfig
        return ModelConfig(n_vocab=32, n_ctx=8, n_embd=16, n_head=2, n_head_kv=1, n_layer=1,
                           n_ff=32, kv_pad=8, wtype="f32", cache_type="f32")

    def make_model(self):
        from ggml_py.models.transformer import Model
        return Model.random(self.config).place(self.cpu)

    def make_kv(self):
        from ggml_py.models.transformer import KVCache
        return KVCache(self.model)

    def make_session(self):
        from ggml_py.models.transformer import Session
        return Session(self.model, [self.cpu])

    def make_forward(self):
        from ggml_py.models.transformer import build_forward
        return build_forward(self.model, self.kv, [1, 2])


# the valid value of a parameter: (callable name suffix, parameter) first, then the
# parameter name alone. Values are env attribute names, or `=expr` (evaluated).
BY_CALL = {
    ("supports_op", "op"): "a", ("offload_op", "op"): "a",
    ("unary", "op"): "=\"RELU\"", ("unary_inplace", "op"): "=\"RELU\"",
    ("glu", "op"): "=\"SWIGLU\"", ("glu_split", "op"): "=\"SWIGLU\"",
    ("op_can_inplace", "op"): "=\"ADD\"", ("op_id", "name"): "=\"ADD\"",
    ("type_id", "name"): "=\"f32\"", ("op_name", "op"): "=2",
    ("type_name", "type"): "=0", ("unary_op_id", "op"): "=\"RELU\"",
    ("glu_op_id", "op"): "=\"SWIGLU\"", ("new_op", "op"): "=\"ADD\"",
    ("new_op", "srcs"): "=[env.a, env.b]", ("new_op", "shape"): "=(4, 8)",
    ("DeviceContext.write", "mem"): "mem", ("Kernel.set_args", "args"): "=[env.mem]",
    ("enqueue", "global_size"): "=(64,)", ("enqueue", "local_size"): "=None",
    ("build", "source"): "=\"__kernel void k(__global float * a) {}\"",
    ("Program.kernel", "name"): "=\"k\"",
    ("copy", "src"): "mem", ("copy", "dst"): "=env.ocl_ctx.alloc(256)",
    ("DeviceContext.read_into", "out"): "=bytearray(16)",
    ("DeviceContext.__init__", "index"): "=0", ("device_info", "index"): "=0",
    ("device_info", "device"): "=0", ("OpenCLBackend.__init__", "device"): "=0",
    ("error_name", "status"): "=0", ("load", "path"): "=None",
    ("tensor_copy", "src"): "a", ("tensor_copy", "dst"): "b",
    ("cpy_tensor_async", "src"): "a", ("cpy_tensor_async", "dst"): "dev_tensor",
    ("cpy_tensor_async", "backend_src"): "cpu",
    ("time_reps", "s"): "=env.sched._core", ("time_reps", "what"): "=0",
    ("time_reps", "snap"): "snapshot", ("time_reps", "assignments"): "=[]",
    ("SchedCore.__init__", "backends"): "=[env.cpu]",
    ("SchedCore.__init__", "bufts"): "=[env.buft]",
    ("Scheduler.__init__", "backends"): "=[env.dev, env.cpu]",
    ("ggml_backend_sched_new", "backends"): "=[env.cpu]", ("ggml_backend_sched_new", "bufts"): "=None",
    ("ggml_backend_sched_new", "n_backends"): "=1",
    ("Runtime.__init__", "backends"): "=[env.cpu]", ("Runtime.__init__", "n_copies"): "=1",
    ("tensor_ndarray", "memory"): "=env.buf.memory", ("tensor_ndarray", "dtype"): "=np.float32",
    ("Buffer.__init__", "base"): "=4096", ("Buffer.__init__", "size"): "=64",
    ("Buffer.__init__", "memory"): "=None",
    ("set_tensor", "data"): "=bytes(128)", ("set_tensor_async", "data"): "=bytes(128)",
    ("set_tensor_async", "tensor"): "dev_tensor",
    ("NumpyDeviceBackend.set_tensor", "tensor"): "dev_tensor",
    ("NumpyDeviceBackend.get_tensor", "tensor"): "dev_tensor",
    ("tensor_set", "data"): "=np.zeros((4, 8), np.float32)", ("tensor_set", "tensor"): "a",
    ("tensor_set_all", "pairs"): "=[(env.a, np.zeros((4, 8), np.float32))]",
    ("store", "x"): "=np.zeros((1, 1, 4, 8), np.float32)",
    ("cases.load_case", "source"): "case_dict", ("format_case", "d"): "case_dict",
    ("dump_case", "case"): "case", ("dump_case", "path"): "=\"sweep.case.json\"",
    ("from_dict", "d"): "backend_dict", ("parse_backend_dict", "d"): "backend_dict",
    ("buffer_types_from_dicts", "backend_dicts"): "=[env.backend_dict]",
    ("GraphAllocator.__init__", "buffer_types"): "=[env.buft]",
    ("VBuffer.__init__", "args"): "=()",
    ("check_keys", "d"): "={\"a\": 1}", ("check_keys", "required"): "=[\"a\"]",
    ("check_keys", "optional"): "=[]", ("check_choice", "choices"): "={\"a\": 1}",
    ("check_choice", "value"): "=\"a\"", ("check_int", "value"): "=1",
    ("check_bool", "value"): "=True", ("check_str", "value"): "=\"s\"",
    ("check_name", "value"): "=\"s\"", ("check_list", "value"): "=[]",
    ("reference_logits", "tokens"): "=[1, 2]", ("Session.forward", "tokens"): "=[1, 2]",
    ("generate", "prompt"): "=[1, 2]", ("generate", "n_new"): "=2",
    ("build_forward", "tokens"): "=[1, 2]", ("build_forward", "cache"): "kv",
    ("Model.__init__", "weights"): "=env.model.weights",
    ("Model.values", "name"): "=\"token_embd.weight\"",
    ("Model.place", "layer_backends"): "cpu", ("layer_of", "name"): "=\"blk.0.x\"",
    ("to_stored", "type_name"): "=\"f16\"", ("to_stored", "values"): "=np.zeros(4, np.float32)",
    ("save_gguf", "path"): "=\"sweep.gguf\"", ("load_gguf", "path"): "=\"sweep.gguf\"",
    ("config_from_gguf", "reader"): "=None", ("synthetic_llama", "n_layers"): "=1",
    ("register", "name"): "=\"sweep\"", ("register", "module"): "=\"ggml_py.backends.sim\"",
    ("register", "cls"): "=\"SimBackend\"", ("get_backend_class", "name"): "=\"sim\"",
    ("Split.__init__", "backend"): "cpu",
    ("GraphView.__init__", "nodes"): "=[env.node]",
    ("compute_nodes", "nodes"): "=[env.node]", ("compute_nodes", "backend_name"): "=\"CPU\"",
    ("rope_cache", "pos"): "=np.arange(4)", ("gelu", "x"): "=np.zeros(4, np.float32)",
    ("gelu_quick", "x"): "=np.zeros(4, np.float32)",
    ("gelu_erf", "x"): "=np.zeros(4, np.float32)",
    ("quants.quantize", "values"): "=np.zeros(32, np.float32)",
    ("vec_dot_round", "w"): "=\"f16\"",
    ("allocation_problems", "allocator"): "=None", ("validate_allocation", "allocator"): "=None",
    ("mul_mat_id", "as_"): "=ops.new_tensor(env.ctx, \"f32\", (8, 4, 2))",
    ("get_rows", "b"): "ids", ("set_rows", "c"): "ids",
    ("json_text", "value"): "=[1, \"a\", None, {\"k\": []}]",
    ("document_tables", "tensors"): "=env.case_dict[\"tensors\"]",
    ("document_tables", "nodes"): "=env.case_dict[\"nodes\"]",
    ("document_tables", "leafs"): "=env.case_dict[\"leafs\"]",
    ("CaseTables.check", "buffer_types"): "=env.case.buffer_types",
    ("CaseTables.check", "backend_names"): "=[b.name for b in env.case.backends]",
    ("CaseTables.wire", "tensors"): "=env.case.tensors",
    ("CaseTables.graph_tensors", "tensors"): "=env.case.tensors",
    ("CaseTables.assignments", "tensors"): "=env.case.tensors",
    ("CaseTables.is_view", "i"): "=0", ("CaseTables.n_src", "i"): "=0",
    ("read_json_value", "data"): "=b'{\"a\": [1, 2.5, null]}'",
    ("read_case_tables", "data"): "=__import__(\"json\").dumps(env.case_dict).encode()",
    ("fake_buffers", "buffer_types"): "=[env.sim_buft]", ("fake_buffers", "sizes"): "=[64]",
    ("fake_buffers", "usages"): "=[\"weights\"]",
    ("SchedCore.plan_tables", "names"): "=[b.name for b in env.sched.backends]",
}

BY_NAME = {
    "ctx": "ctx", "context": "ctx", "a": "a", "b": "b", "c": "c", "t": "a", "tensor": "a",
    "src": "a", "dst": "b", "q": "a", "k": "b", "v": "b", "x": "a", "t0": "a", "t1": "b",
    "view_src": "b", "view_of": "b", "mask": "None", "sinks": "None", "ids": "ids",
    "pos": "ids", "freq_factors": "=None", "timesteps": "c",
    "graph": "graph", "nodes": "=[env.node]", "leafs": "=[env.a, env.b]",
    "buft": "buft", "buffer_type": "buft", "buffer": "buf", "memory": "=None",
    "backend": "cpu", "backend_src": "cpu", "cpu": "cpu", "event": "event", "ev": "cl_event",
    "mem": "mem", "kernel": "kernel", "device": "=0", "sched": "sched", "case": "case",
    "model": "model", "cache": "kv", "config": "config", "cfg": "config", "snap": "snapshot",
    "backends": "=[env.cpu]", "buffer_types": "=[env.buft]", "bufts": "=[env.buft]",
    "name": "=\"x\"", "type": "=\"f32\"", "type_name": "=\"f32\"", "shape": "=(4, 8)",
    "ne": "=(8, 4, 1, 1)", "nb": "=(4, 32, 128, 128)", "axes": "=(1, 0, 2, 3)",
    "size": "=64", "offset": "=0", "min_size": "=16", "buffer_id": "=0", "split_id": "=0",
    "backend_id": "=0", "i": "=0", "n": "=4", "index": "=0", "reps": "=2", "row_bytes": "=0",
    "ne0": "=8", "ne1": "=4", "ne2": "=1", "ne3": "=1", "nb1": "=32", "nb2": "=128",
    "nb3": "=128", "data": "=bytes(128)", "out": "=None", "raw": "=bytes(34)",
    "values": "=np.zeros(32, np.float32)", "dtype": "=np.float32", "params": "=[1, 2]",
    "op": "=\"ADD\"", "ops": "=\"*\"", "supports": "=\"*\"", "unsupported": "=()",
    "graph_size": "=64", "path": "=\"sweep.json\"", "source": "case_dict",
    "tokens": "=[1, 2]", "what": "=\"what\"", "where": "=\"where\"", "field": "=\"field\"",
    "assignments": "=[]", "callback": "=None", "key": "=\"a\"", "obj": "=1",
    "status": "=0", "args": None, "kwargs": None, "kw": None, "kwds": None, "exc": None,
}


def valid_value(env, qual, param):
    for (suffix, name), spec in BY_CALL.items():
        if name == param.name and (qual.endswith("." + suffix) or qual == suffix):
            return resolve(env, spec)
    if param.name in BY_NAME and BY_NAME[param.name] is not None:
        return resolve(env, BY_NAME[param.name])
    if param.default is not inspect.Parameter.empty:
        return param.default
    return 1


def resolve(env, spec):
    from ggml_py import ops  # noqa: F401  (used by `=` expressions)
    if spec == "None":
        return None
    if spec.startswith("="):
        return eval(spec[1:], {"env": env, "np": np, "ops": ops})
    return getattr(env, spec)


# ---------------------------------------------------------------------------
# what to call

def public_callables():
    """(qualified name, module, class or None, attribute name) of every target."""
    out = []
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != m:
                continue
            if inspect.isclass(obj):
                if issubclass(obj, BaseException):
                    out.append((f"{m}.{name}.__init__", m, obj, "__init__"))
                    continue
                out.append((f"{m}.{name}.__init__", m, obj, "__init__"))
                for attr in sorted(dir(obj)):
                    if attr.startswith("_") and attr not in DUNDERS:
                        continue
                    raw = inspect.getattr_static(obj, attr)
                    if isinstance(raw, property) or type(raw).__name__ == "getset_descriptor":
                        if getattr(raw, "fset", None) is not None or \
                                type(raw).__name__ == "getset_descriptor":
                            out.append((f"{m}.{name}.{attr}=", m, obj, attr))
                        continue
                    if callable(getattr(obj, attr, None)):
                        out.append((f"{m}.{name}.{attr}", m, obj, attr))
            elif callable(obj) and m not in CLASSES_ONLY:
                out.append((f"{m}.{name}", m, None, name))
    return out


# instance of each class to call methods on (by name, or by module and name where two
# classes share one)
INSTANCES = {
    "Context": "ctx", "Tensor": "a", "Graph": "graph", "HashSet": "hashset",
    "BufferType": "buft", "Buffer": "buf", "Backend": "backend", "SchedCore": "=env.sched._core",
    "GraphSnapshot": "snapshot", "TensorAllocator": "talloc", "VBuffer": "=env.galloc.buffer(0)",
    "GraphAllocator": "galloc", "DeviceContext": "ocl_ctx", "Mem": "mem", "Program": "program",
    "Kernel": "kernel", "Event": "cl_event", "Scheduler": "sched", "Plan": "plan",
    "Runtime": "=env.sched.runtime", "Profile": "=env.sched.profile",
    "GraphView": "=__import__('ggml_py.runtime').runtime.GraphView([env.node])",
    "Case": "case", "CaseTables": "=env.case._tables", "SimBufferType": "sim_buft",
    "SimBackend": "sim",
    "DeviceBuffer": "dev_buf", "NumpyDeviceBufferType": "=env.dev.buffer_type",
    "DeviceEvent": "event", "NumpyDeviceBackend": "dev", "CPUBackend": "cpu",
    "OpenCLBuffer": "=env.ocl.buffer_type.alloc_buffer(64)", "OpenCLBufferType": "=env.ocl.buffer_type",
    "OpenCLEvent": "=env.ocl.event_new()", "OpenCLBackend": "ocl", "ModelConfig": "config",
    "Model": "model", "KVCache": "kv", "Forward": "forward", "Session": "session",
    "Executor": "=env.cpu.executor", "CPlan": "=env.cpu.executor.cplan_of(env.graph)",
    "KernelPolicy": "=env.cpu.policy",
}

# calls not to make (--skip adds to it)
SKIP = set()


def target_and_params(env, qual, cls, attr):
    """(callable, parameters) for one target; None when it cannot be set up here."""
    if cls is None:
        fn = getattr(importlib.import_module(qual.rsplit(".", 1)[0]), attr)
        return fn, _params(fn)
    if attr == "__init__":
        return cls, _params(cls.__init__)
    spec = INSTANCES.get(f"{cls.__module__}.{cls.__name__}", INSTANCES.get(cls.__name__))
    if spec is None:
        return None
    inst = resolve(env, spec)
    if inst is None:
        return None
    if qual.endswith("="):
        try:        # a read-only attribute refuses any value, as everywhere in Python
            setattr(inst, attr, getattr(inst, attr))
        except AttributeError:
            return None
        except Exception:
            pass
        return (lambda value, _i=inst, _a=attr: setattr(_i, _a, value)), \
            [inspect.Parameter("value", inspect.Parameter.POSITIONAL_ONLY)]
    fn = getattr(inst, attr)
    return fn, _params(fn)


def _params(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values()
            if p.name not in ("self", "cls")
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


# ---------------------------------------------------------------------------
# calling

def allowed(exc):
    from ggml_py.errors import GgmlPyError
    if isinstance(exc, GgmlPyError):
        return True
    # Python's own argument checks: None or a wrong type in a typed parameter
    return type(exc) in (TypeError, ValueError)


# A hostile size that a device could really give (PoCL here: up to 4 GiB at once) takes
# seconds to allocate and zero on a small machine, more under load, and the alarm takes
# that for a hang: every call runs with the OpenCL devices capped, so that such a size
# is refused at once. (Before each call: the sweep of set_memory_limit moves the cap.)
SWEEP_DEVICE_MEMORY = 1 << 26
_n_devices = None


def _cap_device_memory():
    global _n_devices
    try:
        from ggml_py.backends.opencl import _shim
        if _n_devices is None:
            _n_devices = _shim.device_count()
    except Exception:                   # noqa: BLE001 -- no OpenCL: nothing to cap
        _n_devices = 0
        return
    for i in range(_n_devices):
        _shim.set_memory_limit(i, SWEEP_DEVICE_MEMORY)


def call(fn, args, kwargs):
    _cap_device_memory()
    signal.alarm(CALL_TIMEOUT_S)
    try:
        fn(*args, **kwargs)
        return None
    except Hang:
        return "hang"
    except BaseException as e:          # noqa: BLE001 -- judged by allowed()
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return e
    finally:
        signal.alarm(0)


def sweep(values, only=None):
    from ggml_py.errors import GgmlPyError
    problems = []
    n_calls = n_raised = 0
    for qual, mod, cls, attr in public_callables():
        if only and only not in qual or qual in SKIP:
            continue
        env = Env()
        try:
            try:
                got = target_and_params(env, qual, cls, attr)
            except Exception as e:      # the environment itself: a bug of this sweep
                problems.append({"call": qual, "setup": f"{type(e).__name__}: {e}"})
                continue
            if got is None:
                continue
            fn, params = got
            base = []
            for p in params:
                try:
                    base.append(valid_value(env, qual, p))
                except Exception as e:
                    problems.append({"call": qual, "setup": f"{p.name}: {type(e).__name__}: {e}"})
                    base = None
                    break
            if base is None:
                continue
            for k in range(len(params)):
                for value in values:
                    args = list(base)
                    args[k] = value
                    kwargs = {}
                    # keyword-only parameters go by name
                    pos = [a for a, p in zip(args, params) if p.kind != p.KEYWORD_ONLY]
                    kwargs = {p.name: a for a, p in zip(args, params) if p.kind == p.KEYWORD_ONLY}
                    print(f"calling {qual} [{params[k].name}={value!r}]", flush=True)
                    out = call(fn, pos, kwargs)
                    n_calls += 1
                    if out is None:
                        continue
                    n_raised += 1
                    if out == "hang" or not allowed(out):
                        problems.append({
                            "call": qual, "param": params[k].name, "value": repr(value),
                            "error": "hang" if out == "hang" else
                            f"{type(out).__module__}.{type(out).__name__}: {out}"[:300]})
        finally:
            env.close()
            gc.collect()
    return problems, n_calls, n_raised


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--values", choices=("none", "all"), default="all")
    ap.add_argument("--only")
    ap.add_argument("--skip", default="", help="comma-separated qualified names not to call")
    args = ap.parse_args(argv)
    SKIP.update(x for x in args.skip.split(",") if x)
    signal.signal(signal.SIGALRM, _alarm)
    os.chdir(tempfile.mkdtemp(prefix="ggml_py_sweep_"))      # calls may write files
    problems, n_calls, n_raised = sweep(NONE if args.values == "none" else HOSTILE, args.only)
    for p in problems:
        print("PROBLEM " + json.dumps(p), flush=True)
    print("SUMMARY " + json.dumps({"calls": n_calls, "raised": n_raised,
                                   "problems": len(problems)}), flush=True)


if __name__ == "__main__":
    main()
