"""The steering sweep's view: the same prompt unsteered and at each strength, in aligned panes (the side-by-side
machinery of the strategies comparison), each with its text, its mean KL from the unsteered model and its
perplexity under it, and a table of every pane's figures, so a user finds the strength where the style moves and
the text still holds (KL up, perplexity not yet run away)."""

from __future__ import annotations

import html
import math

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from playground.config.steering_sweep import MAX_STRENGTHS, SteeringSweepSettings
from playground.events.panes import PaneToken
from playground.state import Run
from playground.state.panes import PaneRecord, PanesState
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.side_by_side import SideBySidePanes

EXPLANATION = ("<b>Mean KL</b>: the mean over the pane's tokens of KL(steered ‖ unsteered) of the next-token "
               "distributions, in nats (teacher-forced on the pane's own text: how far the steering moved the model). "
               "<b>Perplexity</b>: exp(−mean log p) of the pane's text under the <i>unsteered</i> model (lower: the "
               "model it came from still finds it fluent). Look for the strength where the KL has risen and the "
               "perplexity has not yet run away.")
ROWS = (("mean_kl", "mean KL from unsteered (nats)", "{:.4f}"),
        ("perplexity", "perplexity (unsteered model)", "{:.2f}"), ("tokens", "tokens", "{:.0f}"),
        ("distinct_2", "distinct-2", "{:.3f}"),
        ("repeated_3grams", "repeated 3-grams", "{:.0f}"), ("first_divergence", "leaves the unsteered text at", ""))


class SweepPanes(SideBySidePanes):
    MAX_PANES = MAX_STRENGTHS + 1


def figure_cell(key: str, fmt: str, value: float | None, pane: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if key == "first_divergence":
        return "reference" if pane == 0 else "never" if value < 0 else f"token {value + 1:.0f}"
    return fmt.format(value)


def pane_figures_text(index: int, pane: PaneRecord) -> str:
    """The line under a pane: its mean KL and perplexity (once it has ended and been scored)."""
    if pane.finished is None:
        return "<i>scored when the sweep ends</i>"
    f = pane.finished.figures
    if "mean_kl" not in f:
        return "<i>not scored (the sweep was stopped)</i>"
    return f"mean KL <b>{f['mean_kl']:.4f}</b> · perplexity <b>{f['perplexity']:.2f}</b>"


@register_view
class SteeringSweepView(FoldView):
    name = "steering-sweep"
    title = "Steering sweep"
    consumes = (PaneToken,)
    idle_header = ("<b>Steering sweep</b> — generate with a steering vector and <tt>--steer-sweep=-2,-1,1,2</tt>: "
                   "the prompt decoded unsteered and at each strength appears here side by side.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: PanesState = PanesState()
        layout = QVBoxLayout(self)
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(EXPLANATION)
        self.panes = SweepPanes(self.state, pane_figures_text, self)
        self.table = QTableWidget(len(ROWS), 0, self)
        self.table.setVerticalHeaderLabels([label for _, label, _ in ROWS])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._fit_table()
        layout.addWidget(self.header)
        layout.addWidget(self.panes, stretch=1)
        layout.addWidget(self.table)
        layout.addWidget(self.explanation)
        self._start_drawing()

    def applies_to(self, run: Run) -> bool:
        return run.settings.group(SteeringSweepSettings).active()

    def wants_front(self, run: Run) -> bool:
        return self.applies_to(run)

    def _fit_table(self) -> None:
        """The table as tall as its rows (no scrolling for six rows)."""
        header = max(self.table.horizontalHeader().height(), self.table.horizontalHeader().sizeHint().height())
        self.table.setFixedHeight(header + self.table.verticalHeader().length() + 2 * self.table.frameWidth() + 2)

    def _draw(self) -> None:
        state = self.state
        self.panes.refresh()
        self._fit_table()
        panes = state.panes
        if self.table.columnCount() != len(panes):
            self.table.setColumnCount(len(panes))
        self.table.setHorizontalHeaderLabels([p.label for p in panes])
        for column, pane in enumerate(panes):
            figures = pane.finished.figures if pane.finished is not None else {}
            for row, (key, _, fmt) in enumerate(ROWS):
                text = figure_cell(key, fmt, figures.get(key), column)
                item = self.table.item(row, column)
                if item is None:
                    self.table.setItem(row, column, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
        if not panes:
            return
        status = html.escape(state.status("waiting for the first token…", under_way=any(p.token_ids for p in panes)))
        self.header.setText(f"<b>Steering sweep</b> · {len(panes)} panes: "
                            f"{html.escape(', '.join(p.label for p in panes))} · {status}")
