"""Qt-free: folds contrastive decoding's events into what the contrastive view shows.

Per step: the recorded candidates with the expert's and the amateur's log-probabilities and the contrast score, the
plausibility cut, the chosen token, the expert's own top token and whether the contrast changed it; the token's
text once its ``token`` event comes. Folding one event costs time proportional to that event.

``replay_alpha`` is a what-if on the recorded scores, never a new run: which token each step would choose (the
highest score) under another plausibility α. It is exact for a step when every token the new cut lets in was
recorded — the engine records the expert's top tokens, so a cut above the least likely of them always is, and so is
a stricter cut when the run recorded its whole plausible set — and "unknown" otherwise. First-order: a changed token
would have changed every later step's context, which the recorded run cannot show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from playground.events import Event, TokenStep
from playground.events.contrastive import ContrastCandidate, ContrastiveStarted, ContrastStep
from playground.state.fold import STATUS, Fold

STEPS = "steps"  # a part: the steps (the strip, the DoLa plot, the what-if's replay, the chart)
TEXTS = "texts"  # a part: the steps' token texts (the strip's labels, the step panel)


def relative_prob(candidate: ContrastCandidate, expert_max: float) -> float:
    """p_expert / max p_expert, from the log-probabilities (as the engine decides the cut)."""
    return math.exp(candidate.expert_logprob - expert_max)


def raw_score(candidate: ContrastCandidate) -> float:
    """log p_expert − log p_amateur whether or not the candidate is plausible (the recorded score when it is)."""
    return candidate.score if math.isfinite(candidate.score) else candidate.expert_logprob - candidate.amateur_logprob


DOLA_DIVERGENCE = {"reference": "½[KL(M‖P) + KL(M‖Q)]", "formula": "JSD ½[KL(P‖M) + KL(Q‖M)]"}


def dola_variant(started: ContrastiveStarted | None) -> str:
    """The DoLa variant that ran ("reference" or "formula"; a DoLa run saved before the variants existed ran the
    formula), or "" when the run is not DoLa."""
    if started is None or started.amateur != "dola":
        return ""
    return started.dola_variant or "formula"


@dataclass
class StepRecord:
    """One step (its ``text`` comes with the token event that follows)."""

    contrast: ContrastStep
    alpha: float  # the run's α
    expert_max: float  # the expert's top log-probability (its top token is always recorded)
    floor: float  # every token with a log-probability above this was recorded (the least of the expert's top)
    all_plausible_recorded: bool  # every token of the step's plausible set is among the candidates
    text: str | None = None

    @property
    def step(self) -> int:
        return self.contrast.step

    def covered(self, alpha: float) -> bool:
        """Whether every token with p ≥ alpha · max p is among the recorded candidates."""
        if alpha >= self.alpha and self.all_plausible_recorded:
            return True
        return alpha > 0 and self.expert_max + math.log(alpha) > self.floor

    def plausible_at(self, alpha: float) -> list[bool]:
        """Per candidate: whether it passes the cut at ``alpha``."""
        return [(r := relative_prob(c, self.expert_max)) >= alpha and r > 0 for c in self.contrast.candidates]

    def best_at(self, alpha: float) -> int | None:
        """The highest-scoring token among the candidates plausible at ``alpha`` (ties: the lowest id, as torch's
        argmax); None when the cut lets in tokens that were not recorded."""
        if not self.covered(alpha):
            return None
        inside = [c for c, ok in zip(self.contrast.candidates, self.plausible_at(alpha), strict=True) if ok]
        return max(inside, key=lambda c: (raw_score(c), -c.token_id)).token_id


@dataclass(frozen=True)
class AlphaReplay:
    """Each step's choice under another α (None: unknown), and how that compares with the expert and the run."""

    alpha: float
    choices: tuple[int | None, ...]
    changed: tuple[bool | None, ...]  # the choice is not the expert's top token
    differs: tuple[bool | None, ...]  # the choice is not the run's own contrast choice

    @property
    def unknown(self) -> int:
        return sum(c is None for c in self.choices)

    @property
    def known(self) -> int:
        return len(self.choices) - self.unknown

    @property
    def changes(self) -> int:
        return sum(bool(c) for c in self.changed)

    @property
    def differences(self) -> int:
        return sum(bool(d) for d in self.differs)


def replay_alpha(state: ContrastiveState, alpha: float) -> AlphaReplay:
    choices, changed, differs = [], [], []
    for record in state.steps:
        best = record.best_at(alpha)
        choices.append(best)
        changed.append(None if best is None else best != record.contrast.expert_token_id)
        differs.append(None if best is None else best != record.contrast.contrast_token_id)
    return AlphaReplay(alpha, tuple(choices), tuple(changed), tuple(differs))


class ContrastiveState(Fold):
    """The steps of one contrastive run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({STEPS, TEXTS})
    start_event = ContrastiveStarted
    started: ContrastiveStarted | None

    def _clear(self) -> None:
        self.steps: list[StepRecord] = []
        self.changed = 0  # steps whose contrast choice is not the expert's top token
        self.forced = 0
        self.plausible_total = 0
        self.amateur_ms = 0.0
        self.contrast_ms = 0.0
        self.step_ms = 0.0

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, ContrastStep):
            self._add_step(event)
            return {STEPS, TEXTS, STATUS}
        if isinstance(event, TokenStep):
            if not self.steps or self.steps[-1].step != event.step:
                return None
            self.steps[-1].text = event.text
            self.step_ms += event.step_ms
            return {TEXTS, STATUS}
        return None

    def _add_step(self, s: ContrastStep) -> None:
        alpha = self.started.alpha if self.started is not None else 0.0
        top = self.started.expert_top if self.started is not None else 0
        candidates = s.candidates
        expert_max = max(c.expert_logprob for c in candidates)
        ranked = [c.expert_logprob for c in candidates if c.expert_rank <= top]
        floor = min(ranked) if len(ranked) >= top > 0 else math.inf
        recorded_plausible = sum(c.plausible for c in candidates)
        self.steps.append(StepRecord(s, alpha, expert_max, floor, recorded_plausible == s.plausible_count))
        self.changed += s.changed
        self.forced += s.forced
        self.plausible_total += s.plausible_count
        self.amateur_ms += s.amateur_ms
        self.contrast_ms += s.contrast_ms


    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        return self.started.alpha if self.started is not None else 0.1

    @property
    def mean_plausible(self) -> float | None:
        return self.plausible_total / len(self.steps) if self.steps else None

    def mean_ms(self, total: float) -> float | None:
        return total / len(self.steps) if self.steps else None

    def most_interesting_step(self, shown: int = 10) -> int | None:
        """The step worth showing first: one where the contrast changed the expert's choice and the cut falls among
        the first ``shown`` candidates (both sides of it visible), with the most plausible tokens; else any changed
        step; else the first step. None before any step."""
        if not self.steps:
            return None

        def score(i: int) -> tuple[bool, bool, int, int]:
            s = self.steps[i].contrast
            visible_cut = 2 <= s.plausible_count < shown
            return (s.changed and not s.forced, visible_cut, s.plausible_count if visible_cut else 0, -i)

        return max(range(len(self.steps)), key=score)
