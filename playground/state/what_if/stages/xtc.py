"""XTC, shown as if it fired (an estimate unless its probability is 1), decided at both of the tail's bounds."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _SPREAD, _XTC, _Chain
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("xtc")
def _xtc(c: _Chain, s: RunSettings, *_: object) -> None:
    if s.xtc_probability < 1.0:
        c.flag(np.ones(c.x.shape[0], dtype=bool), _XTC)
    decisions = []
    for bound in (c.lo, c.hi):
        with np.errstate(invalid="ignore"):
            probs = np.where(np.isfinite(c.x), np.exp(c.x - c.log_z(bound)), 0.0)
        above = probs >= s.xtc_threshold
        least = np.argmin(np.where(above, probs, np.inf), axis=1)
        remove = above.copy()
        remove[np.arange(c.x.shape[0]), least] = False
        remove &= (above.sum(axis=1) >= 2)[:, None]
        decisions.append(remove)
    c.flag(c.alive & (decisions[0] != decisions[1]).any(axis=1), _SPREAD)
    tail_above = (c.top - c.log_z(c.lo)[:, 0]) >= math.log(s.xtc_threshold)
    c.flag(c.alive & tail_above, _SPREAD)
    c.x = np.where(decisions[1], NEG_INF, c.x)

