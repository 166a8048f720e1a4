"""What-if: a finished run's steps re-derived under other sampler settings (or another order), from the raw
candidates each step recorded (``TokenStep.raw_top``), without the model. Display only: what the chain would have
made of the same raw distributions, at the tokens the run actually chose.

Input: the run's steps, its prompt ids (for the penalties), the settings to try. Output: ``WhatIf``, NumPy arrays
over [steps, candidates], computed for all steps at once (a 1,000-step run in a few milliseconds; DRY and the
n-gram ban walk each step's context in Python).

Exactness. The raw distribution is known on the recorded candidates (the likeliest N tokens, the chosen one too)
and, for the rest (the tail), only as its total mass M, its size, and an upper bound on each of its logits (the
last recorded one). The chain is run on the recorded candidates with the tail kept as bounds on its summed weight
``Σ exp(logit)``: temperature maps them by the power-mean inequality, the penalties can only lower tail tokens (and
say so when a setting would raise one). A cut whose decision is the same at both bounds and that removes every tail
token (top-k within the recorded ones, min-p / epsilon / top-p / mirostat when the bound falls below the line) makes
the rest of the chain exact, as the engine's compact chain is. A step is not exact (``exact`` False, ``reasons``
says why) when the kept set reaches past the recorded candidates, when a cut's decision depends on how the tail's
mass is spread, when a sampler that reads the whole distribution (typical, eta, top-nσ, dynamic temperature) runs
while the tail is still in play, when XTC fires at random (shown as if it fired), when guidance is on (the negative
prompt's logits are not recorded), when mirostat's mu (re-derived step by step from the chosen tokens) did not
settle, or when the step recorded nothing. Probabilities then are estimates, with the
tail as one lump at its upper bound.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from playground.config import RunSettings
from playground.config.catalog import STRATEGIES
from playground.config.samplers import SAMPLING_ONLY, parse_logit_bias, parse_sampler_order, sampler_is_on
from playground.events.run import TAIL_POWERS, RawCandidates, TokenStep

LOGPROB_STEP = 1024  # RawCandidates.logprobs: -q / 1024 nats
DRY_MAX_MATCH = 50  # as the engine's DRY
NEG_INF = -math.inf


def unpack_raw_candidates(raw: RawCandidates) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [n] (by raw rank) and their raw logits [n] (``logprob + logsumexp``)."""
    ids = np.frombuffer(base64.b64decode(raw.ids), dtype=f"<u{raw.id_bytes}").astype(np.int64)
    quantised = np.frombuffer(base64.b64decode(raw.logprobs), dtype="<u2")
    return ids, -quantised.astype(np.float64) / LOGPROB_STEP + raw.logsumexp


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


# Reasons a step is not exact, by code (the first one found is kept).
REASONS = (
    "",
    "the step recorded no raw candidates",
    "guidance needs the negative prompt's logits, which the run did not record",
    "a setting raises tokens outside the recorded candidates",
    "a word in the logit bias or DRY's breakers needs the tokenizer",
    "a sampler that reads the whole distribution (typical, eta, top-nσ, dynamic temperature) ran while tokens outside "
    "the recorded candidates were still in play",
    "the cut depends on how the probability outside the recorded candidates is spread",
    "the kept set reaches past the recorded candidates",
    "XTC fires at random: shown as if it fired",
    "mirostat's mu follows the earlier steps' choices, and an earlier step is not exact (or mu did not settle)",
    "a candidate lies within the recorded log-probabilities' rounding (1/2048 nat) of the cut",
    "tokens outside the recorded candidates stay in play, and temperature or a penalty changed their share by an "
    "amount the recorded numbers do not tell",
)
(_OK, _NOT_RECORDED, _GUIDANCE, _RAISES, _WORDS, _WHOLE, _SPREAD, _PAST, _XTC, _MIROSTAT,
 _ROUNDING, _TAIL_WEIGHT) = range(len(REASONS))


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


