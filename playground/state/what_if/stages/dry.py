"""DRY (its match lengths and penalty from ``playground.sampler_maths``, as the engine's)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.sampler_maths import dry_match_lengths, dry_penalty
from playground.state.what_if.bounds import _WORDS, _Chain, _per_step_bans
from playground.state.what_if.stages import stage


@stage("dry")
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
    for row in range(c.x.shape[0]):  # the last token of this step's context: start + row - 1
        lengths = dry_match_lengths(tokens, breaker_ids, end=start + row - 1, positions=positions)
        penalties.append({t: dry_penalty(n, s.dry_multiplier, s.dry_base, s.dry_allowed_length)
                          for t, n in lengths.items() if n >= s.dry_allowed_length})
    _per_step_bans(c, penalties, subtract=True)

