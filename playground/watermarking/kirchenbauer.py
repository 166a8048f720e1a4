"""Kirchenbauer et al.'s green lists, as transformers' ``WatermarkLogitsProcessor`` and ``WatermarkDetector``
compute them (its seeds, its permutation, its 40-candidate selfhash), with what repeats cached.

The seed of a green list: ``lefthash``: ``hashing_key · last token``; ``selfhash``: the least of
``hashing_key · (T[w] + 1) · (T[last] + 1)`` over the window's tokens w (int64, wrapping as torch's does), T a fixed
permutation of 1 000 003 seeded by the key. The green list: the first ``int(vocab · γ)`` of ``torch.randperm(vocab)``
from a generator seeded with ``seed mod (2^64 − 1)``. transformers draws that permutation on the model's device, so
its green lists differ between CPU and CUDA (its detector asks for "the correct device"); here they are always drawn
on the CPU, equal to transformers' on the CPU and the same on every device.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

TABLE_SIZE = 1_000_003
SELFHASH_TRIES = 40  # transformers' (from the original repository): the candidates selfhash tries per step
_U64 = 2**64


def _wrap64(x: int) -> int:
    """``x`` as an int64 holds it (two's complement wrap, as torch's multiplication)."""
    return ((x + 2**63) % _U64) - 2**63


@dataclass(frozen=True)
class KirchenbauerKey:
    vocab_size: int
    greenlist_ratio: float = 0.25
    bias: float = 2.0
    hashing_key: int = 15485863
    seeding_scheme: str = "lefthash"
    context_width: int = 1

    @property
    def greenlist_size(self) -> int:
        return int(self.vocab_size * self.greenlist_ratio)

    @property
    def selfhash(self) -> bool:
        return self.seeding_scheme == "selfhash"

    @property
    def skipped(self) -> int:
        """Tokens at the text's start that seed but are not scored (the detector's first n-gram)."""
        return self.context_width - int(self.selfhash)


class GreenLists:
    """The green lists of one key, cached by seed (a lefthash green list is one of at most ``vocab`` lists);
    ``of(key)`` shares one instance per key (the chain's entry, the live record and the detector reuse its cache)."""

    _shared: ClassVar[OrderedDict[KirchenbauerKey, GreenLists]] = OrderedDict()

    @classmethod
    def of(cls, key: KirchenbauerKey) -> GreenLists:
        held = cls._shared.get(key)
        if held is None:
            held = cls._shared[key] = cls(key)
            if len(cls._shared) > 4:
                cls._shared.popitem(last=False)
        return held

    def __init__(self, key: KirchenbauerKey, cache: int = 256) -> None:
        self.key = key
        self._table: list[int] | None = None
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()  # seed -> bool [vocab] on the CPU
        self._bias: OrderedDict[tuple[int, torch.device, torch.dtype], torch.Tensor] = OrderedDict()
        self._member: dict[tuple[int, int], bool] = {}  # (seed, token) -> green (selfhash's questions)
        self.cache = cache

    @property
    def table(self) -> list[int]:
        if self._table is None:
            generator = torch.Generator().manual_seed(self.key.hashing_key)
            self._table = torch.randperm(TABLE_SIZE, generator=generator).tolist()
        return self._table

    def seed(self, window: Sequence[int]) -> int:
        """The seed of the green list for ``window`` (the tokens before the candidate for lefthash, the context
        ending in the candidate for selfhash; only its last ``context_width`` count)."""
        key = self.key
        window = list(window)[-key.context_width:]
        if key.selfhash:
            table = self.table
            b = table[window[-1] % TABLE_SIZE] + 1
            seed = min(_wrap64(key.hashing_key * (table[w % TABLE_SIZE] + 1) * b) for w in window)
        else:
            seed = key.hashing_key * window[-1]
        return seed % (_U64 - 1)

    def mask(self, seed: int) -> torch.Tensor:
        """The green list of ``seed`` as a bool [vocab] (CPU)."""
        held = self._masks.get(seed)
        if held is not None:
            self._masks.move_to_end(seed)
            return held
        generator = torch.Generator().manual_seed(seed)
        green = torch.randperm(self.key.vocab_size, generator=generator)[: self.key.greenlist_size]
        held = torch.zeros(self.key.vocab_size, dtype=torch.bool).index_fill_(0, green, True)
        self._masks[seed] = held
        if len(self._masks) > self.cache:
            self._masks.popitem(last=False)
        return held

    def ids(self, seed: int) -> torch.Tensor:
        """The green token ids of ``seed``, in transformers' order (the permutation's first γ·vocab)."""
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(self.key.vocab_size, generator=generator)[: self.key.greenlist_size]

    def is_green(self, window: Sequence[int], token: int) -> bool:
        """Whether ``token`` is green after ``window`` (lefthash: the tokens before it; selfhash: the window is
        completed by the token itself)."""
        seed = self.seed([*window, token] if self.key.selfhash else window)
        answer = self._member.get((seed, token))
        if answer is None:
            answer = bool(self.mask(seed)[token])
            if len(self._member) > 1 << 20:
                self._member.clear()
            self._member[(seed, token)] = answer
        return answer

    def bias_vector(self, seed: int, like: torch.Tensor) -> torch.Tensor:
        """``bias`` on the green tokens, 0 elsewhere: [vocab] of ``like``'s dtype and device."""
        index = (seed, like.device, like.dtype)
        held = self._bias.get(index)
        if held is not None:
            self._bias.move_to_end(index)
            return held
        held = (self.mask(seed).to(like.dtype) * self.key.bias).to(like.device)
        self._bias[index] = held
        if len(self._bias) > min(self.cache, 64):
            self._bias.popitem(last=False)
        return held

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """transformers' processor on ``ids`` [batch, seq], ``logits`` [batch, vocab]: the watermarked logits and
        each row's green mask (None where the context is too short and nothing is added)."""
        key = self.key
        if ids.shape[-1] < key.context_width:
            return logits, [None] * logits.shape[0]
        out = logits.clone()
        masks: list[torch.Tensor | None] = []
        rows = ids[:, -key.context_width:].tolist()
        for row, window in enumerate(rows):
            if key.selfhash:
                green = self._selfhash_green(window, logits[row])
                out[row] = logits[row] + green.to(logits.dtype).to(logits.device) * key.bias
                masks.append(green)
            else:
                seed = self.seed(window)
                out[row] = logits[row] + self.bias_vector(seed, logits)
                masks.append(self.mask(seed))
        return out, masks

    def _selfhash_green(self, window: list[int], scores: torch.Tensor) -> torch.Tensor:
        """transformers' rejection sampling: of the 40 likeliest candidates, those green in their own list."""
        green = torch.zeros(self.key.vocab_size, dtype=torch.bool)
        tries = min(SELFHASH_TRIES, scores.shape[-1])
        top = scores.sort(dim=-1, descending=True).indices[:tries].tolist()
        for token in top:
            if self.is_green(window, token):
                green[token] = True
        return green
