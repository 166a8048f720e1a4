"""The contrastive view's what-if α (display-only): the cut and the choices re-derived from the recorded scores at
another α, nothing regenerated; its note counts where the choice would change. The amateur (kind, layer,
temperature) changes the scores themselves: the settings form runs again with it."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from playground.state.contrastive import STEPS, AlphaReplay, replay_alpha
from playground.ui.style import rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.contrastive.style import ContrastiveOwner
from playground.ui.views.drawing import TallEnough


class WhatIfAlpha(Panel):
    """The α box, its reset, and the note; ``replay`` is the recorded run re-derived at the box's α."""

    shows = frozenset({STEPS})

    def __init__(self, view: ContrastiveOwner, parent: QWidget) -> None:
        self.view = view
        self.replay: AlphaReplay | None = None
        self.note = rich_label(parent)
        self.alpha_box = QDoubleSpinBox(parent)
        self.alpha_box.setRange(0.0, 1.0)
        self.alpha_box.setDecimals(3)
        self.alpha_box.setSingleStep(0.01)
        self.alpha_box.setToolTip("Re-derive the cut and the choices from the recorded scores at another α "
                                  "(nothing is regenerated). The amateur (kind, layer, temperature) changes the "
                                  "scores themselves: set it in the settings and generate again.")
        self.alpha_box.valueChanged.connect(view.alpha_changed)
        self.alpha_reset = QPushButton("run's α", parent)
        self.alpha_reset.setToolTip("Back to the α the run used")
        self.alpha_reset.clicked.connect(lambda: self.alpha_box.setValue(view.state.alpha))
        self.widget = TallEnough()  # the α and its note: under the step panel, or (short) beside the strip
        controls = QHBoxLayout()
        label = QLabel("<b>What-if α</b>:", parent)
        label.setToolTip("The cut and the choices re-derived from the recorded scores at another α (nothing is "
                         "regenerated)")
        controls.addWidget(label)
        controls.addWidget(self.alpha_box)
        controls.addWidget(self.alpha_reset)
        controls.addStretch(1)
        layout = QVBoxLayout(self.widget)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(controls)
        layout.addWidget(self.note)

    @property
    def alpha(self) -> float:
        return self.alpha_box.value()

    def set_alpha(self, alpha: float) -> None:
        """Show ``alpha`` in the box without drawing (a new run's own α)."""
        self.alpha_box.blockSignals(True)
        self.alpha_box.setValue(alpha)
        self.alpha_box.blockSignals(False)

    def draw(self) -> None:
        state = self.view.state
        self.replay = replay_alpha(state, self.alpha) if state.steps else None
        self.note.setText(self._html())

    def _html(self) -> str:
        replay, state, short = self.replay, self.view.state, self.view.short
        if replay is None:
            return ""
        sampled = state.started is not None and state.started.do_sample
        pick = "the highest score" if sampled else "the choice"
        unknown = (f" · <b>{replay.unknown}</b> unknown (the cut lets in tokens the run did not record)"
                   if replay.unknown else "")
        differs = "" if sampled else f" · differs from the run's choice at <b>{replay.differences}</b>"
        caveat = ("First-order: a changed token would change every later step's context; the amateur's own "
                  "settings need a new run.")
        self.note.setToolTip(caveat if short else "")  # a short dock: the caveat on hover
        return (f"<i>What-if, nothing regenerated</i>: at α = {replay.alpha:g}, {pick} differs from the expert's top "
                f"token at <b>{replay.changes}</b> of {replay.known} steps{differs}{unknown}."
                + ("" if short else f" <i>{caveat}</i>"))
