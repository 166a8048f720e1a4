"""The speculative decoding view: what was drafted, what the target kept, threw away and added, and what it saved.

One module per panel (each a small class that builds its widgets once and draws them in place from the fold):

- ``text``: the output text, marked: accepted drafts, rejected drafts (struck through, where they were rejected,
  just before the target's correction) and the target's own tokens, in three colours used for the same meaning
  everywhere here.
- ``rounds``: a timeline of rounds (stacked bars: accepted, the target's own, rejected); click a round, or a token in
  the text, to see it in ``round_chart``: its drafted tokens as bars of the drafter's q next to the target's p, with
  the verdict (and, for sampled runs, the uniform draw). A tree run's round is drawn as its tree (``tree.RoundTree``).
- ``figures``: the header and the live figures; ``positions``: acceptance by draft position (by depth, for trees);
  ``what_if``: the expected speed-up against k from the measured acceptance and costs (an estimate, labelled as
  one; the measured speed-up comes with the run's end), for tree runs a heat map of the tree cut to each depth and
  width (``tree.TreeGrid``); ``export``: the CSV.

Events are folded into a Qt-free ``SpeculativeState``; the text grows by the new marks only; while a run streams,
only the panels of the parts the fold says changed are redrawn, at most every ``LIVE_PLOTS_MS``.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QSplitter, QVBoxLayout, QWidget

from playground.events.speculative import SpeculativeRound
from playground.state.speculative import SpeculativeState
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.columns import ShortDock
from playground.ui.views.drawing import LeastHeight, fill_with_scroll
from playground.ui.views.speculative.export import write_rounds_csv
from playground.ui.views.speculative.figures import HeaderAndFigures
from playground.ui.views.speculative.positions import PositionsPlot
from playground.ui.views.speculative.round_chart import RoundChart
from playground.ui.views.speculative.rounds import TIMELINE_AXIS, RoundsTimeline
from playground.ui.views.speculative.text import MarkedText
from playground.ui.views.speculative.what_if import WhatIfPlot

LIVE_PLOTS_MS = 200  # while streaming, the plots redraw at most this often (the text follows every batch)


@register_view
class SpeculativeView(ShortDock, FoldView):
    name = "speculative"
    title = "Speculative"
    consumes = (SpeculativeRound,)
    data_formats = ("csv",)
    live_draw_ms = LIVE_PLOTS_MS  # the text follows every batch (``_follow``), the plots at most this often
    idle_header = ("<b>Speculative decoding</b> — choose the speculative strategy and generate: every round's "
                   "drafts and verdicts appear here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: SpeculativeState = SpeculativeState()
        self.selected_round: int | None = None
        self.follow_live = True  # the round chart follows the newest round until the user picks one

        self.top = HeaderAndFigures(self, self)
        self.header, self.figures = self.top.header, self.top.figures
        self.legend = self.top.legend
        self.text = MarkedText(self.state, self)
        self.text.mark_clicked.connect(self._mark_clicked)
        self.show_rejected = QCheckBox("show rejected drafts", self)
        self.show_rejected.setChecked(True)
        self.show_rejected.setToolTip("Rejected drafts are not part of the output: hide them to read the output "
                                      "alone")
        self.show_rejected.toggled.connect(self._toggle_rejected)
        self.rounds = RoundsTimeline(self, self)
        self.round_chart = RoundChart(self, self)
        self.positions = PositionsPlot(self, self)
        self.what_if = WhatIfPlot(self, self)
        self.sections = (self.rounds, self.round_chart, self.positions, self.what_if, self.top)
        self._name_parts()
        self._build_layout()
        self._start_drawing()

    def _name_parts(self) -> None:
        """The panels' widgets and items under the view's names (what tests and screenshots reach)."""
        self.timeline, self.timeline_bars = self.rounds.plot, self.rounds.bars
        chart = self.round_chart
        self.round_plot, self.round_note, self.round_tree = chart.plot, chart.note, chart.tree
        self._q_bars, self._p_bars, self._draws, self._verdicts = chart.q_bars, chart.p_bars, chart.draws, \
            chart.verdicts
        self.positions_plot = self.positions.plot
        what_if = self.what_if
        self.what_if_plot, self.what_if_note, self.tree_grid = what_if.plot, what_if.note, what_if.grid
        self._what_if_curve, self._run_k_line, self._measured = what_if.curve, what_if.run_k_line, what_if.measured

    def _build_layout(self) -> None:
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        output_row = QHBoxLayout()
        output_row.addWidget(QLabel("<b>Output</b>, marked by who proposed each token", left), 1)
        output_row.addWidget(self.show_rejected)
        left_layout.addLayout(output_row)
        left_layout.addWidget(self.text, 1)
        left_layout.addWidget(self.figures)
        right = QWidget()
        self._right = right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.timeline, 3)
        right_layout.addWidget(self.round_plot, 4)
        right_layout.addWidget(self.round_note)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(left)
        top.addWidget(right)
        top.setSizes([520, 620])
        self._what_if_box = what_if = QVBoxLayout()
        what_if.addWidget(self.what_if_plot, 1)
        what_if.addWidget(self.what_if_note)
        self._bottom = bottom = QHBoxLayout()
        bottom.addWidget(self.positions_plot, 2)
        bottom.addLayout(what_if, 3)
        # All in a scroll area: a dock lower than the panels' least heights scrolls instead of squeezing the plots
        # (or growing the window); 1280 x 800's holds them (LeastHeight).
        content = LeastHeight()
        self._content = layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.legend)
        layout.addWidget(top, 5)
        layout.addLayout(bottom, 3)
        fill_with_scroll(self, content)

    def _arrange(self, short: bool) -> None:
        """In a short dock (1280 x 800's) the what-if note stands beside its plot instead of under it, and the round
        note keeps its figures line (how the drafts were judged goes to its tooltip): the plots keep their height."""
        self.stretch_rounds()
        if short:
            self._what_if_box.removeWidget(self.what_if_note)
            self._bottom.setStretch(0, 6)  # positions, what-if, its note: 6 : 7 : 5
            self._bottom.setStretch(1, 7)
            self._bottom.addWidget(self.what_if_note, 5)
        else:
            self._bottom.removeWidget(self.what_if_note)
            self._bottom.setStretch(0, 2)
            self._bottom.setStretch(1, 3)
            self._what_if_box.addWidget(self.what_if_note)
        self._draw()

    def stretch_rounds(self) -> None:
        """The rounds' timeline and the round chart share the column: as tall as each other in a short dock, the
        chart taller in a tall one, and taller still for a tree (its rows need it)."""
        as_tree = self.round_chart.as_tree
        timeline, chart = (2, 3) if as_tree else (1, 1) if self.short else (3, 4)
        self._right.setStretch(0, timeline)
        self._right.setStretch(1, chart)
        # A short dock gives a tree the height of the figures' row (whose plots need less than a tree's rows).
        tree_in_short = as_tree and self.short
        top, bottom = (2, 1) if tree_in_short else (5, 3)
        self._content.setStretch(2, top)
        self._content.setStretch(3, bottom)
        # ... and the timeline's axis title (the plot's title and the legend say it) goes to give the tree its rows.
        self.timeline.getPlotItem().setLabel("bottom", "" if tree_in_short else TIMELINE_AXIS)

    # --- the view interface ---------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.selected_round = None
        self.follow_live = True
        self.rounds.clear()
        self.text.clear_marks()
        self.text.setExtraSelections([])

    def _append_text(self) -> None:
        """The marks settled since the last batch (the text grows by them alone)."""
        state = self.state
        if self.text.drawn < state.settled:
            self.text.append_marks(state.marks[self.text.drawn : state.settled])

    def _follow(self) -> None:
        self._append_text()
        if self.follow_live and self.state.rounds:
            self.selected_round = len(self.state.rounds) - 1

    def _ended(self) -> None:
        if self.follow_live:
            self.follow_live = False
            self.selected_round = self.state.most_interesting_round()
        self._append_text()

    # --- selection ------------------------------------------------------------------------------------------
    def select_round(self, index: int) -> None:
        """Show round ``index`` in the round chart and band it in the text and the timeline (stops following)."""
        if not 0 <= index < len(self.state.rounds):
            return
        self.follow_live = False
        self.selected_round = index
        self.rounds.draw()
        self.round_chart.draw()

    def _toggle_rejected(self, shown: bool) -> None:
        self.text.show_rejected = shown
        self.text.clear_marks()
        self.text.append_marks(self.state.marks[: self.state.settled])
        self.band_text()

    def band_text(self) -> None:
        if self.selected_round is None or self.selected_round >= len(self.state.round_marks):
            self.text.mark_range(0, 0)
            return
        first, end = self.state.round_marks[self.selected_round]
        self.text.mark_range(first, min(end, self.text.drawn))

    def _mark_clicked(self, index: int) -> None:
        mark = self.state.marks[index]
        if mark.round is not None:
            self.select_round(mark.round)

    # --- data -----------------------------------------------------------------------------------------------
    def export_data(self, path: Path) -> None:
        """Every drafted token and target token of the shown run, one row each."""
        write_rounds_csv(self.state, path)
