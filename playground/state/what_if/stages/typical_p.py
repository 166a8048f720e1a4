"""Locally typical sampling on the recorded candidates (it reads the whole distribution: an estimate while the tail
is in play)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _Chain, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("typical_p")
def _typical(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    log_z = c.log_z(np.full(c.x.shape[0], NEG_INF))
    with np.errstate(invalid="ignore"):
        logp = c.x - log_z
        probs = np.where(np.isfinite(c.x), np.exp(logp), 0.0)
        entropy = -(probs * np.where(probs > 0, logp, 0.0)).sum(axis=1, keepdims=True)
        distance = np.where(np.isfinite(c.x), np.abs(-logp - entropy), np.inf)
    rows = np.arange(c.x.shape[0])[:, None]
    order = np.argsort(distance, axis=1, kind="stable")
    ranked = distance[rows, order]
    cumulative = np.cumsum(probs[rows, order], axis=1)
    last = np.minimum((cumulative < s.typical_p).sum(axis=1), c.x.shape[1] - 1)
    remove = distance > ranked[rows[:, 0], last][:, None]
    remove[rows[:, 0], order[:, 0]] = False
    c.x = np.where(remove, NEG_INF, c.x)

