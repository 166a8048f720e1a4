"""Adaptive-P, as llama.cpp's ``llama_sampler_adaptive_p`` computes it.

``apply``: the probabilities p of what the earlier samplers left (a softmax), kept for ``accept``; the adapted
target ``clamp(2·target − weighted_sum / total_weight, 0, 1)``; each finite logit becomes
``PEAK − SHARPNESS · d² / (1 + d)`` with ``d = |p − adapted| / WIDTH`` (removed tokens stay removed). llama.cpp then
draws from its softmax: here the strategy's draw from the chain's last distribution is that draw, since the chain
puts it last. ``accept``: the moving average takes the chosen token's p (before the transform):
``weighted_sum = p + decay · weighted_sum``, ``total_weight = 1 + decay · total_weight``, from
target/(1 − decay) and 1/(1 − decay).
"""

from __future__ import annotations

from typing import Any

import torch

from playground.config.samplers.adaptive_p import AdaptivePSettings
from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.sampler_maths import (
    ADAPTIVE_PEAK,
    ADAPTIVE_SHARPNESS,
    ADAPTIVE_WIDTH,
    adaptive_accept,
    adaptive_start,
    adaptive_target,
)


def adaptive_transform(logits: torch.Tensor, probs: torch.Tensor, adapted: float) -> torch.Tensor:
    """The transformed logits [batch, vocab] for this step's adapted target."""
    dist = ((probs - adapted) * (1.0 / ADAPTIVE_WIDTH)).abs()
    out = ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * dist * dist / (1.0 + dist)
    return torch.where(torch.isfinite(logits), out, logits)


@engine_sampler
class AdaptiveP(Sampler):
    declares = "adaptive_p"
    name = "adaptive_p"

    def __init__(self, target: float, decay: float) -> None:
        self.target, self.decay = target, min(max(decay, 0.0), 0.99)
        self.weighted_sum, self.total_weight = adaptive_start(target, decay)
        self.original: torch.Tensor | None = None  # [vocab] the last apply's input probabilities

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        g = settings.group(AdaptivePSettings)
        return cls(g.adaptive_target, g.adaptive_decay)

    def adapted(self) -> float:
        return adaptive_target(self.target, self.weighted_sum, self.total_weight)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        self.original = probs[0]
        return adaptive_transform(logits, probs, self.adapted())

    def accept(self, token_id: int, prob: float) -> None:
        if self.original is None or token_id < 0:
            return
        before = float(self.original[token_id].item())
        self.weighted_sum, self.total_weight = adaptive_accept(self.weighted_sum, self.total_weight, before,
                                                               self.decay)
        self.original = None

    def reset(self) -> None:
        self.weighted_sum, self.total_weight = adaptive_start(self.target, self.decay)
        self.original = None

    def snapshot(self) -> tuple[float, float]:
        return self.weighted_sum, self.total_weight

    def restore(self, state: tuple[float, float]) -> None:
        self.weighted_sum, self.total_weight = state
        self.original = None
