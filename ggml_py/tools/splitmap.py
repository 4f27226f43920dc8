"""Split maps: a whole plan on one screen, however many nodes it has.

One lane per backend (priority order, top down); along it, in node order, a block per
split, as wide as the split's nodes; arrows from the lane the inputs come from to the
split they are copied into, as thick as the bytes. Below, the bytes copied into each
split, and, when the splits were timed (the demo's prompt), the time each took. Node
counts stand for the time where nothing was measured. Given the graph, the map also
says why each split after the first exists (reasons.split_reasons: beside the split
where there is room, all of them grouped under the x axis) and, on a small graph (up to
OP_NAMES_UP_TO nodes), each node's op.

`SplitMap.from_scheduler(sched, graph=graph)` takes the last split of a Scheduler,
`SplitMap.from_model_plan(plan, graph)` a graph of a model file's plan (models.model_plan);
`m.draw()` makes a matplotlib Figure and `m.save(path)` writes it in the format its
extension names, as matplotlib's savefig does (.png, .svg, .pdf, ...). matplotlib is an
optional extra: pip install "ggml-py-sched[plot]".
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ggml_py._core import Graph
    from ggml_py.models.model_plan import ModelPlan
    from ggml_py.sched import Scheduler

SUFFIXES = (".png", ".svg", ".pdf")     # what the command line offers (save takes more)
OP_NAMES_UP_TO = 48                     # graphs this small show each node's op
LABEL_GAP = 0.1                         # labels closer than this share of the x axis: one
REASON_GAP = 0.2                        # the same for the reasons beside the splits
INSTALL_HINT = 'pip install matplotlib (or pip install "ggml-py-sched[plot]")'

# one colour per lane (ColorBrewer Set2, then Dark2), the CPU always grey
LANE_COLOURS = ["#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f",
                "#e5c494", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"]
CPU_COLOUR = "#b3b3b3"


@dataclass(frozen=True)
class Block:
    """One split: nodes [i_start, i_end) on `backend`, and what was copied into it."""
    index: int
    backend: str
    i_start: int
    i_end: int
    copies: tuple[tuple[str, int], ...] = ()   # (the backend the input came from, bytes)
    seconds: float | None = None               # measured copy + compute time
    ops: tuple[str, ...] = ()                  # its nodes' ops (when the graph was given)
    reason: str = ""                           # why it exists (splits after the first)
    brief: str = ""                            # the reason in a few words, for the picture

    @property
    def n_nodes(self) -> int:
        return self.i_end - self.i_start

    @property
    def bytes_in(self) -> int:
        return sum(n for _, n in self.copies)


@dataclass(frozen=True)
class SplitMap:
    """What a split map shows: the lanes (backends in priority order, by a name unique
    among them) and the blocks."""
    title: str
    lanes: tuple[str, ...]
    blocks: tuple[Block, ...]
    cpu_lanes: tuple[str, ...] = ()

    @classmethod
    def from_scheduler(cls, sched: Scheduler, title: str = "",
                       seconds: Sequence[float] | None = None,
                       graph: Graph | None = None) -> SplitMap:
        """The map of the scheduler's last split; `seconds`: a time per split (as many
        as there are splits), e.g. the demo's measured copy + compute times; `graph`: the
        graph that was split, for each block's ops and why each split exists. Backends of
        the same name get lanes of their own, named 'NAME #i' (i: the priority index)."""
        splits = sched.splits
        if seconds is not None and len(seconds) != len(splits):
            raise ValueError(f"{len(seconds)} times for {len(splits)} splits")
        names = [b.name for b in sched.backends]
        lanes = [n if names.count(n) == 1 else f"{n} #{i}" for i, n in enumerate(names)]

        def lane(backend: Any) -> str:
            return "?" if backend is None else lanes[sched.backend_id(backend)]
        reasons: dict[int, Any] = {}
        nodes: Any = ()
        if graph is not None:
            from ggml_py.reasons import split_reasons
            reasons = {r.split: r for r in split_reasons(sched, graph)}
            nodes = graph.nodes
        blocks = []
        for k, s in enumerate(splits):
            copies = tuple((lane(sched.get_tensor_backend(t)), t.nbytes) for t in s.inputs)
            r = reasons.get(k)
            blocks.append(Block(k, lane(s.backend), s.i_start, s.i_end, copies,
                                None if seconds is None else float(seconds[k]),
                                tuple(t.op for t in nodes[s.i_start:s.i_end]),
                                r.text() if r else "", r.brief() if r else ""))
        return cls(title, tuple(lanes), tuple(blocks),
                   tuple(lanes[i] for i, b in enumerate(sched.backends)
                         if b.device_type == "cpu"))

    @classmethod
    def from_model_plan(cls, plan: ModelPlan, graph: int) -> SplitMap:
        """The map of a model plan's prompt ubatch (graph 0) or decode token (graph 1):
        a lane per device, the splits as the plan recorded them."""
        title = (f"{os.path.basename(plan.path)}, "
                 + ("decode token" if graph else f"prompt ubatch of {plan.n_ubatch} tokens"))
        blocks = tuple(Block(k, s.device, s.i_start, s.i_end, s.copies, reason=s.reason,
                             brief=s.brief) for k, s in enumerate(plan.splits[graph]))
        return cls(title, tuple(d.name for d in plan.devices), blocks,
                   tuple(d.name for d in plan.devices if d.is_cpu))

    @property
    def n_nodes(self) -> int:
        return max((b.i_end for b in self.blocks), default=0)

    @property
    def bytes_in(self) -> int:
        return sum(b.bytes_in for b in self.blocks)

    @property
    def timed(self) -> bool:
        return bool(self.blocks) and all(b.seconds is not None for b in self.blocks)

    def draw(self) -> Figure:
        """A matplotlib Figure of the map (no pyplot state, no display needed)."""
        return draw(self)

    def save(self, path: str | os.PathLike[str], **savefig: Any) -> None:
        """Draw the map and write it to `path`, in the format its extension names as
        matplotlib's savefig does (.png, .svg, .pdf, .eps, .jpg with Pillow, ...);
        keyword arguments go to savefig (dpi=..., transparent=True). ValueError for an
        extension matplotlib cannot write."""
        save(self, path, **savefig)

    def colours(self) -> dict[str, str]:
        out, k = {}, 0
        for lane in self.lanes:
            if lane in self.cpu_lanes:
                out[lane] = CPU_COLOUR
            else:
                out[lane] = LANE_COLOURS[k % len(LANE_COLOURS)]
                k += 1
        return out


BYTE_UNITS = ((1, "B"), (1024, "KiB"), (1024 ** 2, "MiB"), (1024 ** 3, "GiB"))
SECOND_UNITS = ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s"))


def _unit(x: float, units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The largest unit not larger than x (the smallest for 0)."""
    best = units[0]
    for u in units:
        if abs(x) >= u[0]:
            best = u
    return best


