"""OpenAI's presence and frequency penalties, one sampler.

They read the whole context (prompt included), as this app's repetition penalty (transformers') and llama-server
(which feeds the prompt through its penalty sampler) do; OpenAI counts only the sampled tokens.
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def apply_presence_frequency_penalties(ids: torch.Tensor, logits: torch.Tensor, presence: float,
                                       frequency: float) -> torch.Tensor:
    """OpenAI's definition: ``logit − count·frequency − (count > 0)·presence`` for each token's count in ``ids``.

    ids: [batch, seq]; logits: [batch, vocab]. Only the tokens in ``ids`` change (the same arithmetic on them as on
    the whole vocabulary, without a pass over it)."""
    out = logits.clone()
    for row in range(ids.shape[0]):
        tokens, counts = torch.unique(ids[row], return_counts=True)  # [n] each
        counts = counts.to(logits.dtype)
        out[row, tokens] = logits[row, tokens] - counts * frequency - presence
    return out


stateless("penalties", lambda s, c: ("penalties", lambda i, x: apply_presence_frequency_penalties(
    i, x, s.presence_penalty, s.frequency_penalty)))
