"""GGML_SCHED_DEBUG output: the splits of the graph split last with their inputs, and
(level 2) every node with its backend, cause and sources, logged to the "ggml_py.sched"
logger at DEBUG level, as ggml_backend_sched_print_assignments prints them. Scheduler
calls it after a split where its `debug` level (from the environment) is set."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ggml_py._core import VIEW_OPS

if TYPE_CHECKING:
    from ggml_py._backend import Backend
    from ggml_py.sched import Scheduler

log = logging.getLogger("ggml_py.sched")


def log_assignments(sched: Scheduler, level: int = 1) -> None:
    """Log the splits (level 1) and nodes (level 2) of sched's last split."""
    with sched.lock:
        g = sched._require_split()
        for i, node, k, s in sched.walk(g):
            if s is not None:
                ins = " ".join(f"[{t.name} ({_fmt_size(t.nbytes)})]" for t in s.inputs)
                log.debug("## SPLIT #%d: %s # %d inputs%s", k, s.backend.name, len(s.inputs),
                          ": " + ins if ins else "")
            if level > 1 and node.op not in VIEW_OPS:
                b = sched.get_tensor_backend(node)
                srcs = " ".join(
                    f"{s.name} ({_fmt_size(s.nbytes)}) [{_bname(sched.get_tensor_backend(s))} "
                    f"{sched.get_cause(s)}]" for s in node.src if s is not None)
                log.debug("node #%3d (%s): %s (%s) [%s %s] use=%d,c=%d: %s", i, node.op, node.name,
                          _fmt_size(node.nbytes), _bname(b), sched.get_cause(node),
                          g.use_count(node), int("COMPUTE" in node.flags), srcs)


def _fmt_size(n: int) -> str:
    return f"{n // 1024 // 1024}M" if n >= 1024 * 1024 else f"{n // 1024}K"


def _bname(b: Backend | None) -> str:
    return b.name if b is not None else "NULL"
