"""Branching a remote run: continue from an alternative token by sending text, since a server takes text.

A local branch forces token ids (``RunSettings.forced_token_ids``). A server's prompt is text, so a remote branch
carries the parent run's own steps: the generated text before the branch point plus the alternative's text are
sent as the start of the answer (a plain completion's prompt, or the assistant message the chat continues), and the
forced steps are the parent's recorded ones (capture, don't re-run: the server would give the same numbers for the
same prefix, and it does not return a prompt's probabilities while streaming).

One caveat, said where it matters: the server tokenizes the sent text again, which may split it differently from the
tokens the parent generated (" Paris" as one token, not " Par" + "is"); the continuation follows that split.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from playground.config.errors import ConfigError
from playground.events import Candidate, TokenStep
from playground.events.remote import RemoteTokenStep

_BYTE_PIECES = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")


@dataclass(frozen=True)
class RemoteBranch:
    """Continue a remote run from ``alternative``, a candidate of the parent's step ``step``."""

    steps: tuple[TokenStep, ...]  # the parent run's token steps (at least up to ``step``)
    step: int  # the parent step whose token is replaced
    alternative: Candidate  # one of ``steps[step].candidates``

    def validate(self) -> RemoteBranch:
        if not 0 <= self.step < len(self.steps):
            raise ConfigError(f"the branch point {self.step} is not a step of the parent run "
                              f"({len(self.steps)} steps)")
        if _BYTE_PIECES.fullmatch(self.alternative.text):
            raise ConfigError(f"the alternative {self.alternative.text} is part of a character (raw bytes): a server "
                              "takes text, so a remote run cannot continue from part of a character; pick another")
        return self

    def prefix_text(self) -> str:
        """The answer's start sent to the server: the parent's text before the branch point, then the alternative."""
        return "".join(s.text for s in self.steps[: self.step]) + self.alternative.text

    def forced_steps(self) -> list[RemoteTokenStep]:
        """The branch's forced steps: the parent's steps before the branch point, then the alternative, with the
        numbers recorded at that step of the parent (the alternative's probability, rank and the same candidates)."""
        kept = [dataclasses.replace(_remote(s, forced=True), step=i) for i, s in enumerate(self.steps[: self.step])]
        at = self.steps[self.step]
        alt = self.alternative
        chosen = dataclasses.replace(
            _remote(at, forced=True), step=self.step, token_id=alt.token_id, text=alt.text, prob=alt.processed_prob,
            raw_prob=alt.raw_prob, logprob=math.log(alt.raw_prob) if alt.raw_prob > 0 else float("-inf"),
            raw_rank=alt.raw_rank, has_probs=True, rank_exact=True, merged_bytes=0,
        )
        return [*kept, chosen]


def _remote(step: TokenStep, *, forced: bool) -> RemoteTokenStep:
    """``step`` as a remote token event, re-stamped forced, with no time of its own (it was not decoded again)."""
    plain = {f.name: getattr(step, f.name) for f in dataclasses.fields(TokenStep)}
    extra = {f.name: getattr(step, f.name) for f in dataclasses.fields(RemoteTokenStep) if f.name not in plain
             and hasattr(step, f.name)}
    return RemoteTokenStep(**{**plain, **extra, "forced": forced, "step_ms": 0.0})
