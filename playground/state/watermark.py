"""The watermark view's fold: each generated token with its watermark record (``WatermarkStep``) and text."""

from __future__ import annotations

import math
from dataclasses import dataclass

from playground.events import Event, TokenStep
from playground.events.watermark import WatermarkStarted, WatermarkStep
from playground.state.fold import Fold

TOKENS = "tokens"


@dataclass
class MarkedToken:
    mark: WatermarkStep
    text: str | None = None


class WatermarkState(Fold):
    parts = frozenset({TOKENS})
    start_event = WatermarkStarted

    def _clear(self) -> None:
        self.tokens: list[MarkedToken] = []
        self._by_step: dict[int, MarkedToken] = {}

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, WatermarkStep):
            token = MarkedToken(event)
            self.tokens.append(token)
            self._by_step[event.step] = token
            return {TOKENS}
        if isinstance(event, TokenStep):
            held = self._by_step.get(event.step)
            if held is not None:
                held.text = event.text
                return {TOKENS}
        return None

    @property
    def scheme(self) -> str:
        return self.started.scheme if isinstance(self.started, WatermarkStarted) else ""

    @property
    def threshold(self) -> float:
        return self.started.threshold if isinstance(self.started, WatermarkStarted) else 4.0

    @property
    def last(self) -> WatermarkStep | None:
        return self.tokens[-1].mark if self.tokens else None

    def mean_kl(self) -> float | None:
        kls = [t.mark.kl for t in self.tokens if t.mark.kl is not None]
        return sum(kls) / len(kls) if kls else None

    def split_by_entropy(self, bits: float) -> tuple[tuple[int, float], tuple[int, float]]:
        """(count, mean colour) of the scored tokens below ``bits`` of entropy and at or above it: the low-entropy
        tokens carry little of the signal."""
        low = [t.mark.colour for t in self.tokens if t.mark.scored and t.mark.entropy is not None
               and t.mark.entropy < bits]
        high = [t.mark.colour for t in self.tokens if t.mark.scored and t.mark.entropy is not None
                and t.mark.entropy >= bits]

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else math.nan

        return (len(low), mean(low)), (len(high), mean(high))
