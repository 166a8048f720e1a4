"""Eta sampling: its line reads the whole distribution's entropy (an estimate while the tail is in play)."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _below_probability, _Chain, _entropy, _whole_distribution
from playground.state.what_if.stages import stage


@stage("eta_cutoff")
def _eta(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    eta = np.minimum(math.sqrt(s.eta_cutoff) * np.exp(-_entropy(c)[:, 0]), s.eta_cutoff)
    _below_probability(c, eta, protect_top=True)

