"""transformers' n-gram ban (``NoRepeatNGramLogitsProcessor``, checked against it in tests) as the engine's
sampler object: the banned tokens come from the torch-free ``playground.sampler_maths`` (``NgramBans``, the
what-if's ``NgramBan`` too), indexed as the text grows instead of rescanning it each step.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

from typing import Any

import torch

from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.sampler_maths import NgramBans


def mask_banned(logits: torch.Tensor, banned: list[set[int]]) -> torch.Tensor:
    """``logits`` with each row's ``banned`` tokens at ``-inf`` (a copy; the input itself when nothing is banned)."""
    vocab = logits.shape[-1]
    flat = [r * vocab + t for r, tokens in enumerate(banned) for t in tokens]
    if not flat:
        return logits
    out = logits.clone(memory_format=torch.contiguous_format)
    out.view(-1)[torch.tensor(flat, device=logits.device)] = float("-inf")
    return out


def ban_repeated_ngrams(ids: torch.Tensor, logits: torch.Tensor, ngram_size: int) -> torch.Tensor:
    """Forbid any token that would complete an n-gram already present in ``ids`` (a pure function: a fresh index)."""
    if ids.shape[1] < ngram_size:
        return logits
    return mask_banned(logits, NgramBans(ngram_size).banned(ids.tolist()))


@engine_sampler
class NoRepeatNgram(Sampler):
    """The ban with its index kept from call to call: ``apply`` bans for the texts it is given (always exactly
    transformers' rule for those ids), continuing the index of the texts it saw last; ``accept`` extends a single
    text's index by the chosen token. A single text that extends the one seen last is checked on the tensors
    (one comparison in C) and only its new tokens are read: a step costs the same at any history length."""

    declares = "no_repeat_ngram"
    name = "no_repeat_ngram"

    def __init__(self, n: int) -> None:
        self.n = n
        self.bans = NgramBans(n)
        self._seen: torch.Tensor | None = None  # the single text of the last call (a copy): held[0]'s prefix

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.no_repeat_ngram_size)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] < self.n:
            return logits
        seen, held = self._seen, self.bans.held
        if ids.shape[0] == 1 and seen is not None and len(held) == 1 and ids.shape[1] >= seen.shape[0] \
                and torch.equal(ids[0, : seen.shape[0]], seen):
            ban, start = held[0], seen.shape[0]
            ban.follow_from(start, ids[0, start:].tolist())
            banned = [ban.banned()]
        else:
            banned = self.bans.banned(ids.tolist())
        self._seen = ids[0].clone() if ids.shape[0] == 1 else None
        return mask_banned(logits, banned)

    def accept(self, token_id: int, prob: float) -> None:
        self.bans.accept(token_id)

    def reset(self) -> None:
        self.bans.reset()
        self._seen = None

    def clone(self) -> Sampler:
        return NoRepeatNgram(self.n)  # the index is a cache of the texts seen, not state: a twin starts its own
