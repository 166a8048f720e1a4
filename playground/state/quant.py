"""Qt-free: folds a quantization run's events into what the quantization view shows: the copy that was built, the
teacher-forced per-token comparison, and the run's summary (the panes themselves are ``PanesState``'s)."""

from __future__ import annotations

import numpy as np

from playground.events import Event
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable
from playground.state.fold import STATUS, Fold

QUANT = "quant"  # a part: the copy, the per-token comparison, the summary and the table


class QuantState(Fold):
    parts = frozenset({QUANT})

    def _clear(self) -> None:
        self.ready: QuantReady | None = None
        self.steps: list[QuantStep] = []
        self.summary: QuantSummary | None = None
        self.table: QuantTable | None = None

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, QuantReady):
            self.ready = event
        elif isinstance(event, QuantStep):
            self.steps.append(event)
        elif isinstance(event, QuantSummary):
            self.summary = event
        elif isinstance(event, QuantTable):
            self.table = event
        else:
            return None
        return {QUANT, STATUS}

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
        """Relative weight error of each projection kind per decoder layer.

        Errors are named ``layers.<i>.<path under the layer>`` for any family; a kind is that path shortened to its
        last part ("q_proj", Phi-3's "qkv_proj", NeoX's "dense") unless another kind shares the last part (GPT-2's
        "attn.c_proj" and "mlp.c_proj" stay apart). Returns the kinds in the order they first appear (a layer's
        forward order) and, per kind, an array over layers (NaN where a layer has none)."""
        if self.ready is None or not self.ready.layer_errors:
            return [], {}
        parsed: dict[str, dict[int, float]] = {}
        for error in self.ready.layer_errors:
            parts = error.name.split(".")
            at = next((k for k, p in enumerate(parts) if p.isdigit()), None)
            if at is None or at + 1 >= len(parts):
                continue
            parsed.setdefault(".".join(parts[at + 1:]), {})[int(parts[at])] = error.relative_error
        if not parsed:
            return [], {}
        last = [path.rpartition(".")[2] for path in parsed]
        kinds = {path: name if last.count(name) == 1 else path for path, name in zip(parsed, last, strict=True)}
        layers = 1 + max(max(v) for v in parsed.values())
        return list(kinds.values()), {kinds[path]: np.asarray([by_layer.get(i, np.nan) for i in range(layers)])
                                      for path, by_layer in parsed.items()}
