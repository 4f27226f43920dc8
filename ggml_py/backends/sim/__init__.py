"""Simulated backends: the devices of SCHED_CASES.md.

A simulated backend answers the scheduler's questions (supports_op,
offload_op, supports_buft) from the C tables of Backend, filled from a case
file's backend entry, and cannot compute. Besides "*" or a list of op names,
`supports_ops` may name one of ggml_py._supports' C rules, minus `unsupported_ops`
("rpc-cpu-server": a ggml RPC server on a CPU; "cuda", "vulkan", ...: ggml's GPU
backends): a plan for such devices without any of them. Its buffers have a fake, aligned,
non-null base and no memory, so graphs of any size can be split and
allocated without touching RAM.
"""

from __future__ import annotations

from typing import Sequence

from ggml_py._backend import Backend, BufferType, fake_buffer, DEVICE_TYPES
from ggml_py._core import OP_IDS
from ggml_py._supports import RULE_NAMES, use_rule
from ggml_py._validate import (SIZE_MAX, INT64_MIN, INT64_MAX, check_keys, check_int, check_bool, check_name, check_list,
                               check_choice, fail)

DEFAULT_ALIGNMENT = 32
DEFAULT_MAX_SIZE = None         # unbounded (ggml: SIZE_MAX)
RPC_SERVER_OPS = "rpc-cpu-server"   # supports_ops: what a ggml RPC server on a CPU runs

# keys of a backend entry, in file order; the optional ones have defaults
BACKEND_KEYS = ("name", "device_type", "buffer_type", "buffer_type_is_host",
                "buffer_type_alignment", "buffer_type_max_size", "supports_buffer_types",
                "supports_ops", "unsupported_ops", "offload_ops", "offload_min_batch")
OPTIONAL_BACKEND_KEYS = {"buffer_type_alignment": DEFAULT_ALIGNMENT,
                         "buffer_type_max_size": DEFAULT_MAX_SIZE}


class SimBufferType(BufferType):
    """A buffer type of a simulated device: buffers get a fake base, no memory."""

    def alloc_buffer(self, size):
        return fake_buffer(self, size)


def _copy_ops(ops):
    return ops if isinstance(ops, str) else list(ops)


def _ops(value, where, field, rules=()):
    """'*', one of `rules`, or a list of known op names, returned as given (a copy)."""
    if value in rules:
        return value
    check_list(value, where, field)
    for name in value:
        if not isinstance(name, str) or name not in OP_IDS:
            fail(where, f"{field}: unknown op {name!r}")
    return list(value)


def _where(d, index):
    name = d.get("name") if isinstance(d, dict) else None
    label = f"backend {name!r}" if isinstance(name, str) else "backend"
    return label if index is None else f"backends[{index}] ({label})"


def parse_backend_dict(d, index=None):
    """Check a backend entry; return it with defaults filled in and the set
    of optional keys it left out."""
    where = _where(d, index)
    check_keys(d, [k for k in BACKEND_KEYS if k not in OPTIONAL_BACKEND_KEYS],
               OPTIONAL_BACKEND_KEYS, where)
    check_name(d["name"], where, "name")
    check_choice(d["device_type"], DEVICE_TYPES, where, "device_type")
    check_name(d["buffer_type"], where, "buffer_type")
    check_bool(d["buffer_type_is_host"], where, "buffer_type_is_host")
    omitted = {k for k in OPTIONAL_BACKEND_KEYS if k not in d}
    spec = {k: d.get(k, OPTIONAL_BACKEND_KEYS.get(k)) for k in BACKEND_KEYS}
    align = check_int(spec["buffer_type_alignment"], where, "buffer_type_alignment", 1,
                      SIZE_MAX)
    if align & (align - 1):
        fail(where, f"buffer_type_alignment must be a power of two, got {align}")
    if spec["buffer_type_max_size"] is not None:
        check_int(spec["buffer_type_max_size"], where, "buffer_type_max_size", 1, SIZE_MAX)
    for name in check_list(spec["supports_buffer_types"], where, "supports_buffer_types"):
        check_name(name, where, "supports_buffer_types entry")
    spec["supports_ops"] = _ops(spec["supports_ops"], where, "supports_ops",
                                ("*", *RULE_NAMES))
    spec["unsupported_ops"] = _ops(spec["unsupported_ops"], where, "unsupported_ops")
    spec["offload_ops"] = _ops(spec["offload_ops"], where, "offload_ops", ("*",))
    check_int(spec["offload_min_batch"], where, "offload_min_batch", INT64_MIN, INT64_MAX)
    return spec, omitted


