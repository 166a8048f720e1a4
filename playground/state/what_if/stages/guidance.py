"""Guidance: the negative prompt's logits are not recorded, so every step is an estimate."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _GUIDANCE, _Chain
from playground.state.what_if.stages import stage


@stage("guidance")
def _guidance(c: _Chain, s: RunSettings, *_: object) -> None:
    c.flag(np.ones(c.x.shape[0], dtype=bool), _GUIDANCE)
