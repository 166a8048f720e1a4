"""Step mode's bar in the tokens view: the run waits for the user to pick the next token.

The chart shows the waiting step's candidates with the picked one marked; ↑/↓ (or ←/→) move through them, Enter
takes the marked one, Space the strategy's own choice, Esc stops the run; a double-click on a bar takes that token;
"Run on" takes the strategy's choice and lets the run go on by itself.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from playground.events import Candidate, TokenStep
from playground.state import visible_token_text


def choice_order(step: TokenStep) -> list[Candidate]:
    """The candidates in the chart's order (by raw rank)."""
    return sorted(step.candidates, key=lambda c: c.raw_rank)


class StepChoiceBar(QFrame):
    """Shown while a step waits; ``chosen`` the token taken (None: stop), ``run_on`` for Run on, ``moved`` the
    marked candidate's token id."""

    chosen = Signal(object)
    run_on = Signal()
    moved = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("StepChoiceBar { background: #FFF8E1; border: 1px solid #E0B000; }")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.label = QLabel(self)
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.take_button = QPushButton("Take", self)
        self.take_button.setToolTip("Take the marked token (Enter)")
        self.sampler_button = QPushButton("Sampler's", self)
        self.sampler_button.setToolTip("Take the strategy's own choice (Space)")
        self.run_on_button = QPushButton("Run on", self)
        self.run_on_button.setToolTip("Take the strategy's choice and let the run go on by itself")
        for button in (self.take_button, self.sampler_button, self.run_on_button):
            button.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the keys stay with the bar
        self.take_button.clicked.connect(self.take_marked)
        self.sampler_button.clicked.connect(self.take_samplers)
        self.run_on_button.clicked.connect(self._run_on)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 3, 6, 3)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.take_button)
        layout.addWidget(self.sampler_button)
        layout.addWidget(self.run_on_button)
        self.step: TokenStep | None = None
        self.order: list[Candidate] = []
        self.index = 0
        self.hide()

    @property
    def waiting(self) -> bool:
        return self.step is not None

    def ask(self, step: TokenStep) -> None:
        """A step waits: mark the strategy's choice, show the bar and take the keys."""
        self.step = step
        self.order = choice_order(step)
        ids = [c.token_id for c in self.order]
        self.index = ids.index(step.token_id) if step.token_id in ids else 0
        self.show()
        self.setFocus(Qt.FocusReason.OtherFocusReason)
        self._show()

    def marked(self) -> Candidate | None:
        return self.order[self.index] if self.step is not None and self.order else None

    def _show(self) -> None:
        step, marked = self.step, self.marked()
        if step is None or marked is None:
            return
        own = next((c for c in self.order if c.token_id == step.token_id), None)
        own_text = visible_token_text(own.text) if own is not None else str(step.token_id)
        self.label.setText(f"Step {step.step}: you are the sampler. Marked: '{visible_token_text(marked.text)}' "
                           f"(raw rank {marked.raw_rank}). ↑/↓ move, Enter takes it, Space takes the sampler's "
                           f"'{own_text}', Esc stops; double-click a bar to take it.")
        self.moved.emit(marked.token_id)

    def move(self, delta: int) -> None:  # type: ignore[override]  # the mark by delta bars; hides QWidget.move
        if self.step is None or not self.order:
            return
        self.index = max(0, min(len(self.order) - 1, self.index + delta))
        self._show()

    def _answer(self, token_id: int | None) -> None:
        self.step = None
        self.hide()
        self.chosen.emit(token_id)

    def take_marked(self) -> None:
        marked = self.marked()
        if marked is not None:
            self._answer(marked.token_id)

    def take_samplers(self) -> None:
        if self.step is not None:
            self._answer(self.step.token_id)

    def take(self, token_id: int) -> None:
        """The mouse's pick (a double-click on a bar)."""
        if self.step is not None:
            self._answer(token_id)

    def stop(self) -> None:
        if self.step is not None:
            self._answer(None)

    def _run_on(self) -> None:
        if self.step is not None:
            self.run_on.emit()
            self._answer(self.step.token_id)

    def cancel(self) -> None:
        """The run ended (Stop, a new run): nothing waits any more."""
        self.step = None
        self.hide()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key = event.key()
        if self.step is None:
            super().keyPressEvent(event)
        elif key in (Qt.Key.Key_Up, Qt.Key.Key_Left):
            self.move(-1)
        elif key in (Qt.Key.Key_Down, Qt.Key.Key_Right):
            self.move(1)
        elif key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.take_marked()
        elif key == Qt.Key.Key_Space:
            self.take_samplers()
        elif key == Qt.Key.Key_Escape:
            self.stop()
        else:
            super().keyPressEvent(event)
