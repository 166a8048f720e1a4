"""Epsilon sampling: a fixed probability line, decided at both of the tail's bounds."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _below_probability, _Chain
from playground.state.what_if.stages import stage


@stage("epsilon_cutoff")
def _epsilon(c: _Chain, s: RunSettings, *_: object) -> None:
    _below_probability(c, np.full(c.x.shape[0], s.epsilon_cutoff), protect_top=True)

