"""Typical-p, epsilon and eta cutoffs, top-nσ and XTC."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _SPREAD, _XTC, _below_probability, _Chain, _entropy, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("epsilon_cutoff")
def _epsilon(c: _Chain, s: RunSettings, *_: object) -> None:
    _below_probability(c, np.full(c.x.shape[0], s.epsilon_cutoff), protect_top=True)


@stage("eta_cutoff")
def _eta(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    eta = np.minimum(math.sqrt(s.eta_cutoff) * np.exp(-_entropy(c)[:, 0]), s.eta_cutoff)
    _below_probability(c, eta, protect_top=True)


@stage("typical_p")
def _typical(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    log_z = c.log_z(np.full(c.x.shape[0], NEG_INF))
    with np.errstate(invalid="ignore"):
        logp = c.x - log_z
        probs = np.where(np.isfinite(c.x), np.exp(logp), 0.0)
        entropy = -(probs * np.where(probs > 0, logp, 0.0)).sum(axis=1, keepdims=True)
        distance = np.where(np.isfinite(c.x), np.abs(-logp - entropy), np.inf)
    rows = np.arange(c.x.shape[0])[:, None]
    order = np.argsort(distance, axis=1, kind="stable")
    ranked = distance[rows, order]
    cumulative = np.cumsum(probs[rows, order], axis=1)
    last = np.minimum((cumulative < s.typical_p).sum(axis=1), c.x.shape[1] - 1)
    remove = distance > ranked[rows[:, 0], last][:, None]
    remove[rows[:, 0], order[:, 0]] = False
    c.x = np.where(remove, NEG_INF, c.x)


@stage("top_n_sigma")
def _top_n_sigma(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    finite = np.isfinite(c.x)
    count = np.maximum(finite.sum(axis=1, keepdims=True), 1)
    zeroed = np.where(finite, c.x, 0.0)
    mean = zeroed.sum(axis=1, keepdims=True) / count
    spread = np.where(finite, (zeroed - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / count
    floor = np.max(np.where(finite, c.x, -np.inf), axis=1, keepdims=True) - s.top_n_sigma * np.sqrt(spread)
    c.x = np.where(c.x < floor, NEG_INF, c.x)


@stage("xtc")
def _xtc(c: _Chain, s: RunSettings, *_: object) -> None:
    if s.xtc_probability < 1.0:
        c.flag(np.ones(c.x.shape[0], dtype=bool), _XTC)
    decisions = []
    for bound in (c.lo, c.hi):
        with np.errstate(invalid="ignore"):
            probs = np.where(np.isfinite(c.x), np.exp(c.x - c.log_z(bound)), 0.0)
        above = probs >= s.xtc_threshold
        least = np.argmin(np.where(above, probs, np.inf), axis=1)
        remove = above.copy()
        remove[np.arange(c.x.shape[0]), least] = False
        remove &= (above.sum(axis=1) >= 2)[:, None]
        decisions.append(remove)
    c.flag(c.alive & (decisions[0] != decisions[1]).any(axis=1), _SPREAD)
    tail_above = (c.top - c.log_z(c.lo)[:, 0]) >= math.log(s.xtc_threshold)
    c.flag(c.alive & tail_above, _SPREAD)
    c.x = np.where(decisions[1], NEG_INF, c.x)
