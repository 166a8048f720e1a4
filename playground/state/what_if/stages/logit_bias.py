"""Logit bias on recorded and unrecorded tokens (a raised unrecorded token moves the tail's bounds)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from playground.config import RunSettings
from playground.config.samplers import parse_logit_bias
from playground.state.what_if.bounds import _WORDS, _Chain
from playground.state.what_if.stages import stage


@stage("logit_bias")
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