@dataclass(frozen=True)
class RecordedRun:
    """A run's recorded candidates unpacked once into [S, C] arrays (the what-if re-derives from these as often as
    the settings change): by raw rank, then the chosen token where it was not recorded; ``ids`` -1 pads a row."""

    steps: tuple[TokenStep, ...]
    ids: np.ndarray  # [S, C] int64
    x: np.ndarray  # [S, C] raw logits, -inf for padding
    log_tail: np.ndarray  # [S] log of the unrecorded tokens' Σ exp(logit) (-inf: none)
    tail_top: np.ndarray  # [S] the largest logit an unrecorded token may have (the last recorded one)
    tail_count: np.ndarray  # [S] how many tokens are unrecorded
    moments: np.ndarray  # [S, 5] log Σ exp(a·logit) over the tail at a = MOMENT_POWERS (NaN: not recorded)
    chosen: np.ndarray  # [S] the run's tokens
    chosen_col: np.ndarray  # [S] their columns
    recorded: np.ndarray  # [S] bool: the step has raw candidates
    context: np.ndarray  # prompt + generated token ids
    start: int  # the prompt's length: step s reads context[:start + s]

    @functools.cached_property
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The penalties' counts, once per run (``_context_counts``)."""
        return _context_counts(self)

    @classmethod
    def of(cls, steps: Sequence[TokenStep], prompt_ids: Sequence[int]) -> RecordedRun:
        ids, x, log_tail, tail_top, tail_count, chosen, chosen_col, moments = _load(steps)
        context = np.array([*prompt_ids, *(s.token_id for s in steps)], dtype=np.int64)
        return cls(steps=tuple(steps), ids=ids, x=x, log_tail=log_tail, tail_top=tail_top, tail_count=tail_count,
                   moments=moments,
                   chosen=chosen, chosen_col=chosen_col,
                   recorded=np.array([s.raw_top is not None for s in steps], dtype=bool), context=context,
                   start=len(prompt_ids))


def re_derive(run: RecordedRun, settings: RunSettings, *, sampling: bool | None = None,
              encode: Callable[[str], Sequence[int]] | None = None,
              breaker_ids: frozenset[int] | None = None) -> WhatIf:
    """Re-derive every step of ``run`` (``RecordedRun.of(steps, prompt_ids)``) under ``settings`` (their samplers
    and order; ``sampling``: whether the sampling-only samplers apply, by default when the strategy is "sample", as
    ``build_pipeline`` decides).

    ``encode``: a word's token ids (a logit bias on a word); ``breaker_ids``: DRY's breakers as token ids (every
    token whose text holds one, as the engine reads them). Without them such a step is marked not exact.
    """
    with np.errstate(all="ignore"):  # -inf marks removed tokens throughout: its arithmetic is meant
        return _re_derive(run, settings, sampling, encode, breaker_ids)


def _re_derive(run: RecordedRun, settings: RunSettings, sampling: bool | None,
               encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None) -> WhatIf:
    if sampling is None:  # the strategy's catalog entry says whether it reads the sampling settings
        entry = STRATEGIES.get(settings.strategy)
        sampling = entry is not None and "sampling" in entry.sections
    names = [n for n in parse_sampler_order(settings.samplers)
             if sampler_is_on(settings, n) and (sampling or n not in SAMPLING_ONLY)]
    if "mirostat" not in names:
        return _chain_once(run, settings, names, encode, breaker_ids, None)
    # Mirostat's mu at each step follows the earlier steps' choices under these settings: start from 2·tau
    # everywhere, derive, recompute mu from the chosen tokens' probabilities (a running sum), and again until mu
    # stops moving. Step 0's mu is exact from the start and each pass fixes at least one more, so the fixed point
    # is the sequential answer; steps whose mu still moved after the last pass are marked not exact.
    mu = np.full(len(run.steps), 2.0 * settings.mirostat_tau)
    before = _Progress(_Chain(run), [], np.full(run.x.shape, -1, dtype=np.int16))
    _run_stages(before, run, settings, names[:names.index("mirostat")], encode, breaker_ids)  # once for all passes
    for _ in range(MIROSTAT_PASSES):
        result = _chain_once(run, settings, names, encode, breaker_ids, mu, before)
        following = _mirostat_mu(result.chosen_prob, settings)
        moved = following != mu
        if not moved.any():
            break
        # Past the first step that is not exact every mu is marked not exact anyway: no pass can change that.
        first_moved, first_inexact = int(np.argmax(moved)), int(np.argmin(result.exact))
        if not result.exact.all() and first_moved > first_inexact:
            break
        mu = following
    else:
        result = _chain_once(run, settings, names, encode, breaker_ids, mu, before)
    # A step's mu is only as exact as every earlier step's chosen probability.
    earlier = np.concatenate([[False], np.cumsum(~result.exact)[:-1] > 0])
    unsettled = (_mirostat_mu(result.chosen_prob, settings) != mu) | earlier
    reasons = tuple(REASONS[_MIROSTAT] if bad and not why else why for bad, why in zip(unsettled, result.reasons,
                                                                                         strict=True))
    return dataclasses.replace(result, exact=result.exact & ~unsettled, reasons=reasons)


