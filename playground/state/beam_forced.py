"""Qt-free: constrained beam search's progress (forced words), for the beam tree's marks, tooltips and bank table.

Folds ``ForcedWordsStarted`` (the constraints), ``BeamBanks`` (each step's candidates' progress, in the order of
that step's ``BeamStep.candidates``, which is the order the beam tree numbers its nodes) and ``ForcedWordsDone``.
A step's work is proportional to its candidates.
"""

from __future__ import annotations

from playground.events import Event
from playground.events.beam_forced import BankedCandidate, BeamBanks, ForcedWord, ForcedWordsDone, ForcedWordsStarted
from playground.state.fold import Fold

FORCED = "forced"  # a part: the constraints, the banks by step, the returned sequences' constraints


class ForcedProgress(Fold):
    parts = frozenset({FORCED})
    start_event = ForcedWordsStarted

    def _clear(self) -> None:
        self.constraints: tuple[ForcedWord, ...] = ()
        self.bank_unit = 1
        self.prompt_met: tuple[int, ...] = ()
        self.steps: list[tuple[BankedCandidate, ...]] = []  # by step: each candidate's progress
        self.survivor_banks: list[tuple[int, ...]] = []  # by step: the surviving beams' banks
        self.returned_met: tuple[tuple[int, ...], ...] = ()
        self.filled_in = False

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, ForcedWordsStarted):
            self.constraints, self.bank_unit, self.prompt_met = event.constraints, event.bank_unit, event.prompt_met
        elif isinstance(event, BeamBanks):
            while len(self.steps) < event.step:  # a step without its banks (never from the engine): none known
                self.steps.append(())
                self.survivor_banks.append(())
            self.steps[event.step:] = [event.candidates]
            self.survivor_banks[event.step:] = [event.survivor_banks]
        elif isinstance(event, ForcedWordsDone):
            self.returned_met, self.filled_in = event.met, event.filled_in
        else:
            return None
        return {FORCED}

    @property
    def active(self) -> bool:
        return bool(self.constraints)

    @property
    def top_bank(self) -> int:
        """The bank of a beam that met every constraint."""
        return len(self.constraints) * self.bank_unit

    def candidate(self, step: int, rank: int) -> BankedCandidate | None:
        """The progress of a step's candidate (``rank``: 1 = the first of that step's ``BeamStep.candidates``)."""
        if 0 <= step < len(self.steps) and 0 < rank <= len(self.steps[step]):
            return self.steps[step][rank - 1]
        return None

    def word(self, index: int) -> str:
        return self.constraints[index].text if 0 <= index < len(self.constraints) else f"#{index + 1}"

    def describe(self, c: BankedCandidate) -> list[str]:
        """A candidate's progress in words (for its tooltip)."""
        n = len(self.constraints)
        met = ", ".join(repr(self.word(i)) for i in c.met) or "none"
        lines = [f"forced words met: {len(c.met)} of {n} ({met})"]
        if c.current >= 0:
            word = self.constraints[c.current] if c.current < n else None
            total = max((len(a) for a in word.alternatives), default=0) if word else 0
            lines.append(f"in progress: {self.word(c.current)!r}, {c.matched} of {total} tokens")
        how = "proposed by a forced word (a token that advances it), beside the top-K" if c.proposed else \
            "one of the top-K continuations"
        sort = "" if c.sorted else ", not sorted (an EOS, or below the best non-EOS ones)"
        lines.append(f"bank {c.bank} of {self.top_bank} · {how}{sort}")
        return lines

    def bank_counts(self, step: int) -> dict[int, int]:
        """How many surviving beams each bank holds after ``step``."""
        counts: dict[int, int] = {}
        for b in self.survivor_banks[step] if 0 <= step < len(self.survivor_banks) else ():
            counts[b] = counts.get(b, 0) + 1
        return counts
