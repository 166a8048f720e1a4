"""The beam tree view: beam search's tree growing step by step (the drawing lives in ``panel`` and ``items``)."""

from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout, QWidget

from playground.events import BeamStep, Event
from playground.state import Run
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.beam_tree.panel import BeamTreePanel


@register_view
class BeamTreeView(View):
    name = "beam"
    title = "Beam tree"
    consumes = (BeamStep,)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.panel = BeamTreePanel(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.panel)

    def reset(self) -> None:
        self.panel.reset()

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            self.panel.apply(event)  # the tree draws itself at most once per frame

    def flush(self) -> None:
        self.panel.flush()

    def end(self, run: Run) -> None:
        if run.finished is None:
            self.panel.end(run.status)
