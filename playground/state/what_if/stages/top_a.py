"""Top-a: a token is removed when ``p < a · p_max²``, i.e. when its logit is below ``log a + 2·top − log Z``: the
line falls as the tail's weight (in Z) grows, so the cut is decided at both of the tail's bounds."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.config.samplers.top_a import TopASettings
from playground.state.what_if.bounds import _PAST, _SPREAD, _Chain
from playground.state.what_if.stages import stage


@stage("top_a")
def _top_a(c: _Chain, s: RunSettings, *_: object) -> None:
    log_a = math.log(s.group(TopASettings).top_a)
    top = np.max(c.x, axis=1)
    c.flag(c.alive & (top < c.top), _SPREAD)  # the likeliest token may be one outside the recorded candidates
    lse = c.recorded_lse()
    line_high = log_a + 2 * top - c.log_z(c.lo, lse)[:, 0]  # the smallest normaliser: the line at its highest
    line_low = log_a + 2 * top - c.log_z(c.hi, lse)[:, 0]
    remove = c.x < line_high[:, None]
    keep_anyway = c.x >= line_low[:, None]
    c.near(c.x - line_high[:, None])
    c.flag(c.alive & (remove & keep_anyway).any(axis=1), _SPREAD)
    gone = c.top < line_low  # the likeliest tail token is below even the lowest line
    c.flag(c.alive & ~gone, _PAST)
    c.x = np.where(remove, -np.inf, c.x)
    c.cut_tail(gone)
