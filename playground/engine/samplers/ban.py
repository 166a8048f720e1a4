"""Phrase bans as a sampler: ``apply`` forbids (logit ``-inf``) the tokens earlier rollbacks forbade at the position
being decoded; ``find`` says where the earliest banned phrase or pattern begins in a text. The rollbacks themselves
(the cache, the other samplers, the events) are ``playground.engine.bans.BanGuard``'s, which sets ``position``
before each step and adds to ``forbidden``.

``forbidden`` is not a state a rollback restores: a rollback to a position adds to that position's set and drops
the sets of later positions (they were forbidden after another prefix). ``snapshot`` is therefore None.

ids: [batch, seq]; logits: [batch, vocab].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from playground.config.samplers.ban import BanSettings, compile_ban
from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler


@dataclass(frozen=True)
class Match:
    """Where a ban matched in a text: [start, end) in characters, the ban's own words and kind."""

    start: int
    end: int
    banned: str
    kind: str  # "phrase" or "regex"
    text: str


@engine_sampler
class Ban(Sampler):
    declares = "ban"
    name = "ban"

    def __init__(self, phrases: tuple[str, ...], patterns: tuple[str, ...], max_rollbacks: int) -> None:
        self.phrases = phrases
        self.patterns = patterns
        self._compiled = [compile_ban(p) for p in patterns]
        self.max_rollbacks = max_rollbacks
        self.forbidden: dict[int, set[int]] = {}  # generated position -> tokens forbidden there
        self.position: int | None = None  # the generated position being decoded (set by the guard)

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        g = settings.group(BanSettings)
        return cls(g.phrases(), g.patterns(), g.ban_max_rollbacks)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        banned = self.forbidden.get(self.position) if self.position is not None else None
        if not banned:
            return logits
        index = torch.tensor(sorted(t for t in banned if 0 <= t < logits.shape[-1]), device=logits.device,
                             dtype=torch.long)
        return logits.index_fill(-1, index, float("-inf"))

    def find(self, text: str, start: int = 0) -> Match | None:
        """The ban match that begins first in ``text[start:]`` (ties: the phrases in order, then the patterns)."""
        best: Match | None = None
        for phrase in self.phrases:
            at = text.find(phrase, start)
            if at >= 0 and (best is None or at < best.start):
                best = Match(at, at + len(phrase), phrase, "phrase", phrase)
        for pattern, compiled in zip(self.patterns, self._compiled, strict=True):
            found = compiled.search(text, start)
            if found is not None and (best is None or found.start() < best.start):
                best = Match(found.start(), found.end(), pattern, "regex", found.group(0))
        return best

    def forbid(self, position: int, token_id: int) -> int:
        """Forbid ``token_id`` at ``position`` (and forget the later positions' sets); how many are forbidden there."""
        for later in [p for p in self.forbidden if p > position]:
            del self.forbidden[later]
        at = self.forbidden.setdefault(position, set())
        at.add(token_id)
        return len(at)

    def reset(self) -> None:
        self.forbidden = {}
        self.position = None

    def clone(self) -> Sampler:
        twin = Ban(self.phrases, self.patterns, self.max_rollbacks)
        twin.forbidden = {p: set(s) for p, s in self.forbidden.items()}
        twin.position = self.position
        return twin

