"""Qt-free: folds contrastive search's events into what its view shows.

Per step: the k candidates with the model's confidence, the degeneration penalty, the earlier position each one
resembles most and the combined score, the winner, and whether the penalty overturned the model's top choice; the
text of every position (the prompt's tokens from the start event, each step's token from its ``token`` event, its
search event's text until then). Folding one event costs time proportional to that event.
"""

from __future__ import annotations

from playground.events import Event, TokenStep
from playground.events.contrastive_search import SearchCandidate, SearchStarted, SearchStep
from playground.state.fold import Fold

STEPS = "steps"  # a part: the steps (the strip, the candidates table)
TEXTS = "texts"  # a part: the positions' texts (the text panel)


class ContrastiveSearchState(Fold):
    parts = frozenset({STEPS, TEXTS})
    start_event = SearchStarted
    started: SearchStarted | None

    def _clear(self) -> None:
        self.steps: list[SearchStep] = []
        self.texts: list[str] = []  # every position's text: the prompt's tokens, then each step's token
        self.overturned = 0

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, SearchStarted):
            self.texts = list(event.context_tokens)
            return {TEXTS}
        if isinstance(event, SearchStep):
            self.steps.append(event)
            self.texts.append(event.text)
            self.overturned += event.overturned
            return {STEPS, TEXTS}
        if isinstance(event, TokenStep) and self.steps and event.step == self.steps[-1].step:
            self.texts[self.position(event.step)] = event.text  # the incremental text (whole characters)
            return {TEXTS}
        return None

    # --- reading --------------------------------------------------------------------------------------------
    @property
    def prompt_length(self) -> int:
        return len(self.started.context_tokens) if self.started is not None else 0

    def position(self, step: int) -> int:
        """The sequence position of step ``step``'s token."""
        return self.prompt_length + step

    def describe_position(self, position: int) -> str:
        """"prompt token 12" or "step 3" (where a candidate's most similar earlier token sits)."""
        if position < self.prompt_length:
            return f"prompt token {position}"
        return f"step {position - self.prompt_length}"

    def most_similar_text(self, candidate: SearchCandidate) -> str:
        position = candidate.similar_position
        return self.texts[position] if 0 <= position < len(self.texts) else ""

    def overturned_fraction(self) -> float:
        searched = [s for s in self.steps if not s.forced]
        return sum(s.overturned for s in searched) / len(searched) if searched else 0.0

    def most_interesting_step(self) -> int | None:
        """The step to show once the run ended: the last step where the penalty overturned the model's top choice
        (the most text to see what it steered away from); the last step when none was overturned."""
        if not self.steps:
            return None
        overturned = [i for i, s in enumerate(self.steps) if s.overturned and not s.forced]
        return overturned[-1] if overturned else len(self.steps) - 1
