"""transformers' top-p warper (``TopPLogitsWarper``, checked against it in tests) as a pure function that never
modifies its input, and its engine object.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def keep_top_p(ids: torch.Tensor, logits: torch.Tensor, top_p: float, min_keep: int = 1) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    if logits.shape[-1] > FAST_VOCAB:
        fast = _top_p_among_top(logits, top_p, min_keep)
        if fast is not None:
            return fast
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -min_keep:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


# Above this vocabulary, top-p first looks among the 256 likeliest tokens (llama.cpp's adaptive sort): sorting the
# whole vocabulary costs ~8 ms on 49k tokens, a tenth of a decode step.
FAST_VOCAB, FAST_TOP = 1024, 256


def _top_p_among_top(logits: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor | None:
    """Top-p decided among the likeliest ``FAST_TOP`` tokens, or None when the nucleus may reach past them."""
    probs = logits.softmax(dim=-1)
    top_probs, top_ids = probs.topk(FAST_TOP, dim=-1)  # descending
    tail = probs.sum(dim=-1, keepdim=True) - top_probs.sum(dim=-1, keepdim=True)  # the mass outside them
    if bool((tail >= (1 - top_p) * 0.999).any()) or min_keep > FAST_TOP:
        return None  # some token outside might be kept: the full sort decides
    cumulative = tail + top_probs.flip(-1).cumsum(dim=-1)  # ascending, as the full sort adds them up
    keep_sorted = (cumulative > (1 - top_p)).flip(-1)
    keep_sorted[..., :min_keep] = True
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top_ids, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


stateless("top_p", lambda s, c: ("top_p", lambda i, x: keep_top_p(i, x, s.top_p)))