MIROSTAT_PASSES = 8


def _mirostat_mu(chosen_prob: np.ndarray, s: RunSettings) -> np.ndarray:
    """mu at each step [S]: 2·tau, moved after each step by eta·(surprise − tau) of the chosen token (a token the
    chain removed, probability 0, teaches nothing), as the engine's ``MirostatState.update``."""
    with np.errstate(divide="ignore"):
        error = np.where(chosen_prob > 0, -np.log2(chosen_prob) - s.mirostat_tau, 0.0)
    return 2.0 * s.mirostat_tau - s.mirostat_eta * np.concatenate([[0.0], np.cumsum(error)[:-1]])


def _chain_once(run: RecordedRun, settings: RunSettings, names: list[str],
                encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None,
                mu: np.ndarray | None, start: _Progress | None = None) -> WhatIf:
    """The chain over every step; ``start``: the state after the stages before mirostat, already run."""
    progress = start.copy() if start is not None else _Progress(_Chain(run), [],
                                                                 np.full(run.x.shape, -1, dtype=np.int16))
    progress.chain.mu = mu
    _run_stages(progress, run, settings, names[len(progress.stages):], encode, breaker_ids)
    return _finish(progress, run)


@dataclasses.dataclass
class _Progress:
    """A chain part-way: its arrays, the stages run so far and what each cut."""

    chain: _Chain
    stages: list[str]
    cut_by: np.ndarray

    def copy(self) -> _Progress:
        chain = _Chain.__new__(_Chain)
        chain.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                               for k, v in self.chain.__dict__.items()})
        return _Progress(chain, list(self.stages), self.cut_by.copy())


def _run_stages(progress: _Progress, run: RecordedRun, settings: RunSettings, names: list[str],
                encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None) -> None:
    chain, cut_by, stages = progress.chain, progress.cut_by, progress.stages
    for name in names:
        label = "dynatemp" if name == "temperature" and settings.dynatemp_range > 0 else name
        before = np.isfinite(chain.x)
        _STAGES[name](chain, settings, run.context, run.start, run.steps, encode, breaker_ids)
        rows, at = np.nonzero(before & ~np.isfinite(chain.x))  # a removed token never comes back
        cut_by[rows, chain.cols[rows, at]] = len(stages)
        stages.append(label)
        chain.compact()


def _finish(progress: _Progress, run: RecordedRun) -> WhatIf:
    chain = progress.chain
    # Unrecorded tokens still in play leave the recorded ones' probabilities exact when their total weight is known
    # (no temperature, no penalty on them: the bounds agree); a cut that may have kept some of them said so itself.
    chain.flag(chain.alive & (chain.hi - chain.lo > 1e-9), _TAIL_WEIGHT)
    chain.reason[~run.recorded] = _NOT_RECORDED
    x: np.ndarray = np.full(run.x.shape, NEG_INF)
    rows = np.arange(run.x.shape[0])
    x[rows[:, None], chain.cols] = chain.x
    probs = np.where(np.isfinite(x), np.exp(x - chain.log_z(chain.hi)), 0.0)
    kept = np.isfinite(x) & (run.ids >= 0)
    greedy = run.ids[rows, np.argmax(x, axis=1)] if x.shape[1] else run.chosen
    chosen_cut = ~kept[rows, run.chosen_col]
    tail_prob = np.where(chain.alive, np.exp(chain.hi - chain.log_z(chain.hi)[:, 0]), 0.0)
    return WhatIf(stages=tuple(progress.stages), ids=run.ids, probs=probs, cut_by=progress.cut_by, kept=kept,
                  tail_prob=tail_prob,
                  chosen=run.chosen, chosen_prob=probs[rows, run.chosen_col], chosen_cut=chosen_cut,
                  greedy=greedy, greedy_differs=greedy != run.chosen, exact=chain.reason == 0,
                  reasons=tuple(REASONS[int(r)] for r in chain.reason), mirostat_mu=chain.mu)


MOMENT_POWERS = (0.0, *sorted({1.0, *TAIL_POWERS}))  # 0, 0.5, 1, 1.5, 2


