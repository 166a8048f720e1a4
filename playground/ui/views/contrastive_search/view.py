"""The contrastive-search view: per step, the k candidates with the model's confidence p, the degeneration penalty
(the largest cosine similarity of the candidate's last hidden state to any earlier token's), the earlier token that
similarity was found at, the combined score (1 − α)·p − α·penalty, and the winner.

Hover a candidate and its most similar earlier token is marked in the text beside (by default the winner's); the
strip under the header has every step, magenta where the penalty overturned the model's top choice (hover a step to
see it, click to keep it). Drawn from the Qt-free ``ContrastiveSearchState``, live or from a saved run.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from playground.events.contrastive_search import SearchStep
from playground.state import visible_token_text
from playground.state.contrastive_search import ContrastiveSearchState
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.contrastive_search.strip import KEPT_COLOR, OVERTURNED_COLOR, OverturnStrip
from playground.ui.views.contrastive_search.text import SIMILAR_COLOR, sequence_html
from playground.ui.views.drawing import LeastHeight, fill_with_scroll
from playground.ui.views.texts import status_html

COLUMNS = ("", "token", "confidence p", "penalty (max cos)", "most similar to", "score")
WINNER_BG = "#D9F2D9"


class CandidatesTable(QTableWidget):
    """The shown step's candidates; hovering a row tells the view (``hovered``), leaving it too (None)."""

    def __init__(self, view: ContrastiveSearchView) -> None:
        super().__init__(0, len(COLUMNS), view)
        self.view = view
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setMouseTracking(True)
        self.verticalHeader().setVisible(False)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)  # every column its texts' width
        header.setStretchLastSection(True)
        self.cellEntered.connect(lambda row, column: self.view.hover_candidate(row))
        self.setMinimumHeight(150)

    def leaveEvent(self, event) -> None:  # Qt's name
        self.view.hover_candidate(None)
        super().leaveEvent(event)


