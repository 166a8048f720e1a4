"""Top-nσ (llama.cpp's definition), and its engine object. The top token always stays.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless
from playground.engine.samplers.cuts import NEG_INF


def keep_top_n_sigma(ids: torch.Tensor, logits: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ (Tang et al.; llama.cpp): keep logits at least ``max − n·σ``, σ the standard deviation of the logits
    still in play (population, over the finite ones)."""
    finite = torch.isfinite(logits)
    count = finite.sum(dim=-1, keepdim=True).clamp(min=1)
    zeroed = torch.where(finite, logits, 0.0)
    mean = zeroed.sum(dim=-1, keepdim=True) / count
    spread = torch.where(finite, (logits - mean) ** 2, 0.0).sum(dim=-1, keepdim=True) / count
    floor = logits.amax(dim=-1, keepdim=True) - n * spread.sqrt()
    return logits.masked_fill(logits < floor, NEG_INF)


stateless("top_n_sigma", lambda s, c: ("top_n_sigma", lambda i, x: keep_top_n_sigma(i, x, s.top_n_sigma)))
