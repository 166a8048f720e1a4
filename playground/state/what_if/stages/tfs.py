"""Tail-free sampling on the recorded candidates: exact once every unrecorded token is cut (the removed tokens'
zeros end the sorted probabilities, and beyond two of them they add nothing to the second differences); while
they are in play, an estimate with them taken as zeros (their spread enters the normalisation)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.config.samplers.tfs import TailFreeSettings
from playground.state.what_if.bounds import _ROUNDING, _Chain, _whole_distribution
from playground.state.what_if.stages import stage


def tail_free_removed(sorted_probs: np.ndarray, z: float) -> np.ndarray:
    """text-generation-webui's rule on one row of descending probabilities -> which positions it removes."""
    with np.errstate(invalid="ignore", divide="ignore"):
        d2 = np.abs(np.diff(sorted_probs, n=2))
        cdf = np.cumsum(d2 / d2.sum())
    return np.concatenate([[False], cdf > z, [True]])


@stage("tfs")
def _tfs(c: _Chain, s: RunSettings, *_: object) -> None:
    z = s.group(TailFreeSettings).tfs
    _whole_distribution(c)
    log_z = c.log_z(c.hi)
    with np.errstate(invalid="ignore"):
        probs = np.where(np.isfinite(c.x), np.exp(c.x - log_z), 0.0)
    remove = np.zeros(c.x.shape, dtype=bool)
    tail_cut = np.zeros(c.x.shape[0], dtype=bool)
    tail_count = c.run.tail_count
    for row in range(c.x.shape[0]):
        finite = np.nonzero(np.isfinite(c.x[row]))[0]
        order = finite[np.argsort(-probs[row, finite], kind="stable")]
        zeros = min(2, int(c.x.shape[1] - len(finite) + tail_count[row]))  # the vocabulary's removed (or tail) ones
        padded = np.concatenate([probs[row, order], np.zeros(zeros)])
        if len(padded) < 2:
            continue
        removed = tail_free_removed(padded, z)
        remove[row, order] = removed[:len(order)]
        tail_cut[row] = len(order) < len(removed) and bool(removed[len(order)])
        # A rounding of the recorded log-probabilities (1/2048 nat) that moves the cut: the step is not exact.
        for sign in (1.0, -1.0):
            wobble = padded * np.exp(sign * 2.5 * c.err[row] * (-1.0) ** np.arange(len(padded)))
            if (tail_free_removed(wobble, z) != removed).any():
                c.flag(np.arange(c.x.shape[0]) == row, _ROUNDING)
                break
    c.x = np.where(remove, -np.inf, c.x)
    c.cut_tail(tail_cut)
