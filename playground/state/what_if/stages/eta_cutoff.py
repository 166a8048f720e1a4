"""Eta sampling: its line reads the whole distribution's entropy, the recorded one where the chain still sees the
raw distribution (then a fixed line, decided as epsilon's); on the recorded candidates once the tail is cut (exact
too); an estimate while the tail is in play otherwise."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _below_probability, _Chain, _entropy, _whole_distribution
from playground.state.what_if.stages import stage


@stage("eta_cutoff")
def _eta(c: _Chain, s: RunSettings, *_: object) -> None:
    known = c.whole() & c.alive
    _whole_distribution(c, known)
    entropy = np.where(known, c.run.whole[:, 0], _entropy(c)[:, 0])
    eta = np.minimum(math.sqrt(s.eta_cutoff) * np.exp(-entropy), s.eta_cutoff)
    _below_probability(c, eta, protect_top=True)
