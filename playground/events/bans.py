"""A phrase ban's rollback (``--ban``, ``--ban-regex``): the decode undid the tokens from ``position`` on, because the
generated text came to contain a banned phrase that began in the token at ``position``, and forbade that token
there. Every rollback is kept as one event, after the steps it undid; the run's steps from ``position`` on are
replaced by the steps that follow it (``TokenStep.step`` counts from ``position`` again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Rollback:
    """One rollback: the undone tokens (their ids, texts and probabilities after the sampler chain, and raw), what
    matched, and the token now forbidden at ``position``."""

    type: ClassVar[str] = "rollback"
    position: int  # the generated token the decode went back to (0 = the first): tokens from here on were undone
    token_ids: tuple[int, ...]  # the undone tokens, from ``position`` on
    texts: tuple[str, ...]  # each one's text (what it added to the output)
    probs: tuple[float, ...]  # each one's probability after the sampler chain (the one it was drawn from)
    raw_probs: tuple[float, ...]  # each one's raw probability (softmax of the model's logits)
    banned: str  # the phrase or pattern that matched
    kind: str  # "phrase" (--ban) or "regex" (--ban-regex)
    matched: str  # the text that matched
    match_start: int  # where the match began, in characters of the generated text
    forbidden: int  # the token forbidden at ``position`` by this rollback (the first undone one)
    forbidden_text: str
    forbidden_count: int  # tokens forbidden at ``position`` now, this one included
    number: int  # 1 for the run's first rollback
