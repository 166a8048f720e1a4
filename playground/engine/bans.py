"""Phrase bans with backtracking: the decode loop's guard (``DecodeLoop.guard``) for greedy and sampling.

Before each step the guard keeps every sampler's state at the position about to be decoded (``Sampler.snapshot``:
mirostat's mu, Adaptive-P's average, a grammar's matcher, ...) and tells the ban sampler the position. After each
step it searches the generated text (never the prompt, nor tokens forced by hand) for the earliest banned phrase or
pattern; on a match it rolls the run back to the token whose text holds the match's first character (a token that
only began that character, with an empty text of its own, goes too):

- that token is forbidden at that position (``Ban.forbid``: a later rollback to the same position adds to the set);
- the KV cache is cropped to what it held before that position was decoded, and every sampler's state restored to
  its snapshot there; the run's generator goes on (a draw is never repeated);
- the loop forgets the undone tokens (``DecodeLoop.rewind``) and decodes that position again;
- a ``Rollback`` event says what was undone, with the undone tokens' ids, texts and probabilities.

After ``max_rollbacks`` rollbacks the run ends ("ban_limit"); a step whose every token is forbidden ends it
("ban_blocked", in ``playground.engine.sampling``). A model with sliding-window layers is refused: its cache cannot
go back past its window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from playground.config import ConfigError
from playground.engine.samplers.ban import Ban, Match
from playground.engine.samplers.base import Sampler
from playground.engine.speculative.rollback import roll_back
from playground.events import Event, StopReason, TokenStep
from playground.events.bans import Rollback


def check_croppable(lm: Any) -> None:
    """``ConfigError`` for a model whose KV cache cannot be cropped back to any earlier position."""
    from playground.models.anatomy import anatomy_of

    try:
        sliding = anatomy_of(lm.model).has_sliding_layers
    except ConfigError:
        config = getattr(lm.model, "config", None)
        sliding = bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)
    if sliding:
        raise ConfigError(f"phrase bans (--ban, --ban-regex) roll the KV cache back, and {lm.name}'s sliding-window "
                          "layers cannot go back past their window: not available on this model")


class BanGuard:
    """The rollbacks of one run. ``samplers``: the run's chain (their states are rolled back with the tokens);
    ``generator``: the run's own (a sampler whose state is that generator, as XTC, is not rolled back: the draws go
    on)."""

    def __init__(self, ban: Ban, samplers: Sequence[Sampler], token_text: Any, generator: Any) -> None:
        self.ban = ban
        self.samplers = [s for s in samplers if s is not ban and getattr(s, "generator", None) is not generator]
        self.token_text = token_text  # id -> its display text
        self.snapshots: list[list[Any]] = []  # per generated position: each sampler's state before that step
        self.texts: list[str] = []  # per generated token: what it added to the output
        self.probs: list[tuple[float, float]] = []  # per generated token: (processed, raw) probability
        self.rollbacks = 0
        self.undone = 0  # tokens the rollbacks undid in all

    # -- the loop's hooks ---------------------------------------------------------------------------------------

    def before_step(self, loop: Any) -> None:
        position = len(loop.generated)
        del self.snapshots[position:]
        self.snapshots.append([s.snapshot() for s in self.samplers])
        self.ban.position = position

    def after_step(self, loop: Any, texts: list[str], events: Sequence[Any]
                   ) -> tuple[list[Event], tuple[StopReason, str] | None] | None:
        """After a step kept ``texts`` (its tokens' texts; ``events``: what it yielded): None when no ban matches,
        else (the rollback's events, the run's end when the rollbacks reached their limit)."""
        # ``texts`` mirrors the loop's generated tokens (a rollback trims both alike), and a sampling step's events
        # hold one TokenStep per token it kept.
        self.texts.extend(texts)
        steps = [e for e in events if isinstance(e, TokenStep)]
        self.probs.extend((s.prob, s.raw_prob) for s, _ in zip(steps, texts, strict=True))
        forced = min(len(loop.forced), len(self.texts))
        starts = self._starts()
        match = self.ban.find("".join(self.texts), starts[forced])
        if match is None:
            return None
        return self._roll_back(loop, match, starts, forced)

    def figures(self) -> dict[str, float]:
        return {"rollbacks": float(self.rollbacks), "rollback_tokens": float(self.undone)}

    # -- the rollback ---------------------------------------------------------------------------------------------

    def _starts(self) -> list[int]:
        """Each token's first character in the generated text, and the text's length last."""
        out, at = [], 0
        for text in self.texts:
            out.append(at)
            at += len(text)
        out.append(at)
        return out

    def _roll_back(self, loop: Any, match: Match, starts: list[int], forced: int
                   ) -> tuple[list[Event], tuple[StopReason, str] | None]:
        # The token whose text holds the match's first character; where that character is the token's first, the
        # tokens just before it with no text of their own (the first bytes of that character) began it.
        position = next(i for i in range(len(self.texts)) if starts[i] <= match.start < starts[i + 1])
        while match.start == starts[position] and position > forced and not self.texts[position - 1]:
            position -= 1
        ids = list(loop.generated[position:])
        token = ids[0]
        count = self.ban.forbid(position, token)
        for sampler, state in zip(self.samplers, self.snapshots[position], strict=True):
            sampler.restore(state)  # (the next step's before_step drops the snapshots after ``position``)
        # The cache as it was before ``position`` was decoded: the step feeds the last kept token (the prefill's
        # own logits serve position 0, after the prompt tokens it left to the first step).
        roll_back(loop.cache, len(loop.prompt_ids) + position - 1 if position else len(loop.prompt_ids) - loop.deferred)
        loop.rewind(position)
        self.rollbacks += 1
        self.undone += len(ids)
        event = Rollback(
            position=position, token_ids=tuple(ids), texts=tuple(self.texts[position:]),
            probs=tuple(p for p, _ in self.probs[position:]), raw_probs=tuple(r for _, r in self.probs[position:]),
            banned=match.banned, kind=match.kind, matched=match.text, match_start=match.start, forbidden=token,
            forbidden_text=self.token_text(token), forbidden_count=count, number=self.rollbacks)
        del self.texts[position:], self.probs[position:]
        ends: tuple[StopReason, str] | None = None
        if self.rollbacks >= self.ban.max_rollbacks:
            ends = ("ban_limit", f"the bans rolled the run back {self.rollbacks} times (the limit, "
                                 f"--ban-max-rollbacks), undoing {self.undone} tokens: it ends on the text they left")
        return [event], ends


def blocked_note(ban: Ban, position: int) -> str:
    """Why a step whose every token is forbidden ends the run."""
    n = len(ban.forbidden.get(position, ()))
    return (f"no token is left at output token {position}: the bans' rollbacks forbade {n} token"
            f"{'s' if n != 1 else ''} there and the other samplers removed the rest")
