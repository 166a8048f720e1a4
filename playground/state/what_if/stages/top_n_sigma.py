"""Top-nσ: its spread is the whole vocabulary's where the chain still sees the raw distribution, a temperature
at most (the spread scales with the logits; each step records its logits' mean and standard deviation), and then
exact when its line falls above every unrecorded token; on the recorded candidates once the tail is cut (exact
too); an estimate while the tail is in play otherwise."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _PAST, _Chain, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("top_n_sigma")
def _top_n_sigma(c: _Chain, s: RunSettings, *_: object) -> None:
    known = c.whole(unscaled=False) & c.alive
    _whole_distribution(c, known)
    finite = np.isfinite(c.x)
    count = np.maximum(finite.sum(axis=1, keepdims=True), 1)
    zeroed = np.where(finite, c.x, 0.0)
    mean = zeroed.sum(axis=1, keepdims=True) / count
    spread = np.where(finite, (zeroed - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / count
    sigma = np.where(known[:, None], c.run.whole[:, 2:3] * c.scale[:, None], np.sqrt(spread))
    floor = np.max(np.where(finite, c.x, -np.inf), axis=1, keepdims=True) - s.top_n_sigma * sigma
    c.near(c.x - floor)
    gone = c.top < floor[:, 0]  # every unrecorded token lies below the line
    c.flag(known & ~gone, _PAST)
    c.x = np.where(c.x < floor, NEG_INF, c.x)
    c.cut_tail(known & gone)
