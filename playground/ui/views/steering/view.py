"""The steering view: what a steering vector did to each token, and where the model is along the vector.

- A live strength slider (a run streaming here): the next token uses the new strength, the text marks where it
  changed; the earlier tokens' cache is not recomputed (the view says so).
- The representation reading: decoder blocks × tokens, the residual's projection onto the vector's unit direction.
- Per token, with the unsteered comparison recorded (``--steer-compare``): the chosen token's steered and unsteered
  probability and KL(steered ‖ unsteered) (a plot and a table); without it, how to turn it on and what it costs.
- The strength also relative to the steered blocks' residual norm (strength × ‖direction‖ / median ‖h‖ over the
  prompt's positions after the first: position 0, the attention sink, has a norm many times the others'): a
  unit-norm PCA direction and a mean difference of the same bare strength push very differently.
"""

from __future__ import annotations

import html
import math
from typing import ClassVar

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSlider,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from playground.config.steering import SteeringSettings
from playground.config.steering_sweep import SteeringSweepSettings
from playground.events.steering import SteerStep
from playground.state import Run, visible_token_text
from playground.state.steering import SteeringState, format_strengths
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import fill_with_scroll, static_plot
from playground.ui.views.steering.heatmap import CHANGE_COLOR, NEGATIVE, POSITIVE, ProjectionMap
from playground.ui.views.steering.text import SteeredText, change_tooltip
from playground.ui.views.texts import status_html

STEERED_COLOR = "#EE7733"  # Tol's orange: the steered model
UNSTEERED_COLOR = "#0077BB"  # Tol's blue: the unsteered model
KL_COLOR = "#009988"
SLIDER_NOTCHES = 100  # notches on each side of 0
CACHE_NOTE = ("Moving the slider changes the strength from the <b>next token</b> on; the cache of the earlier "
              "tokens is <b>not recomputed</b> (their keys and values keep the strength they were computed with).")
COMPARE_OFF = ("<b>Unsteered comparison off.</b> Tick <i>compare with unsteered</i> in the steering settings "
               "(<tt>--steer-compare</tt>) to see each token's unsteered probability and the KL between the two "
               "distributions. It costs one more forward pass of the whole model per step (about twice a step's "
               "time) and an unsteered read of the prompt.")
RELATIVE_TIP = ("× ‖h‖: the strength relative to the residual it is added to, strength × ‖direction‖ / median ‖h‖ of "
                "the block's output over the prompt's positions after the first (position 0, the attention sink, "
                "has a norm many times the others' and would make every strength look small); a range: the "
                "smallest and largest over the vector's blocks")
TABLE_COLUMNS = ("#", "token", "strength", "p steered", "p unsteered", "KL (nats)")


def slider_top(strength: float) -> float:
    """The slider's end (± this): twice the settings' strength, at least 2, rounded up to a whole number."""
    return float(max(2, math.ceil(2 * abs(strength))))


def relative_text(state: SteeringState, strength: float, vector: int = 0) -> str:
    """"0.12–0.31× ‖h‖" (the strength against the steered blocks' residual norm), or "" when not known."""
    span = state.relative_range(strength, vector)
    if span is None:
        return ""
    low, high = span
    return f"{low:.2f}× ‖h‖" if math.isclose(low, high, rel_tol=0.005) else f"{low:.2f}–{high:.2f}× ‖h‖"


def table_cells(state: SteeringState, index: int) -> tuple[str, ...]:
    """One token's row of the table."""
    token = state.tokens[index]
    s = token.steer

    def prob(value: float | None) -> str:
        return format_percent(value) if value is not None else "—"

    text = visible_token_text(token.text) if token.text is not None else "…"
    return (str(index), text, format_strengths(s.strengths), prob(s.steered_prob), prob(s.unsteered_prob),
            f"{s.kl:.4f}" if s.kl is not None else "—")


