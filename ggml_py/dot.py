"""Pictures of a plan: Graphviz DOT with nodes coloured by backend, splits as
clusters and cross-backend copies as marked edges."""

from __future__ import annotations

import shutil
import subprocess

PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f", "#ffffb3"]
VIEW_OPS = ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE")


def _q(s) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_to_dot(sched, graph, title="") -> str:
    """DOT text for the last split of `sched` over `graph`."""
    colour = {b.name: PALETTE[i % len(PALETTE)] for i, b in enumerate(sched.backends)}
    lines = ["digraph plan {", "  rankdir=TB;", "  node [style=filled, fontsize=10];",
             f"  label={_q(title)}; labelloc=t;"]

    def node_id(t):
        return f"t{t.id}"

    def backend_name(t):
        b = sched.get_tensor_backend(t)
        return b.name if b is not None else None

    nodes = graph.nodes
    for k, split in enumerate(sched.splits):
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f"    label={_q(f'split {k}: {split.backend.name} ({len(split.inputs)} inputs)')};"
                     f" style=rounded; color={_q(colour[split.backend.name])};")
        for t in nodes[split.i_start:split.i_end]:
            shape = "ellipse" if t.op in VIEW_OPS else "box"
            b = backend_name(t)
            label = _q(t.name + "\\n" + f"{t.op} [{b}]")
            lines.append(f"    {node_id(t)} [label={label}, shape={shape}, "
                         f"fillcolor={_q(colour.get(b, 'white'))}];")
        lines.append("  }")
    for t in graph.leafs:
        b = backend_name(t)
        label = _q(t.name + "\\n" + f"[{b}]")
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
            subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot_text.encode(), check=True)
            return True
        path = path + ".dot"
    with open(path, "w") as f:
        f.write(dot_text)
    return False
