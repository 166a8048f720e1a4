"""The contrastive decoding view: per step, what the expert thought, what the amateur thought, and their difference.

- Three panels over the selected step's candidates (in the expert's order), each on its own scale: the expert's
  log-probability (with the plausibility cut, log α + its top log p, as a dashed line), the amateur's, and the
  contrast score log p_expert − log p_amateur; candidates outside the cut shaded in all three, the chosen token
  banded and starred, the expert's own top token marked. A side panel lists the numbers.
- A strip of every step, steps where the contrast changed the expert's choice highlighted; hover a step to see it,
  click to keep it.
- DoLa runs (``--amateur dola``): a plot beside the strip of every step's premature layer (a dot) over the JSD of
  each candidate layer from the final layer (colour), and the step's JSDs in the side panel.
- A what-if α (display-only): the cut and the choices re-derived from the recorded scores, nothing regenerated
  (a second row of the strip). The amateur (kind, layer, temperature) changes the scores themselves: the settings
  form runs again with it.

Events are folded into the Qt-free ``ContrastiveState``; the plot items are built once and updated with
``setOpts``/``setData``, at most every ``LIVE_DRAW_MS`` while streaming.
"""

from __future__ import annotations

import csv
import html
import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from playground.events import Event, RunStarted
from playground.events.contrastive import ContrastCandidate, ContrastStep
from playground.state import Run, visible_token_text
from playground.state.contrastive import AlphaReplay, ContrastiveState, StepRecord, raw_score, replay_alpha
from playground.ui.style import MARK_BAND_COLOR, MARK_COLOR, PROCESSED_COLOR, RAW_COLOR, format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import LeastHeight, TallEnough, TextsInside, clear_bars, fill_with_scroll, static_plot

LIVE_DRAW_MS = 200
SHORT_DOCK = 600  # px: a view lower than this is a short dock (1280 x 800's is 531)
CHART_HEIGHT, SHORT_CHART_HEIGHT = 280, 235  # the three candidate panels' least height
STRIP_HEIGHT, SHORT_STRIP_HEIGHT = 110, 90  # the steps strip's
PANEL_LABELS = ("expert log p", "amateur log p", "score")
SHORT_PANEL_LABELS = ("expert", "amateur", "score")
EXPERT_COLOR = RAW_COLOR  # the expert's own distribution: the raw model output, blue as everywhere
AMATEUR_COLOR = "#009988"  # Tol's teal
CONTRAST_COLOR = PROCESSED_COLOR  # the scores the token was chosen from: orange, as "processed" everywhere
CHANGED_COLOR = "#EE3377"  # a step where the contrast overruled the expert (Tol's magenta)
SAME_COLOR = "#BBBBBB"
UNKNOWN_COLOR = "#E6E6E6"
CUT_SHADE = (120, 120, 120, 55)
SLOTS = 10  # candidates shown in the chart
BAR_WIDTH = 0.6
FLOOR = -80.0  # log-probabilities below this are drawn at it (the bar's label says the value)
CSV_COLUMNS = ("step", "token_id", "token", "expert_rank", "expert_logprob", "amateur_logprob", "score",
               "plausible", "contrast_prob", "chosen", "expert_top")


def _short(text: str, limit: int = 7) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bars(color: str) -> pg.BarGraphItem:
    return pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=color, pen=pg.mkPen(None))


def _padded(values: list[float], room_above: float = 0.12) -> tuple[float, float]:
    """A y range holding ``values`` and 0, with a margin (``room_above`` of the span above, for marks)."""
    low, high = min([*values, 0.0]), max([*values, 0.0])
    span = max(high - low, 1.0)
    return low - 0.08 * span, high + room_above * span


def _swatch(color: str, text: str) -> str:
    return f"<span style='color:{color};font-size:13pt'>■</span>&nbsp;{text}"


def _percent(prob: float) -> str:
    return html.escape(format_percent(prob))  # "<0.01%" is not a tag


def _nats(value: float) -> str:
    return "−∞" if value == -math.inf else f"{value:+.2f}".replace("-", "−")


