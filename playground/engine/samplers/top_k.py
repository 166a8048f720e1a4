"""transformers' top-k warper (``TopKLogitsWarper``, checked against it in tests) as a pure function that never
modifies its input, and its engine object.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def keep_top_k(ids: torch.Tensor, logits: torch.Tensor, top_k: int, min_keep: int = 1) -> torch.Tensor:
    """Keep the ``top_k`` highest logits (ties with the k-th are kept too)."""
    k = min(max(top_k, min_keep), logits.shape[-1])
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


stateless("top_k", lambda s, c: ("top_k", lambda i, x: keep_top_k(i, x, s.top_k)))