def fmt_bytes(n: float) -> str:
    div, name = _unit(n, BYTE_UNITS)
    return f"{n:.0f} B" if div == 1 else f"{n / div:.1f} {name}"


def _fmt_seconds(s: float) -> str:
    div, name = _unit(s, SECOND_UNITS)
    return f"{s / div:.1f} {name}"


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"the split map needs matplotlib: {INSTALL_HINT}") from None
    return matplotlib


# ---------------------------------------------------------------------------
# drawing

def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _lane_label(lane: str) -> str:
    """A lane's name on the axis: an RPC device's endpoint ('RPC0[host:port]') on a line
    of its own, so that two servers' lanes differ where the eye looks."""
    head, bracket, rest = lane.partition("[")
    return f"{head}\n[{rest}" if bracket and head else lane


def _spaced(xs: Sequence[float], gap: float) -> list[int]:
    """Indices of xs (in the order given: most important first) kept so that no two are
    closer than `gap`: labels that would overlap are left out."""
    kept: list[int] = []
    for k, x in enumerate(xs):
        if all(abs(x - xs[j]) >= gap for j in kept):
            kept.append(k)
    return kept


def _why(m: SplitMap, limit: int = 4) -> str:
    """Why the splits exist, grouped: 'why: 6 x REASON (splits 2, 4, ...); ...'."""
    groups: dict[str, list[int]] = {}
    for b in m.blocks:
        if b.reason:
            groups.setdefault(b.reason, []).append(b.index)
    if not groups:
        return ""
    lines = []
    for text, ks in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))[:limit]:
        at = ", ".join(map(str, ks[:5])) + (", ..." if len(ks) > 5 else "")
        lines.append(f"{len(ks)} x {text} ({'splits' if len(ks) > 1 else 'split'} {at})")
    if len(groups) > limit:
        more = len(groups) - limit
        lines.append(f"... and {more} more reason{'s' if more > 1 else ''} "
                     "(ggml-py plan --explain)")
    return "why the splits after the first: " + "\n".join(lines)


