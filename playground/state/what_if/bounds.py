"""The what-if's working state and its bounds: the candidates still carried (``_Chain``) with the tail (the tokens
not recorded) kept as bounds on its summed weight, the reasons a step is not exact, and the bounding arithmetic
the stages share (temperature's power-mean bounds, a cut at a probability decided at both bounds, per-step bans).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from playground.state.what_if.recorded import LOGPROB_STEP, MOMENT_POWERS, NEG_INF, RecordedRun


@dataclass(frozen=True)
class WhatIf:
    """A run re-derived under other settings; [S, C] arrays, one row per step, one column per candidate (the
    recorded ones by raw rank, then the chosen token when it was not among them; ``ids`` -1 pads a row)."""

    stages: tuple[str, ...]  # the chain as it ran, in order ("dynatemp" for temperature with a range)
    ids: np.ndarray  # [S, C] int64 token ids
    probs: np.ndarray  # [S, C] float64 processed probabilities (0 where cut or padding)
    cut_by: np.ndarray  # [S, C] int16: index into ``stages`` of the first stage that removed it; -1 kept
    kept: np.ndarray  # [S, C] bool: still in play after the whole chain
    chosen: np.ndarray  # [S] int64 the token the run chose
    chosen_prob: np.ndarray  # [S] its processed probability under these settings
    chosen_cut: np.ndarray  # [S] bool: these settings would have removed the run's token
    greedy: np.ndarray  # [S] int64 greedy's pick under these settings (the likeliest processed candidate)
    greedy_differs: np.ndarray  # [S] bool: greedy's pick is not the run's token
    exact: np.ndarray  # [S] bool: the numbers are the chain's own, not estimates
    reasons: tuple[str, ...]  # [S] why a step is not exact ("" when it is)
    mirostat_mu: np.ndarray | None = None  # [S] mirostat v2's mu at each step under these settings (None: off)
    # [S] the processed probability of the tokens not recorded, together (the "rest of the vocabulary" row; an upper
    # bound where the step is not exact); 0 once a cut removed them all
    tail_prob: np.ndarray | None = None

    def cut_name(self, step: int, column: int) -> str | None:
        """The name of the sampler that removed a candidate, as ``Candidate.cut_by`` says it."""
        index = int(self.cut_by[step, column])
        return self.stages[index] if index >= 0 else None


REASONS = [
    "",
    "the step recorded no raw candidates",
    "guidance needs the negative prompt's logits, which the run did not record",
    "a setting raises tokens outside the recorded candidates",
    "a word in the logit bias or DRY's breakers needs the tokenizer",
    "a sampler that reads the whole distribution (typical, eta, top-nσ, dynamic temperature) ran while tokens outside "
    "the recorded candidates were still in play, after an earlier sampler changed the distribution (or in a run "
    "saved without the whole vocabulary's numbers)",
    "the cut depends on how the probability outside the recorded candidates is spread",
    "the kept set reaches past the recorded candidates",
    "XTC fires at random: shown as if it fired",
    "mirostat's mu follows the earlier steps' choices, and an earlier step is not exact (or mu did not settle)",
    "a candidate lies within the recorded log-probabilities' rounding (1/2048 nat) of the cut",
    "tokens outside the recorded candidates stay in play, and temperature or a penalty changed their share by an "
    "amount the recorded numbers do not tell",
]
(_OK, _NOT_RECORDED, _GUIDANCE, _RAISES, _WORDS, _WHOLE, _SPREAD, _PAST, _XTC, _MIROSTAT,
 _ROUNDING, _TAIL_WEIGHT) = range(len(REASONS))


def reason(text: str) -> int:
    """The code of a reason a step is not exact (a stage may add its own)."""
    if text not in REASONS:
        REASONS.append(text)
    return REASONS.index(text)


class _Chain:
    """The arrays one re-derivation works on: logits ``x`` [S, K] of the candidates still worth carrying (``cols``:
    their columns in the recorded arrays; after a cut, only the tokens in play, as the engine's compact chain) and
    the tail's bounds, per step."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run
        self.x = run.x.copy()
        self.ids = run.ids
        self.cols = np.broadcast_to(np.arange(run.x.shape[1]), run.x.shape)
        self.lo = run.log_tail.copy()  # log Σ exp(logit) over the tail: lower and upper bound
        self.hi = run.log_tail.copy()
        self.top = run.tail_top.copy()  # every tail logit is at most this
        self.count = np.maximum(run.tail_count, 1).astype(np.float64)
        self.alive = np.isfinite(run.log_tail)  # the tail may still hold a token in play
        self.reason = np.zeros(run.x.shape[0], dtype=np.int8)
        self.err = np.full(run.x.shape[0], 0.5 / LOGPROB_STEP)  # how far a recorded logit may be from the true one
        self.mu: np.ndarray | None = None  # mirostat's mu per step, when it is on
        self.moments = run.moments  # the tail's recorded log-moments, valid while ``pristine``
        self.pristine = np.isfinite(run.moments).all(axis=1)  # the tail's logits are still the raw ones
        # The steps whose chain is still the raw distribution with every logit times ``scale`` (nothing cut or moved,
        # at most a temperature) and whose whole-vocabulary numbers were recorded (``run.whole``): the samplers that
        # read every token compute from those there. ``derive`` clears it after every stage but those declared
        # ``scales`` (temperature), which keep ``scale`` (and clear the steps where they do more).
        self.raw = np.isfinite(run.whole).all(axis=1)
        self.scale = np.ones(run.x.shape[0])

    def whole(self, unscaled: bool = True) -> np.ndarray:
        """[S] bool: the steps where a stage may read the recorded whole-vocabulary numbers (``unscaled``: only where
        no temperature scaled the logits, for the numbers that do not scale, the entropy)."""
        return self.raw & (self.scale == 1.0) if unscaled else self.raw.copy()

    def flag(self, where: np.ndarray, code: int) -> None:
        self.reason[(self.reason == 0) & where] = code

    def near(self, gap: np.ndarray, where: np.ndarray | None = None) -> None:
        """Flag the steps where a candidate's distance ``gap`` [S, K] to a cut is within the rounding."""
        close = np.isfinite(self.x) & (np.abs(gap) <= 2.5 * self.err[:, None])
        self.flag(close.any(axis=1) if where is None else close.any(axis=1) & where, _ROUNDING)

    def lower_tail(self, touched: np.ndarray) -> None:
        """``touched`` [S] tail tokens had their logit lowered by an unknown amount: the lower bound drops."""
        left = np.exp(self.lo) - touched * np.exp(self.top)
        self.lo = np.where(touched > 0, np.log(np.maximum(left, 0.0)), self.lo)
        self.pristine &= ~(touched > 0)

    def cut_tail(self, removed: np.ndarray) -> None:
        self.alive &= ~removed

    def recorded_lse(self) -> np.ndarray:
        """log Σ exp(x) over the candidates in play [S]."""
        m = np.max(self.x, axis=1, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0.0)
        return np.log(np.exp(self.x - m[:, None]).sum(axis=1)) + m

    def log_z(self, bound: np.ndarray, lse: np.ndarray | None = None) -> np.ndarray:
        """log of the normaliser [S, 1] with the tail's weight at ``bound`` (where it is still in play)."""
        lse = self.recorded_lse() if lse is None else lse
        return np.where(self.alive, np.logaddexp(lse, bound), lse)[:, None]

    def compact(self) -> None:
        """Keep only the columns still in play once every step has at most half of them."""
        finite = np.isfinite(self.x)
        width = int(finite.sum(axis=1).max(initial=0))
        if width * 2 > self.x.shape[1] or width == 0:
            return
        order = np.argsort(~finite, axis=1, kind="stable")[:, :width]
        self.x = np.take_along_axis(self.x, order, axis=1)
        self.ids = np.take_along_axis(self.ids, order, axis=1)
        self.cols = np.take_along_axis(self.cols, order, axis=1)


def _counts(chain: _Chain) -> tuple[np.ndarray, np.ndarray]:
    """The context counts of the candidates the chain still carries [S, K], and how many distinct context tokens
    at each step are not among them [S]."""
    counts = np.take_along_axis(chain.run.counts[0], chain.cols, axis=1)
    return counts, chain.run.counts[1] - (counts > 0).sum(axis=1)


def _per_step_bans(c: _Chain, changes: list[dict[int, float]], subtract: bool) -> None:
    """Apply each step's {token: amount} (``subtract``: lower the logit by it; else ban the token)."""
    touched = np.zeros(c.x.shape[0])
    for row, tokens in enumerate(changes):
        ids = c.ids[row]
        for token, amount in tokens.items():
            where = np.nonzero(ids == token)[0]
            if where.size:
                c.x[row, where] = c.x[row, where] - amount if subtract else NEG_INF
            else:
                touched[row] += 1
    c.lower_tail(touched)


def _scale_tail(c: _Chain, a: np.ndarray) -> None:
    """Every logit times ``a`` [S] (> 0): the tail's summed weight by the power-mean inequality."""
    log_n = np.log(c.count)
    spread_lo, spread_hi = (1 - a) * log_n + a * c.lo, (1 - a) * log_n + a * c.hi
    peak_lo, peak_hi = c.lo + (a - 1) * c.top, c.hi + (a - 1) * c.top
    sharper = a >= 1
    with np.errstate(invalid="ignore"):
        c.lo = np.where(sharper, spread_lo, peak_lo)
        c.hi = np.where(sharper, peak_hi, spread_hi)
    if c.pristine.any():  # the recorded log-moments bound it much closer (log Σ exp(a·logit) is convex in a)
        lo, hi = _moment_bounds(c.moments, a, c.top)
        c.lo = np.where(c.pristine, np.maximum(c.lo, lo), c.lo)
        c.hi = np.where(c.pristine, np.minimum(c.hi, hi), c.hi)
    c.pristine = np.zeros_like(c.pristine)  # later scalings compose: the plain bounds from here on
    # A step with no tail at all (-inf bounds) keeps -inf, whatever the arithmetic of infinities says.
    c.lo = np.where(np.isnan(c.lo), NEG_INF, c.lo)
    c.hi = np.where(np.isnan(c.hi), NEG_INF, c.hi)
    c.top = c.top * a
    c.err = c.err * a


def _moment_bounds(moments: np.ndarray, a: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds [S] on log Σ exp(a·logit) over the tail from its values at MOMENT_POWERS ([S, 5]): a convex function
    lies below each chord over its own segment and above every other chord's extension; past the last power each
    tail logit is at most ``top``."""
    powers = np.array(MOMENT_POWERS)
    slopes = np.diff(moments, axis=1) / np.diff(powers)  # [S, 4]
    lines = moments[:, :-1] + slopes * (a[:, None] - powers[:-1])  # each chord at a, [S, 4]
    inside = (powers[:-1] <= a[:, None]) & (a[:, None] <= powers[1:])  # the chord over a's own segment
    upper = np.where(inside, lines, np.inf).min(axis=1)
    beyond = moments[:, -1] + (a - powers[-1]) * top  # Σ e^{a·l} ≤ e^{(a − 2)·top} Σ e^{2·l} for a > 2
    upper = np.where(a > powers[-1], beyond, upper)
    lower = np.where(inside & ~np.isclose(a[:, None], powers[1:]) & ~np.isclose(a[:, None], powers[:-1]),
                     -np.inf, lines).max(axis=1)
    return lower, upper


def _entropy(c: _Chain) -> np.ndarray:
    """Entropy (nats) of the recorded candidates in play [S, 1] (the tail left out)."""
    log_z = c.log_z(np.full(c.x.shape[0], NEG_INF))
    with np.errstate(invalid="ignore"):
        logp = c.x - log_z
        p = np.where(np.isfinite(c.x), np.exp(logp), 0.0)
        return -(p * np.where(p > 0, logp, 0.0)).sum(axis=1, keepdims=True)


def _whole_distribution(c: _Chain, known: np.ndarray | None = None) -> None:
    """Flag the steps where tokens outside the recorded candidates are in play (``known``: but not those where the
    stage read the recorded whole-vocabulary numbers)."""
    c.flag(c.alive if known is None else c.alive & ~known, _WHOLE)


def _below_probability(c: _Chain, line: np.ndarray, protect_top: bool) -> None:
    """Remove the tokens whose probability is below ``line`` [S] (the likeliest one kept), deciding at both of
    the tail's bounds."""
    top = np.argmax(c.x, axis=1)
    rows = np.arange(c.x.shape[0])
    log_line = np.log(line)[:, None]
    lse = c.recorded_lse()
    z_lo, z_hi = c.log_z(c.lo, lse), c.log_z(c.hi, lse)
    remove = (c.x - z_hi) < log_line  # the smaller probabilities: the bound that removes the most
    keep_anyway = (c.x - z_lo) >= log_line
    if protect_top:
        remove[rows, top] = False
    c.near(c.x - z_hi - log_line)
    c.flag(c.alive & (remove & keep_anyway).any(axis=1), _SPREAD)
    gone = (c.top[:, None] - z_lo)[:, 0] < log_line[:, 0]  # the likeliest tail token, at the smallest normaliser
    c.flag(c.alive & ~gone, _PAST)
    c.x = np.where(remove, NEG_INF, c.x)
    c.cut_tail(gone)
