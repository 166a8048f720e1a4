"""XTC, exclude top choices (llama.cpp's definition): its cut, and the engine object that draws whether to apply it.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.engine.samplers.cuts import NEG_INF


def exclude_top_choices(ids: torch.Tensor, logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """XTC's cut (applied when its draw says so): when two or more tokens are at least ``threshold`` likely,
    remove all of them but the least likely one, so the text leaves its most predictable path."""
    probs = logits.softmax(dim=-1)
    above = probs >= threshold
    least = torch.where(above, probs, math.inf).argmin(dim=-1, keepdim=True)  # the least likely of them stays
    remove = above.scatter(-1, least, False) & (above.sum(dim=-1, keepdim=True) >= 2)
    return logits.masked_fill(remove, NEG_INF)


@engine_sampler
class Xtc(Sampler):
    """XTC: llama.cpp draws once per step from the run's seeded generator and cuts when the draw is within the
    probability (runs are reproducible). Its state is the generator's."""

    declares = "xtc"
    name = "xtc"

    def __init__(self, probability: float, threshold: float, generator: torch.Generator) -> None:
        self.probability, self.threshold, self.generator = probability, threshold, generator
        self.start = generator.get_state()

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.xtc_probability, settings.xtc_threshold, context.run.generator)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        generator = self.generator
        draw = float(torch.rand((), generator=generator, device=generator.device).item())
        return exclude_top_choices(ids, logits, self.threshold) if draw < self.probability else logits

    def reset(self) -> None:
        self.generator.set_state(self.start)

    def snapshot(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

