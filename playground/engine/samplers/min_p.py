"""transformers' min-p warper (``MinPLogitsWarper``, checked against it in tests) as a pure function that never
modifies its input, and its engine object.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def keep_min_p(ids: torch.Tensor, logits: torch.Tensor, min_p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the top token's probability."""
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    keep = torch.topk(probs, min(min_keep, probs.shape[-1]), dim=-1).indices
    remove = remove.scatter(-1, keep, False)
    return logits.masked_fill(remove, float("-inf"))


stateless("min_p", lambda s, c: ("min_p", lambda i, x: keep_min_p(i, x, s.min_p)))
