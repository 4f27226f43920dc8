"""Simulated devices for planning a model without loading it: `--device` specs.

A spec is `KIND[:MEMORY]` (`cuda0:24GiB`, `rpc:24105MiB`, `cpu`), one per device (a
numbered kind may carry its index, which must be the device's place among that kind's,
as llama.cpp counts them), or `rpc:HOST:PORT`, the devices of a live ggml RPC server with
the free memory it reports; comma-separated. Each kind is a module of this package with
its ggml backend's rules (supports_op, buffer alignment and size) and llama.cpp's device
name (CUDA0, Vulkan0, MTL0, GPUOpenCL, RPC0, CPU): it defines KIND, PREFIX, NUMBERED
(whether names carry an index; an unnumbered kind has one device at most) and
`backend(name)`; adding a kind is adding such a module to KINDS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from ggml_py._backend import Backend
from ggml_py.errors import ArgumentError
from ggml_py.models.devices import cpu, cuda, metal, opencl, rpc, vulkan

KINDS: dict[str, ModuleType] = {m.KIND: m for m in (cuda, metal, vulkan, opencl, rpc, cpu)}
_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
_SPEC = re.compile(r"(?P<kind>[a-z]+)(?P<index>\d+)?"
                   r"(?::(?P<amount>\d+(?:\.\d+)?)(?P<unit>[a-zA-Z]*))?")
_SERVER = re.compile(r"rpc:(?P<endpoint>.+:\d+)")


@dataclass
class Device:
    """One simulated device: its llama.cpp name, kind, memory (None: not said) and backend."""
    name: str
    kind: str
    memory: int | None
    backend: Backend

    @property
    def is_cpu(self) -> bool:
        """Whether this is the CPU (llama.cpp's fallback device, always last)."""
        return self.kind == cpu.KIND


def parse_memory(text: str, unit: str) -> int:
    """Bytes of '24105' + 'MiB' (units B, KiB, MiB, GiB, TiB; none: bytes)."""
    if unit.upper() not in _UNITS:
        raise ArgumentError(f"unknown memory unit {unit!r}; use one of B, KiB, MiB, GiB, TiB")
    return int(float(text) * _UNITS[unit.upper()])


def _check_index(item: str, kind: ModuleType, index: str | None, count: int) -> None:
    """An index written in a spec (`cuda1`) is the device's place among its kind's."""
    if index is None:
        return
    if not kind.NUMBERED:
        raise ArgumentError(f"--device {item!r}: {kind.KIND} takes no index (llama.cpp "
                            f"names its one device {kind.PREFIX})")
    if int(index) != count:
        raise ArgumentError(f"--device {item!r}: this is {kind.KIND} device {count} of the "
                            f"list, named {kind.PREFIX}{count}; write {kind.KIND}{count} "
                            f"or {kind.KIND}")


def parse_devices(spec: str) -> list[Device]:
    """The devices of a `--device` spec, named as llama.cpp names them (the kind's prefix and
    its index among that kind's devices; the CPU is `CPU`); a live server's are asked for
    their memory (RPCError naming the server when it cannot be). The CPU comes last, added when
    the spec leaves it out: llama.cpp always has it."""
    if not isinstance(spec, str) or not spec.strip():
        raise ArgumentError("--device needs at least one device, e.g. rpc:24GiB,cpu")
    devices: list[Device] = []
    counts: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        m = _SPEC.fullmatch(item)
        server = _SERVER.fullmatch(item)
        if server is not None and m is None:
            memories: list[int | None] = list(rpc.free_memory(server["endpoint"]))
            kind = rpc
        elif m is not None and m["kind"] in KINDS:
            kind = KINDS[m["kind"]]
            memories = [parse_memory(m["amount"], m["unit"]) if m["amount"] is not None
                        else None]
            _check_index(item, kind, m["index"], counts.get(kind.KIND, 0))
        else:
            raise ArgumentError(f"--device {item!r}: expected KIND[:MEMORY] with KIND one of "
                                f"{', '.join(KINDS)} (e.g. cuda0:24GiB, rpc:24105MiB), or "
                                f"rpc:HOST:PORT")
        for memory in memories:
            index = counts.get(kind.KIND, 0)
            counts[kind.KIND] = index + 1
            name = f"{kind.PREFIX}{index}" if kind.NUMBERED else kind.PREFIX
            devices.append(Device(name, kind.KIND, memory, kind.backend(name)))
    for k, n in counts.items():
        if n > 1 and not KINDS[k].NUMBERED:
            raise ArgumentError(f"--device {spec!r}: one {k} at most (llama.cpp names it "
                                f"{KINDS[k].PREFIX}, with no index)")
    if cpu.KIND not in counts:
        devices.append(Device(cpu.PREFIX, cpu.KIND, None, cpu.backend(cpu.PREFIX)))
    devices.sort(key=lambda d: d.is_cpu)        # the CPU last, the others in spec order
    return devices


__all__ = ["Device", "KINDS", "parse_devices", "parse_memory"]
