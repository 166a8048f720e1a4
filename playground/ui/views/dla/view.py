"""The "why this token" view: where the model hesitated, when it committed, and which layers and heads pushed a
token over its alternative.

- Uncertainty strip (every step): entropy (bits) and varentropy (bits²) of the raw distribution, each step's dot
  coloured by its entropix quadrant (thresholds in the legend).
- Commitment strip (runs recorded with the lens): per emitted token, the first layer from which the lens keeps it
  at top-1 (top row) and within its top 5 (bottom row), dark = early, yellow = late, grey = never.
- Logit attribution (steps attributed: ``--attribute-steps``, the Attribute button, or a candidate's "Why this and
  not it?" in the tokens view): the chosen step's logit difference A − B split over each layer's attention (blue)
  and MLP (orange) output, one row per layer; click a layer to open its heads beneath it (``layers.LayerBars``).
  Beside them the running sum across layers against the logit lens's own difference of the same pair; below, every
  head at once as a heat map (click a layer's column to open its heads above).
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from playground.events import Event, LayerStep, TokenStep
from playground.events.dla import LogitAttribution
from playground.state import Run, visible_token_text
from playground.state.dla import ATTRIBUTION, COMMITMENT, QUADRANTS, UNCERTAINTY, DlaFold
from playground.ui.style import RAW_COLOR
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.dla.layers import LayerBars
from playground.ui.views.drawing import ThrottledDraw

QUADRANT_COLORS = {"flowing": "#009988", "careful": "#0077BB", "forks": "#EE7733", "mist": "#CC3311",
                   "middle": "#BBBBBB"}
LIVE_DRAW_MS = 300  # a streaming run's strips redraw at most this often
CONTENT_HEIGHT = 640  # px: the default window's dock shows it whole; a shorter one scrolls


def _token_ticks(texts: list[str], limit: int = 40) -> list[list[tuple[float, str]]]:
    every = max(1, (len(texts) + limit - 1) // limit)
    return [[(float(i), visible_token_text(t)[:10]) for i, t in enumerate(texts) if i % every == 0]]


def _largest(values: tuple[float, ...], n: int = 2) -> list[int]:
    """The indices of the ``n`` values largest in size."""
    return sorted(range(len(values)), key=lambda i: -abs(values[i]))[:n]


@register_view
class DlaView(View):
    name = "dla"
    attributes = True
    title = "Why this token"
    consumes = (LogitAttribution, LayerStep)
    attribution_requested = Signal(int, int)  # step, alternative token id (-1: the runner-up)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = DlaFold()
        self.run: Run | None = None
        self.header = QLabel("Why this token: run with the lens (--lens) or attribute steps (--attribute-steps).")
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.PlainText)

        self.uncertainty = pg.PlotWidget()
        self.uncertainty.setLabel("left", "H, V")
        self.uncertainty.showGrid(x=True, y=True, alpha=0.3)
        self.uncertainty.addLegend(offset=(-4, 4), colCount=3)
        self.entropy_curve = self.uncertainty.plot([], [], pen=pg.mkPen(RAW_COLOR, width=2), name="entropy H")
        dashed = pg.mkPen("#444444", width=1, style=Qt.PenStyle.DashLine)
        self.varentropy_curve = self.uncertainty.plot([], [], pen=dashed, name="varentropy V")
        # One scatter per quadrant, each with one brush: pyqtgraph draws a uniform scatter from one cached symbol,
        # where a brush per point rendered every symbol again on each redraw (most of the GUI thread's time by the
        # end of a long run).
        self.quadrant_dots = {q: pg.ScatterPlotItem(size=9, pen=None, brush=pg.mkBrush(colour))
                              for q, colour in QUADRANT_COLORS.items()}
        for dots in self.quadrant_dots.values():
            self.uncertainty.addItem(dots)
        swatches = "; ".join(f"<span style='color:{QUADRANT_COLORS[q]}'>&#9679;</span> {html.escape(text)}"
                             for q, text in QUADRANTS.items())
        self.quadrant_note = QLabel(f"Dots: entropix's quadrants (H bits, V bits²): {swatches}")
        self.quadrant_note.setTextFormat(Qt.TextFormat.RichText)
        self.quadrant_note.setWordWrap(True)

        self.commitment = pg.PlotWidget()
        self.commitment.setTitle("Commitment: first layer from which the lens keeps the emitted token (grey: never)",
                                 size="9pt")
        self.commitment.getAxis("left").setTicks([[(0.5, "top-5"), (1.5, "top-1")]])
        self.commitment_image = pg.ImageItem(axisOrder="row-major")
        self.commitment.addItem(self.commitment_image)
        self.commitment_bar = pg.ColorBarItem(values=(1, 2), colorMap=pg.colormap.get("viridis"), interactive=False,
                                              label="layer")
        self.commitment_bar.setImageItem(self.commitment_image, insert_in=self.commitment.getPlotItem())
        self.commitment.setXLink(self.uncertainty)

        self.step_choice = QComboBox()
        self.step_choice.currentIndexChanged.connect(lambda _i: self._draw_attribution())
        self.ask_step = QSpinBox()
        self.ask_step.setPrefix("step ")
        self.ask_button = QPushButton("Attribute")
        self.ask_button.setToolTip("Split this step's logit difference (its token over the runner-up) by layer and "
                                   "head: one extra forward pass of the loaded model")
        self.against_choice = QComboBox()
        self.against_choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.against_choice.setToolTip("The alternative B: the runner-up, or any candidate the step recorded")
        self.ask_step.valueChanged.connect(lambda _v: self._fill_against())
        self.ask_button.clicked.connect(lambda: self.attribution_requested.emit(
            self.ask_step.value(), int(self.against_choice.currentData() if self.against_choice.count() else -1)))
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)

        self.bars = LayerBars()
        self.bars.setToolTip("")
        self.bars.toggled.connect(lambda _layer: self._fit_content())

        self.running = pg.PlotWidget()
        self.running.setLabel("left", "A − B so far")
        self.running.setLabel("bottom", "layer")
        self.running.showGrid(x=True, y=True, alpha=0.3)
        self.running.addLegend(offset=(8, 4))
        self.running_curve = self.running.plot([], [], pen=pg.mkPen("#222222", width=2), symbol="o", symbolSize=5,
                                               name="running sum (frozen norm)")
        self.lens_curve = self.running.plot([], [], pen=pg.mkPen(RAW_COLOR, width=2, style=Qt.PenStyle.DashLine),
                                            name="logit lens")

        self.heads = pg.PlotWidget()
        self.heads.setLabel("left", "head")
        self.heads.setLabel("bottom", "layer")
        self.heads_image = pg.ImageItem(axisOrder="row-major")
        self.heads.addItem(self.heads_image)
        self.heads.setTitle("Each head's share of A − B (red raises A, blue raises B; click a layer: its heads above)",
                            size="9pt")
        self.heads_bar = pg.ColorBarItem(values=(-1, 1), colorMap=pg.colormap.get("CET-D1"), interactive=False)
        self.heads_bar.setImageItem(self.heads_image, insert_in=self.heads.getPlotItem())
        self.heads.getPlotItem().setMenuEnabled(False)
        self.heads.getPlotItem().setMouseEnabled(x=False, y=False)
        self.heads.scene().sigMouseClicked.connect(self._heads_clicked)

        ask = QHBoxLayout()
        ask.addWidget(QLabel("Attributed step"))
        ask.addWidget(self.step_choice, 1)
        ask.addWidget(self.ask_step)
        ask.addWidget(QLabel("over"))
        ask.addWidget(self.against_choice)
        ask.addWidget(self.ask_button)
        charts = QHBoxLayout()
        charts.addWidget(self.bars, 3, Qt.AlignmentFlag.AlignTop)
        charts.addWidget(self.running, 2)
        for plot, least in ((self.uncertainty, 110), (self.commitment, 100), (self.running, 150), (self.heads, 110)):
            # the word-wrapped labels make the scroll area size its content by height-for-width, which would
            # add up the plots' preferred 480-600 px: a plot takes the room it is given, at least ``least``
            plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
            plot.setMinimumHeight(least)
        self.content = content = QWidget()
        content.setMinimumHeight(CONTENT_HEIGHT)  # below it the dock scrolls: the plots keep room for their axes
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        layout = QVBoxLayout(content)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.uncertainty, 2)
        layout.addWidget(self.quadrant_note)
        layout.addWidget(self.commitment, 1)
        layout.addLayout(ask)
        layout.addWidget(self.summary)
        layout.addLayout(charts, 3)
        layout.addWidget(self.heads, 2)
        self._shown: list[tuple[int, int]] = []  # the steps in the step list, with their alternatives
        self._wanted: int | None = None  # the step asked for from another view: shown when its attribution comes
        self._against_step = -1  # the step whose alternatives the "over" list holds
        self._pending: set[str] = set()  # parts changed and not drawn yet
        self._live = ThrottledDraw(self, LIVE_DRAW_MS, self._draw_pending)
        self.reset()

    # --- the view interface ---------------------------------------------------------------------------------
    def applies_to(self, run: Run) -> bool:
        return super().applies_to(run) or any(isinstance(e, TokenStep) for e in run.steps[:1])

    def explain_alternative(self, step: int, against: int) -> bool:
        """The step and alternative picked in another view (a candidate's "Why this and not it?"): shown at once when
        the run holds that attribution, else asked for (``attribution_requested``: the window's Attribute job)."""
        self._wanted = step
        if self.run is not None:  # a view behind another has not drawn the run's steps (nor set the range) yet
            self.ask_step.setMaximum(max(self.ask_step.maximum(), len(self.run.steps) - 1))
        self.ask_step.setValue(step)
        self._fill_against()
        index = self.against_choice.findData(against)
        if index < 0:
            self.against_choice.addItem(f"token {against}", against)
            index = self.against_choice.count() - 1
        self.against_choice.setCurrentIndex(index)
        have = self.state.attributions.get(step)
        if have is not None and have.against_id == against:
            self._draw_pending()
            self._draw_choices()
        else:
            self.attribution_requested.emit(step, against)
        return True

    def reset(self) -> None:
        self.run = None
        self._wanted = None
        self.bars.expanded.clear()
        self._live.cancel()
        self._pending = set()
        self.state.reset()
        self._draw(self.state.take_dirty())

    def apply(self, run: Run, events: list[Event]) -> None:
        self.run = run
        for event in events:
            self.state.apply(event)

    def flush(self) -> None:
        """What changed, drawn: at most every LIVE_DRAW_MS while a run streams, and not at all while the view is
        hidden or a tab behind another (it draws when it comes to the front): it applies to every run that decodes
        tokens, and redrawing its strips on each batch took ~30 ms of the GUI thread per token by the end of a long
        run."""
        self._pending |= self.state.take_dirty()
        if self._pending and self.isVisible() and not self.behind:
            self._live.request(streaming=self.run is not None and self.run.running)

    def _draw_pending(self) -> None:
        parts, self._pending = self._pending, set()
        if parts:
            self._draw(parts)

    def catch_up(self) -> None:
        self._live.cancel()
        self._draw_pending()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._draw_pending()

    def end(self, run: Run) -> None:
        self.run = run
        self._live.cancel()
        if not self.state.ended:
            self.state.end(run.status)
        parts, self._pending = self._pending | self.state.take_dirty() | {UNCERTAINTY, COMMITMENT, ATTRIBUTION}, set()
        self._draw(parts)

    # --- drawing ----------------------------------------------------------------------------------------------
    def _draw(self, parts: set[str]) -> None:
        if UNCERTAINTY in parts:
            self._draw_uncertainty()
        if COMMITMENT in parts:
            self._draw_commitment()
        if ATTRIBUTION in parts:
            self._draw_choices()
        self._draw_header()

    def _draw_header(self) -> None:
        s = self.state
        if not s.steps:
            self.header.setText("Why this token: each step's uncertainty; with the lens (--lens) when each token was "
                                "decided; with --attribute-steps (or Attribute) which layers and heads pushed it.")
            return
        counted: dict[str, int] = {}
        for step in s.steps:
            if step.quadrant:
                counted[step.quadrant] = counted.get(step.quadrant, 0) + 1
        quadrants = ", ".join(f"{n} {q}" for q, n in sorted(counted.items(), key=lambda kv: -kv[1]))
        committed = [c.top1 for c in s.commitments if c.top1 is not None]
        late = sum(1 for c in committed if s.layers and c > 0.75 * s.layers)
        commit = (f"; committed (top-1 kept) at layer {np.median(committed):.0f} of {s.layers} on median, "
                  f"{late} of {len(s.commitments)} only in the last quarter" if committed else
                  "; commitment: record the lens (--lens)")
        self.header.setText(f"{len(s.steps)} steps: {quadrants or 'varentropy not recorded'}{commit}; "
                            f"{len(s.attributions)} attributed.")

    def _draw_uncertainty(self) -> None:
        steps = self.state.steps
        x = np.arange(len(steps), dtype=float)
        self.entropy_curve.setData(x, [s.entropy for s in steps])
        known = [(i, s) for i, s in enumerate(steps) if s.varentropy is not None]
        self.varentropy_curve.setData([float(i) for i, _ in known], [s.varentropy or 0.0 for _, s in known])
        for q, dots in self.quadrant_dots.items():
            mine = [(i, s) for i, s in known if (s.quadrant or "middle") == q]
            dots.setData([float(i) for i, _ in mine], [s.entropy for _, s in mine])
        self.uncertainty.setXRange(-0.5, max(len(steps), 1) - 0.5, padding=0.02)
        ticks = _token_ticks([s.text for s in steps])
        self.uncertainty.getAxis("bottom").setTicks(ticks)
        self.commitment.getAxis("bottom").setTicks(ticks)
        self.ask_step.setRange(0, max(0, len(steps) - 1))
        self._fill_against()

    def _fill_against(self) -> None:
        """The alternatives offered for the asked step: the runner-up, then the step's recorded candidates."""
        steps = self.run.steps if self.run is not None else []
        step = self.ask_step.value()
        kept = self.against_choice.currentData() if step == self._against_step else None  # a redraw keeps the pick
        self._against_step = step
        self.against_choice.blockSignals(True)
        self.against_choice.clear()
        self.against_choice.addItem("the runner-up", -1)
        if step < len(steps):
            chosen = steps[step].token_id
            for c in steps[step].candidates:
                if c.token_id != chosen:
                    self.against_choice.addItem(f"'{visible_token_text(c.text)}' ({c.raw_prob:.1%})", c.token_id)
        self.against_choice.setCurrentIndex(max(0, self.against_choice.findData(kept)) if kept is not None else 0)
        self.against_choice.blockSignals(False)

    def _draw_commitment(self) -> None:
        s = self.state
        n = len(s.steps)
        if not s.commitments or not n:
            self.commitment_image.clear()
            return
        image = np.full((2, n), np.nan)
        for c in s.commitments:
            if c.step < n:
                image[1, c.step] = c.top1 if c.top1 is not None else np.nan
                image[0, c.step] = c.topk if c.topk is not None else np.nan
        self.commitment_image.setImage(image, autoLevels=False)
        self.commitment_image.setRect(-0.5, 0, n, 2)
        self.commitment_bar.setLevels((1, max(2, s.layers)))

    def _draw_choices(self) -> None:
        attributions = self.state.attributions
        shown = [(step, attributions[step].against_id) for step in sorted(attributions)]
        wanted = self._wanted if self._wanted in attributions else None
        if shown != self._shown or wanted is not None:
            self.step_choice.blockSignals(True)
            if shown != self._shown:
                self._shown = shown
                self.step_choice.clear()
                for step, _against in shown:
                    a = attributions[step]
                    self.step_choice.addItem(f"step {step}: '{visible_token_text(a.token_text)}' over "
                                             f"'{visible_token_text(a.against_text)}'", step)
                self.step_choice.setCurrentIndex(len(shown) - 1 if shown else -1)
            if wanted is not None:  # asked for from another view: show it, not the newest
                self.step_choice.setCurrentIndex(self.step_choice.findData(wanted))
                self._wanted = None
            self.step_choice.blockSignals(False)
        self._draw_attribution()

    def _fit_content(self) -> None:
        """The content as tall as the layer chart needs (its open heads add rows): the dock scrolls."""
        self.content.setMinimumHeight(CONTENT_HEIGHT + max(0, self.bars.needed_height() - 150))

    def _heads_clicked(self, event) -> None:
        """A click on the heat map's column of a layer opens that layer's heads in the bars above."""
        a = self.bars.attribution
        view = self.heads.getPlotItem().getViewBox()
        if a is None or event.button() != Qt.MouseButton.LeftButton:
            return
        if not view.sceneBoundingRect().contains(event.scenePos()):
            return
        layer = round(view.mapSceneToView(event.scenePos()).x()) - 1
        if 0 <= layer < len(a.attention):
            event.accept()
            self.bars.expand(layer)

    def _draw_attribution(self) -> None:
        step = self.step_choice.currentData()
        a = self.state.attributions.get(step) if step is not None else None
        self.bars.show_attribution(a)
        self._fit_content()
        if a is None:
            self.running_curve.setData([], [])
            self.lens_curve.setData([], [])
            self.heads_image.clear()
            missing = "; ".join(self.state.missing)
            self.summary.setText(missing or "No step attributed yet: --attribute-steps, or pick a step and "
                                 "Attribute (the loaded model reads the run once more).")
            return
        layers = np.arange(1, len(a.attention) + 1, dtype=float)
        self.running_curve.setData(layers, list(a.running))
        self.lens_curve.setData(layers, list(a.lens))
        heads = np.array(a.heads, dtype=float).T  # [heads, layers]
        self.heads_image.setImage(heads, autoLevels=False)
        self.heads_image.setRect(0.5, -0.5, heads.shape[1], heads.shape[0])
        top = float(np.abs(heads).max()) if heads.size else 1.0
        self.heads_bar.setLevels((-top or -1.0, top or 1.0))
        best = np.unravel_index(int(np.argmax(np.abs(heads))), heads.shape) if heads.size else (0, 0)
        attn_top = ", ".join(f"L{i + 1} {a.attention[i]:+.2f}" for i in _largest(a.attention))
        mlp_top = ", ".join(f"L{i + 1} {a.mlp[i]:+.2f}" for i in _largest(a.mlp))
        cap = (f"; after soft-capping at {a.softcap:g}: {a.capped_difference:+.3f}" if a.softcap else "")
        other = sum(a.other)
        steer = f"; other writes (steering) {other:+.3f}" if abs(other) > 1e-3 else ""
        self.summary.setText(
            f"Step {a.step}: '{visible_token_text(a.token_text)}' over '{visible_token_text(a.against_text)}' by "
            f"Δ {a.difference:+.3f} logits{cap} = embeddings {a.embeddings:+.3f} + attention {sum(a.attention):+.3f} "
            f"+ MLP {sum(a.mlp):+.3f} + norm bias {a.norm_bias:+.3f}{steer}. Largest attention: {attn_top}; MLP: "
            f"{mlp_top}; head L{best[1] + 1}H{best[0]} {heads[best]:+.2f}. Linearised: {a.linearisation}.")