def shown_candidates(record: StepRecord, must: set[int], limit: int = SLOTS) -> list[ContrastCandidate]:
    """The candidates the chart shows, in the expert's order: the first ``limit``, with the tokens of ``must`` (the
    chosen one, the what-if's) taking the places of the last others when they rank lower."""
    ranked = list(record.contrast.candidates)
    shown = ranked[:limit]
    missing = [c for c in ranked[limit:] if c.token_id in must]
    for extra in missing:
        for i in range(len(shown) - 1, -1, -1):
            if shown[i].token_id not in must:
                shown[i] = extra
                break
    return sorted(shown, key=lambda c: (c.expert_rank, c.token_id))


@register_view
class ContrastiveView(FoldView):
    name = "contrastive"
    title = "Contrastive"
    consumes = (ContrastStep,)
    live_draw_ms = LIVE_DRAW_MS
    idle_header = ("<b>Contrastive decoding</b> — choose the contrastive strategy and generate: every step's expert, "
                   "amateur and contrast scores appear here.")
    data_formats = ("csv",)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: ContrastiveState = ContrastiveState()
        self.selected: int | None = None  # the pinned step
        self.hovered: int | None = None  # the step under the mouse in the strip (shown while hovered)
        self.follow_live = True
        self.replay: AlphaReplay | None = None
        self.shown: list[ContrastCandidate] = []
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(
            "<i>Among the tokens the expert finds plausible (p<sub>expert</sub> ≥ α × its top p), pick the one it "
            "prefers most <b>over the amateur</b>: score = log p<sub>expert</sub> − log p<sub>amateur</sub>.</i>")
        self.legend = rich_label(self)
        self.legend.setText(
            f"{_swatch(EXPERT_COLOR, 'expert log p')} &nbsp; {_swatch(AMATEUR_COLOR, 'amateur log p')} &nbsp; "
            f"{_swatch(CONTRAST_COLOR, 'score')} &nbsp; <span style='background:#C8C8C8'>&nbsp;shaded&nbsp;</span> "
            "below the cut (dashed): not eligible &nbsp; ★ chosen &nbsp; ▲ expert's top &nbsp; ◆ what-if's choice"
            f"<br>Steps: <span style='color:{CHANGED_COLOR}'>■</span> the contrast changed the expert's choice, "
            f"<span style='color:{SAME_COLOR}'>■</span> it did not · <i>hover a step to see it, click to keep it</i>"
            f" · log p below {FLOOR:g} is drawn at {FLOOR:g}")
        self.step_panel = rich_label(self)
        self.step_panel.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.step_panel.setMinimumWidth(360)
        self.figures = rich_label(self)
        self.what_if_note = rich_label(self)
        self._build_chart()
        self._build_strip()
        self._build_dola()
        self._build_controls()
        self._build_layout()
        self._start_drawing()

    # --- building -------------------------------------------------------------------------------------------
    def _build_chart(self) -> None:
        """Three panels over the same candidates, each on its own scale: the expert's log p (with the cut), the
        amateur's log p, and the contrast score."""
        self.chart = pg.GraphicsLayoutWidget(self)
        self.chart.setMinimumHeight(CHART_HEIGHT)
        self.panels: list[pg.PlotItem] = []
        self._shades: list[pg.BarGraphItem] = []
        self._bands: list[pg.BarGraphItem] = []
        self.expert_bars, self.amateur_bars, self.contrast_bars = (_bars(c) for c in (EXPERT_COLOR, AMATEUR_COLOR,
                                                                                      CONTRAST_COLOR))
        rows = ((self.expert_bars, PANEL_LABELS[0], EXPERT_COLOR), (self.amateur_bars, PANEL_LABELS[1], AMATEUR_COLOR),
                (self.contrast_bars, PANEL_LABELS[2], CONTRAST_COLOR))
        for row, (bars, label, color) in enumerate(rows):
            panel = self.chart.addPlot(row=row, col=0)
            panel.setMenuEnabled(False)
            panel.hideButtons()
            panel.setMouseEnabled(x=False, y=False)
            panel.showGrid(y=True, alpha=0.15)
            panel.setLabel("left", label, color=color)
            panel.getAxis("left").setWidth(62)
            panel.getAxis("left").enableAutoSIPrefix(False)  # "score (x0.001)" reads worse than small numbers
            if row:
                panel.setXLink(self.panels[0])
            if row < 2:
                panel.getAxis("bottom").setStyle(showValues=False)
            shade = pg.BarGraphItem(x=[], height=[], width=1.0, brush=pg.mkBrush(*CUT_SHADE), pen=pg.mkPen(None))
            band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
            zero = pg.InfiniteLine(pos=0.0, angle=0, movable=False, pen=pg.mkPen("#555555", width=1))
            for graphic in (band, shade, zero, bars):
                panel.addItem(graphic)
            self.panels.append(panel)
            self._shades.append(shade)
            self._bands.append(band)
        self.panels[2].setLabel("bottom", "candidate (the expert's order)")
        self._cut_shade, self._chosen_band = self._shades[0], self._bands[0]
        self._cut_line = pg.InfiniteLine(angle=0, movable=False,
                                         pen=pg.mkPen("#444444", width=1.5, style=Qt.PenStyle.DashLine),
                                         label="cut", labelOpts={"position": 0.995, "color": "#333333",
                                                                 "fill": (255, 255, 255, 220),
                                                                 "anchors": [(1, 1), (1, 1)]})
        self.panels[0].addItem(self._cut_line)
        self._marks: list[pg.TextItem] = []
        for _ in range(SLOTS):
            mark = pg.TextItem("", anchor=(0.5, 1.0), color="#222222")
            mark.setFont(QFont("DejaVu Sans", 12))
            mark.setVisible(False)
            self.panels[0].addItem(mark)
            self._marks.append(mark)
        self._mark_texts = TextsInside(self.panels[0].getViewBox())

    def _build_strip(self) -> None:
        self.strip = static_plot(self, "Steps", "generated token (hover to see a step, click to keep it)", "",
                                 min_height=STRIP_HEIGHT)
        item = self.strip.getPlotItem()
        item.setMouseEnabled(x=True, y=False)  # long runs: drag or wheel along the steps
        self._strip_band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_COLOR, pen=pg.mkPen(None))
        self._strip_run = pg.BarGraphItem(x=[], height=[], width=0.86, brushes=[], pen=pg.mkPen(None))
        self._strip_what_if = pg.BarGraphItem(x=[], height=[], width=0.86, brushes=[], pen=pg.mkPen(None))
        for graphic in (self._strip_band, self._strip_run, self._strip_what_if):
            item.addItem(graphic)
        item.getAxis("left").setTicks([[(1.0, "this run"), (0.0, "what-if")]])
        item.getAxis("left").setWidth(64)
        item.getViewBox().sigResized.connect(self._strip_ticks)
        item.getViewBox().sigXRangeChanged.connect(self._strip_ticks)
        self.strip.scene().sigMouseClicked.connect(self._strip_clicked)
        self.strip.scene().sigMouseMoved.connect(self._strip_hovered)

    def _build_dola(self) -> None:
        """DoLa's choice per step: the JSD of each candidate layer from the final layer as an image (rows: the
        candidate layers, columns: the steps) and the chosen premature layer as a dot on its row."""
        self.dola_plot = static_plot(self, "DoLa", "generated token", "layer", min_height=SHORT_STRIP_HEIGHT)
        item = self.dola_plot.getPlotItem()
        item.getAxis("left").setWidth(34)
        item.setXLink(self.strip.getPlotItem())
        self._dola_image = pg.ImageItem(axisOrder="row-major")
        self._dola_image.setColorMap(pg.colormap.get("viridis"))
        self._dola_dots = pg.ScatterPlotItem(size=6, brush=pg.mkBrush("#FFFFFF"), pen=pg.mkPen("#EE3377", width=1.5))
        item.addItem(self._dola_image)
        item.addItem(self._dola_dots)
        self.dola_plot.setVisible(False)

    def _build_controls(self) -> None:
        self.alpha_box = QDoubleSpinBox(self)
        self.alpha_box.setRange(0.0, 1.0)
        self.alpha_box.setDecimals(3)
        self.alpha_box.setSingleStep(0.01)
        self.alpha_box.setToolTip("Re-derive the cut and the choices from the recorded scores at another α "
                                  "(nothing is regenerated). The amateur (kind, layer, temperature) changes the "
                                  "scores themselves: set it in the settings and generate again.")
        self.alpha_box.valueChanged.connect(self._alpha_changed)
        self.alpha_reset = QPushButton("run's α", self)
        self.alpha_reset.setToolTip("Back to the α the run used")
        self.alpha_reset.clicked.connect(lambda: self.alpha_box.setValue(self.state.alpha))

    def _build_layout(self) -> None:
        controls = QHBoxLayout()
        label = QLabel("<b>What-if α</b>:", self)
        label.setToolTip("The cut and the choices re-derived from the recorded scores at another α (nothing is "
                         "regenerated)")
        controls.addWidget(label)
        controls.addWidget(self.alpha_box)
        controls.addWidget(self.alpha_reset)
        controls.addStretch(1)
        self._what_if = what_if = TallEnough()  # the what-if α and its note: under the step panel, or the chart
        what_if_layout = QVBoxLayout(what_if)
        what_if_layout.setContentsMargins(0, 0, 0, 0)
        what_if_layout.addLayout(controls)
        what_if_layout.addWidget(self.what_if_note)
        right = TallEnough()
        self._right = right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.step_panel, 1)
        right_layout.addWidget(what_if)
        self._short = False
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

    def resizeEvent(self, event) -> None:
        self._arrange(event.size().height() < SHORT_DOCK)
        super().resizeEvent(event)

    def _arrange(self, short: bool) -> None:
        """In a short dock (1280 x 800's) the what-if α and its note stand beside the steps strip rather than under
        the step panel, and the chart and the strip take their least heights: nothing scrolls."""
        if short == self._short:
            return
        self._short = short
        (self._right if short else self._bottom).removeWidget(self._what_if)
        if short:
            self._bottom.addWidget(self._what_if, 1)  # the strip keeps two thirds: its title is long
        else:
            self._right.addWidget(self._what_if)
        self.chart.setMinimumHeight(SHORT_CHART_HEIGHT if short else CHART_HEIGHT)
        # a short panel's axis holds "expert" (the legend above says log p), not "expert log p"
        for panel, label, color in zip(self.panels, SHORT_PANEL_LABELS if short else PANEL_LABELS,
                                       (EXPERT_COLOR, AMATEUR_COLOR, CONTRAST_COLOR), strict=True):
            panel.setLabel("left", label, color=color)
        self._draw()
        self.strip.setMinimumHeight(SHORT_STRIP_HEIGHT if short else STRIP_HEIGHT)
        # the method in one line: under the header, or (short) on hover over the header
        self.explanation.setVisible(not short)
        self.header.setToolTip(self.explanation.text() if short else "")

    # --- the view interface ---------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.selected = self.hovered = None
        self.follow_live = True
        self.replay = None
        self._set_alpha(0.1)

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self.reset()
            started = self.state.started
            self.state.apply(event)
            if self.state.started is not started and self.state.started is not None:
                self._set_alpha(self.state.started.alpha)  # the what-if starts at the run's own α

    def _follow(self) -> None:
        if self.follow_live and self.state.steps:
            self.selected = len(self.state.steps) - 1

    def _ended(self) -> None:
        if self.follow_live:
            self.follow_live = False
            self.selected = self.state.most_interesting_step(SLOTS)

    # --- selection and the what-if --------------------------------------------------------------------------
    def select_step(self, index: int) -> None:
        """Keep step ``index`` in the chart (stops following the newest step)."""
        if not 0 <= index < len(self.state.steps):
            return
        self.follow_live = False
        self.selected = index
        self.hovered = None
        self._draw_strip_band()
        self._draw_step()

    def hover_step(self, index: int | None) -> None:
        """Show step ``index`` while the mouse is on it (None: back to the kept step)."""
        if index is not None and not 0 <= index < len(self.state.steps):
            index = None
        if index == self.hovered:
            return
        self.hovered = index
        self._draw_strip_band()
        self._draw_step()

    @property
    def shown_step(self) -> int | None:
        return self.hovered if self.hovered is not None else self.selected

    def what_if_alpha(self) -> float:
        return self.alpha_box.value()

    def _set_alpha(self, alpha: float) -> None:
        self.alpha_box.blockSignals(True)
        self.alpha_box.setValue(alpha)
        self.alpha_box.blockSignals(False)

    def _alpha_changed(self) -> None:
        self._draw_what_if()
        self._draw_step()

    def _strip_step(self, scene_pos) -> int | None:
        box = self.strip.getPlotItem().getViewBox()
        if not box.sceneBoundingRect().contains(scene_pos):
            return None
        return round(box.mapSceneToView(scene_pos).x())

    def _strip_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        index = self._strip_step(event.scenePos())
        if index is not None:
            self.select_step(index)

    def _strip_hovered(self, scene_pos) -> None:
        self.hover_step(self._strip_step(scene_pos))

    def leaveEvent(self, event) -> None:  # Qt's name
        self.hover_step(None)
        super().leaveEvent(event)

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_dola()
        self._draw_what_if()
        self._draw_step()
        self._draw_texts()

    def _draw_what_if(self) -> None:
        state = self.state
        self.replay = replay_alpha(state, self.what_if_alpha()) if state.steps else None
        self._draw_strip()
        self.what_if_note.setText(self._what_if_html())

    def _draw_strip(self) -> None:
        state, replay = self.state, self.replay
        n = len(state.steps)
        xs = np.arange(n, dtype=float)
        run_brushes = [self._step_brush(r.contrast.changed, r.contrast.forced) for r in state.steps]
        self._strip_run.setOpts(x=xs, y0=np.full(n, 0.55), height=np.full(n, 0.9), width=0.86, brushes=run_brushes)
        if replay is not None:
            what_brushes = [pg.mkBrush(UNKNOWN_COLOR) if c is None else self._step_brush(c, False)
                            for c in replay.changed]
            self._strip_what_if.setOpts(x=xs, y0=np.full(n, -0.45), height=np.full(n, 0.9), width=0.86,
                                        brushes=what_brushes)
        else:
            clear_bars(self._strip_what_if)
        item = self.strip.getPlotItem()
        item.setXRange(-0.6, max(n, 12) - 0.4, padding=0)
        item.setYRange(-0.55, 1.55, padding=0)
        chosen = n - state.forced
        share = f" ({format_percent(state.changed / chosen)})" if chosen else ""
        item.setTitle(f"Steps: the contrast changed the expert's choice at {state.changed} of {chosen}{share}" if n
                      else "Steps", size="10pt")
        self._strip_ticks()
        self._draw_strip_band()

    def dola_rows(self) -> tuple[tuple[int, ...], np.ndarray, list[int]]:
        """DoLa's candidate layers, the JSD image [layers, steps] (nats) and each step's chosen row (empty when the
        run is not DoLa)."""
        started = self.state.started
        layers = started.dola_layers if started is not None else ()
        steps = [r.contrast for r in self.state.steps if r.contrast.layer_jsd]
        if not layers or not steps:
            return layers, np.zeros((len(layers), 0)), []
        image = np.array([s.layer_jsd for s in steps], dtype=float).T  # [layers, steps]
        return layers, image, [layers.index(s.premature_layer) for s in steps]

    def _draw_dola(self) -> None:
        layers, image, rows = self.dola_rows()
        self.dola_plot.setVisible(bool(layers))
        if not layers:
            return
        item = self.dola_plot.getPlotItem()
        n = image.shape[1]
        if n:
            self._dola_image.setImage(image, levels=(0.0, max(float(image.max()), 1e-9)))
            self._dola_image.setRect(-0.5, -0.5, n, len(layers))
        else:
            self._dola_image.clear()
        self._dola_dots.setData(x=np.arange(n, dtype=float), y=np.array(rows, dtype=float))
        every = max(1, math.ceil(len(layers) / 4))  # a short plot has room for about four labels
        item.getAxis("left").setTicks([[(i, str(layer)) for i, layer in enumerate(layers) if i % every == 0]])
        item.setYRange(-0.5, len(layers) - 0.5, padding=0)
        chosen = [layers[r] for r in rows]
        common = max(set(chosen), key=chosen.count) if chosen else None
        top = f" · colour: JSD, 0 to {image.max():.2g} nats" if n else ""
        most = f" (layer {common}: {chosen.count(common)} of {n})" if common is not None else ""
        item.setTitle(f"DoLa: ● premature layer{most}{top}", size="10pt")

    def _strip_ticks(self) -> None:
        """Token texts under the steps: every one when they fit, else every k-th (at the strip's current size)."""
        item = self.strip.getPlotItem()
        box = item.getViewBox()
        low, high = box.viewRange()[0]
        per_step = box.width() / max(high - low, 1.0)
        stride = max(1, math.ceil(56 / max(per_step, 1e-6)))  # a shortened label is ~55 px wide
        item.getAxis("bottom").setTicks([[(float(j), _short(visible_token_text(r.text if r.text is not None else "…")))
                                          for j, r in enumerate(self.state.steps) if j % stride == 0]])

    @staticmethod
    def _step_brush(changed: bool, forced: bool) -> QBrush:
        if forced:
            return QBrush(QColor(SAME_COLOR), Qt.BrushStyle.BDiagPattern)
        return pg.mkBrush(CHANGED_COLOR if changed else SAME_COLOR)

    def _draw_strip_band(self) -> None:
        shown = self.shown_step
        if shown is None:
            clear_bars(self._strip_band)
        else:
            self._strip_band.setOpts(x=[shown], y0=[-0.55], height=[2.1], width=1.0)

    def _draw_step(self) -> None:
        state, index = self.state, self.shown_step
        top_panel, bottom_panel = self.panels[0], self.panels[2]
        for mark in self._marks:
            mark.setVisible(False)
        if index is None or index >= len(state.steps):
            for bars in (self.expert_bars, self.amateur_bars, self.contrast_bars, *self._shades, *self._bands):
                clear_bars(bars)
            self._cut_line.setVisible(False)
            bottom_panel.getAxis("bottom").setTicks([[]])
            top_panel.setTitle("Selected step (none yet)", size="10pt")
            self.shown = []
            self.step_panel.setText("<b>Selected step</b><br><i>Steps appear as the run goes.</i>")
            return
        record = state.steps[index]
        s = record.contrast
        alpha = self.what_if_alpha()
        what_if = self.replay.choices[index] if self.replay is not None else None
        must = {s.token_id, s.contrast_token_id, s.expert_token_id} | ({what_if} if what_if is not None else set())
        shown = self.shown = shown_candidates(record, must)
        plausible = record.plausible_at(alpha)
        inside = {c.token_id for c, ok in zip(s.candidates, plausible, strict=True) if ok}
        n = len(shown)
        xs = np.arange(n, dtype=float)
        expert = [max(c.expert_logprob, FLOOR) for c in shown]
        amateur = [max(c.amateur_logprob, FLOOR) for c in shown]
        scores = [raw_score(c) if c.token_id in inside else math.nan for c in shown]
        drawn = [(x, v) for x, v in zip(xs, scores, strict=True) if math.isfinite(v)]
        self.expert_bars.setOpts(x=xs, height=expert, width=BAR_WIDTH)
        self.amateur_bars.setOpts(x=xs, height=amateur, width=BAR_WIDTH)
        self.contrast_bars.setOpts(x=[x for x, _ in drawn], height=[v for _, v in drawn], width=BAR_WIDTH)
        cut = record.expert_max + math.log(alpha) if alpha > 0 else -math.inf
        ranges = [_padded([*expert, *([cut] if math.isfinite(cut) else [])], room_above=0.35),
                  _padded(amateur), _padded([v for _, v in drawn])]
        outside = [x for x, c in zip(xs, shown, strict=True) if c.token_id not in inside]
        chosen_x = [x for x, c in zip(xs, shown, strict=True) if c.token_id == s.token_id]
        for panel, shade, band, (bottom, top) in zip(self.panels, self._shades, self._bands, ranges, strict=True):
            shade.setOpts(x=outside, y0=[bottom] * len(outside), height=[top - bottom] * len(outside), width=1.0)
            band.setOpts(x=chosen_x, y0=[bottom] * len(chosen_x), height=[top - bottom] * len(chosen_x), width=1.0)
            panel.setYRange(bottom, top, padding=0)
        self._cut_line.setVisible(math.isfinite(cut))
        if math.isfinite(cut):
            self._cut_line.setValue(cut)
            self._cut_line.label.setFormat(f"cut {cut:.2f}")
        mark_y = 0.05 * (ranges[0][1] - ranges[0][0])
        for slot, (x, c) in enumerate(zip(xs, shown, strict=True)):
            marks = []
            if c.token_id == s.token_id:
                marks.append("★")
            if c.token_id == s.expert_token_id:
                marks.append("▲")
            if what_if is not None and c.token_id == what_if and abs(alpha - record.alpha) > 1e-12:
                marks.append("◆")
            if marks:
                mark = self._marks[slot]
                mark.setText(" ".join(marks))
                mark.setVisible(True)
                self._mark_texts.place(mark, x, mark_y)
        bottom_panel.getAxis("bottom").setTicks([[(float(x), _short(visible_token_text(c.text)))
                                                  for x, c in zip(xs, shown, strict=True)]])
        top_panel.setXRange(-0.6, max(n, 4) - 0.4, padding=0)
        verdict = "changed" if s.changed else "kept"  # short: a narrow chart is at least as wide as its title
        top_panel.setTitle(f"Step {index}: {verdict} the choice · {s.plausible_count} plausible at "
                           f"α = {record.alpha:g}", size="10pt")
        self.step_panel.setText(self._step_html(record, index, alpha, inside))

    def _step_html(self, record: StepRecord, index: int, alpha: float, inside: set[int]) -> str:
        s = record.contrast
        text = html.escape(visible_token_text(record.text if record.text is not None else s.text))
        expert = html.escape(visible_token_text(s.expert_text))
        if s.forced:
            head = f"<b>Step {index}</b>: “{text}” was forced (branching)"
        elif s.changed:
            head = (f"<b>Step {index}</b>: chose “{text}” — the expert alone would have said “{expert}”: "
                    f"<b style='color:{CHANGED_COLOR}'>changed</b>")
        else:
            head = f"<b>Step {index}</b>: chose “{text}”, the expert's own top token too"
        if s.layer_jsd and self.state.started is not None:
            pairs = zip(self.state.started.dola_layers, s.layer_jsd, strict=False)
            jsd = ", ".join(f"<b>{j}</b>: {d:.3g}" if j == s.premature_layer else f"{j}: {d:.3g}" for j, d in pairs)
            head += (f"<br>DoLa: amateur = layer <b>{s.premature_layer}</b>, the largest JSD from the last layer "
                     f"(nats, by layer: {jsd})")
        cut_p = math.exp(record.expert_max) * alpha
        what = "" if abs(alpha - record.alpha) < 1e-12 else " (what-if)"
        cut = (f"Cut at α = {alpha:g}{what}: p<sub>expert</sub> ≥ {alpha:g} × "
               f"{_percent(math.exp(record.expert_max))} = {_percent(cut_p)}")
        count = f"{s.plausible_count} plausible at the run's α = {record.alpha:g}"
        rows = []
        for c in self.shown:
            mark = "★" if c.token_id == s.token_id else ("▲" if c.token_id == s.expert_token_id else "")
            ok = c.token_id in inside
            score = _nats(raw_score(c)) if ok else "<span style='color:#888'>cut</span>"
            rows.append(
                f"<tr><td>{mark}</td><td style='font-family:DejaVu Sans Mono'>"
                f"{html.escape(visible_token_text(c.text))}</td>"
                f"<td align='right'>{_percent(math.exp(c.expert_logprob))}</td>"
                f"<td align='right'>{_percent(math.exp(c.amateur_logprob))}</td>"
                f"<td align='right'>{score}</td>"
                f"<td align='right'>{_percent(c.prob) if c.plausible else '—'}</td></tr>")
        table = ("<table cellspacing='3'><tr><th></th><th align='left'>token</th>"
                 f"<th style='color:{EXPERT_COLOR}'>p expert</th><th style='color:{AMATEUR_COLOR}'>p amateur</th>"
                 f"<th style='color:{CONTRAST_COLOR}'>score</th><th>chosen from</th></tr>{''.join(rows)}</table>")
        timing = f"amateur {s.amateur_ms:.2f} ms · contrast maths {s.contrast_ms:.2f} ms"
        note = "score in nats; “chosen from”: the softmax of the scores over the plausible set"
        self.step_panel.setToolTip(f"{note}<br>{timing}" if self._short else "")  # short: footnote, timing on hover
        return (f"{head}<br>{cut} · {count}<br>{table}" if self._short
                else f"{head}<br>{cut} · {count}<br>{table}<i>{note}</i><br>{timing}")

    def _what_if_html(self) -> str:
        replay, state = self.replay, self.state
        if replay is None:
            return ""
        sampled = state.started is not None and state.started.do_sample
        pick = "the highest score" if sampled else "the choice"
        unknown = (f" · <b>{replay.unknown}</b> unknown (the cut lets in tokens the run did not record)"
                   if replay.unknown else "")
        differs = "" if sampled else f" · differs from the run's choice at <b>{replay.differences}</b>"
        caveat = ("First-order: a changed token would change every later step's context; the amateur's own "
                  "settings need a new run.")
        self.what_if_note.setToolTip(caveat if self._short else "")  # a short dock: the caveat on hover
        return (f"<i>What-if, nothing regenerated</i>: at α = {replay.alpha:g}, {pick} differs from the expert's top "
                f"token at <b>{replay.changes}</b> of {replay.known} steps{differs}{unknown}."
                + ("" if self._short else f" <i>{caveat}</i>"))

    def _draw_texts(self) -> None:
        state = self.state
        if state.started is None and not state.steps:
            self.figures.setText("")
            return
        if state.stop_reason:
            status = f"finished ({html.escape(state.stop_reason)})"
        elif state.ended_status:
            status = f"<b>{html.escape(state.ended_status)}</b>"
        else:
            status = "running…" if state.steps else "waiting for the first step…"
        started = state.started
        if started is not None:
            temperature = f" at T = {started.amateur_temperature:g}" if started.amateur_temperature != 1 else ""
            mode = "sampled from the normalised scores" if started.do_sample else "greedy on the scores"
            what = (f" · amateur <b>{html.escape(started.amateur)}</b>: {html.escape(started.detail)}{temperature} · "
                    f"α = {started.alpha:g} · {mode}")
        else:
            what = ""
        self.header.setText(f"<b>Contrastive decoding</b>{what} · {len(state.steps)} steps · {status}")
        self.figures.setText(self._figures_html())

    def _figures_html(self) -> str:
        s = self.state
        n = len(s.steps)
        if not n:
            return ""
        chosen = n - s.forced
        share = format_percent(s.changed / chosen) if chosen else "—"
        rows = [f"<b>This run</b>: the contrast changed the expert's choice at <b>{s.changed}</b> of {chosen} steps "
                f"({share}) · plausible set: {s.mean_plausible:.1f} tokens on average · per step: amateur "
                f"{s.mean_ms(s.amateur_ms):.2f} ms, contrast maths {s.mean_ms(s.contrast_ms):.2f} ms, whole step "
                f"{s.mean_ms(s.step_ms):.1f} ms"]
        f = s.figures
        if "step_cost" in f:
            divergence = f.get("first_divergence")
            where = "" if divergence is None else (" · identical to greedy" if divergence < 0 else
                                                   f" · first differs from greedy at token {int(divergence)}")
            rows.append(f"<b>Against plain greedy</b> (measured after the run, same prompt): a contrastive step costs "
                        f"<b>{f['step_cost']:.2f}×</b> a greedy step ({s.tokens_per_s:.1f} vs "
                        f"{f['greedy_tokens_per_s']:.1f} tokens/s){where}")
        return "<br>".join(rows)

    # --- data -----------------------------------------------------------------------------------------------
    def export_data(self, path: Path) -> None:
        """Every recorded candidate of every step, one row each."""
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(CSV_COLUMNS)
            for record in self.state.steps:
                s = record.contrast
                for c in s.candidates:
                    writer.writerow([s.step, c.token_id, c.text, c.expert_rank, repr(c.expert_logprob),
                                     repr(c.amateur_logprob), repr(c.score), int(c.plausible), repr(c.prob),
                                     int(c.token_id == s.token_id), int(c.token_id == s.expert_token_id)])
