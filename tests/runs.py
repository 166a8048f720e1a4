"""A strategy's recorded events split by kind, for the engine tests: ``Run.from_events(events)``."""

from __future__ import annotations

from collections.abc import Iterable

from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.speculative import SpeculativeRound


class Run:
    """One run's events: ``start`` (its ``RunStarted``, first) and ``done`` (its ``RunFinished``, last), the prompt's
    and the output's token ids, and the events of any kind in order (``of``, ``first``, ``after``)."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.start: RunStarted = events[0]
        self.done: RunFinished = events[-1]
        assert isinstance(self.start, RunStarted) and isinstance(self.done, RunFinished)
        self.prompt_ids = list(self.start.prompt_token_ids)
        self.ids = list(self.done.token_ids)

    @classmethod
    def from_events(cls, events: Iterable) -> Run:
        """The run of ``events`` (a strategy's iterator is drained)."""
        return cls(list(events))

    def of(self, kind: type) -> list:
        """Its events of type ``kind``, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    def first(self, kind: type):
        """Its first event of type ``kind``."""
        return next(e for e in self.events if isinstance(e, kind))

    def after(self, head: type, kind: type) -> list[list]:
        """The events of type ``kind`` that follow each ``head`` event (up to the next one or the end)."""
        out: list[list] = []
        for event in self.events:
            if isinstance(event, head):
                out.append([])
            elif isinstance(event, kind) and out:
                out[-1].append(event)
        return out

    @property
    def steps(self) -> list[TokenStep]:
        """Its token steps (each output token's)."""
        return self.of(TokenStep)

    # A speculative run's rounds and their sums.

    @property
    def rounds(self) -> list[SpeculativeRound]:
        return self.of(SpeculativeRound)

    def round_steps(self) -> list[list[TokenStep]]:
        """The TokenSteps that follow each round event (up to the next round or the end)."""
        return self.after(SpeculativeRound, TokenStep)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)
