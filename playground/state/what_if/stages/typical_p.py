"""Locally typical sampling. Where the chain still sees the raw distribution and the step recorded its entropy:
every unrecorded token is at least as surprising as the last recorded one, so at least ``s_tail − H`` from the
entropy; when the recorded tokens ranked before that distance already reach the mass, the cut is theirs and the
tail is out (exact). On the recorded candidates once the tail is cut (exact too); an estimate while the tail is in
play otherwise."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _PAST, _ROUNDING, _Chain, _whole_distribution
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("typical_p")
def _typical(c: _Chain, s: RunSettings, *_: object) -> None:
    known = c.whole() & c.alive
    _whole_distribution(c, known)
    # Known: the whole vocabulary's normaliser and entropy; else the recorded candidates' own.
    log_z = c.log_z(np.where(known, c.hi, NEG_INF))
    with np.errstate(invalid="ignore"):
        logp = c.x - log_z
        probs = np.where(np.isfinite(c.x), np.exp(logp), 0.0)
        entropy = -(probs * np.where(probs > 0, logp, 0.0)).sum(axis=1, keepdims=True)
        entropy = np.where(known[:, None], c.run.whole[:, :1], entropy)
        distance = np.where(np.isfinite(c.x), np.abs(-logp - entropy), np.inf)
    rows = np.arange(c.x.shape[0])[:, None]
    order = np.argsort(distance, axis=1, kind="stable")
    ranked = distance[rows, order]
    cumulative = np.cumsum(probs[rows, order], axis=1)
    last = np.minimum((cumulative < s.typical_p).sum(axis=1), c.x.shape[1] - 1)
    line = ranked[rows[:, 0], last][:, None]
    remove = distance > line
    remove[rows[:, 0], order[:, 0]] = False
    # The tail: its tokens are at least this far from the entropy (each at most as likely as the last recorded).
    with np.errstate(invalid="ignore"):
        tail_distance = np.maximum(-(c.top - log_z[:, 0]) - entropy[:, 0], 0.0)
    reached = cumulative[rows[:, 0], last] >= s.typical_p
    margin = 5 * c.err  # a distance carries a logit's rounding and the normaliser's
    gone = reached & (line[:, 0] < tail_distance - margin)
    c.flag(known & ~gone, _PAST)
    others = np.isfinite(distance) & (np.abs(distance - line) <= margin[:, None])
    others[rows[:, 0], order[rows[:, 0], last]] = False
    near_mass = np.abs(cumulative[rows[:, 0], last] - s.typical_p) <= margin * s.typical_p
    near_mass |= (last > 0) & (np.abs(cumulative[rows[:, 0], np.maximum(last - 1, 0)] - s.typical_p)
                               <= margin * s.typical_p)
    c.flag(known & (others.any(axis=1) | near_mass), _ROUNDING)
    c.x = np.where(remove, NEG_INF, c.x)
    c.cut_tail(known & gone)
