"""Locally typical sampling (transformers' ``TypicalLogitsWarper``), and its engine object. It keeps at least one
token.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless
from playground.engine.samplers.cuts import NEG_INF


def keep_typical(ids: torch.Tensor, logits: torch.Tensor, mass: float, min_keep: int = 1) -> torch.Tensor:
    """Locally typical sampling (Meister et al.): rank tokens by how far their surprise −log p is from the entropy,
    and keep the closest ones until their probability exceeds ``mass``."""
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)
    distance = (-logprobs - entropy).abs()  # inf for removed tokens
    if logits.shape[-1] > TYPICAL_FAST_VOCAB and logits.shape[0] == 1:
        kept = _typical_among_top(logprobs, probs, entropy, distance, mass, min_keep)
        if kept is not None:
            return logits.masked_fill(~kept, NEG_INF)
    ranked, order = torch.sort(distance, dim=-1)
    cumulative = probs.gather(-1, order).cumsum(dim=-1)
    # The token that brings the mass to ``mass``: as many as lie below it, plus itself.
    last = (cumulative < mass).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    remove = distance > ranked.gather(-1, last)
    keep = order[..., :min_keep]
    return logits.masked_fill(remove.scatter(-1, keep, False), NEG_INF)


# Above this vocabulary typical-p first ranks the likeliest 1024 tokens only (sorting 49k distances costs ~10 ms):
# a token outside them is more surprising than all of them, so it can only come later in the ranking.
TYPICAL_FAST_VOCAB, TYPICAL_TOP = 4096, 1024


def _typical_among_top(logprobs: torch.Tensor, probs: torch.Tensor, entropy: torch.Tensor, distance: torch.Tensor,
                       mass: float, min_keep: int) -> torch.Tensor | None:
    """The kept mask [1, vocab] ranked among the likeliest tokens, or None when the cut may reach past them."""
    top_logprobs, top_ids = logprobs.topk(TYPICAL_TOP, dim=-1)
    # Every token outside is at least this far from the entropy (its surprise is at least the last one's).
    outside = float(-top_logprobs[0, -1] - entropy[0, 0])
    ranked, order = torch.sort(distance.gather(-1, top_ids), dim=-1)
    cumulative = probs.gather(-1, top_ids).gather(-1, order).cumsum(dim=-1)
    last = int((cumulative < mass).sum())
    if last >= TYPICAL_TOP - 1 or min_keep > TYPICAL_TOP or not float(ranked[0, last]) < outside:
        return None
    kept = distance <= ranked[0, last]
    return kept.scatter(-1, top_ids.gather(-1, order[..., :min_keep]), True)


stateless("typical_p", lambda s, c: ("typical_p", lambda i, x: keep_typical(i, x, s.typical_p)))
