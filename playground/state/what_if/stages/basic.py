"""transformers' processors and warpers: repetition penalty, the n-gram ban, top-k, top-p, min-p."""

from __future__ import annotations

import math

import numpy as np

from playground.config import RunSettings
from playground.sampler_maths import NgramIndex
from playground.state.what_if.bounds import _PAST, _RAISES, _ROUNDING, _SPREAD, _Chain, _counts, _per_step_bans
from playground.state.what_if.recorded import NEG_INF
from playground.state.what_if.stages import stage


@stage("repetition_penalty")
def _repetition(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    counts, outside = _counts(c)
    p = s.repetition_penalty
    c.x = np.where(counts > 0, np.where(c.x < 0, c.x * p, c.x / p), c.x)
    c.err = c.err * max(p, 1 / p)
    if p > 1:
        c.lower_tail(outside)
    else:
        c.flag(c.alive & (outside > 0), _RAISES)
        c.pristine &= ~(outside > 0)
        c.top = np.where(c.top > 0, c.top / p, c.top * p)


@stage("no_repeat_ngram")
def _no_repeat_ngram(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    """The engine's rule: every n-gram window of the context whose first n-1 tokens are the context's last n-1
    bans its last token."""
    index, tokens = NgramIndex(s.no_repeat_ngram_size), context.tolist()
    banned = [dict.fromkeys(index.banned(tokens, start + row), 0.0) for row in range(c.x.shape[0])]
    _per_step_bans(c, banned, subtract=False)


@stage("top_k")
def _top_k(c: _Chain, s: RunSettings, *_: object) -> None:
    k = max(s.top_k, 1)
    finite = c.x
    width = c.x.shape[1]
    kth = np.full(c.x.shape[0], -np.inf)
    if k <= width:
        ranked = -np.partition(-finite, [k - 1, k] if k < width else [k - 1], axis=1)  # k-th (and next) largest
        kth = ranked[:, k - 1]
        if k < width:  # the k-th and the next one too close to tell apart
            c.near((kth - np.where(np.isfinite(ranked[:, k]), ranked[:, k], -np.inf))[:, None])
    above = (finite > c.top[:, None]).sum(axis=1)
    decided = above >= k  # k recorded tokens lie above every tail token: the tail is out
    c.flag(c.alive & ~decided, _PAST)
    c.x = np.where(finite < kth[:, None], NEG_INF, c.x)
    c.cut_tail(decided)


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


@stage("min_p")
def _min_p(c: _Chain, s: RunSettings, *_: object) -> None:
    top = np.max(c.x, axis=1)
    line = top + math.log(s.min_p)
    c.flag(c.alive & (top < c.top), _SPREAD)
    c.near(c.x - line[:, None])
    c.x = np.where(c.x < line[:, None], NEG_INF, c.x)
    gone = c.top < line
    c.flag(c.alive & ~gone, _PAST)
    c.cut_tail(gone)
