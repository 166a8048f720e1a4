"""The contrastive decoding view: per step, what the expert thought, what the amateur thought, and their difference.

One module per panel (each a small class that builds its widgets once and draws them in place from the fold):

- ``chart``: three panels over the selected step's candidates (in the expert's order), each on its own scale: the
  expert's log-probability (with the plausibility cut, log α + its top log p, as a dashed line), the amateur's, and
  the contrast score log p_expert − log p_amateur; candidates outside the cut shaded in all three, the chosen token
  banded and starred, the expert's own top token marked. A side panel lists the numbers.
- ``strip``: every step, steps where the contrast changed the expert's choice highlighted; hover a step to see it,
  click to keep it.
- ``dola``: DoLa runs (``--amateur dola``): beside the strip, every step's premature layer (a dot) over the JSD of
  each candidate layer from the final layer (colour), and the step's JSDs in the side panel.
- ``what_if``: a what-if α (display-only): the cut and the choices re-derived from the recorded scores, nothing
  regenerated (a second row of the strip). The amateur (kind, layer, temperature) changes the scores themselves: the
  settings form runs again with it.
- ``figures``: the header and the run's figures; ``export``: the CSV; ``style``: the colours they share.

Events are folded into the Qt-free ``ContrastiveState``; while a run streams, only the panels of the parts the fold
says changed are redrawn, at most every ``LIVE_DRAW_MS``.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QSplitter, QVBoxLayout, QWidget

from playground.events import Event, RunStarted
from playground.events.contrastive import ContrastCandidate, ContrastStep
from playground.state import Run
from playground.state.contrastive import AlphaReplay, ContrastiveState
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.columns import ShortDock
from playground.ui.views.contrastive.chart import StepChart
from playground.ui.views.contrastive.dola import DolaPlot
from playground.ui.views.contrastive.export import write_candidates_csv
from playground.ui.views.contrastive.figures import HeaderAndFigures
from playground.ui.views.contrastive.strip import StepsStrip
from playground.ui.views.contrastive.style import (
    AMATEUR_COLOR,
    CHANGED_COLOR,
    CONTRAST_COLOR,
    EXPERT_COLOR,
    FLOOR,
    SAME_COLOR,
    SHORT_STRIP_HEIGHT,
    SLOTS,
    STRIP_HEIGHT,
    swatch,
)
from playground.ui.views.contrastive.what_if import WhatIfAlpha
from playground.ui.views.drawing import LeastHeight, TallEnough, fill_with_scroll

LIVE_DRAW_MS = 200


@register_view
class ContrastiveView(ShortDock, FoldView):
    name = "contrastive"
    title = "Contrastive"
    consumes = (ContrastStep,)
    live_draw_ms = LIVE_DRAW_MS
    idle_header = ("<b>Contrastive decoding</b> — choose the contrastive strategy and generate: every step's expert, "
                   "amateur and contrast scores appear here.")
    data_formats = ("csv",)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = ContrastiveState()
        self.selected: int | None = None  # the pinned step
        self.hovered: int | None = None  # the step under the mouse in the strip (shown while hovered)
        self.follow_live = True
        self.top = HeaderAndFigures(self, self)
        self.header, self.figures = self.top.header, self.top.figures
        self.explanation = rich_label(self)
        self.explanation.setText(
            "<i>Among the tokens the expert finds plausible (p<sub>expert</sub> ≥ α × its top p), pick the one it "
            "prefers most <b>over the amateur</b>: score = log p<sub>expert</sub> − log p<sub>amateur</sub>.</i>")
        self.legend = rich_label(self)
        self.legend.setText(
            f"{swatch(EXPERT_COLOR, 'expert log p')} &nbsp; {swatch(AMATEUR_COLOR, 'amateur log p')} &nbsp; "
            f"{swatch(CONTRAST_COLOR, 'score')} &nbsp; <span style='background:#C8C8C8'>&nbsp;shaded&nbsp;</span> "
            "below the cut (dashed): not eligible &nbsp; ★ chosen &nbsp; ▲ expert's top &nbsp; ◆ what-if's choice"
            f"<br>Steps: <span style='color:{CHANGED_COLOR}'>■</span> the contrast changed the expert's choice, "
            f"<span style='color:{SAME_COLOR}'>■</span> it did not · <i>hover a step to see it, click to keep it</i>"
            f" · log p below {FLOOR:g} is drawn at {FLOOR:g}")
        self.step_chart = StepChart(self, self)
        self.steps_strip = StepsStrip(self, self)
        self.dola = DolaPlot(self, self, self.steps_strip.plot)
        self.what_if = WhatIfAlpha(self, self)
        self.sections = (self.dola, self.what_if, self.steps_strip, self.step_chart, self.top)
        self._name_parts()
        self._build_layout()
        self._start_drawing()

    def _name_parts(self) -> None:
        """The panels' widgets and items under the view's names (what tests and screenshots reach)."""
        chart = self.step_chart
        self.chart, self.panels, self.step_panel = chart.chart, chart.panels, chart.step_panel
        self.expert_bars, self.amateur_bars, self.contrast_bars = chart.expert_bars, chart.amateur_bars, \
            chart.contrast_bars
        self._shades, self._bands, self._marks = chart.shades, chart.bands, chart.marks
        self._cut_shade, self._chosen_band, self._cut_line = chart.cut_shade, chart.chosen_band, chart.cut_line
        strip = self.steps_strip
        self.strip = strip.plot
        self._strip_band, self._strip_run, self._strip_what_if = strip.band, strip.run_row, strip.what_if_row
        self.dola_plot, self._dola_image, self._dola_dots = self.dola.plot, self.dola.image, self.dola.dots
        self.alpha_box, self.alpha_reset, self.what_if_note = self.what_if.alpha_box, self.what_if.alpha_reset, \
            self.what_if.note

    def _build_layout(self) -> None:
        self._what_if = self.what_if.widget  # the what-if α and its note: under the step panel, or the chart
        right = TallEnough()
        self._right = right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.step_panel, 1)
        right_layout.addWidget(self._what_if)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.chart)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([680, 480])
        content = LeastHeight()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        for widget in (self.header, self.explanation, self.legend):
            layout.addWidget(widget)
        layout.addWidget(split, 3)
        self._bottom = bottom = QHBoxLayout()
        bottom.addWidget(self.strip, 2)
        bottom.addWidget(self.dola_plot, 2)
        layout.addLayout(bottom, 1)
        layout.addWidget(self.figures)
        fill_with_scroll(self, content)

    def _arrange(self, short: bool) -> None:
        """In a short dock (1280 x 800's) the what-if α and its note stand beside the steps strip rather than under
        the step panel, and the chart and the strip take their least heights: nothing scrolls."""
        (self._right if short else self._bottom).removeWidget(self._what_if)
        if short:
            self._bottom.addWidget(self._what_if, 1)  # the strip keeps two thirds: its title is long
        else:
            self._right.addWidget(self._what_if)
        self.step_chart.arrange(short)
        self._draw()
        self.strip.setMinimumHeight(SHORT_STRIP_HEIGHT if short else STRIP_HEIGHT)
        # the method in one line: under the header, or (short) on hover over the header
        self.explanation.setVisible(not short)
        self.header.setToolTip(self.explanation.text() if short else "")

    # --- the view interface ---------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.selected = self.hovered = None
        self.follow_live = True
        self.what_if.replay = None
        self.what_if.set_alpha(0.1)

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self.reset()
            started = self.state.started
            self.state.apply(event)
            if self.state.started is not started and self.state.started is not None:
                self.what_if.set_alpha(self.state.started.alpha)  # the what-if starts at the run's own α

    def _follow(self) -> None:
        if self.follow_live and self.state.steps:
            self.selected = len(self.state.steps) - 1

    def _ended(self) -> None:
        if self.follow_live:
            self.follow_live = False
            self.selected = self.state.most_interesting_step(SLOTS)

    # --- selection and the what-if --------------------------------------------------------------------------
    @property
    def replay(self) -> AlphaReplay | None:
        """The recorded run re-derived at the what-if α (None before any step)."""
        return self.what_if.replay

    @property
    def shown(self) -> list[ContrastCandidate]:
        """The candidates the chart shows for the shown step."""
        return self.step_chart.shown

    def select_step(self, index: int) -> None:
        """Keep step ``index`` in the chart (stops following the newest step)."""
        if not 0 <= index < len(self.state.steps):
            return
        self.follow_live = False
        self.selected = index
        self.hovered = None
        self.steps_strip.draw_band()
        self.step_chart.draw()

    def hover_step(self, index: int | None) -> None:
        """Show step ``index`` while the mouse is on it (None: back to the kept step)."""
        if index is not None and not 0 <= index < len(self.state.steps):
            index = None
        if index == self.hovered:
            return
        self.hovered = index
        self.steps_strip.draw_band()
        self.step_chart.draw()

    @property
    def shown_step(self) -> int | None:
        return self.hovered if self.hovered is not None else self.selected

    def what_if_alpha(self) -> float:
        return self.what_if.alpha

    def alpha_changed(self) -> None:
        self.what_if.draw()
        self.steps_strip.draw()
        self.step_chart.draw()

    def leaveEvent(self, event) -> None:  # Qt's name
        self.hover_step(None)
        super().leaveEvent(event)

    # --- data -----------------------------------------------------------------------------------------------
    def export_data(self, path: Path) -> None:
        """Every recorded candidate of every step, one row each."""
        write_candidates_csv(self.state, path)
