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
    if len(flat) == 1:
        out.view(-1)[flat[0]] = float("-inf")  # the common case: one op, no index tensor
    else:
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
    text's index by the chosen token. Texts that extend those of the last call (a step; beams, each continuing a
    parent) are matched on the tensors (comparisons in C) and only their new tokens are read."""

    declares = "no_repeat_ngram"
    name = "no_repeat_ngram"

    def __init__(self, n: int) -> None:
        self.n = n
        self.bans = NgramBans(n)
        self._seen: torch.Tensor | None = None  # the last call's ids (a copy): row k is held[k]'s prefix
        self._fingerprint: torch.Tensor | None = None  # int64 weights of the prefixes' fingerprints

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.no_repeat_ngram_size)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] < self.n:
            return logits
        parents, seen = self._parents(ids), self._seen
        if parents is None or seen is None:
            banned = self.bans.banned(ids.tolist())
        else:
            start = seen.shape[1]
            banned = self.bans.continued(parents, start, ids[:, start:].tolist())
        self._seen = ids.clone()
        return mask_banned(logits, banned)

    def _parents(self, ids: torch.Tensor) -> list[int] | None:
        """For each row of ``ids``, a text of the last call it extends; None when one extends none
        (``NgramBans.banned`` then finds the closest by reading the rows). Matched on the tensors: each row's
        prefix by a fingerprint (a random weighted sum), then checked whole against the row it names."""
        seen = self._seen
        if seen is None or seen.shape[0] != len(self.bans.held) or ids.shape[1] < seen.shape[1]:
            return None
        width = seen.shape[1]
        prefix = ids[:, :width]
        if seen.shape[0] == 1:
            return [0] * ids.shape[0] if bool((prefix == seen).all()) else None
        weights = self._weights(width, ids.device)
        first = {key: k for k, key in reversed(list(enumerate((seen * weights).sum(dim=-1).tolist())))}
        parents = [first.get(key) for key in (prefix * weights).sum(dim=-1).tolist()]
        if any(p is None for p in parents):
            return None
        chosen = [p for p in parents if p is not None]
        return chosen if bool((prefix == seen[chosen]).all()) else None  # (a fingerprint collision: None)

    def _weights(self, width: int, device: torch.device) -> torch.Tensor:
        held = self._fingerprint
        if held is None or held.shape[0] < width or held.device != device:
            size = max(2 * width, 1024)
            held = torch.randint(1, 2**62, (size,), generator=torch.Generator().manual_seed(0)).to(device)
            self._fingerprint = held
        return held[:width]

    def accept(self, token_id: int, prob: float) -> None:
        self.bans.accept(token_id)

    def reset(self) -> None:
        self.bans.reset()
        self._seen = None

    def clone(self) -> Sampler:
        return NoRepeatNgram(self.n)  # the index is a cache of the texts seen, not state: a twin starts its own
