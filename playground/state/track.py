"""Track one token through a run: its raw and processed probability and its raw rank at every step, from what each
step recorded (its top candidates by raw probability, plus the chosen token).

Exact where the token is among a step's recorded candidates; its raw probability and rank also where it is among
the raw candidates the step packed for the what-if (``TokenStep.raw_top``, the top 256; its processed probability
is not recorded there); elsewhere only a bound is known: it ranks below the step's N recorded candidates, so its raw
probability is at most the N-th one's. Qt-free; the track view draws the points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from playground.events import TokenStep
from playground.state.what_if import unpack_raw_candidates


@dataclass(frozen=True)
class TrackedPoint:
    step: int
    exact: bool  # the token was among the step's recorded candidates
    raw_prob: float | None  # exact values (None where not recorded)
    processed_prob: float | None
    rank: int | None  # raw rank, 1 = top
    below_rank: int  # not exact: the token ranks below this many recorded candidates
    raw_bound: float  # not exact: its raw probability is at most this (the N-th candidate's)
    chosen: bool = False  # the step chose it


def track_token(steps: Sequence[TokenStep], token_id: int) -> list[TrackedPoint]:
    points = []
    for step in steps:
        found = next((c for c in step.candidates if c.token_id == token_id), None)
        if found is not None:
            points.append(TrackedPoint(step.step, True, found.raw_prob, found.processed_prob, found.raw_rank, 0,
                                       0.0, step.token_id == token_id))
            continue
        if step.raw_top is not None:  # the what-if's recorded raw candidates (the top 256 by default)
            points.append(_from_raw_top(step, token_id))
            continue
        ranked = sorted(step.candidates, key=lambda c: c.raw_rank)
        listed = [c for i, c in enumerate(ranked) if c.raw_rank == i + 1]  # the top N, ranks 1..N without gaps
        n = len(listed)
        bound = listed[-1].raw_prob if listed else 1.0
        points.append(TrackedPoint(step.step, False, None, None, None, n, bound))
    return points


def _from_raw_top(step: TokenStep, token_id: int) -> TrackedPoint:
    """From the step's packed raw candidates (ids by raw rank, log-probabilities to 1/1024 nat): the token's raw
    probability and rank exactly (its processed probability was not recorded there), or the bound below them."""
    assert step.raw_top is not None
    ids, logits = unpack_raw_candidates(step.raw_top)
    logprobs = logits - step.raw_top.logsumexp
    where = np.flatnonzero(ids == token_id)
    if where.size:
        i = int(where[0])
        return TrackedPoint(step.step, True, float(np.exp(logprobs[i])), None, i + 1, 0, 0.0, False)
    bound = float(np.exp(logprobs[-1])) if ids.size else 1.0
    return TrackedPoint(step.step, False, None, None, None, int(ids.size), bound)


def find_token_by_text(steps: Sequence[TokenStep], text: str) -> int | None:
    """The id of a recorded candidate whose text is exactly ``text`` (spaces count), if any step recorded one."""
    for step in steps:
        for c in step.candidates:
            if c.text == text:
                return c.token_id
    return None
