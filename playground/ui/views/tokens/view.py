"""The tokens view: the streamed output shaded by probability beside the candidates bar chart of one step."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from playground.events import Event, RunStarted, TokenNumbers, TokenStep
from playground.state import Run, character_piece, most_interesting_step
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.tokens.candidates import CandidatesPanel
from playground.ui.views.tokens.step_choice import StepChoiceBar
from playground.ui.views.tokens.text import TokenView
from playground.ui.views.tokens.tooltip import token_tooltip_html

# While a run streams, the chart redraws at most this often: its repaint costs more than a token view update,
# and on a 2-core CPU every GUI millisecond is taken from the model's threads.
LIVE_CHART_MS = 200
CSV_COLUMNS = ("step", "token_id", "token", "raw_prob", "processed_prob", "logprob", "raw_rank", "entropy_bits",
               "processed_entropy_bits", "forced")


def token_numbers(run: Run) -> TokenNumbers:
    """What a run's start events say its numbers are: the last that says (a server's follows the run's own)."""
    said = [e.token_numbers for e in run.events[:4] if hasattr(e, "token_numbers")]
    return said[-1] if said else TokenNumbers()


@register_view
class TokensView(View):
    name = "tokens"
    title = "Tokens"
    consumes = (TokenStep,)
    data_formats = ("csv",)
    # Step mode: the user's pick for the waiting step (a token id, None = stop), and Run on.
    choice_made = Signal(object)
    run_on_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run: Run | None = None
        self.token_view = TokenView()
        self.chart = CandidatesPanel()
        self.step_bar = StepChoiceBar()
        self.chart_index: int | None = None  # step shown in the chart
        self.follow_live = True  # the chart follows the newest step until the user picks one
        self._new_steps: list[TokenStep] = []
        self._live_chart_timer = QTimer(self)
        self._live_chart_timer.setSingleShot(True)
        self._live_chart_timer.setInterval(LIVE_CHART_MS)
        self._live_chart_timer.timeout.connect(self._show_pending_live_step)
        self._live_chart_pending = False

        output = QWidget()
        output_layout = QVBoxLayout(output)
        output_layout.setContentsMargins(0, 0, 0, 0)
        output_layout.addWidget(QLabel("<b>Output</b> (grey: the prompt as the model sees it)"))
        output_layout.addWidget(self.token_view, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(output)
        split.addWidget(self.chart)
        split.setStretchFactor(0, 5)
        split.setStretchFactor(1, 4)
        split.setSizes([600, 520])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.step_bar)
        layout.addWidget(split)

        self.token_view.text.step_clicked.connect(lambda i: self.show_chart_step(i, follow=False))
        self.token_view.text.step_key.connect(self.step_chart)
        self.token_view.text.branch_requested.connect(self.branch_requested)
        self.chart.branch_requested.connect(self._chart_pick)
        self.step_bar.moved.connect(self._show_waiting)
        self.step_bar.chosen.connect(self._chosen)
        self.step_bar.run_on.connect(self.run_on_requested)

    # --- the view interface ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self.step_bar.cancel()
        self.run = None
        self._new_steps.clear()
        self.chart_index = None
        self.follow_live = True
        self.token_view.reset()
        self.chart.reset()

    def show_run(self, run: Run) -> None:
        self.reset()
        self.run = run
        self._show_numbers(token_numbers(run))
        self.token_view.show_run(run)
        self.follow_live = run.running
        target = len(run.steps) - 1 if run.running else most_interesting_step(run.steps)
        if target is not None and target >= 0:
            self.show_chart_step(target, follow=run.running)

    def apply(self, run: Run, events: list[Event]) -> None:
        self.run = run
        for event in events:
            if isinstance(event, RunStarted):
                self.token_view.reset(event.prompt_text)
            if isinstance(event, TokenStep):
                self._new_steps.append(event)
            elif hasattr(event, "token_numbers"):  # a start event: which distribution the numbers are
                self._show_numbers(event.token_numbers)

    def flush(self) -> None:
        if not self._new_steps:
            return
        self.token_view.append_steps(self._new_steps)
        self._new_steps = []
        if self.follow_live:
            self._show_live_step()

    def end(self, run: Run) -> None:
        self.step_bar.cancel()
        self.flush()
        if self.follow_live and run.steps:
            # Done: show the most telling step rather than the trailing EOS.
            target = most_interesting_step(run.steps)
            if target is not None:
                self.show_chart_step(target, follow=False)

    def _show_numbers(self, numbers: TokenNumbers) -> None:
        """A server's run says which distribution its numbers are (one number per token); a local run has two."""
        self.token_view.set_remote(numbers.distribution, numbers.note)
        self.chart.set_remote(numbers.distribution, numbers.note)

    # --- step mode ------------------------------------------------------------------------------------------
    def ask_choice(self, step: TokenStep) -> None:
        """The run waits for the user to pick step ``step.step``'s token (``step``: as the strategy would record
        it with its own choice): the chart shows its candidates, the bar takes the keys."""
        self.flush()
        self.follow_live = False
        self.step_bar.ask(step)

    def _show_waiting(self, token_id: int) -> None:
        step = self.step_bar.step
        if step is None:
            return
        total = (len(self.run.steps) if self.run is not None else step.step) + 1
        self.chart.show_step(dataclasses.replace(step, token_id=token_id), total, None)
        self.chart_index = None
        self.token_view.text.mark_step(None)

    def _chart_pick(self, step: int, token_id: int) -> None:
        waiting = self.step_bar.step
        if waiting is not None and step == waiting.step:
            self.step_bar.take(token_id)
        else:
            self.branch_requested.emit(step, token_id)

    def _chosen(self, token_id: object) -> None:
        self.follow_live = True
        self.choice_made.emit(token_id)

    # --- the chart ------------------------------------------------------------------------------------------
    def show_chart_step(self, index: int, follow: bool = False) -> None:
        run = self.run
        if run is None or not 0 <= index < len(run.steps):
            return
        self.follow_live = follow
        self.chart_index = index
        piece = character_piece(run.steps, index)
        self.chart.show_step(run.steps[index], len(run.steps), piece[1] if piece else None)
        self.token_view.text.mark_step(index)

    def _show_live_step(self) -> None:
        if self._live_chart_timer.isActive():
            self._live_chart_pending = True
            return
        if self.run is not None and self.run.steps:
            self.show_chart_step(len(self.run.steps) - 1, follow=True)
        self._live_chart_pending = False
        self._live_chart_timer.start()

    def _show_pending_live_step(self) -> None:
        if self._live_chart_pending and self.follow_live:
            self._show_live_step()

    def step_chart(self, delta: int) -> None:
        run = self.run
        if run is None or not run.steps:
            return
        current = self.chart_index if self.chart_index is not None else len(run.steps) - 1
        self.show_chart_step(max(0, min(len(run.steps) - 1, current + delta)), follow=False)

    # --- pictures and data ----------------------------------------------------------------------------------
    def export_data(self, path: Path) -> None:
        """Every step of the shown run as CSV: the chosen token and the numbers behind its shade."""
        steps = self.run.steps if self.run is not None else []
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(CSV_COLUMNS)
            for s in steps:
                writer.writerow([s.step, s.token_id, s.text, repr(s.raw_prob), repr(s.prob), repr(s.logprob),
                                 s.raw_rank, repr(s.entropy), repr(s.processed_entropy), int(s.forced)])

    def paint_overlay(self, pixmap: QPixmap, origin: QWidget) -> None:
        """The tooltip a user sees hovering the charted token (tooltips are windows a grab would miss)."""
        run, index = self.run, self.chart_index
        if run is None or index is None or not 0 <= index < len(run.steps):
            return
        view = self.token_view.text
        rect = view.step_rect(index)
        tip = QLabel(token_tooltip_html(run.steps[index], piece=character_piece(run.steps, index)))
        tip.setStyleSheet("QLabel { background: #FFFFE8; color: #000; border: 1px solid #777; padding: 5px; }")
        tip.adjustSize()
        anchor = view.viewport().mapTo(origin, rect.bottomLeft() + QPoint(12, 6))
        # Keep it over the output, clear of the chart.
        right = view.viewport().mapTo(origin, view.viewport().rect().topRight()).x()
        x = max(0, min(anchor.x(), right - tip.width() - 4))
        y = anchor.y() if anchor.y() + tip.height() < pixmap.height() else max(
            0, anchor.y() - rect.height() - 12 - tip.height())
        painter = QPainter(pixmap)
        tip.render(painter, QPoint(x, y))
        painter.end()
