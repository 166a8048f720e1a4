"""Classifier-free guidance's formula (Sanchez et al., "Stay on topic with CFG"; transformers'
``UnbatchedClassifierFreeGuidanceLogitsProcessor``). The negative prompt's forward pass is the strategy's."""

from __future__ import annotations

import torch


def combine_guidance(logits: torch.Tensor, negative_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale · (log p(x | prompt) − log p(x | negative)) + log p(x | negative)``: log-probabilities pushed away from
    what the negative prompt predicts (scale 1 gives the prompt's own). logits, negative_logits: [batch, vocab]."""
    cond = logits.log_softmax(dim=-1)
    uncond = negative_logits.log_softmax(dim=-1)
    return scale * (cond - uncond) + uncond
