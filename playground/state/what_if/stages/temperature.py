"""Temperature (the tail's weight by the power-mean inequality) and dynamic temperature (its entropy and count the
whole vocabulary's where the chain still sees the raw distribution and the step recorded them; else an estimate
from the recorded candidates while the tail is in play)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _Chain, _entropy, _scale_tail, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("temperature", label=lambda s: "dynatemp" if s.dynatemp_range > 0 else "temperature", scales=True)
def _temperature(c: _Chain, s: RunSettings, *_: object) -> None:
    if s.dynatemp_range > 0:
        _dynamic_temperature(c, s)
        return
    c.x = c.x / s.temperature
    c.scale = c.scale / s.temperature
    _scale_tail(c, np.full(c.x.shape[0], 1.0 / s.temperature))


def _dynamic_temperature(c: _Chain, s: RunSettings) -> None:
    known = c.whole()
    _whole_distribution(c, known)
    low, high = max(0.0, s.temperature - s.dynatemp_range), s.temperature + s.dynatemp_range
    count = np.where(known, c.run.whole[:, 3], np.isfinite(c.x).sum(axis=1))[:, None]
    entropy = np.where(known[:, None], c.run.whole[:, :1], _entropy(c))
    normalised = entropy / np.log(np.maximum(count, 2))
    temp = low + (high - low) * np.maximum(normalised, 0.0) ** s.dynatemp_exponent
    single = count <= 1
    top = np.argmax(c.x, axis=1)
    argmax_only = np.full(c.x.shape, NEG_INF)
    argmax_only[np.arange(c.x.shape[0]), top] = c.x[np.arange(c.x.shape[0]), top]
    scaled = np.where(temp > 0, c.x / np.maximum(temp, 1e-30), argmax_only)  # the divisor is never 0
    c.x = np.where(single, c.x, scaled)
    a = np.where(single[:, 0] | (temp[:, 0] <= 0), 1.0, 1.0 / np.maximum(temp[:, 0], 1e-30))
    c.scale = c.scale * a
    _scale_tail(c, a)
    argmax = (temp[:, 0] <= 0) & ~single[:, 0]  # a temperature of 0 keeps the top token only: no scaling
    c.cut_tail(argmax)
    c.raw &= ~argmax