@register_view
class SteeringView(FoldView):
    name = "steering"
    title = "Steering"
    consumes = (SteerStep,)
    sets_strength: ClassVar[bool] = True  # the window routes ``strength_requested`` to the running run
    idle_header = ("<b>Steering</b> — generate with a steering vector (<tt>--steer FILE[:STRENGTH]</tt>): what it "
                   "does to each token, and where the model is along the vector, appear here.")

    strength_requested = Signal(float)  # the slider moved: the running run's new strength (every vector's)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: SteeringState = SteeringState()
        self.vector = 0  # the vector the heat map reads
        self._rows = 0  # table rows filled
        self._slider_strength: float | None = None  # the slider's value as a strength (None: not set yet)
        self._build()
        self._start_drawing()

    # --- building -------------------------------------------------------------------------------------------
    def _build(self) -> None:
        content = QWidget(self)
        layout = QVBoxLayout(content)
        self.header = rich_label(content)
        layout.addWidget(self.header)
        live = QHBoxLayout()
        self.slider_label = QLabel("<b>Strength</b> (live)", content)
        self.slider = QSlider(Qt.Orientation.Horizontal, content)
        self.slider.setRange(-SLIDER_NOTCHES, SLIDER_NOTCHES)
        self.slider.setMinimumWidth(160)
        self.slider.setToolTip("The strength of every steering vector of the running run: the next token uses it")
        self.slider_value = QLabel(content)
        self.slider_value.setToolTip(RELATIVE_TIP)
        self.slider_value.setMinimumWidth(self.slider_value.fontMetrics().horizontalAdvance("+00.00 · 0.00–0.00× ‖h‖"))
        self.vector_box = QComboBox(content)
        self.vector_box.setToolTip("The vector the heat map reads the residual along")
        self.vector_box.currentIndexChanged.connect(self._vector_changed)
        live.addWidget(self.slider_label)
        live.addWidget(self.slider, stretch=1)
        live.addWidget(self.slider_value)
        live.addWidget(self.vector_box)
        layout.addLayout(live)
        self.cache_note = rich_label(content)
        self.cache_note.setText(f"<i>{CACHE_NOTE}</i>")
        layout.addWidget(self.cache_note)
        self.map = ProjectionMap(content)
        layout.addWidget(self.map.plot, stretch=3)
        self.legend = rich_label(content)
        self.legend.setText(
            f"<span style='background:{POSITIVE};color:white'>&nbsp;red&nbsp;</span> along the vector (its positive "
            f"side) · <span style='background:{NEGATIVE};color:white'>&nbsp;blue&nbsp;</span> against it · white: "
            "neither. A cell: block N's output where the token was predicted (before N's own vector is added) · the "
            f"vector's unit direction. <span style='color:{CHANGE_COLOR}'><b>│ ▶</b></span> live strength change.")
        layout.addWidget(self.legend)
        self.compare_note = rich_label(content)
        layout.addWidget(self.compare_note)
        middle = QHBoxLayout()
        self.text = SteeredText(content)
        self.text.setMinimumHeight(100)
        self.table = QTableWidget(0, len(TABLE_COLUMNS), content)
        self.table.setHorizontalHeaderLabels(list(TABLE_COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.prob_plot = static_plot(content, f"Chosen token's p: <span style='color:{STEERED_COLOR}'>steered</span>"
                                     f" · <span style='color:{UNSTEERED_COLOR}'>unsteered</span>", "generated token",
                                     "p", min_height=100)
        item = self.prob_plot.getPlotItem()
        self.steered_curve = item.plot([], [], pen=pg.mkPen(STEERED_COLOR, width=2), symbol="o", symbolSize=5,
                                       symbolBrush=STEERED_COLOR, symbolPen=None)
        self.unsteered_curve = item.plot([], [], pen=pg.mkPen(UNSTEERED_COLOR, width=2, style=Qt.PenStyle.DashLine),
                                         symbol="s", symbolSize=5, symbolBrush=UNSTEERED_COLOR, symbolPen=None)
        self.prob_changes = pg.PlotDataItem([], [], pen=pg.mkPen(CHANGE_COLOR, width=2), connect="pairs")
        item.addItem(self.prob_changes)
        item.setYRange(0, 1.05, padding=0)
        self.kl_plot = static_plot(content, "KL(steered ‖ unsteered)", "generated token", "nats", min_height=100)
        self.kl_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=KL_COLOR, pen=pg.mkPen(None))
        self.kl_plot.getPlotItem().addItem(self.kl_bars)
        self.kl_changes = pg.PlotDataItem([], [], pen=pg.mkPen(CHANGE_COLOR, width=2), connect="pairs")
        self.kl_plot.getPlotItem().addItem(self.kl_changes)
        self.tabs = QTabWidget(content)
        self.tabs.addTab(self.table, "per token")
        self.tabs.addTab(self.prob_plot, "probability")
        self.tabs.addTab(self.kl_plot, "KL")
        self.tabs.setMinimumHeight(150)
        middle.addWidget(self.text, stretch=1)
        middle.addWidget(self.tabs, stretch=1)
        layout.addLayout(middle, stretch=2)
        self.figures = rich_label(content)
        layout.addWidget(self.figures)
        fill_with_scroll(self, content)
        self.slider.valueChanged.connect(self._slider_moved)

    # --- the window's calls ---------------------------------------------------------------------------------
    def applies_to(self, run: Run) -> bool:
        return super().applies_to(run) or run.settings.group(SteeringSettings).active()

    def wants_front(self, run: Run) -> bool:
        """A steered run comes here first (a sweep: to the sweep's panes)."""
        return run.settings.group(SteeringSettings).active() and not run.settings.group(SteeringSweepSettings).active()

    def _forget(self) -> None:
        self.vector = 0
        self._rows = 0
        self._slider_strength = None
        self.table.setRowCount(0)
        self.text.forget()
        self.vector_box.blockSignals(True)
        self.vector_box.clear()
        self.vector_box.blockSignals(False)
        self.vector_box.setVisible(False)

    def _ended(self) -> None:
        self._sync_slider()

    # --- the slider -----------------------------------------------------------------------------------------
    def slider_strength(self) -> float:
        return self.slider.value() * self._slider_step()

    def _slider_step(self) -> float:
        started = self.state.started
        strength = started.vectors[0].strength if started is not None and started.vectors else 1.0
        return slider_top(strength) / SLIDER_NOTCHES

    def set_slider_strength(self, strength: float) -> None:
        """Move the slider to ``strength`` as a user would (it sends ``strength_requested`` when live)."""
        self.slider.setValue(round(strength / self._slider_step()))

    def _slider_moved(self, notch: int) -> None:
        strength = notch * self._slider_step()
        self._slider_strength = strength
        self._show_slider_value(strength)
        if self._live():
            self.strength_requested.emit(strength)

    def _live(self) -> bool:
        started = self.state.started
        return started is not None and started.live and not self.state.ended

    def _sync_slider(self) -> None:
        """Slider enabled only for a run streaming here with a live strength; it shows the strength in use."""
        live = self._live()
        self.slider.setEnabled(live)
        self.slider.setToolTip("The strength of every steering vector of the running run: the next token uses it"
                               if live else "The slider steers a run while it streams in this window (a model "
                               "loaded here); this run is not streaming")
        current = self.state.current_strengths()
        if self._slider_strength is None and current:
            self.slider.blockSignals(True)
            self.slider.setValue(round(current[0] / self._slider_step()))
            self.slider.blockSignals(False)
            self._slider_strength = self.slider_strength()
        self._show_slider_value(self._slider_strength if self._slider_strength is not None else 0.0)

    def _show_slider_value(self, strength: float) -> None:
        relative = relative_text(self.state, strength, self.vector)
        self.slider_value.setText(f"{strength:+.2f}" + (f" · {relative}" if relative else ""))

    def _vector_changed(self, index: int) -> None:
        if index >= 0 and index != self.vector:
            self.vector = index
            self._draw()

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_header()
        self._sync_slider()
        self.map.draw(self.state, self.vector)
        self.text.draw(self.state)
        self._draw_table()
        self._draw_plots()

    def _draw_header(self) -> None:
        state = self.state
        started = state.started
        if started is None and not state.tokens:
            return
        if started is not None and self.vector_box.count() != len(started.vectors):
            self.vector_box.blockSignals(True)
            self.vector_box.clear()
            self.vector_box.addItems([f"read along: {v.name or v.source}" for v in started.vectors])
            self.vector_box.blockSignals(False)
            self.vector_box.setVisible(len(started.vectors) > 1)
        status = status_html(state, "waiting for the first token…", under_way=bool(state.tokens))
        parts = ["<b>Steering</b>"]
        if started is not None:
            for i, v in enumerate(started.vectors):
                method = f", {v.method}" if v.method else ""
                blocks = (f"blocks {v.layers[0]}–{v.layers[-1]}" if len(v.layers) > 1 else
                          f"block {v.layers[0]}" if v.layers else "no block")
                relative = relative_text(state, v.strength, i)
                rel = f" = {relative} at its blocks" if relative else ""
                parts.append(f"{html.escape(v.name or v.source)}{method} × {v.strength:+g}{rel} on {blocks}")
        now = state.current_strengths()
        if state.changes:
            parts.append(f"now × {format_strengths(now)} ({len(state.changes)} live change"
                         f"{'s' if len(state.changes) != 1 else ''})")
        parts.append(f"{len(state.tokens)} tokens · {status}")
        self.header.setText(" · ".join(parts))

    def _draw_table(self) -> None:
        state = self.state
        if self._rows > len(state.tokens):
            self.table.setRowCount(0)
            self._rows = 0
        if len(state.tokens) != self.table.rowCount():
            self.table.setRowCount(len(state.tokens))
        # a row whose text had not come yet is filled again
        first = max(0, self._rows - 1)
        for row in range(first, len(state.tokens)):
            for column, text in enumerate(table_cells(state, row)):
                item = self.table.item(row, column)
                if item is None:
                    item = QTableWidgetItem(text)
                    if column != 1:
                        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                    self.table.setItem(row, column, item)
                elif item.text() != text:
                    item.setText(text)
            change = state.change_at(row)
            cell = self.table.item(row, 2)
            if change is not None and cell is not None:
                cell.setToolTip(change_tooltip(change))
                cell.setForeground(pg.mkColor(CHANGE_COLOR))
        self._rows = len(state.tokens)
        if not state.ended and self._rows:
            self.table.scrollToBottom()

    def _draw_plots(self) -> None:
        state = self.state
        compared = state.compared
        for index in (1, 2):  # the plots' tabs; the table stays (its columns say "—")
            self.tabs.setTabVisible(index, compared)
        n = len(state.tokens)
        xs = np.arange(n, dtype=float)
        if compared:
            steered = np.array([np.nan if t.steer.steered_prob is None else t.steer.steered_prob
                                for t in state.tokens])
            unsteered = np.array([np.nan if t.steer.unsteered_prob is None else t.steer.unsteered_prob
                                  for t in state.tokens])
            kl = np.array([0.0 if t.steer.kl is None else t.steer.kl for t in state.tokens])
            self.steered_curve.setData(xs, steered, connect="finite")
            self.unsteered_curve.setData(xs, unsteered, connect="finite")
            self.kl_bars.setOpts(x=xs, height=kl, width=0.8)
            top = float(kl.max()) if kl.size else 0.0
            self.kl_plot.getPlotItem().setYRange(0, max(top, 1e-3) * 1.1, padding=0)
            for plot in (self.prob_plot, self.kl_plot):
                plot.getPlotItem().setXRange(-0.5, max(n, 1) - 0.5, padding=0)
            cx, cy = [], []
            for change in state.changes:
                cx += [change.token - 0.5, change.token - 0.5]
                cy += [0.0, 1.05]
            self.prob_changes.setData(cx, cy)
            self.kl_changes.setData(cx, [y * max(top, 1e-3) * 1.1 / 1.05 for y in cy])
            mean_kl, perplexity = state.mean_kl(), state.unsteered_perplexity()
            self.compare_note.setText(
                "<b>Against the unsteered model</b> (same tokens, its own cache): mean KL(steered ‖ unsteered) "
                f"<b>{mean_kl:.4f}</b> nats · the text's perplexity under the unsteered model "
                f"<b>{perplexity:.2f}</b>" if mean_kl is not None and perplexity is not None else
                "<b>Against the unsteered model</b>: waiting for the first token…")
        else:
            self.compare_note.setText(COMPARE_OFF if state.started is not None or state.tokens else "")
        self.figures.setText(self._figures_html())

    def _figures_html(self) -> str:
        state = self.state
        started = state.started
        if started is None:
            return ""
        self.header.setToolTip(started.target_only)
        if state.norms is None or not state.norms.layers:
            return ""
        norms = state.norms
        pairs = [f"block {n}: {v:.1f}" for n, v in zip(norms.layers, norms.residual_norms, strict=False)]
        shown = ", ".join(pairs) if len(pairs) <= 4 else f"{pairs[0]} … {pairs[-1]}"
        return (f"Median residual norm ‖h‖ over the prompt's {norms.positions} positions after the first (what the "
                f"relative strength divides by; position 0, the attention sink, is left out): {shown}")
