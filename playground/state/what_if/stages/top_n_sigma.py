"""Top-nσ on the recorded candidates (the spread reads the whole distribution: an estimate while the tail is in
play)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _Chain, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("top_n_sigma")
def _top_n_sigma(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    finite = np.isfinite(c.x)
    count = np.maximum(finite.sum(axis=1, keepdims=True), 1)
    zeroed = np.where(finite, c.x, 0.0)
    mean = zeroed.sum(axis=1, keepdims=True) / count
    spread = np.where(finite, (zeroed - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / count
    floor = np.max(np.where(finite, c.x, -np.inf), axis=1, keepdims=True) - s.top_n_sigma * np.sqrt(spread)
    c.x = np.where(c.x < floor, NEG_INF, c.x)

