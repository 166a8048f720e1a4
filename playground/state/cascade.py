"""Qt-free: folds cascade inference's events into what the cascade view shows.

Marks, in reading order, one per token: the cheap model's token (*cheap*), a token the full model decided (*full*;
the first of each stretch is an *escalation point*), a forced token (branching), and, per response, a token of the
cheap model's response that the full model rewrote (*discarded*: shown before the full model's response). Per
response, the cheap response's marks are *pending* until the verdict; when the verdict throws the response away
they turn into discarded marks (``restyled`` counts such changes, so a view redraws what it drew).

Live figures come from the steps (tokens by each model, escalations, the full model's passes and catch-ups, each
model's time); the comparison with the full model alone and the compute and time saved come with the run's final
event (``RunFinished.figures``). Folding an event costs time proportional to that event.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.events import Event, TokenStep
from playground.events.cascade import CHEAP, FORCED, FULL, CascadeResponse, CascadeStarted, CascadeStep
from playground.state.fold import STATUS, Fold

DISCARDED = "discarded"  # per response: a token of the cheap response that the full model rewrote
KINDS = (CHEAP, FULL, FORCED, DISCARDED)
MARKS = "marks"  # a part: the marked output, the confidence strip and the counts


@dataclass
class Mark:
    """One token of the marked text, in reading order."""

    kind: str  # CHEAP | FULL | FORCED | DISCARDED
    step: CascadeStep
    escalation: bool = False  # the first token of a stretch the full model decided
    pending: bool = False  # per response: the cheap response's token before the verdict

    @property
    def text(self) -> str:
        return self.step.text


class CascadeState(Fold):
    """One cascade run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({MARKS})
    start_event = CascadeStarted
    started: CascadeStarted | None

    def _clear(self) -> None:
        self.marks: list[Mark] = []
        self.output: list[CascadeStep] = []  # the output's steps, in order
        self.drafts: list[CascadeStep] = []  # per response: the cheap model's response
        self._draft_marks: list[int] = []  # index into marks of each draft step
        self.response: CascadeResponse | None = None
        self.restyled = 0  # times marks already made changed kind (a view redraws its text)
        self.counts = {kind: 0 for kind in (CHEAP, FULL, FORCED)}  # output tokens by who produced them
        self.escalations = 0
        self.full_passes = 0  # steps where the full model ran (one catch-up pass each, chunked for long prompts)
        self.full_read = 0  # positions it read in them
        self.cheap_ms = 0.0
        self.full_ms = 0.0
        self.cheap_steps = 0  # steps where the cheap model chose (its pass or, at the first, the prefill's logits)

    # --- folding events -------------------------------------------------------------------------------------
    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, CascadeStep):
            self._add_step(event)
        elif isinstance(event, CascadeResponse):
            self._verdict(event)
        elif not (isinstance(event, TokenStep) and self._kept_draft(event)):
            return None
        return {MARKS, STATUS}

    def _add_step(self, step: CascadeStep) -> None:
        self._count_cost(step)
        if step.draft:
            self.drafts.append(step)
            self._draft_marks.append(len(self.marks))
            self.marks.append(Mark(CHEAP if step.producer != FORCED else FORCED, step, pending=True))
            return
        self._add_output(step)

    def _count_cost(self, step: CascadeStep) -> None:
        self.cheap_ms += step.cheap_ms
        self.full_ms += step.full_ms
        self.cheap_steps += step.cheap_token_id is not None
        if step.full_read:
            self.full_passes += 1
            self.full_read += step.full_read

    def _add_output(self, step: CascadeStep) -> None:
        previous = self.output[-1].producer if self.output else None
        escalation = step.producer == FULL and previous != FULL
        self.output.append(step)
        self.counts[step.producer] += 1
        self.escalations += escalation
        self.marks.append(Mark(step.producer, step, escalation=escalation))

    def _verdict(self, response: CascadeResponse) -> None:
        self.response = response
        for index in self._draft_marks:
            mark = self.marks[index]
            if mark.pending:
                mark.pending = False
                if response.escalated:
                    mark.kind = DISCARDED
        self.restyled += 1

    def _kept_draft(self, token: TokenStep) -> bool:
        """Per response, a token event of the kept cheap response (or of one Stop cut short) makes its draft step
        part of the output."""
        if not self.drafts or (self.response is not None and self.response.escalated):
            return False
        if token.step != len(self.output) or token.step >= len(self.drafts):
            return False
        draft = self.drafts[token.step]
        self.output.append(draft)
        self.counts[draft.producer] += 1
        mark = self.marks[self._draft_marks[token.step]]
        if mark.pending:  # no verdict (Stop cut the response short): it stands as it was written
            mark.pending = False
            self.restyled += 1
        return True


    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def per_response(self) -> bool:
        return self.started is not None and self.started.unit == "response"

    @property
    def threshold(self) -> float | None:
        return self.started.threshold if self.started is not None else None

    @property
    def full_share(self) -> float | None:
        """Share of the output's tokens the full model decided."""
        return self.counts[FULL] / len(self.output) if self.output else None

    def confidence_steps(self) -> list[CascadeStep]:
        """The steps whose cheap confidence the strip shows: the output's (per token), the cheap response's (per
        response)."""
        return self.drafts if self.per_response else self.output

    def escalation_steps(self) -> list[int]:
        """Output positions where the full model took over (the first token of each of its stretches)."""
        return [m.step.step for m in self.marks if m.escalation]
