"""Adaptive-P over every step: the chosen tokens' probabilities before the transform (what the earlier stages
left) drive the moving average step by step (``playground.sampler_maths``, as the engine's), each step's adapted
target transforms the candidates' logits. Exact where the unrecorded tokens are cut and every earlier step is;
the unrecorded tokens still in play keep bounds (each one's probability lies between 0 and the likeliest's)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.config.samplers.adaptive_p import AdaptivePSettings
from playground.sampler_maths import (
    ADAPTIVE_PEAK,
    ADAPTIVE_SHARPNESS,
    ADAPTIVE_WIDTH,
    adaptive_accept,
    adaptive_start,
    adaptive_target,
)
from playground.state.what_if.bounds import _Chain, reason
from playground.state.what_if.stages import stage

_TAIL = reason("Adaptive-P transforms every token by its own probability, and tokens outside the recorded "
               "candidates were still in play")
_EARLIER = reason("Adaptive-P's average follows the earlier steps' choices, and an earlier step is not exact")


def transform(probs: np.ndarray, adapted: np.ndarray) -> np.ndarray:
    """llama.cpp's transform: PEAK − SHARPNESS · d² / (1 + d), d = |p − adapted| / WIDTH."""
    d = np.abs(probs - adapted) / ADAPTIVE_WIDTH
    return ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * d * d / (1.0 + d)


@stage("adaptive_p")
def _adaptive_p(c: _Chain, s: RunSettings, *_: object) -> None:
    g = s.group(AdaptivePSettings)
    lse = c.recorded_lse()
    with np.errstate(invalid="ignore"):
        probs = np.where(np.isfinite(c.x), np.exp(c.x - c.log_z(c.hi, lse)), 0.0)
    c.flag(c.alive, _TAIL)
    chosen = np.where(c.cols == c.run.chosen_col[:, None], probs, 0.0).sum(axis=1)  # 0 where an earlier stage cut it
    weighted, total = adaptive_start(g.adaptive_target, g.adaptive_decay)
    adapted = np.empty(c.x.shape[0])
    for row, prob in enumerate(chosen.tolist()):
        adapted[row] = adaptive_target(g.adaptive_target, weighted, total)
        weighted, total = adaptive_accept(weighted, total, prob, g.adaptive_decay)
    c.x = np.where(np.isfinite(c.x), transform(probs, adapted[:, None]), c.x)
    # The transform's slope in log p is at most SHARPNESS / WIDTH · p: the recorded log-probabilities' rounding
    # grows by that much (exact means: up to this rounding).
    c.err = c.err * np.maximum(1.0, ADAPTIVE_SHARPNESS / ADAPTIVE_WIDTH * probs.max(axis=1, initial=0.0))
    # The tail: each token's probability in [0, p_top]; its new logit between the ends' (the curve peaks at adapted).
    with np.errstate(invalid="ignore", over="ignore"):
        p_top = np.where(c.alive, np.minimum(np.exp(c.top - c.log_z(c.lo, lse)[:, 0]), 1.0), 0.0)
    near = np.clip(adapted, 0.0, p_top)
    far = np.where(np.abs(adapted) >= np.abs(p_top - adapted), 0.0, p_top)
    log_n = np.log(c.count)
    top = transform(near, adapted)
    c.hi = np.where(c.alive, log_n + top, c.hi)
    c.lo = np.where(c.alive, log_n + transform(far, adapted), c.lo)
    c.top = np.where(c.alive, top, c.top)
    c.pristine = np.zeros_like(c.pristine)
    earlier = np.concatenate([[False], np.cumsum((c.reason != 0) | ~c.run.recorded)[:-1] > 0])
    c.flag(earlier, _EARLIER)
