"""The decode graph kept across steps, as llama.cpp reuses its graph.

A one-token step differs from the step before only in the token, its position and
the number of cached cells. Built with `kv_rows` (K/V written by set_rows at cell
ids given as inputs, the attention over the cells rounded up to `kv_pad`, the
causal mask an input), the graph of one step serves every step until the padded
KV length grows: only its inputs change. The scheduler then reuses its plan and
allocation too (Scheduler graph reuse), so such a step builds nothing, splits
nothing and allocates nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ggml_py._core import instance_arg
from ggml_py.errors import ModelError
from ggml_py.models.graph import (Forward, build_forward, padded_kv, step_inputs, swa_mask,
                                  token_ids)
from ggml_py.models.model import KVCache, Model, SwaSlot


class DecodeGraph:
    """The one-token forward graph of a model and cache, kept while its shape holds.

    `forward(tokens, logits)` returns the Forward to compute for the cache's next
    position: the kept one with its inputs' data brought up to date when the padded
    KV length and the logits kind are those it was built for, else a new one (which
    is kept from then on). `n_builds` and `n_reuses` count both outcomes."""

    def __init__(self, model: Model, cache: KVCache) -> None:
        self.model = instance_arg(model, Model, "model")
        self.cache = instance_arg(cache, KVCache, "cache")
        self.kept: Forward | None = None
        self.key: tuple[int, int, str] | None = None
        # the kept graph's input arrays by name, rewritten in place each step
        self.arrays: dict[str, np.ndarray] = {}
        # per cache (the global layers', the sliding layers'): the names of its K and V
        # cell ids, and V's ids less the token's cell (channel c's row starts at c * cells
        # with V transposed; with flash attention, V's row is K's)
        self.cell_inputs: list[tuple[str, str, np.ndarray]] = []
        self.n_builds = 0
        self.n_reuses = 0

    def forward(self, tokens: Sequence[int] | np.ndarray,
                logits: str = "last") -> tuple[Forward, bool]:
        """(Forward for one token at the cache's n_past, whether the kept graph was
        reused)."""
        cfg = self.model.config
        tokens = token_ids(tokens, cfg)
        if tokens.size != 1:
            raise ModelError(f"a decode step is one token, got {tokens.size}")
        n_past = self.cache.n_past
        swa = self.cache.swa_slot(n_past, 1) if cfg.iswa else None
        key = (padded_kv(cfg, n_past, 1), swa.n_kv if swa else 0, logits)
        if self.kept is None or key != self.key or n_past + 1 > cfg.n_ctx:
            fw = build_forward(self.model, self.cache, tokens, logits=logits, kv_rows=True)
            self.kept, self.key = fw, key
            self.arrays = a = {t.name: values for t, values in fw.inputs}
            self.cell_inputs = [(k, v, a[v] - a[k][0]) for k, v in (
                ("inp_k_idxs", "inp_v_idxs"), ("inp_k_idxs_swa", "inp_v_idxs_swa")) if k in a]
            self.n_builds += 1
            return fw, False
        fw = self.kept
        if n_past == fw.n_past + 1:
            self._advance(int(tokens[0]), n_past, swa)
        else:                                   # a jump (the cache was rewound): all anew
            data = step_inputs(cfg, tokens, n_past, fw.n_kv, kv_rows=True, swa=swa)
            for name, values in self.arrays.items():
                if name in data:
                    values[...] = data[name]
        fw.n_past, fw.swa = n_past, swa
        self.n_reuses += 1
        return fw, True

    def _advance(self, token: int, n_past: int, swa: SwaSlot | None) -> None:
        """The inputs of the next position, written in place: what step_inputs would give
        for one token at n_past when the kept inputs are those of n_past - 1 (the global
        mask opens one more cell, the sliding one is the slot's; the cell ids move to the
        token's cells)."""
        a = self.arrays
        a["inp_tokens"][0] = token
        a["inp_pos"][0] = n_past
        if "kq_mask" in a:
            a["kq_mask"][..., n_past] = 0.0
        if swa is not None:
            a["kq_mask_swa"][...] = swa_mask(self.model.config, swa.pos[:swa.n_kv],
                                             a["inp_pos"])
        for k_idxs, v_idxs, v_offsets in self.cell_inputs:
            cell = int(swa.idxs[0]) if swa is not None and k_idxs.endswith("_swa") else n_past
            a[k_idxs][0] = cell
            np.add(v_offsets, cell, out=a[v_idxs])

    def drop(self) -> None:
        """Forget the kept graph (the cache was cleared, or the model changed)."""
        self.kept = self.key = None
