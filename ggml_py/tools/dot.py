"""Pictures of a plan: Graphviz DOT with nodes coloured by backend, splits as
clusters (each with why it exists: reasons.split_reasons) and cross-backend copies as
marked edges."""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

from ggml_py._core import VIEW_OPS

if TYPE_CHECKING:
    from ggml_py._core import Graph, Tensor
    from ggml_py.sched import Scheduler

PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f", "#ffffb3"]


def _q(s: object) -> str:
    """A DOT string literal; a newline in `s` becomes DOT's line break."""
    text = str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def plan_to_dot(sched: Scheduler, graph: Graph, title: str = "") -> str:
    """DOT text for the last split of `sched` over `graph`."""
    from ggml_py.reasons import split_reasons
    colour: dict[str | None, str] = {b.name: PALETTE[i % len(PALETTE)]
                                     for i, b in enumerate(sched.backends)}
    why = {r.split: r.brief() for r in split_reasons(sched, graph)}
    lines = ["digraph plan {", "  rankdir=TB;", "  node [style=filled, fontsize=10];",
             f"  label={_q(title)}; labelloc=t;"]

    def node_id(t: Tensor) -> str:
        return f"t{t.id}"

    def backend_name(t: Tensor) -> str | None:
        b = sched.get_tensor_backend(t)
        return b.name if b is not None else None

    nodes = graph.nodes
    for k, split in enumerate(sched.splits):
        lines.append(f"  subgraph cluster_{k} {{")
        head = f"split {k}: {split.backend.name} ({len(split.inputs)} inputs)"
        lines.append(f"    label={_q(head + (chr(10) + why[k] if k in why else ''))};"
                     f" style=rounded; color={_q(colour[split.backend.name])};")
        for t in nodes[split.i_start:split.i_end]:
            shape = "ellipse" if t.op in VIEW_OPS else "box"
            b = backend_name(t)
            label = _q(f"{t.name}\n{t.op} [{b}]")
            lines.append(f"    {node_id(t)} [label={label}, shape={shape}, "
                         f"fillcolor={_q(colour.get(b, 'white'))}];")
        lines.append("  }")
    for t in graph.leafs:
        b = backend_name(t)
        label = _q(f"{t.name}\n[{b}]")
        lines.append(f"  {node_id(t)} [label={label}, shape=note, "
                     f"fillcolor={_q(colour.get(b, 'white'))}];")
    for t in nodes:
        for s in t.src:
            if s is None:
                continue
            d = sched.describe(s)
            if d is not None and d[0] == "copy":
                _, of, backend, slot = d
                lines.append(f"  {node_id(of)} -> {node_id(t)} [color=red, style=dashed, penwidth=2, "
                             f"label={_q(f'copy to {backend.name}#{slot}')}, fontcolor=red];")
            else:
                lines.append(f"  {node_id(s)} -> {node_id(t)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(dot_text: str, path: str) -> bool:
    """Write DOT to `path`; for .svg/.png/.pdf paths render it with `dot` when it is
    installed (writing the DOT beside it otherwise). Returns True when rendered."""
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else "dot"
    if fmt in ("svg", "png", "pdf"):
        exe = shutil.which("dot")
        if exe:
            r = subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot_text.encode(),
                               capture_output=True)
            if r.returncode != 0:
                raise OSError(f"Graphviz could not write {path}: "
                              f"{r.stderr.decode(errors='replace').strip()}")
            return True
        path = path + ".dot"
    with open(path, "w") as f:
        f.write(dot_text)
    return False
