"""transformers' min-p: a line below the recorded top token's logit, exact when it falls above the tail's bound."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _PAST, _SPREAD, _Chain
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("min_p")
def _min_p(c: _Chain, s: RunSettings, *_: object) -> None:
    top = np.max(c.x, axis=1)
    line = top + math.log(s.min_p)
    c.flag(c.alive & (top < c.top), _SPREAD)
    c.near(c.x - line[:, None])
    c.x = np.where(c.x < line[:, None], NEG_INF, c.x)
    gone = c.top < line
    c.flag(c.alive & ~gone, _PAST)
    c.cut_tail(gone)