def draw(m: SplitMap) -> Figure:
    """A matplotlib Figure of the map (no pyplot state, no display needed)."""
    _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    n_lanes = max(len(m.lanes), 1)
    panels = [1.0 + 0.5 * n_lanes, 1.4] + ([1.4] if m.timed else [])
    fig = Figure(figsize=(13, sum(panels) + 0.9), dpi=110, layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, height_ratios=panels)
    lanes_ax, bytes_ax = axes[0], axes[1]
    colours = m.colours()
    # a split narrower than this still shows as a sliver
    min_w = max(m.n_nodes / 250, 0.6)

    _draw_lanes(lanes_ax, m, colours, min_w)
    _draw_values(bytes_ax, m, colours, min_w, [b.bytes_in for b in m.blocks], BYTE_UNITS,
                 f"bytes copied into each split (total {fmt_bytes(m.bytes_in)})", stems=True)
    if m.timed:
        secs = [b.seconds or 0.0 for b in m.blocks]
        _draw_values(axes[2], m, colours, min_w, secs, SECOND_UNITS,
                     f"time of each split, copies included (total {_fmt_seconds(sum(secs))})",
                     stems=False)
    why = _why(m)
    axes[-1].set_xlabel("graph nodes, in execution order" + (f"\n{why}" if why else ""),
                        fontsize=9)
    axes[-1].set_xlim(-0.01 * max(m.n_nodes, 1), 1.01 * max(m.n_nodes, 1))
    # node indices are whole numbers: no 0.5 ticks rounded to repeated labels
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    head = f"{m.title}: " if m.title else ""
    fig.suptitle(f"{head}{_plural(m.n_nodes, 'node')} in {_plural(len(m.blocks), 'split')} "
                 f"on {_plural(len(m.lanes), 'backend')}, {fmt_bytes(m.bytes_in)} copied "
                 "between them per evaluation", fontsize=12)
    return fig


def _draw_lanes(ax: Axes, m: SplitMap, colours: dict[str, str], min_w: float) -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    y = {lane: len(m.lanes) - 1 - i for i, lane in enumerate(m.lanes)}   # first lane on top
    total_nodes = max(m.n_nodes, 1)
    height = 0.6
    max_bytes = max((n for b in m.blocks for _, n in b.copies), default=1) or 1
    show_ops = 0 < m.n_nodes <= OP_NAMES_UP_TO and any(b.ops for b in m.blocks)
    # the brief reason beside each split that has room for it (the rest: under the axis)
    # (a label that would run past the right end ends there instead)
    last_start = (1 - REASON_GAP) * total_nodes
    beside: set[int] = set()
    for lane in m.lanes:            # labels in different lanes do not meet
        mine = [b for b in m.blocks if b.brief and b.backend == lane]
        beside.update(mine[k].index for k in _spaced(
            [min(b.i_start, last_start) for b in mine], REASON_GAP * total_nodes))
    for b in m.blocks:
        w = max(b.n_nodes, min_w)
        ax.add_patch(Rectangle((b.i_start, y[b.backend] - height / 2), w, height,
                               facecolor=colours[b.backend], edgecolor="white", linewidth=0.6))
        if show_ops:            # each node's op, across its column; the split's name above
            for i, op in enumerate(b.ops):
                ax.text(b.i_start + i + 0.5, y[b.backend], op[:10], rotation=90, ha="center",
                        va="center", fontsize=5.5)
        elif b.n_nodes / total_nodes >= 0.06:     # room for a label
            ax.text(b.i_start + w / 2, y[b.backend],
                    f"split {b.index}\n{_plural(b.n_nodes, 'node')}",
                    ha="center", va="center", fontsize=8)
        if b.index in beside or (show_ops and not b.brief):
            # above the block in the top lane, below it in the others (arrows come in
            # from above there)
            top = y[b.backend] == len(m.lanes) - 1
            note = f"split {b.index}" + (f": {b.brief}" if b.brief else "")
            at_end = b.i_start > last_start and b.index in beside
            ax.text(total_nodes if at_end else b.i_start + 0.15 * min_w,
                    y[b.backend] + (height / 2 + 0.03) * (1 if top else -1), note,
                    ha="right" if at_end else "left", va="bottom" if top else "top",
                    fontsize=6.5, color="#333333")
        # one arrow per source lane: from where the inputs live to the split
        by_source: dict[str, int] = {}
        for src, n in b.copies:
            by_source[src] = by_source.get(src, 0) + n
        for src, n in by_source.items():
            if src not in y or src == b.backend:
                continue
            y0, y1 = y[src], y[b.backend]
            step = height / 2 if y1 > y0 else -height / 2
            width = 0.6 + 2.4 * math.log1p(n) / math.log1p(max_bytes)
            ax.add_patch(FancyArrowPatch((b.i_start, y0 + step), (b.i_start, y1 - step),
                                         arrowstyle="-|>", mutation_scale=8, linewidth=width,
                                         color="#444444", alpha=0.75, zorder=3))
    labels = []
    for lane in m.lanes:
        mine = [b for b in m.blocks if b.backend == lane]
        nodes = sum(b.n_nodes for b in mine)
        line = (f"{_lane_label(lane)}\n{_plural(len(mine), 'split')}, "
                f"{_plural(nodes, 'node')}")
        if m.timed:
            line += f"\n{_fmt_seconds(sum(b.seconds or 0.0 for b in mine))}"
        labels.append(line)
    ax.set_yticks([y[lane] for lane in m.lanes], labels, fontsize=9)
    ax.set_ylim(-0.7, len(m.lanes) - 0.15)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("splits per backend (arrows: inputs copied in, thicker = more bytes)",
                 fontsize=9, loc="left")


