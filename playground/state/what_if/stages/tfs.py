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
    """text-generation-webui's rule on rows of descending probabilities [..., n] -> the positions it removes."""
    with np.errstate(invalid="ignore", divide="ignore"):
        d2 = np.abs(np.diff(sorted_probs, n=2, axis=-1))
        cdf = np.cumsum(d2 / d2.sum(axis=-1, keepdims=True), axis=-1)
    edge = np.ones((*sorted_probs.shape[:-1], 1), dtype=bool)
    return np.concatenate([~edge, cdf > z, edge], axis=-1)


@stage("tfs")
def _tfs(c: _Chain, s: RunSettings, *_: object) -> None:
    z = s.group(TailFreeSettings).tfs
    _whole_distribution(c)
    with np.errstate(invalid="ignore"):
        probs = np.where(np.isfinite(c.x), np.exp(c.x - c.log_z(c.hi)), 0.0)
    rows, width = c.x.shape
    order = np.argsort(-probs, axis=1, kind="stable")  # the removed (0) last
    finite = np.isfinite(c.x).sum(axis=1)
    # Every row ends with two more zeros: beyond two, zeros add nothing to the second differences and the last
    # position (always removed) is a zero. A row whose vocabulary has fewer removed or unrecorded tokens than two
    # has exactly that many (only a tiny vocabulary recorded whole).
    zeros = np.minimum(2, width - finite + c.run.tail_count).astype(int)
    padded = np.concatenate([np.take_along_axis(probs, order, axis=1), np.zeros((rows, 2))], axis=1)
    removed = tail_free_removed(padded, z)
    for row in np.nonzero(zeros < 2)[0]:
        n = int(finite[row] + zeros[row])
        removed[row, :n] = tail_free_removed(padded[row, :n], z)
        for sign in (1.0, -1.0):  # the rounding check below, on this row's own length
            wobble = padded[row, :n] * np.exp(sign * 2.5 * c.err[row] * (-1.0) ** np.arange(n))
            if (tail_free_removed(wobble, z) != removed[row, :n]).any():
                c.flag(np.arange(rows) == row, _ROUNDING)
    at = np.arange(width)[None, :]
    remove = np.zeros(c.x.shape, dtype=bool)
    np.put_along_axis(remove, order, removed[:, :width] & (at < finite[:, None]), axis=1)
    # The unrecorded tokens come after the recorded ones: gone when the first place after them is removed.
    c.cut_tail(removed[np.arange(rows), finite])
    # A rounding of the recorded log-probabilities (1/2048 nat) that moves the cut: the step is not exact.
    alternate = (-1.0) ** np.arange(padded.shape[1])
    for sign in (1.0, -1.0):
        wobble = padded * np.exp(sign * 2.5 * c.err[:, None] * alternate)
        moved = (tail_free_removed(wobble, z) != removed)[:, :width] & (at < finite[:, None] + 1)
        c.flag(moved.any(axis=1) & (zeros == 2), _ROUNDING)
    c.x = np.where(remove, -np.inf, c.x)
