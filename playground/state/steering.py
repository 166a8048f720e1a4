"""Qt-free: folds a steered run's events (``--steer``) into what the steering view shows.

Per kept token: the strengths its pass used (and whether the live slider changed them since the previous token),
the residual's projection onto each vector's unit direction at every steered block (the representation reading),
and, when the run recorded the unsteered pass (``--steer-compare``), the chosen token's steered and unsteered
probability and the KL between the two distributions. The token's text comes with its own ``token`` event, which
follows its ``steer`` event (same ``step``).

For the heat map the projections grow as a blocks × tokens matrix per vector by whole columns with capacity
doubling, so folding a token costs time proportional to its blocks. ``relative_strength`` is a strength shown
against the block's residual: strength × ‖direction‖ / median ‖h‖ over the prompt's positions after the first (a
PCA direction is unit-norm, a mean difference is not, so the bare strength of two vectors says little about how
hard each pushes; position 0, the attention sink, has a norm many times the others' and is left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from playground.events import Event, TokenStep
from playground.events.steering import SteeringNorms, SteeringStarted, SteerStep
from playground.state.columns import GrowingColumns
from playground.state.fold import STATUS, Fold

STEPS = "steps"  # a part: the per-token figures (the probabilities, the KL, the strength marks, the text)
MAP = "map"  # a part: the projection heat map


@dataclass
class SteeredToken:
    """One kept token: its ``steer`` event, and its text and id once its ``token`` event comes."""

    steer: SteerStep
    text: str | None = None
    token_id: int | None = None

    @property
    def step(self) -> int:
        return self.steer.step


@dataclass(frozen=True)
class StrengthChange:
    """Where the live strength changed: the first token whose pass used the new strengths."""

    token: int  # index into ``SteeringState.tokens``
    before: tuple[float, ...]
    after: tuple[float, ...]



def format_strengths(strengths: tuple[float, ...]) -> str:
    return " + ".join(f"{s:+g}" for s in strengths) if strengths else "—"


class SteeringState(Fold):
    """The steering record of one run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({STEPS, MAP})
    start_event = SteeringStarted
    started: SteeringStarted | None

    def _clear(self) -> None:
        self.norms: SteeringNorms | None = None
        self.tokens: list[SteeredToken] = []
        self.changes: list[StrengthChange] = []
        self._maps: list[GrowingColumns] = []  # per vector: blocks × tokens projections (NaN: no direction there)
        self._waiting: dict[int, int] = {}  # step -> index into tokens, until its token event comes

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, SteeringStarted):
            self._maps = [GrowingColumns(len(event.layers)) for _ in event.vectors]
            return {STEPS, MAP}
        if isinstance(event, SteeringNorms):
            self.norms = event
            return {STEPS}
        if isinstance(event, SteerStep):
            self._add(event)
            return {STEPS, MAP, STATUS}
        if isinstance(event, TokenStep):
            index = self._waiting.pop(event.step, None)
            if index is None:
                return None
            token = self.tokens[index]
            token.text, token.token_id = event.text, event.token_id
            return {STEPS, MAP}
        return None

    def _add(self, step: SteerStep) -> None:
        if not self._maps:  # a view fed without the start event still draws
            self._maps = [GrowingColumns(len(row)) for row in step.projections]
        if self.tokens:
            before = self.tokens[-1].steer.strengths
            if step.changed or before != step.strengths:
                self.changes.append(StrengthChange(len(self.tokens), before, step.strengths))
        self._waiting[step.step] = len(self.tokens)
        self.tokens.append(SteeredToken(step))
        for columns, row in zip(self._maps, step.projections, strict=False):
            columns.append([np.nan if v is None else float(v) for v in row])

    # --- reading --------------------------------------------------------------------------------------------
    @property
    def layers(self) -> tuple[int, ...]:
        """The steered blocks N (0-based, as the vector files number them), ascending."""
        return self.started.layers if self.started is not None else ()

    @property
    def compared(self) -> bool:
        """Whether the run recorded the unsteered pass (``--steer-compare``)."""
        if self.started is not None:
            return self.started.compare
        return any(t.steer.kl is not None for t in self.tokens)

    def projection_map(self, vector: int = 0) -> np.ndarray:
        """Blocks × tokens projections of the residual onto vector ``vector``'s unit direction (a copy)."""
        if vector >= len(self._maps):
            return np.zeros((len(self.layers), 0))
        return self._maps[vector].view.copy()

    def residual_norm(self, layer: int) -> float | None:
        """Block ``layer``'s median residual norm over the prompt but its first position (None: not recorded)."""
        if self.norms is None or layer not in self.norms.layers:
            return None
        return self.norms.residual_norms[self.norms.layers.index(layer)]

    def relative_strength(self, strength: float, vector: int, layer: int) -> float | None:
        """``strength`` × ‖direction at ``layer``‖ / median ‖h_layer‖: how large the added vector is against the
        residual it is added to (None where the vector has no direction there or the norm is not known)."""
        if self.started is None or vector >= len(self.started.vectors):
            return None
        info = self.started.vectors[vector]
        norm = self.residual_norm(layer)
        if layer not in info.layers or not norm:
            return None
        return abs(strength) * info.norms[info.layers.index(layer)] / norm

    def relative_range(self, strength: float, vector: int = 0) -> tuple[float, float] | None:
        """The smallest and largest ``relative_strength`` over vector ``vector``'s blocks."""
        values = [r for layer in self.layers if (r := self.relative_strength(strength, vector, layer)) is not None]
        return (min(values), max(values)) if values else None

    def current_strengths(self) -> tuple[float, ...]:
        if self.tokens:
            return self.tokens[-1].steer.strengths
        return tuple(v.strength for v in self.started.vectors) if self.started is not None else ()

    def mean_kl(self) -> float | None:
        values = [t.steer.kl for t in self.tokens if t.steer.kl is not None]
        return sum(values) / len(values) if values else None

    def unsteered_perplexity(self) -> float | None:
        """exp(−mean log p_unsteered(chosen token)): how likely the unsteered model finds the steered text."""
        logs = [math.log(max(t.steer.unsteered_prob, 1e-300)) for t in self.tokens
                if t.steer.unsteered_prob is not None]
        return math.exp(-sum(logs) / len(logs)) if logs else None

    def change_at(self, token: int) -> StrengthChange | None:
        for change in self.changes:
            if change.token == token:
                return change
        return None
