"""transformers' top-k: exact when k recorded tokens lie above every token outside the recorded candidates."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _PAST, _Chain
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("top_k")
def _top_k(c: _Chain, s: RunSettings, *_: object) -> None:
    k = max(s.top_k, 1)
    finite = c.x
    width = c.x.shape[1]
    kth = np.full(c.x.shape[0], -np.inf)
    if k <= width:
        ranked = -np.partition(-finite, [k - 1, k] if k < width else [k - 1], axis=1)  # k-th (and next) largest
        kth = ranked[:, k - 1]
        if k < width:  # the k-th and the next one too close to tell apart
            c.near((kth - np.where(np.isfinite(ranked[:, k]), ranked[:, k], -np.inf))[:, None])
    above = (finite > c.top[:, None]).sum(axis=1)
    decided = above >= k  # k recorded tokens lie above every tail token: the tail is out
    c.flag(c.alive & ~decided, _PAST)
    c.x = np.where(finite < kth[:, None], NEG_INF, c.x)
    c.cut_tail(decided)

