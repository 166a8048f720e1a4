"""Qt-free: folds a quantization run's events into what the quantization view shows: the copy that was built, the
teacher-forced per-token comparison, and the run's summary (the panes themselves are ``PanesState``'s)."""

from __future__ import annotations

import numpy as np

from playground.events import Event
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable


class QuantState:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ready: QuantReady | None = None
        self.steps: list[QuantStep] = []
        self.summary: QuantSummary | None = None
        self.table: QuantTable | None = None

    def apply(self, event: Event) -> bool:
        if isinstance(event, QuantReady):
            self.ready = event
        elif isinstance(event, QuantStep):
            self.steps.append(event)
        elif isinstance(event, QuantSummary):
            self.summary = event
        elif isinstance(event, QuantTable):
            self.table = event
        else:
            return False
        return True

    @property
    def kl(self) -> np.ndarray:
        return np.asarray([s.kl for s in self.steps], dtype=float)

    @property
    def disagreements(self) -> list[int]:
        """Steps where the quantized model's top token is not the reference's."""
        return [s.step for s in self.steps if not s.top1_agrees]

    def running_agreement(self) -> float | None:
        return sum(s.top1_agrees for s in self.steps) / len(self.steps) if self.steps else None

    def layer_errors_by_layer(self) -> tuple[list[str], dict[str, np.ndarray]]:
        """Relative weight error of each projection kind (q_proj, ..., down_proj) per decoder layer.

        Returns the projection kinds and, per kind, an array over layers (NaN where a layer has none)."""
        if self.ready is None or not self.ready.layer_errors:
            return [], {}
        parsed: dict[str, dict[int, float]] = {}
        for error in self.ready.layer_errors:
            parts = error.name.split(".")
            layer = next((int(p) for p in parts if p.isdigit()), None)
            if layer is None:
                continue
            parsed.setdefault(parts[-1], {})[layer] = error.relative_error
        layers = 1 + max(max(v) for v in parsed.values()) if parsed else 0
        kinds = list(parsed)
        return kinds, {k: np.asarray([parsed[k].get(i, np.nan) for i in range(layers)]) for k in kinds}
