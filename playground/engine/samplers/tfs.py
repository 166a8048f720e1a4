"""Tail-free sampling, as text-generation-webui's ``TailFreeLogitsWarper`` computes it (min_tokens_to_keep 1):
sort the probabilities descending, d2 = |second differences| normalised to sum 1, cumulative; the sorted token
j (1 ≤ j ≤ V − 2) is removed when the cumulative sum at j − 1 exceeds z, the first is always kept and the last
always removed (the original's centring)."""

from __future__ import annotations

from typing import Any

import torch

from playground.config.samplers.tfs import TailFreeSettings
from playground.engine.samplers.base import stateless


def keep_tail_free(ids: torch.Tensor, logits: torch.Tensor, z: float) -> torch.Tensor:
    """ids: [batch, seq]; logits: [batch, vocab] (-inf where removed; their zeros count, as in the original)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    d2 = probs.diff().diff().abs()
    cdf = (d2 / d2.sum(dim=-1, keepdim=True)).cumsum(dim=-1)
    rows = logits.shape[0]
    remove_sorted = torch.cat([torch.zeros(rows, 1, dtype=torch.bool, device=logits.device), cdf > z,
                               torch.ones(rows, 1, dtype=torch.bool, device=logits.device)], dim=-1)
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def _build(settings: Any, context: Any) -> tuple[str, Any]:
    z = settings.group(TailFreeSettings).tfs
    return "tfs", lambda i, x: keep_tail_free(i, x, z)


stateless("tfs", _build)