@register_view
class ContrastiveSearchView(FoldView):
    name = "contrastive_search"
    title = "Contrastive search"
    consumes = (SearchStep,)
    idle_header = ("<b>Contrastive search</b> — choose the contrastive-search strategy (--top-k K candidates, "
                   "--penalty-alpha α) and generate: every step's candidates, their confidence, degeneration "
                   "penalty and score appear here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = ContrastiveSearchState()
        self.selected: int | None = None  # the kept step
        self.hovered_step: int | None = None  # the strip's step under the mouse
        self.hovered: int | None = None  # the candidate row under the mouse (None: the winner's is marked)
        self.follow_live = True
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(
            "<i>Each step runs the model's k likeliest tokens one step ahead (one batched pass) and takes the best "
            "<b>score = (1 − α)·p − α·penalty</b>; the <b>degeneration penalty</b> is the largest cosine similarity "
            "of the candidate's last hidden state (after the final norm) to any earlier token's, prompt "
            "included.</i>")
        self.strip_label = rich_label(self)
        self.strip = OverturnStrip(self.hover_step, self.select_step, self)
        self.step_label = rich_label(self)
        self.table = CandidatesTable(self)
        self.text_label = rich_label(self)
        self.text = QTextBrowser(self)
        self.text.setOpenLinks(False)
        self.text.setMinimumHeight(150)
        self.legend = rich_label(self)
        self.legend.setText(
            f"<span style='color:{OVERTURNED_COLOR}'>■</span> the penalty overturned the model's top choice · "
            f"<span style='color:{KEPT_COLOR}'>■</span> it did not · ▲ the model's top choice · ★ the winner "
            f"(green row) · <span style='background:{SIMILAR_COLOR}'>&nbsp;marked&nbsp;</span> the hovered "
            "candidate's most similar earlier token · boxed: the shown step's token · grey: the prompt")
        self._build_layout()
        self._start_drawing()

    def _build_layout(self) -> None:
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.text_label)
        right_layout.addWidget(self.text, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.table)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([640, 420])
        content = LeastHeight()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(4, 4, 4, 4)
        for widget in (self.header, self.explanation, self.strip_label, self.strip, self.step_label):
            layout.addWidget(widget)
        layout.addWidget(split, 1)
        layout.addWidget(self.legend)
        fill_with_scroll(self, content)

    # --- the view interface ---------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.selected = self.hovered_step = self.hovered = None
        self.follow_live = True

    def _follow(self) -> None:
        if self.follow_live and self.state.steps:
            self.selected = len(self.state.steps) - 1

    def _ended(self) -> None:
        if self.follow_live:
            self.follow_live = False
            self.selected = self.state.most_interesting_step()

    # --- what is shown --------------------------------------------------------------------------------------
    @property
    def shown_step(self) -> int | None:
        return self.hovered_step if self.hovered_step is not None else self.selected

    def marked_candidate(self) -> int | None:
        """The candidate whose most similar earlier token the text marks: the hovered one, else the winner."""
        step = self.shown_step
        if step is None:
            return None
        winner = self.state.steps[step].winner
        return self.hovered if self.hovered is not None else (winner if winner >= 0 else 0)

    def select_step(self, index: int) -> None:
        if 0 <= index < len(self.state.steps):
            self.follow_live = False
            self.selected, self.hovered_step, self.hovered = index, None, None
            self._draw()

    def hover_step(self, index: int | None) -> None:
        if index != self.hovered_step:
            self.hovered_step, self.hovered = index, None
            self._draw()

    def hover_candidate(self, row: int | None) -> None:
        step = self.shown_step
        if row is not None and (step is None or not 0 <= row < len(self.state.steps[step].candidates)):
            row = None
        if row != self.hovered:
            self.hovered = row
            self._draw_text()

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        state = self.state
        if state.started is None and not state.steps:
            self.strip.set_steps([], None)
            self.table.setRowCount(0)
            self.text.setHtml("")
            self.strip_label.setText("")
            self.step_label.setText("")
            self.text_label.setText("")
            return
        started = state.started
        rule = f" · α = {started.alpha:g} · k = {started.k}" if started is not None else ""
        self.header.setText(f"<b>Contrastive search</b>{rule} · {len(state.steps)} steps · "
                            f"{status_html(state, 'waiting for the first step…', under_way=bool(state.steps))}")
        searched = sum(not s.forced for s in state.steps)
        self.strip_label.setText(
            f"<b>The penalty overturned the model's top choice at {state.overturned} of {searched} steps "
            f"({state.overturned_fraction() * 100:.0f} %)</b> · every step below, hover to see one, click to keep it")
        self.strip.set_steps([(s.overturned, s.forced) for s in state.steps], self.shown_step)
        self._draw_table()
        self._draw_text()

    def _draw_table(self) -> None:
        step_index = self.shown_step
        table = self.table
        if step_index is None:
            table.setRowCount(0)
            self.step_label.setText("")
            return
        step = self.state.steps[step_index]
        alpha = self.state.started.alpha if self.state.started is not None else 0.0
        verdict = ("the penalty <b>overturned</b> the model's top choice" if step.overturned
                   else "the model's top choice won")
        forced = " · <b>forced</b> (branching)" if step.forced else ""
        self.step_label.setText(
            f"<b>Step {step_index}</b>: the {len(step.candidates)} candidates, likeliest first · took "
            f"‘<b>{html.escape(visible_token_text(step.text))}</b>’ · {verdict}{forced} · score = "
            f"{1 - alpha:.2g}·p − {alpha:.2g}·penalty")
        table.setRowCount(len(step.candidates))
        bold = QFont()
        bold.setBold(True)
        for row, c in enumerate(step.candidates):
            mark = ("★" if row == step.winner else "") + ("▲" if row == 0 else "")
            similar = self.state.most_similar_text(c)
            cells = (mark, visible_token_text(c.text), format_percent(c.confidence), f"{c.penalty:.3f}",
                     f"{visible_token_text(similar)}  ({self.state.describe_position(c.similar_position)})",
                     f"{c.score:+.3f}")
            for column, value in enumerate(cells):
                item = QTableWidgetItem(value)
                item.setToolTip(f"{visible_token_text(c.text)}: p = {format_percent(c.confidence)}, penalty "
                                f"{c.penalty:.3f} (cos to '{visible_token_text(similar)}' at "
                                f"{self.state.describe_position(c.similar_position)}), score {c.score:+.4f}")
                if column in (2, 3, 5):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if row == step.winner:
                    item.setBackground(QBrush(QColor(WINNER_BG)))
                    item.setFont(bold)
                table.setItem(row, column, item)

    def _draw_text(self) -> None:
        step_index = self.shown_step
        if step_index is None:
            self.text.setHtml("")
            self.text_label.setText("")
            return
        step = self.state.steps[step_index]
        marked = self.marked_candidate()
        candidate = step.candidates[marked] if marked is not None and marked < len(step.candidates) else None
        similar = candidate.similar_position if candidate is not None else None
        if candidate is not None:
            who = "the hovered candidate" if self.hovered is not None else "the winner"
            self.text_label.setText(
                f"The text up to step {step_index}: {who} ‘<b>{html.escape(visible_token_text(candidate.text))}</b>’ "
                f"is most like ‘<span style='background:{SIMILAR_COLOR}'>"
                f"<b>{html.escape(visible_token_text(self.state.most_similar_text(candidate)))}</b></span>’ "
                f"({self.state.describe_position(candidate.similar_position)}, cos {candidate.penalty:.3f}) · hover "
                "a candidate to mark its own")
        self.text.setHtml(sequence_html(self.state, self.state.position(step_index), similar))
        if similar is not None:
            self.text.scrollToAnchor("similar")  # a long text scrolls to the marked token
