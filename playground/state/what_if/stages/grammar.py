"""The constraint: the run records how many tokens its mask allowed at each step, not which, so the what-if cannot
re-apply it; every step of a constrained run is flagged an estimate (the recorded tokens stay as they were)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _Chain, reason
from playground.state.what_if.stages import stage

_NOT_REPLAYED = reason("the constraint's mask is not recorded (only how many tokens it allowed), so the what-if does "
                       "not apply it")


@stage("grammar")
def _grammar(c: _Chain, s: RunSettings, *_: object) -> None:
    c.flag(np.ones(c.x.shape[0], dtype=bool), _NOT_REPLAYED)
