"""The what-if's input: a run's recorded raw candidates (``TokenStep.raw_top``) unpacked once into [S, C] arrays,
and the context counts the penalties read."""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from playground.events.run import TAIL_POWERS, RawCandidates, TokenStep

LOGPROB_STEP = 1024  # RawCandidates.logprobs: -q / 1024 nats
NEG_INF = -math.inf


def unpack_raw_candidates(raw: RawCandidates) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [n] (by raw rank) and their raw logits [n] (``logprob + logsumexp``)."""
    ids = np.frombuffer(base64.b64decode(raw.ids), dtype=f"<u{raw.id_bytes}").astype(np.int64)
    quantised = np.frombuffer(base64.b64decode(raw.logprobs), dtype="<u2")
    return ids, -quantised.astype(np.float64) / LOGPROB_STEP + raw.logsumexp


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
    # [S, 4] the whole raw distribution's entropy (nats), its finite logits' mean, standard deviation and count
    # (``RawCandidates.whole``; NaN where not recorded: an older saved run)
    whole: np.ndarray
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
        ids, x, log_tail, tail_top, tail_count, chosen, chosen_col, moments, whole = _load(steps)
        context = np.array([*prompt_ids, *(s.token_id for s in steps)], dtype=np.int64)
        return cls(steps=tuple(steps), ids=ids, x=x, log_tail=log_tail, tail_top=tail_top, tail_count=tail_count,
                   moments=moments, whole=whole,
                   chosen=chosen, chosen_col=chosen_col,
                   recorded=np.array([s.raw_top is not None for s in steps], dtype=bool), context=context,
                   start=len(prompt_ids))


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
    whole = np.full((len(steps), 4), np.nan)
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
        if raw.whole is not None:
            w = raw.whole
            whole[row] = (w.entropy, w.logit_mean, w.logit_std, w.finite)
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
    return ids, x, log_tail, tail_top, tail_count, chosen, chosen_col, moments, whole


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