def _load(steps: Sequence[TokenStep]) -> tuple[np.ndarray, ...]:
    """The recorded candidates as [S, C] arrays (the chosen token appended where it was not recorded)."""
    unpacked = [unpack_raw_candidates(s.raw_top) if s.raw_top is not None else (np.zeros(0, np.int64), np.zeros(0))
                for s in steps]
    width = max((len(i) for i, _ in unpacked), default=0)
    chosen = np.array([s.token_id for s in steps], dtype=np.int64)
    ids = np.full((len(steps), width + 1), -1, dtype=np.int64)
    x = np.full((len(steps), width + 1), NEG_INF)
    log_tail = np.full(len(steps), NEG_INF)
    tail_top = np.full(len(steps), NEG_INF)
    tail_count = np.zeros(len(steps))
    chosen_col = np.full(len(steps), width, dtype=np.int64)
    moments = np.full((len(steps), len(MOMENT_POWERS)), np.nan)
    for row, (step, (step_ids, logits)) in enumerate(zip(steps, unpacked, strict=True)):
        n = len(step_ids)
        ids[row, :n], x[row, :n] = step_ids, logits
        raw = step.raw_top
        where = np.nonzero(step_ids == step.token_id)[0]
        if where.size:
            chosen_col[row] = where[0]
        if raw is None:
            ids[row, width], x[row, width] = step.token_id, 0.0  # shown alone; the step is marked not recorded
            continue
        tail = raw.tail_mass
        if not where.size:  # the chosen token's own raw logit is in the step: it leaves the tail
            ids[row, width], x[row, width] = step.token_id, step.logprob + raw.logsumexp
            tail = max(0.0, tail - math.exp(step.logprob))
        log_tail[row] = math.log(tail) + raw.logsumexp if tail > 0 else NEG_INF
        tail_top[row] = float(logits[-1]) if n else NEG_INF
        tail_count[row] = raw.vocab_size - n - (0 if where.size else 1)
        if where.size and len(raw.tail_log_moments) == len(TAIL_POWERS) and tail > 0:
            # log Σ exp(a·logit) = log Σ p^a + a·logsumexp; a = 0 counts the tokens, a = 1 is the mass
            by_power = dict(zip(TAIL_POWERS, raw.tail_log_moments, strict=True))
            by_power |= {0.0: math.log(max(tail_count[row], 1)), 1.0: math.log(tail)}
            moments[row] = [by_power[a] + a * raw.logsumexp for a in MOMENT_POWERS]
    return ids, x, log_tail, tail_top, tail_count, chosen, chosen_col, moments


# ---- counts of the context, per step ------------------------------------------------------------------------------

def _context_counts(run: RecordedRun) -> tuple[np.ndarray, np.ndarray]:
    """How often each recorded candidate occurs in its step's context [S, C], and how many distinct tokens each
    step's context holds [S]."""
    context, steps = run.context, run.x.shape[0]
    order = np.lexsort((np.arange(len(context)), context))
    keys = context[order] * (len(context) + 1) + order  # sorted by (token, position)
    ends = run.start + np.arange(steps)  # step s reads context[:start + s]
    ids = np.where(run.ids >= 0, run.ids, 0)
    base = ids * (len(context) + 1)
    counts = np.searchsorted(keys, base + ends[:, None]) - np.searchsorted(keys, base)
    counts = np.where(run.ids >= 0, counts, 0)
    first = np.zeros(len(context), dtype=np.int64)
    _, first_at = np.unique(context, return_index=True)
    first[first_at] = 1
    return counts, np.concatenate([[0], np.cumsum(first)])[ends]


def _counts(chain: _Chain) -> tuple[np.ndarray, np.ndarray]:
    """The context counts of the candidates the chain still carries [S, K], and how many distinct context tokens
    at each step are not among them [S]."""
    counts = np.take_along_axis(chain.run.counts[0], chain.cols, axis=1)
    return counts, chain.run.counts[1] - (counts > 0).sum(axis=1)


# ---- the samplers -------------------------------------------------------------------------------------------------

def _guidance(c: _Chain, s: RunSettings, *_: object) -> None:
    c.flag(np.ones(c.x.shape[0], dtype=bool), _GUIDANCE)


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


