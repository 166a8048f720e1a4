"""The toy view: one label with the fold's text."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout

from playground.ui.views import register_view
from playground.ui.views.base import View
from toy_capability import ToyStep
from toy_capability.fold import ToyFold


@register_view
class ToyView(View):
    name, title, consumes = "toy", "Toy echo", (ToyStep,)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.label = QLabel("no toy run yet")
        QVBoxLayout(self).addWidget(self.label)
        self.fold = ToyFold()

    def reset(self) -> None:
        self.fold = ToyFold()
        self.label.setText("no toy run yet")

    def apply(self, run, events) -> None:
        self.fold.apply(events)

    def flush(self) -> None:
        self.label.setText(self.fold.text())

    def end(self, run) -> None:
        self.flush()
