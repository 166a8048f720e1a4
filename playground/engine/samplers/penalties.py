"""Penalties on what the text already holds: OpenAI's presence and frequency penalties, and DRY.

Both read the whole context (prompt included), as this app's repetition penalty (transformers') and llama-server (which
feeds the prompt through its penalty and DRY samplers) do; OpenAI counts only the sampled tokens.
"""

from __future__ import annotations

import torch

# A match longer than this is counted as this long (text-generation-webui's cap; it also bounds base**length).
DRY_MAX_MATCH = 50


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


def dry_match_lengths(tokens: list[int], breakers: frozenset[int]) -> dict[int, int]:
    """For each token that would continue an earlier occurrence of the text's ending: the longest such ending.

    The text ``a b c ... a b`` ends with ``a b``, which was followed by ``c`` before: emitting ``c`` would extend a
    repeat of length 2. A repeat never extends across a sequence breaker, and a breaker is never penalised.
    """
    lengths: dict[int, int] = {}
    if not tokens or tokens[-1] in breakers:
        return lengths
    last = tokens[-1]
    end = len(tokens) - 1
    for i in range(end):  # every earlier occurrence of the last token (the last one itself always matches)
        if tokens[i] != last:
            continue
        following = tokens[i + 1]
        if following in breakers:
            continue
        length = 1
        while length < DRY_MAX_MATCH and i - length >= 0:
            behind = tokens[end - length]
            if tokens[i - length] != behind or behind in breakers:
                break
            length += 1
        lengths[following] = max(length, lengths.get(following, 0))
    return lengths


def apply_dry(ids: torch.Tensor, logits: torch.Tensor, multiplier: float, base: float, allowed_length: int,
              breakers: frozenset[int]) -> torch.Tensor:
    """DRY (text-generation-webui / llama.cpp): a token that would extend a repeat of ``n >= allowed_length``
    tokens loses ``multiplier · base^(n − allowed_length)`` from its logit."""
    out = logits.clone()
    for row, tokens in enumerate(ids.tolist()):
        lengths = dry_match_lengths(tokens, breakers)
        hit = [(token, n) for token, n in lengths.items() if n >= allowed_length]
        if hit:
            index = torch.tensor([t for t, _ in hit], device=logits.device)
            penalty = torch.tensor([multiplier * base ** (n - allowed_length) for _, n in hit],
                                   dtype=logits.dtype, device=logits.device)
            out[row, index] -= penalty
    return out
