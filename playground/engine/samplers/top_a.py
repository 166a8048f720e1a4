"""Top-a, as text-generation-webui's ``TopALogitsWarper`` computes it: remove the tokens whose probability is
below ``top_a · max_prob²`` (the likeliest is never below it; min_tokens_to_keep 1)."""

from __future__ import annotations

from typing import Any

import torch

from playground.config.samplers.top_a import TopASettings
from playground.engine.samplers.base import stateless


def keep_top_a(ids: torch.Tensor, logits: torch.Tensor, top_a: float) -> torch.Tensor:
    """ids: [batch, seq]; logits: [batch, vocab] (-inf where removed) -> the kept tokens' logits, -inf elsewhere."""
    probs = logits.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < top * top * top_a, float("-inf"))


def _build(settings: Any, context: Any) -> tuple[str, Any]:
    top_a = settings.group(TopASettings).top_a
    return "top_a", lambda i, x: keep_top_a(i, x, top_a)


stateless("top_a", _build)
