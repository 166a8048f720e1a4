"""Logit transforms as pure functions ``(ids, logits) -> logits`` that never modify their input.

``ids``: [batch, seq] token ids so far (prompt + generated), ``logits``: [batch, vocab]. Each one follows the
definition of the transformers logits processor of the same name (checked against it in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from playground.config import RunSettings

LogitTransform = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    vocab = logits.shape[-1]
    # Non-matching windows write to a spare column past the vocabulary, which is dropped.
    banned = torch.zeros((logits.shape[0], vocab + 1), dtype=torch.bool, device=logits.device)
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
    banned = banned[:, :vocab]
    return logits.masked_fill(banned, float("-inf"))


def apply_temperature(ids: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def keep_top_k(ids: torch.Tensor, logits: torch.Tensor, top_k: int, min_keep: int = 1) -> torch.Tensor:
    """Keep the ``top_k`` highest logits (ties with the k-th are kept too)."""
    k = min(max(top_k, min_keep), logits.shape[-1])
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(ids: torch.Tensor, logits: torch.Tensor, top_p: float, min_keep: int = 1) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -min_keep:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def keep_min_p(ids: torch.Tensor, logits: torch.Tensor, min_p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the top token's probability."""
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    keep = torch.topk(probs, min(min_keep, probs.shape[-1]), dim=-1).indices
    remove = remove.scatter(-1, keep, False)
    return logits.masked_fill(remove, float("-inf"))


@dataclass(frozen=True)
class NamedTransform:
    name: str
    apply: LogitTransform


def build_pipeline(settings: RunSettings, *, sampling: bool) -> tuple[NamedTransform, ...]:
    """The processors a run applies, in transformers' order.

    Penalties apply to every strategy; temperature, top-k, top-p and min-p only when sampling (as in
    ``generate``, where greedy and beam search ignore them).
    """
    s = settings
    steps: list[NamedTransform] = []
    if s.repetition_penalty != 1.0:
        steps.append(NamedTransform("repetition_penalty",
                                    lambda i, x: apply_repetition_penalty(i, x, s.repetition_penalty)))
    if s.no_repeat_ngram_size > 0:
        steps.append(NamedTransform("no_repeat_ngram",
                                    lambda i, x: ban_repeated_ngrams(i, x, s.no_repeat_ngram_size)))
    if sampling:
        if s.temperature != 1.0:
            steps.append(NamedTransform("temperature", lambda i, x: apply_temperature(i, x, s.temperature)))
        if s.top_k > 0:
            steps.append(NamedTransform("top_k", lambda i, x: keep_top_k(i, x, s.top_k)))
        if s.top_p < 1.0:
            steps.append(NamedTransform("top_p", lambda i, x: keep_top_p(i, x, s.top_p)))
        if s.min_p > 0.0:
            steps.append(NamedTransform("min_p", lambda i, x: keep_min_p(i, x, s.min_p)))
    return tuple(steps)


def run_pipeline(pipeline: tuple[NamedTransform, ...], ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    for step in pipeline:
        logits = step.apply(ids, logits)
    return logits
