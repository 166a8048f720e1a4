"""Tail-free sampling on the recorded candidates: exact once every unrecorded token is cut (the removed tokens'
zeros end the sorted probabilities, and beyond two of them they add nothing to the second differences). While they
are in play and sort below every recorded token in play (each at most the last one's logit), the second
differences up to the recorded ones' last are the recorded numbers', and the rest add up to at most the last two
recorded probabilities (a non-increasing row's |p_i − 2p_{i+1} + p_{i+2}| ≤ p_i − p_{i+2}, which telescopes): the
normaliser lies between the two, and a cut decided at both bounds within the recorded candidates is exact (the tail
is out). Else an estimate, with the unrecorded tokens taken as zeros."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.config.samplers.tfs import TailFreeSettings
from playground.state.what_if.bounds import _ROUNDING, _SPREAD, _Chain, _whole_distribution
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
    go, kept_x = _tfs_with_tail(c, z)
    c.cut_tail(np.isin(np.arange(c.x.shape[0]), go))
    reasons = c.reason[go].copy()
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
    c.x[go], c.reason[go] = kept_x, reasons  # decided with the tail in play: not the zeros' rule


def _tfs_with_tail(c: _Chain, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The steps whose tail is in play, sorted below the recorded tokens in play, and whose cut falls within them at
    both of the normaliser's bounds, and their logits after the cut (the tail out); the others in play flagged."""
    # The prefix: the tokens in play at or above every unrecorded token (the others, a chosen token appended below
    # the recorded ones or one a penalty lowered, sort among the unrecorded ones).
    prefix = np.isfinite(c.x) & (c.x >= c.top[:, None])
    m = prefix.sum(axis=1)
    rows = np.nonzero(c.alive & (m >= 3))[0]
    none = (np.zeros(0, dtype=np.int64), np.zeros((0, c.x.shape[1])))
    if not rows.size:
        return none
    x = np.where(prefix[rows], c.x[rows], -np.inf)
    order = np.argsort(-x, axis=1, kind="stable")  # descending, the rest (-inf here) last
    top = np.max(x, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        p = np.exp(np.take_along_axis(x, order, axis=1) - top)  # the normaliser cancels in the cdf; 0 where removed
    slack = np.expm1(2.5 * c.err[rows])[:, None]  # each recorded probability's relative rounding
    d2 = np.abs(p[:, :-2] - 2 * p[:, 1:-1] + p[:, 2:])
    at = np.arange(d2.shape[1])[None, :]
    inside = at < (m[rows] - 2)[:, None]  # the differences of three recorded tokens in play
    partial = np.cumsum(np.where(inside, d2, 0.0), axis=1)
    wobble = np.cumsum(np.where(inside, (p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]) * slack, 0.0), axis=1)
    total, total_wobble = partial[:, -1:], wobble[:, -1:]
    last_two = np.take_along_axis(p, np.stack([m[rows] - 2, m[rows] - 1], axis=1), axis=1).sum(axis=1,
                                                                                                keepdims=True)
    low, high = total - total_wobble, total + total_wobble + last_two * (1 + slack)
    with np.errstate(invalid="ignore", divide="ignore"):
        removed_surely = inside & ((partial - wobble) / high > z)
        kept_surely = (partial + wobble) / np.maximum(low, 1e-300) <= z
        kept_plainly = partial / np.maximum(total, 1e-300) <= z  # without the rounding
    decided = removed_surely.any(axis=1)
    first = np.argmax(removed_surely, axis=1)  # the first cdf position surely past z: its next token goes
    before = np.maximum(first - 1, 0)
    below = (first == 0) | kept_surely[np.arange(rows.size), before]
    plain = (first == 0) | kept_plainly[np.arange(rows.size), before]
    exact = decided & below
    c.flag(np.isin(np.arange(c.x.shape[0]), rows[decided & ~below & plain]), _ROUNDING)
    c.flag(np.isin(np.arange(c.x.shape[0]), rows[decided & ~below & ~plain]), _SPREAD)
    sorted_remove = np.arange(x.shape[1])[None, :] > first[exact][:, None]  # the positions after first + 1
    remove = np.zeros((int(exact.sum()), x.shape[1]), dtype=bool)
    np.put_along_axis(remove, order[exact], sorted_remove, axis=1)
    return rows[exact], np.where(remove, -np.inf, c.x[rows[exact]])