def _draw_values(ax: Axes, m: SplitMap, colours: dict[str, str], min_w: float,
                 values: list[float], units: Sequence[tuple[float, str]], title: str,
                 stems: bool) -> None:
    """A value per split under the lanes: stems at the split's start for what happens
    there (bytes copied in), bars over its nodes for what it spends (time)."""
    div, unit = _unit(max(values, default=0.0), units)
    ys = [v / div for v in values]
    xs = [b.i_start for b in m.blocks]
    cs = [colours[b.backend] for b in m.blocks]
    if stems:
        ax.vlines(xs, 0, ys, colors=cs, linewidth=2.5)
        ax.scatter(xs, ys, c=cs, s=18, edgecolors="#555555", linewidths=0.4, zorder=3)
    else:
        ax.bar(xs, ys, width=[max(b.n_nodes, min_w) for b in m.blocks], align="edge",
               color=cs, edgecolor="#555555", linewidth=0.3)
    # name the three largest, so the eye finds where the bulk goes; of those closer than
    # LABEL_GAP, only the larger (their labels would overlap)
    largest = [k for k in sorted(range(len(ys)), key=lambda k: -ys[k]) if ys[k] > 0]
    named = [largest[j] for j in _spaced([xs[k] for k in largest],
                                         LABEL_GAP * max(m.n_nodes, 1))][:3]
    for k in named:
        ax.annotate(f"split {m.blocks[k].index}: {ys[k]:.1f} {unit}", (xs[k], ys[k]),
                    xytext=(4, 2), textcoords="offset points", fontsize=7.5)
    top = max(ys, default=0.0)
    if top > 0:
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel(unit, fontsize=8)
    else:                   # nothing to scale: no axis of 1e-9 units, a sentence instead
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.text(0.5, 0.5, "none", transform=ax.transAxes, ha="center", va="center",
                fontsize=9, color="#666666")
    ax.tick_params(axis="y", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=9, loc="left")


def formats() -> list[str]:
    """The file extensions save() can write here (matplotlib's savefig formats)."""
    _matplotlib()
    from matplotlib.figure import Figure
    return sorted(Figure().canvas.get_supported_filetypes())


def save(m: SplitMap, path: str | os.PathLike[str], **savefig: Any) -> None:
    """Draw the map and write it to `path` in the format its extension names (.png, .svg,
    .pdf, ...: formats()); keyword arguments go to matplotlib's savefig."""
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    known = formats()
    if ext not in known:
        raise ValueError(f"{os.fspath(path)}: a split map is written as "
                         f"{', '.join('.' + f for f in known)} (the extension names the format)")
    draw(m).savefig(path, format=ext, **savefig)
