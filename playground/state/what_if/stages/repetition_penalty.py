"""transformers' repetition penalty: the recorded tokens' logits divided, the tail's bounds lowered (or flagged
when a penalty below 1 raises tokens outside the recorded candidates)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _RAISES, _Chain, _counts
from playground.state.what_if.stages import stage


@stage("repetition_penalty")
def _repetition(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    counts, outside = _counts(c)
    p = s.repetition_penalty
    c.x = np.where(counts > 0, np.where(c.x < 0, c.x * p, c.x / p), c.x)
    c.err = c.err * max(p, 1 / p)
    if p > 1:
        c.lower_tail(outside)
    else:
        c.flag(c.alive & (outside > 0), _RAISES)
        c.pristine &= ~(outside > 0)
        c.top = np.where(c.top > 0, c.top / p, c.top * p)

