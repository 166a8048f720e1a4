"""Presence and frequency penalties on the recorded tokens, the tail's bounds lowered (or flagged when a negative
penalty raises tokens outside the recorded candidates)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _RAISES, _Chain, _counts
from playground.state.what_if.stages import stage


@stage("penalties")
def _penalties(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    counts, outside = _counts(c)
    c.x = np.where(counts > 0, c.x - counts * s.frequency_penalty - s.presence_penalty, c.x)
    if s.frequency_penalty >= 0 and s.presence_penalty >= 0:
        c.lower_tail(outside)
    else:
        c.flag(c.alive & (outside > 0), _RAISES)
        c.pristine &= ~(outside > 0)