def _penalties(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    counts, outside = _counts(c)
    c.x = np.where(counts > 0, c.x - counts * s.frequency_penalty - s.presence_penalty, c.x)
    if s.frequency_penalty >= 0 and s.presence_penalty >= 0:
        c.lower_tail(outside)
    else:
        c.flag(c.alive & (outside > 0), _RAISES)
        c.pristine &= ~(outside > 0)


def _logit_bias(c: _Chain, s: RunSettings, context: np.ndarray, start: int, steps: object,
                encode: Callable[[str], Sequence[int]] | None, *_: object) -> None:
    rows = c.x.shape[0]
    ends = start + np.arange(rows)
    bias = np.zeros(c.x.shape)
    resolved: dict[tuple[int, ...], float] = {}
    for key, value in parse_logit_bias(s.logit_bias):
        if isinstance(key, int):
            resolved[(key,)] = value
        elif encode is None:
            c.flag(np.ones(rows, dtype=bool), _WORDS)
        else:
            resolved[tuple(encode(key))] = value
    for sequence, value in resolved.items():
        *prefix, last = sequence
        applies = np.ones(rows, dtype=bool)
        for back, token in enumerate(reversed(prefix), start=1):  # the context must end with the prefix
            at = ends - back
            applies &= (at >= 0) & (context[np.maximum(at, 0)] == token)
        hit = (c.ids == last) & applies[:, None]
        bias += np.where(hit, value, 0.0)
        unrecorded = applies & ~hit.any(axis=1)
        if value > 0:  # one unrecorded token rises by a known amount: the tail's bounds with it
            raised = c.alive & unrecorded
            c.hi = np.where(raised, np.logaddexp(c.hi, c.top + math.log(math.expm1(value))), c.hi)
            c.top = np.where(raised, c.top + value, c.top)
            c.pristine &= ~raised
        else:
            c.lower_tail(unrecorded.astype(np.float64))
    with np.errstate(invalid="ignore"):
        c.x = c.x + bias


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


def _no_repeat_ngram(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    """The engine's rule: every n-gram window of the context whose first n-1 tokens are the context's last n-1
    bans its last token."""
    n = s.no_repeat_ngram_size
    tokens = context.tolist()
    following: dict[tuple[int, ...], set[int]] = {}
    banned: list[dict[int, float]] = []
    indexed = 0  # windows tokens[i:i + n] with i < indexed are in ``following``
    for row in range(c.x.shape[0]):
        length = start + row
        while indexed <= length - n:
            following.setdefault(tuple(tokens[indexed:indexed + n - 1]), set()).add(tokens[indexed + n - 1])
            indexed += 1
        suffix = tuple(tokens[length - n + 1:length]) if length >= n else None
        banned.append(dict.fromkeys(following.get(suffix, ()), 0.0) if suffix is not None else {})
    _per_step_bans(c, banned, subtract=False)


def _dry(c: _Chain, s: RunSettings, context: np.ndarray, start: int, steps: object, encode: object,
         breaker_ids: frozenset[int] | None) -> None:
    if breaker_ids is None:
        if s.dry_sequence_breakers:
            c.flag(np.ones(c.x.shape[0], dtype=bool), _WORDS)
        breaker_ids = frozenset()
    tokens = context.tolist()
    positions: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        positions.setdefault(t, []).append(i)
    penalties: list[dict[int, float]] = []
    for row in range(c.x.shape[0]):
        end = start + row - 1  # the last token of this step's context
        lengths: dict[int, int] = {}
        if end >= 0 and tokens[end] not in breaker_ids:
            for i in positions.get(tokens[end], ()):
                if i >= end:
                    break
                after = tokens[i + 1]
                if after in breaker_ids:
                    continue
                length = 1
                while length < DRY_MAX_MATCH and i - length >= 0:
                    behind = tokens[end - length]
                    if tokens[i - length] != behind or behind in breaker_ids:
                        break
                    length += 1
                lengths[after] = max(length, lengths.get(after, 0))
        penalties.append({t: s.dry_multiplier * s.dry_base ** (n - s.dry_allowed_length)
                          for t, n in lengths.items() if n >= s.dry_allowed_length})
    _per_step_bans(c, penalties, subtract=True)


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


def _temperature(c: _Chain, s: RunSettings, *_: object) -> None:
    if s.dynatemp_range > 0:
        _dynamic_temperature(c, s)
        return
    c.x = c.x / s.temperature
    _scale_tail(c, np.full(c.x.shape[0], 1.0 / s.temperature))


def _entropy(c: _Chain) -> np.ndarray:
    """Entropy (nats) of the recorded candidates in play [S, 1] (the tail left out)."""
    log_z = c.log_z(np.full(c.x.shape[0], NEG_INF))
    with np.errstate(invalid="ignore"):
        logp = c.x - log_z
        p = np.where(np.isfinite(c.x), np.exp(logp), 0.0)
        return -(p * np.where(p > 0, logp, 0.0)).sum(axis=1, keepdims=True)


def _whole_distribution(c: _Chain) -> None:
    c.flag(c.alive, _WHOLE)


def _dynamic_temperature(c: _Chain, s: RunSettings) -> None:
    _whole_distribution(c)
    low, high = max(0.0, s.temperature - s.dynatemp_range), s.temperature + s.dynatemp_range
    count = np.isfinite(c.x).sum(axis=1, keepdims=True)
    normalised = _entropy(c) / np.log(np.maximum(count, 2))
    temp = low + (high - low) * np.maximum(normalised, 0.0) ** s.dynatemp_exponent
    single = count <= 1
    top = np.argmax(c.x, axis=1)
    argmax_only = np.full(c.x.shape, NEG_INF)
    argmax_only[np.arange(c.x.shape[0]), top] = c.x[np.arange(c.x.shape[0]), top]
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = np.where(temp > 0, c.x / np.maximum(temp, 1e-30), argmax_only)
    c.x = np.where(single, c.x, scaled)
    _scale_tail(c, np.where(single[:, 0] | (temp[:, 0] <= 0), 1.0, 1.0 / np.maximum(temp[:, 0], 1e-30)))
    c.cut_tail((temp[:, 0] <= 0) & ~single[:, 0])


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


def _min_p(c: _Chain, s: RunSettings, *_: object) -> None:
    top = np.max(c.x, axis=1)
    line = top + math.log(s.min_p)
    c.flag(c.alive & (top < c.top), _SPREAD)
    c.near(c.x - line[:, None])
    c.x = np.where(c.x < line[:, None], NEG_INF, c.x)
    gone = c.top < line
    c.flag(c.alive & ~gone, _PAST)
    c.cut_tail(gone)


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


def _epsilon(c: _Chain, s: RunSettings, *_: object) -> None:
    _below_probability(c, np.full(c.x.shape[0], s.epsilon_cutoff), protect_top=True)


def _eta(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    eta = np.minimum(math.sqrt(s.eta_cutoff) * np.exp(-_entropy(c)[:, 0]), s.eta_cutoff)
    _below_probability(c, eta, protect_top=True)


def _mirostat(c: _Chain, s: RunSettings, *_: object) -> None:
    """Mirostat v2's cut: surprise −log2 p above mu removed (the likeliest kept), mu per step from ``re_derive``."""
    assert c.mu is not None
    err = c.err
    # mu itself carries the rounding of every earlier chosen probability: the cut's border is that much wider.
    c.err = err + s.mirostat_eta * 2 * (0.5 / LOGPROB_STEP) * np.arange(c.x.shape[0])
    _below_probability(c, 2.0 ** -c.mu, protect_top=True)
    c.err = err


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


def _top_n_sigma(c: _Chain, s: RunSettings, *_: object) -> None:
    _whole_distribution(c)
    finite = np.isfinite(c.x)
    count = np.maximum(finite.sum(axis=1, keepdims=True), 1)
    zeroed = np.where(finite, c.x, 0.0)
    mean = zeroed.sum(axis=1, keepdims=True) / count
    spread = np.where(finite, (zeroed - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / count
    floor = np.max(np.where(finite, c.x, -np.inf), axis=1, keepdims=True) - s.top_n_sigma * np.sqrt(spread)
    c.x = np.where(c.x < floor, NEG_INF, c.x)


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


_STAGES: dict[str, Callable[..., None]] = {
    "guidance": _guidance, "logit_bias": _logit_bias, "repetition_penalty": _repetition,
    "no_repeat_ngram": _no_repeat_ngram, "penalties": _penalties, "dry": _dry, "temperature": _temperature,
    "top_k": _top_k, "top_p": _top_p, "min_p": _min_p, "typical_p": _typical, "epsilon_cutoff": _epsilon,
    "eta_cutoff": _eta, "top_n_sigma": _top_n_sigma, "xtc": _xtc, "mirostat": _mirostat,
}
