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
from ggml_py.models.graph import Forward, build_forward, padded_kv, step_inputs, token_ids
from ggml_py.models.model import KVCache, Model


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
        self.key: tuple[int, str] | None = None
        # the kept graph's input arrays by name, rewritten in place each step
        self.arrays: dict[str, np.ndarray] = {}
        self.v_cells = np.zeros(0, dtype=np.int64)
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
        key = (padded_kv(cfg, n_past, 1), logits)
        if self.kept is None or key != self.key or n_past + 1 > cfg.n_ctx:
            fw = build_forward(self.model, self.cache, tokens, logits=logits, kv_rows=True)
            self.kept, self.key = fw, key
            self.arrays = {t.name: values for t, values in fw.inputs}
            # the V cell ids of position 0 (transposed, channel c's cell row starts at
            # c * n_ctx; with flash attention, V's row 0 as K's)
            v_idxs = "inp_v_idxs" if "inp_v_idxs" in self.arrays else "inp_v_idxs_swa"
            self.v_cells = self.arrays[v_idxs] - n_past
            self.n_builds += 1
            return fw, False
        fw = self.kept
        if n_past == fw.n_past + 1:
            self._advance(int(tokens[0]), n_past)
        else:                                   # a jump (the cache was rewound): all anew
            data = step_inputs(cfg, tokens, n_past, fw.n_kv, kv_rows=True)
            for name, values in self.arrays.items():
                if name in data:
                    values[...] = data[name]
        fw.n_past = n_past
        self.n_reuses += 1
        return fw, True

    def _advance(self, token: int, n_past: int) -> None:
        """The inputs of the next position, written in place: what step_inputs would give
        for one token at n_past when the kept inputs are those of n_past - 1 (the mask
        opens one more cell; the cell ids move by one)."""
        a = self.arrays
        a["inp_tokens"][0] = token
        a["inp_pos"][0] = n_past
        n_swa = self.model.config.n_swa
        for mask in ("kq_mask", "kq_mask_swa"):     # (a graph has one of them, or both)
            if mask in a:
                a[mask][..., n_past] = 0.0
        if "kq_mask_swa" in a and n_past >= n_swa:  # the window moves: one cell in, one out
            a["kq_mask_swa"][..., n_past - n_swa] = -np.inf
        for k_idxs, v_idxs in (("inp_k_idxs", "inp_v_idxs"),
                               ("inp_k_idxs_swa", "inp_v_idxs_swa")):
            if k_idxs in a:                     # (the sliding layers' cells are the same)
                a[k_idxs][0] = n_past
                np.add(self.v_cells, n_past, out=a[v_idxs])

    def drop(self) -> None:
        """Forget the kept graph (the cache was cleared, or the model changed)."""
        self.kept = self.key = None
