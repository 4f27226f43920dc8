"""What machine a benchmark ran on, printed beside its numbers.

A machine kind of a given size (2 cores here) is not one speed: the development machine
has run 3x apart from one spell to another (ggml's own split of 1k nodes: 0.048 µs per
node in one, 0.146 in another), and a virtual machine's CPU name, family and model may
be its hypervisor's generic model rather than the host's. Absolute times mean little
without the machine beside them; ratios against ggml measured in the same run depend on
neither.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

CPUINFO = "/proc/cpuinfo"


def _cpuinfo(path: str = CPUINFO) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break           # the first processor's block ends here
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def describe(path: str = CPUINFO) -> dict[str, Any]:
    """The CPU (model name, x86 family and model, MHz now, cache size as reported),
    the cores this process may use and the load average: a benchmark's JSON "machine"."""
    info = _cpuinfo(path)
    mhz = info.get("cpu MHz")
    try:
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "mhz": round(float(mhz)) if mhz else None,
        "cache": info.get("cache size"),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load1": load1,
    }


def summary(path: str = CPUINFO) -> str:
    """describe() on one line: 'AMD EPYC (family 23 model 1), 1996 MHz, 2 cores, load 0.41'."""
    d = describe(path)
    out = d["cpu"]
    if d["family"] is not None:
        out += f" (family {d['family']} model {d['model']})"
    if d["mhz"] is not None:
        out += f", {d['mhz']} MHz"
    out += f", {d['cores']} cores"
    if d["load1"] is not None:
        out += f", load {d['load1']}"
    return out


def announce(as_json: bool = False) -> dict[str, Any]:
    """The machine, said once before a benchmark's numbers. As text: 'machine: ...' is
    printed now. As JSON nothing is printed: the benchmark puts the returned describe()
    under "machine" in each object it prints (with_machine), so that every line of its
    output is one whole JSON object (json.tool, jq and pandas read any of them alone)."""
    d = describe()
    if not as_json:
        print(f"machine: {summary()}", flush=True)
    return d


def with_machine(row: dict[str, Any], machine: dict[str, Any]) -> str:
    """One JSON line: a benchmark's row with the machine inside it."""
    return json.dumps({**row, "machine": machine})
