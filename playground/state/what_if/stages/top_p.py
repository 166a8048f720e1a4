"""transformers' top-p, decided at both of the tail's bounds."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _PAST, _ROUNDING, _SPREAD, _Chain
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("top_p")
def _top_p(c: _Chain, s: RunSettings, *_: object) -> None:
    """The engine's rule (ascending cumulative ≤ 1 − p removed, the likeliest kept), with the tail's mass below every
    recorded token above its bound, and either below or above the ones under it (their order is unknown)."""
    order = np.argsort(c.x, axis=1, kind="stable")  # ascending, -inf first
    ranked = np.take_along_axis(c.x, order, axis=1)
    lse = c.recorded_lse()
    recorded = np.cumsum(np.exp(ranked - lse[:, None]), axis=1)  # within the recorded candidates
    under = np.isfinite(ranked) & (ranked < c.top[:, None])
    line = 1 - s.top_p
    variants = [(c.hi, False)]
    if (c.alive & (c.lo != c.hi)).any():
        variants.append((c.lo, False))
    if (c.alive[:, None] & under).any():
        variants += [(bound, True) for bound, _ in variants]
    decisions = []
    for bound, tail_under in variants:
        log_z = c.log_z(bound, lse)
        share = np.exp(lse[:, None] - log_z)  # the recorded candidates' share of the whole
        tail = np.where(c.alive, np.exp(bound - log_z[:, 0]), 0.0)[:, None]
        cumulative = recorded * share + tail * (~under | tail_under)
        remove_sorted = cumulative <= line
        remove_sorted[:, -1] = False
        decisions.append(remove_sorted)
        c.near(np.log(np.maximum(cumulative, 1e-300)) - math.log(line), np.isfinite(ranked).any(axis=1))
    differ = np.zeros(c.x.shape[0], dtype=bool)
    for d in decisions[1:]:
        differ |= (d != decisions[0]).any(axis=1)
    c.flag(c.alive & differ, _SPREAD)
    tail_hi = np.where(c.alive, np.exp(c.hi - c.log_z(c.hi, lse)[:, 0]), 0.0)
    gone = tail_hi <= line  # even the likeliest tail token has at most the whole tail at or below it
    c.flag(c.alive & ~gone, _PAST)
    remove = np.zeros_like(decisions[0])
    np.put_along_axis(remove, order, decisions[0], axis=1)
    # The last token kept and the first removed too close to tell which comes first.
    kept_low = np.min(np.where(remove, np.inf, c.x), axis=1)
    removed_high = np.max(np.where(remove, c.x, -np.inf), axis=1)
    c.flag(kept_low - removed_high <= 5 * c.err, _ROUNDING)
    c.x = np.where(remove, NEG_INF, c.x)
    c.cut_tail(gone)

