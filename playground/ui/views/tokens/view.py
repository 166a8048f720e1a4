"""The tokens view: the streamed output shaded by probability beside the candidates bar chart of one step."""

from __future__ import annotations

import csv
import dataclasses
import html
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from playground.events import Event, Rollback, RunStarted, TokenNumbers, TokenStep
from playground.state import Run, character_piece, most_interesting_step
from playground.state.grammar import constraint_kind, summarise
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.tokens.candidates import CandidatesPanel, HeldExtents
from playground.ui.views.tokens.constraint import ConstraintStrip, start_unconstrained, step_figures
from playground.ui.views.tokens.step_choice import StepChoiceBar
from playground.ui.views.tokens.text import TokenView
from playground.ui.views.tokens.tooltip import token_tooltip_html
from playground.ui.views.tokens.what_if import (
    DEBOUNCE_MS,
    WHAT_IF_COLOR,
    WHAT_IF_LABEL,
    WhatIfState,
    WhatIfStrip,
    start_branch,
    step_under,
    what_if_header,
)

# While a run streams, the chart follows the newest step at most this often: one update of it (bars, token labels,
# header, repaint) costs the GUI thread ~6-10 ms here, several token-view updates' worth, and on a 2-core CPU every
# GUI millisecond is taken from the model's threads (benchmarks/bench_window.py). At 200 ms the chart alone was
# about half the GUI thread's work during a greedy stream; 2.5 updates a second still follow it, every token is
# still drawn in the text as it comes, and when the run ends the chart shows the step it always showed.
LIVE_CHART_MS = 400
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
    picks_tokens = True
    choice_made = Signal(object)
    run_on_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run: Run | None = None
        self.token_view = TokenView()
        self.chart = CandidatesPanel()
        self._extents = HeldExtents()  # the chart's axis at each step of the shown run
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
        self.constraint_strip = ConstraintStrip()  # a constrained run's steps (hidden without one)
        self.constraint_strip.setVisible(False)
        self.constraint_strip.step_clicked.connect(lambda i: self.show_chart_step(i, follow=False))
        output_layout.addWidget(self.constraint_strip)
        output_layout.addWidget(self.token_view, 1)
        output_layout.addLayout(self._build_what_if())
        output_layout.addWidget(self.strip)
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
        self.token_view.text.unconstrained_requested.connect(self.continue_unconstrained)
        self.token_view.constraint_bar.unconstrained.connect(lambda: self.continue_unconstrained(self.chart_index))
        self.chart.branch_requested.connect(self._chart_pick)
        self.chart.why_requested.connect(self.why_requested)
        self.step_bar.moved.connect(self._show_waiting)
        self.step_bar.chosen.connect(self._chosen)
        self.step_bar.run_on.connect(self.run_on_requested)

    # --- what-if (views/tokens/what_if.py) --------------------------------------------------------------------
    def _build_what_if(self) -> QHBoxLayout:
        self.what_if_switch = QCheckBox("What-if")
        self.what_if_switch.setToolTip(
            "Re-derive every step of this finished run with the settings form's sampler values and order, from the "
            "raw candidates the run recorded: display only (nothing is decoded again). Change a setting or the "
            "order and the chart, the tooltips, the output's marks and the strip below follow at once.")
        self.what_if_note = QLabel()
        self.what_if_note.setTextFormat(Qt.TextFormat.RichText)
        self.what_if_note.setMinimumWidth(40)
        self.what_if_note.setWordWrap(True)
        self.continue_button = QPushButton("Continue from here with these settings")
        self.continue_button.setToolTip("Branch from the charted step: the run's tokens before it are forced, the "
                                        "form's sampler settings decide from it on (a new run in the runs list)")
        self.continue_button.setVisible(False)
        self.strip = WhatIfStrip()
        self.strip.setVisible(False)
        self.what_if_state: WhatIfState | None = None
        self.form: Any = None  # the window's settings form (``RunControls``), found when the switch goes on
        self.what_if_ms: dict[str, float] = {}  # what the last re-derivation cost: "derive", "draw"
        self._what_if_timer = QTimer(self)
        self._what_if_timer.setSingleShot(True)
        self._what_if_timer.setInterval(DEBOUNCE_MS)
        self._what_if_timer.timeout.connect(self.refresh_what_if)
        self.what_if_switch.toggled.connect(self._what_if_toggled)
        self.continue_button.clicked.connect(self.continue_with_what_if)
        self.strip.step_clicked.connect(lambda i: self.show_chart_step(i, follow=False))
        row = QHBoxLayout()
        row.addWidget(self.what_if_switch)
        row.addWidget(self.continue_button)
        row.addWidget(self.what_if_note, 1)
        return row

    @property
    def what_if(self):
        """The shown re-derivation (``state.what_if.WhatIf``), None while the switch is off or it has none."""
        state = self.what_if_state
        return state.what_if if state is not None and self.what_if_switch.isChecked() else None

    def _find_form(self) -> Any:
        if self.form is None:
            form = getattr(self.window(), "controls", None)
            if form is not None and hasattr(form, "settings_changed"):
                self.form = form
                form.settings_changed.connect(self._what_if_changed)
        return self.form

    def _what_if_changed(self) -> None:
        if self.what_if_switch.isChecked():
            self._what_if_timer.start()  # a burst of edits costs one re-derivation

    def _what_if_toggled(self, on: bool) -> None:
        self._what_if_timer.stop()
        self.strip.setVisible(on)
        self.continue_button.setVisible(on)
        self.token_view.set_what_if(on)
        if on:
            self._find_form()
            self.refresh_what_if()
        else:
            self._clear_what_if()

    def _clear_what_if(self, note: str = "") -> None:
        """The run's own numbers again: chart, tooltips and text exactly as without a what-if."""
        if self.what_if_state is not None:
            self.what_if_state.what_if = None
        self.chart.set_what_if(None)
        self.token_view.text.tooltip_source = None
        self.token_view.text.set_cut_steps([])
        self.strip.clear()
        self.continue_button.setEnabled(False)
        self.what_if_note.setText(note)
        self._redraw_chart()

    def what_if_settings(self) -> Any:
        form = self._find_form()
        if form is None:
            return None
        prompt = self.run.settings.prompt if self.run is not None else ""
        return form.run_settings(prompt)

    def _encode(self) -> Any:
        """A word's token ids for a logit bias on words (the loaded model's tokenizer), if there is one."""
        source = getattr(self.window(), "source", None)
        tokenizer = source.tokenizer() if source is not None and hasattr(source, "tokenizer") else None
        if tokenizer is None:
            return None
        return lambda word: tokenizer.encode(word, add_special_tokens=False)

    def refresh_what_if(self) -> None:
        """Re-derive the shown run under the form's settings and draw it (the switch on), now."""
        self._what_if_timer.stop()
        if not self.what_if_switch.isChecked():
            return
        run = self.run
        if run is None or run.running or not run.steps or not run.steps[0].two_distributions:
            self._clear_what_if("what-if: for a finished greedy or sample run of a local model")
            return
        settings = self.what_if_settings()
        if settings is None:
            self._clear_what_if("what-if: needs the window's settings form")
            return
        start = time.perf_counter()
        state = self.what_if_state
        if state is None or not state.matches(run):
            state = self.what_if_state = WhatIfState(run)
        derived = state.derive(settings, self._encode())
        derived_at = time.perf_counter()
        self.strip.set_marks(state.marks(), derived.exact, state.step_tip)
        self.token_view.text.set_cut_steps([int(i) for i in derived.chosen_cut.nonzero()[0]])
        self.token_view.text.tooltip_source = self._what_if_tooltip
        self.continue_button.setEnabled(self.chart_index is not None)
        self._redraw_chart()
        done = time.perf_counter()
        self.what_if_ms = {"derive": (derived_at - start) * 1000, "draw": (done - derived_at) * 1000}
        n = len(run.steps)
        changed = "; ".join(state.diff) if state.diff else "the run's own settings"
        cost = self.what_if_ms["derive"] + self.what_if_ms["draw"]
        self.what_if_note.setToolTip(
            f"{WHAT_IF_LABEL}: {changed}. The strip below: per step (left to right), greedy's pick under these "
            "settings is not the run's token · the run's token would be cut · the kept set differs from the run's; "
            f"grey hatching: an estimate (hover for why). {len(self.strip.inexact)} of {n} steps are estimates; "
            f"re-derived and drawn in {cost:.1f} ms.")
        self.what_if_note.setText(f"<span style='color:{WHAT_IF_COLOR}'><b>{WHAT_IF_LABEL}</b></span> · "
                                  f"{len(self.strip.inexact)}/{n} estimates · {cost:.0f} ms")

    def _what_if_step(self, index: int) -> TokenStep | None:
        state, derived = self.what_if_state, self.what_if
        if derived is None or state is None or self.run is None or not 0 <= index < len(state.steps):
            return None
        return step_under(self.run.steps[index], derived, index)

    def _what_if_line(self, index: int, separator: str = " · ") -> str:
        state, derived = self.what_if_state, self.what_if
        assert state is not None and derived is not None
        cut = None
        if derived.chosen_cut[index]:
            column = int((derived.ids[index] == derived.chosen[index]).nonzero()[0][0])
            cut = derived.cut_name(index, column)
        return what_if_header(state.diff, bool(derived.exact[index]), derived.reasons[index], cut,
                              float(derived.chosen_prob[index]), separator)

    def _what_if_tooltip(self, index: int) -> str:
        run = self.run
        step = self._what_if_step(index)
        if step is None or run is None:
            return token_tooltip_html(run.steps[index], piece=character_piece(run.steps, index)) if run else ""
        return token_tooltip_html(step, piece=character_piece(run.steps, index),
                                  what_if=self._what_if_line(index, "<br>"),
                                  **self.token_view.text.constraint_notes(index))

    def _redraw_chart(self) -> None:
        if self.chart_index is not None and self.run is not None:
            self.show_chart_step(self.chart_index, follow=self.follow_live)

    def continue_with_what_if(self) -> None:
        """Branch from the charted step with the form's settings (a child run in the runs list)."""
        run, index, settings = self.run, self.chart_index, self.what_if_settings()
        if run is None or index is None or settings is None:
            return
        why = start_branch(self.window(), run, index, settings)
        banner = getattr(self.window(), "banner", None)
        if why is not None and banner is not None:
            banner.show_error(why)

    # --- the constraint (views/tokens/constraint.py) ----------------------------------------------------------
    def _show_constraint(self) -> None:
        """The strip, the summary and the reason words for the shown run's constrained steps (hidden without)."""
        run = self.run
        steps = self.token_view.steps
        kind = constraint_kind(run.settings) if run is not None else None
        summary = summarise(steps) if kind is not None else None  # a server's constrained run records none
        kind = kind if summary is not None else None
        self.token_view.set_constraint(kind)
        self.chart.set_constraint(kind)
        self.token_view.constraint_bar.show_summary(summary, kind)
        self.token_view.constraint_bar.button.setEnabled(self.chart_index is not None)
        self.constraint_strip.setVisible(summary is not None)
        if summary is None:
            self.constraint_strip.clear()
        else:
            self.constraint_strip.set_steps(steps, self._constraint_tip)
        self.constraint_strip.select(self.chart_index)

    def _constraint_tip(self, index: int) -> str:
        steps = self.token_view.steps
        if not 0 <= index < len(steps):
            return ""
        tip = step_figures(steps[index])
        path = self.token_view.text.constraint_notes(index).get("json_path")
        if path is not None:
            tip += f"<br>JSON path being written: <code>{html.escape(path)}</code>"
        return tip + "<br><i>click to chart this step; right-click its token to continue without the constraint</i>"

    def continue_unconstrained(self, step: int | None) -> None:
        """Branch from ``step`` with the run's settings minus its constraint (a child run in the runs list)."""
        run = self.run
        if run is None or step is None:
            return
        why = start_unconstrained(self.window(), run, step)
        banner = getattr(self.window(), "banner", None)
        if why is not None and banner is not None:
            banner.show_error(why)

    # --- the view interface ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self.step_bar.cancel()
        self.run = None
        self._new_steps.clear()
        self.chart_index = None
        self.follow_live = True
        self.token_view.reset()
        self.chart.reset()
        self._extents = HeldExtents()
        self.what_if_state = None
        self.chart.set_what_if(None)
        self.token_view.text.tooltip_source = None
        self.strip.clear()
        self._show_constraint()

    def show_run(self, run: Run) -> None:
        self.reset()
        self.run = run
        self._show_numbers(token_numbers(run))
        self.token_view.show_run(run)
        self._show_constraint()
        self.follow_live = run.running
        target = len(run.steps) - 1 if run.running else most_interesting_step(run.steps)
        if target is not None and target >= 0:
            self.show_chart_step(target, follow=run.running)
        if self.what_if_switch.isChecked():
            self.refresh_what_if()

    def apply(self, run: Run, events: list[Event]) -> None:
        self.run = run
        for event in events:
            if isinstance(event, RunStarted):
                self.token_view.reset(event.prompt_text)
            if isinstance(event, TokenStep):
                self._new_steps.append(event)
            elif isinstance(event, Rollback):  # a phrase ban undid the steps from its position on
                self._draw_new_steps()
                self.token_view.undo_steps(event)
                self._show_constraint()
            elif hasattr(event, "token_numbers"):  # a start event: which distribution the numbers are
                self._show_numbers(event.token_numbers)

    def flush(self) -> None:
        if not self.behind:  # behind another view's tab (a lens run shows the layers first): drawn in catch_up
            self._draw_new_steps()

    def catch_up(self) -> None:
        self._draw_new_steps()

    def _draw_new_steps(self) -> None:
        if not self._new_steps:
            return
        self.token_view.append_steps(self._new_steps)
        self._new_steps = []
        self._show_constraint()
        if self.follow_live:
            self._show_live_step()

    def end(self, run: Run) -> None:
        self.step_bar.cancel()
        self._draw_new_steps()
        if self.follow_live and run.steps:
            # Done: show the most telling step rather than the trailing EOS.
            target = most_interesting_step(run.steps)
            if target is not None:
                self.show_chart_step(target, follow=False)
        if self.what_if_switch.isChecked():
            self.refresh_what_if()

    def _show_numbers(self, numbers: TokenNumbers) -> None:
        """A server's run says which distribution its numbers are (one number per token); a local run has two."""
        self.token_view.set_remote(numbers.distribution, numbers.note)
        self.chart.set_remote(numbers.distribution, numbers.note)

    # --- step mode ------------------------------------------------------------------------------------------
    def ask_choice(self, step: TokenStep) -> None:
        """The run waits for the user to pick step ``step.step``'s token (``step``: as the strategy would record
        it with its own choice): the chart shows its candidates, the bar takes the keys."""
        self._draw_new_steps()
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
        what_if_step = self._what_if_step(index)
        self.chart.set_what_if(self._what_if_line(index) if what_if_step is not None else None)
        self.chart.show_step(what_if_step or run.steps[index], len(run.steps), piece[1] if piece else None,
                             extent=self._extents.up_to(run.steps, index))
        self.token_view.text.mark_step(index)
        self.strip.select(index)
        self.constraint_strip.select(index)
        self.token_view.constraint_bar.button.setEnabled(True)
        self.continue_button.setEnabled(self.what_if is not None)

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
        tip = QLabel(view.tooltip_html(index))
        tip.setStyleSheet("QLabel { background: #FFFFE8; color: #000; border: 1px solid #777; padding: 5px; }")
        anchor = view.viewport().mapTo(origin, rect.bottomLeft() + QPoint(12, 6))
        # Keep it over the output, clear of the chart, and below what sits over the text (the constraint's strip):
        # the output's width, its long lines wrapped there (adjustSize would cap it at 2/3 of the screen and cut
        # them), at the output's left edge under (or over) the token's line. So in an animation it moves only when
        # the text starts a line, and a frame redraws only its numbers: a tip that followed each token across the
        # line was half of a GIF frame's bytes.
        left = view.viewport().mapTo(origin, QPoint(0, 0))
        right = view.viewport().mapTo(origin, view.viewport().rect().topRight()).x()
        top = left.y()
        tip.setWordWrap(True)
        width = max(360, right - left.x() - 8)
        tip.resize(width, tip.heightForWidth(width))
        x = max(0, left.x() + 4)
        # Below the token's line if it fits above the output's bottom edge (not over the legend under it), else
        # above the line if it fits there, else on the side with more room.
        bottom = view.viewport().mapTo(origin, view.viewport().rect().bottomLeft()).y()
        below, above = anchor.y(), anchor.y() - rect.height() - 12 - tip.height()
        if below + tip.height() <= bottom or (above < top and bottom - below >= below - rect.height() - top):
            y = min(below, max(top, pixmap.height() - tip.height()))
        else:
            y = max(top, above)
        painter = QPainter(pixmap)
        tip.render(painter, QPoint(x, y))
        painter.end()
