"""transformers' own processors and warpers, as pure functions ``(ids, logits) -> logits`` that never modify their
input (checked against transformers in tests), and their engine objects: repetition penalty, the n-gram ban,
top-k, top-p, min-p.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def apply_repetition_penalty(ids: torch.Tensor, logits: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: a token already in ``ids`` has its logit divided by ``penalty`` (multiplied if negative)."""
    seen = torch.gather(logits, 1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(1, ids, seen)


def ban_repeated_ngrams(ids: torch.Tensor, logits: torch.Tensor, ngram_size: int) -> torch.Tensor:
    """Forbid any token that would complete an n-gram already present in ``ids``."""
    seq_len = ids.shape[1]
    if seq_len < ngram_size:
        return logits
    # windows: [batch, n_windows, n]; a window whose first n-1 tokens equal the current suffix bans its last token
    windows = ids.unfold(1, ngram_size, 1)
    suffix = ids[:, seq_len - ngram_size + 1 :]
    matches = (windows[..., :-1] == suffix.unsqueeze(1)).all(dim=-1)  # [batch, n_windows]
    rows, at = matches.nonzero(as_tuple=True)  # the matching windows: a few, against the whole vocabulary
    out = logits.clone()
    out[rows, windows[rows, at, -1]] = float("-inf")
    return out


def keep_top_k(ids: torch.Tensor, logits: torch.Tensor, top_k: int, min_keep: int = 1) -> torch.Tensor:
    """Keep the ``top_k`` highest logits (ties with the k-th are kept too)."""
    k = min(max(top_k, min_keep), logits.shape[-1])
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


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


def keep_min_p(ids: torch.Tensor, logits: torch.Tensor, min_p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the top token's probability."""
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    keep = torch.topk(probs, min(min_keep, probs.shape[-1]), dim=-1).indices
    remove = remove.scatter(-1, keep, False)
    return logits.masked_fill(remove, float("-inf"))


stateless("repetition_penalty", lambda s, c: ("repetition_penalty", lambda i, x: apply_repetition_penalty(
    i, x, s.repetition_penalty)))
stateless("no_repeat_ngram", lambda s, c: ("no_repeat_ngram", lambda i, x: ban_repeated_ngrams(
    i, x, s.no_repeat_ngram_size)))
stateless("top_k", lambda s, c: ("top_k", lambda i, x: keep_top_k(i, x, s.top_k)))
stateless("top_p", lambda s, c: ("top_p", lambda i, x: keep_top_p(i, x, s.top_p)))
stateless("min_p", lambda s, c: ("min_p", lambda i, x: keep_min_p(i, x, s.min_p)))

