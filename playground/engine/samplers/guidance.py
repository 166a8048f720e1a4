"""Classifier-free guidance's formula (Sanchez et al., "Stay on topic with CFG"; transformers'
``UnbatchedClassifierFreeGuidanceLogitsProcessor``). The negative prompt's forward pass is the strategy's."""

from __future__ import annotations

from typing import Any

import torch

from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler


def combine_guidance(logits: torch.Tensor, negative_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale · (log p(x | prompt) − log p(x | negative)) + log p(x | negative)``: log-probabilities pushed away from
    what the negative prompt predicts (scale 1 gives the prompt's own). logits, negative_logits: [batch, vocab]."""
    cond = logits.log_softmax(dim=-1)
    uncond = negative_logits.log_softmax(dim=-1)
    return scale * (cond - uncond) + uncond


@engine_sampler
class Guidance(Sampler):
    """Guidance against the logits the strategy provides each step: ``run.negative_logits`` (the hook), set by a
    strategy that runs the negative prompt beside the text before the chain."""

    declares = "guidance"
    name = "guidance"

    def __init__(self, scale: float, run: Any) -> None:
        self.scale = scale
        self.run = run

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.guidance_scale, context.run)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        negative = self.run.negative_logits
        assert negative is not None, "the strategy runs the negative prompt before the pipeline"
        return combine_guidance(logits, negative, self.scale)