def _layout(spec):
    return (spec["buffer_type_is_host"], spec["buffer_type_alignment"],
            spec["buffer_type_max_size"])


def buffer_types_from_dicts(backend_dicts):
    """One SimBufferType per buffer type name the backends mention.

    A declared type (some backend's `buffer_type`) takes its layout from the
    backends that declare it, which must agree; a type only named in
    `supports_buffer_types` gets the defaults: alignment 32, unbounded, not host.
    """
    declared = {}       # name -> (layout, first declaring backend)
    referenced = []
    for i, d in enumerate(backend_dicts):
        spec, _ = parse_backend_dict(d, i)
        name = spec["buffer_type"]
        if name in declared and declared[name][0] != _layout(spec):
            (host, align, size), owner = declared[name]
            fail(f"buffer type {name!r}",
                 f"backend {owner!r} declares is_host={host}, alignment={align}, max_size={size} "
                 f"but backend {spec['name']!r} declares is_host={spec['buffer_type_is_host']}, "
                 f"alignment={spec['buffer_type_alignment']}, "
                 f"max_size={spec['buffer_type_max_size']}")
        declared.setdefault(name, (_layout(spec), spec["name"]))
        referenced.extend(spec["supports_buffer_types"])
    out = {}
    for name, ((host, align, size), owner) in declared.items():
        out[name] = SimBufferType(name, align, size, host, device=owner)
    for name in referenced:
        if name not in out:
            out[name] = SimBufferType(name, DEFAULT_ALIGNMENT, DEFAULT_MAX_SIZE, False)
    return out


class SimBackend(Backend):
    """A backend of a case file: table-driven supports_op / offload_op /
    supports_buft (never a Python call while splitting), no compute."""

    def __init__(self, name: str, buffer_type: BufferType, device_type: str = "cpu",
                 supports_ops: str | Sequence[str] = "*", unsupported_ops: Sequence[str] = (),
                 offload_ops: str | Sequence[str] = (), offload_min_batch: int = 0,
                 supported_buffer_types: Sequence[BufferType] | None = None) -> None:
        self._omitted = set()
        super().__init__(name, buffer_type, device_type, supports_ops, unsupported_ops,
                         offload_ops, offload_min_batch, supported_buffer_types)

    # the tables lose how they were written ('*' minus a list); keep that for to_dict
    def set_supported_ops(self, supports="*", unsupported=()):
        if isinstance(supports, str) and supports in RULE_NAMES:
            use_rule(self, supports, unsupported)
        else:
            super().set_supported_ops(supports, unsupported)
        self._supports_ops = _copy_ops(supports)
        self._unsupported_ops = list(unsupported)

    def set_offload_ops(self, ops=(), min_batch=0):
        super().set_offload_ops(ops, min_batch)
        self._offload_ops = _copy_ops(ops)
        self._offload_min_batch = min_batch

    @classmethod
    def from_dict(cls, d, buffer_types=None):
        """A backend from a case file's backend entry.

        `buffer_types` maps names to the case's BufferType objects (see
        buffer_types_from_dicts); None builds them from this entry alone.
        """
        spec, omitted = parse_backend_dict(d)
        if buffer_types is None:
            buffer_types = buffer_types_from_dicts([d])
        where = _where(d, None)

        def lookup(name):
            if name not in buffer_types:
                fail(where, f"buffer type {name!r} is not among the case's buffer types")
            return buffer_types[name]

        own = lookup(spec["buffer_type"])
        if _layout(spec) != (own.is_host, own.alignment, own.max_size):
            fail(where, f"buffer type {own.name!r} has is_host={own.is_host}, "
                        f"alignment={own.alignment}, max_size={own.max_size}, which this "
                        f"entry contradicts")
        b = cls(spec["name"], own, spec["device_type"], spec["supports_ops"],
                spec["unsupported_ops"], spec["offload_ops"], spec["offload_min_batch"],
                [lookup(n) for n in spec["supports_buffer_types"]])
        b._omitted = omitted
        return b

    def to_dict(self):
        """The backend entry this backend was made from (same key order)."""
        buft = self.buffer_type
        d = {
            "name": self.name,
            "device_type": self.device_type,
            "buffer_type": buft.name,
            "buffer_type_is_host": buft.is_host,
            "buffer_type_alignment": buft.alignment,
            "buffer_type_max_size": buft.max_size,
            "supports_buffer_types": [b.name for b in self.supported_buffer_types],
            "supports_ops": _copy_ops(self._supports_ops),
            "unsupported_ops": list(self._unsupported_ops),
            "offload_ops": _copy_ops(self._offload_ops),
            "offload_min_batch": self._offload_min_batch,
        }
        for k in self._omitted:
            del d[k]
        return d
