"""transformers' n-gram ban (the banned tokens from ``playground.sampler_maths``, as the engine's)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.sampler_maths import NgramIndex
from playground.state.what_if.bounds import _Chain, _per_step_bans
from playground.state.what_if.stages import stage


@stage("no_repeat_ngram")
def _no_repeat_ngram(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    """The engine's rule: every n-gram window of the context whose first n-1 tokens are the context's last n-1
    bans its last token."""
    index, tokens = NgramIndex(s.no_repeat_ngram_size), context.tolist()
    banned = [dict.fromkeys(index.banned(tokens, start + row), 0.0) for row in range(c.x.shape[0])]
    _per_step_bans(c, banned, subtract=False)

