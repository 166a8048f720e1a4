"""transformers' n-gram ban (the banned tokens from ``playground.sampler_maths``'s ``NgramBan``, the engine's)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.sampler_maths import NgramBan
from playground.state.what_if.bounds import _Chain, _per_step_bans
from playground.state.what_if.stages import stage


@stage("no_repeat_ngram")
def _no_repeat_ngram(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    """The engine's rule: every n-gram window of the context whose first n-1 tokens are the context's last n-1
    bans its last token; one index walks the context step by step (a window per token)."""
    tokens = context.tolist()
    ban = NgramBan(s.no_repeat_ngram_size, tokens[:start])
    banned = []
    for row in range(c.x.shape[0]):
        banned.append(dict.fromkeys(ban.banned(), 0.0))
        ban.extend(tokens[start + row:start + row + 1])
    _per_step_bans(c, banned, subtract=False)
