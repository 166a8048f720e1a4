"""The layers view: what every layer would have said (the logit lens), where early exit stopped, what was skipped.

- A heatmap, layers (up, layer 1 at the bottom) × generated tokens (across): each cell is the entropy of that layer's
  next-token distribution (the final norm and LM head applied to its output), in bits; grey where the layer did not
  run, × where it was skipped; the layer that answered each token outlined.
- Click a cell: that layer's top candidates for that token, its entropy, whether it agrees with the answering layer
  and its residual update; a line plot of the token's entropy and top-1 probability across layers.
- A what-if: replay early exit on the recorded lens with another threshold (nothing is regenerated), with the
  compute it would save and the tokens whose top-1 would change.
- Figures: layers computed against the total and, for early-exit / layer-skip runs, the comparison with the full
  model that comes with the run's end.

Events are folded into the Qt-free ``LayerState``; the plot items are built once and updated with
``setImage``/``setData``, at most every ``LIVE_DRAW_MS`` while streaming.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QGraphicsRectItem,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from playground.config import LensSettings
from playground.events import Event, RunStarted
from playground.events.layers import LayerStep
from playground.state import Run, visible_token_text
from playground.state.layers import ENTROPY, MAX_PROB, METRICS, LayerState, LayerToken, Replay, replay_exit
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import fill_with_scroll, set_ticks, set_title, static_plot
from playground.ui.views.texts import short_label, status_html

LIVE_DRAW_MS = 200  # while streaming, the plots redraw at most this often
TICK_CHARS = 8  # a token's label under its column
NOT_RUN_COLOR = "#A8A8A8"  # a layer that did not run: neutral grey, in no colour map
EXIT_COLOR = "#EE3377"  # the layer that answered (Tol's magenta: in no part of the colour map)
REPLAY_COLOR = "#000000"  # the replayed threshold's exits: a dashed line on a white one reads on any cell
SELECT_COLOR = "#00AAFF"  # the clicked cell
ENTROPY_LINE = "#0077BB"
TOP_PROB_LINE = "#CC6600"
SLIDER_STEPS = {ENTROPY: 0.05, MAX_PROB: 0.01}  # threshold per slider notch
EXPLANATION = ("Each cell: how unsure layer L is about the next token if the model stopped there — the entropy, in "
               "bits, of that layer's guess (final norm + LM head on its output). Light = sure, dark = unsure.")


def _outline(size: float, color: str, width: float) -> pg.ScatterPlotItem:
    """Squares in data units (one per cell), drawn as outlines."""
    return pg.ScatterPlotItem(pxMode=False, symbol="s", size=size, brush=None, pen=pg.mkPen(color, width=width))


def _mark(symbol: str, color: str, background: str = "") -> str:
    """A legend mark: a coloured symbol (Qt's rich text draws no borders on spans)."""
    back = f"background:{background};" if background else ""
    return f"<span style='{back}color:{color};font-size:14pt'><b>{symbol}</b></span>"


def replay_steps(exits: tuple[int | None, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A step line along the top edge of each token's exit cell (token j spans x = j ± 0.5, layer e spans
    y = e ± 0.5); NaN, a gap, over unknown tokens."""
    tops = np.asarray([np.nan if e is None else e + 0.5 for e in exits], dtype=float)
    columns = np.arange(len(exits), dtype=float)
    xs = np.column_stack([columns - 0.5, columns + 0.5]).ravel()
    return xs, np.repeat(tops, 2)


def _timing_text(time_saved: float | None) -> str:
    """The engine's time saved per token against the full model (1 − full speed / this speed)."""
    if time_saved is None:
        return ""
    if time_saved >= 0:
        return f" · time saved <b>{format_percent(time_saved)}</b>"
    return f" · <b>slower</b>: {1 - time_saved:.2f}× the full model's time per token"


def _kl_line(lens, i: int) -> str:
    """The cell's KL to the last layer's distribution under both lenses (those recorded)."""
    both = (("logit lens", lens.kl_logit), ("tuned lens", lens.kl_tuned))
    parts = [f"{name} {values[i]:.2f}" for name, values in both if len(values) > i and values[i] is not None]
    return f"<br>KL to the last layer (nats): {' · '.join(parts)}" if parts else ""


def mean_kl(tokens, field: str) -> list[float | None]:
    """Per layer, the mean over tokens of the recorded KL to the last layer (``field``: kl_logit or kl_tuned)."""
    sums: dict[int, list[float]] = {}
    for record in tokens:
        for i, value in enumerate(getattr(record.lens, field)):
            if value is not None:
                sums.setdefault(i, []).append(value)
    count = max(sums, default=-1) + 1
    return [sum(sums[i]) / len(sums[i]) if i in sums else None for i in range(count)]


def kl_summary(tokens) -> str:
    """One line: the mean KL to the last layer over the layers below it, under each lens recorded, and on how many
    layers the tuned lens is the closer."""
    logit, tuned = mean_kl(tokens, "kl_logit"), mean_kl(tokens, "kl_tuned")
    if not logit or not tuned:  # without a tuned lens the cell panel has the logit lens's KL
        return ""

    def mean(values: list[float | None]) -> str:
        known = [v for v in values[:-1] if v is not None]
        return f"{sum(known) / len(known):.2f}" if known else "—"

    below = list(zip(logit, tuned, strict=False))[:-1]
    lower = sum(a is not None and b is not None and b < a for a, b in below)
    return (f"mean KL to the last layer: logit lens {mean(logit)} → <b>tuned lens {mean(tuned)}</b> nats "
            f"(lower on {lower} of {len(below)} layers)")


def _entropy_colormap() -> pg.ColorMap:
    """viridis reversed: 0 bits (sure) light yellow, many bits (unsure) dark, as light = likely elsewhere."""
    return pg.colormap.get("viridis").getSubset(1.0, -1.0)  # a reversed copy (get() may share)


@register_view
class LayersView(FoldView):
    name = "layers"
    title = "Layers"
    consumes = (LayerStep,)
    live_draw_ms = LIVE_DRAW_MS
    idle_header = ("<b>Layers</b> — generate with the logit lens on (or with early exit / layer skip): what every "
                   "layer would have answered appears here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: LayerState = LayerState()
        self.replay: Replay | None = None
        self.selected_token: int | None = None
        self.selected_layer: int | None = None
        self.follow_live = True  # the selection follows the newest token until the user clicks
        self._pending = False
        self._pen_widths = (0.0, 0.0)  # outline widths drawn (exit, replay), fitted to the cells' size
        self._entropy_top = 4.0  # the colour bar's and the slider's top, in bits (grows, never shrinks in a run)
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(f"<i>{EXPLANATION}</i> Click a cell to see what that layer would say.")
        self.legend = rich_label(self)
        self.legend.setText(
            f"{_mark('□', EXIT_COLOR)} early exit: the layer that answered (else the last layer did) &nbsp; "
            f"{_mark('╌╌', REPLAY_COLOR, '#FFFFFF')} replay: the layers up to this line would run at the threshold "
            "below &nbsp; "
            f"{_mark('■', NOT_RUN_COLOR)} did not run &nbsp; {_mark('×', '#333333', NOT_RUN_COLOR)} skipped &nbsp; "
            f"{_mark('□', SELECT_COLOR)} selected cell")
        self.cell_panel = rich_label(self)
        self.cell_panel.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.cell_panel.setMinimumWidth(280)
        self.replay_note = rich_label(self)
        self.figures = rich_label(self)
        self._build_heatmap()
        self._build_token_plot()
        self._build_replay_controls()
        self._build_layout()
        self._start_drawing()

    # --- building -------------------------------------------------------------------------------------------
    def _build_heatmap(self) -> None:
        self.heatmap = static_plot(self, "Entropy of each layer's next-token guess", "generated token", "layer")
        item = self.heatmap.getPlotItem()
        item.setMouseEnabled(x=True, y=False)  # long runs: drag or wheel along the tokens
        self._not_run = QGraphicsRectItem()
        self._not_run.setBrush(QBrush(QColor(NOT_RUN_COLOR)))
        self._not_run.setPen(pg.mkPen(None))
        self._not_run.setZValue(-10)
        self.image = pg.ImageItem(axisOrder="row-major")  # NaN (did not run) is transparent: the grey shows
        self._skipped = pg.ScatterPlotItem(symbol="x", size=11, brush="#333333", pen=pg.mkPen(None))
        # The replay as one step line along the top of each token's exit cell (it hides no cell, at any width).
        self._replay_under = pg.PlotDataItem([], [], pen=pg.mkPen("#FFFFFF", width=4), connect="finite")
        self._replay_steps = pg.PlotDataItem([], [], pen=pg.mkPen(REPLAY_COLOR, width=2, style=Qt.PenStyle.DashLine),
                                             connect="finite")
        self._exit_marks = _outline(0.94, EXIT_COLOR, 3)
        self._selected = _outline(1.0, SELECT_COLOR, 3)
        for graphic in (self._not_run, self.image, self._skipped, self._exit_marks, self._replay_under,
                        self._replay_steps, self._selected):
            item.addItem(graphic)
        self.colorbar = pg.ColorBarItem(values=(0.0, self._entropy_top), colorMap=_entropy_colormap(),
                                        label="entropy (bits)", interactive=False, width=18)
        self.colorbar.setImageItem(self.image, insert_in=item)
        item.getViewBox().sigXRangeChanged.connect(self._fit_to_cells)
        item.getViewBox().sigResized.connect(self._fit_to_cells)
        self.heatmap.scene().sigMouseClicked.connect(self._heatmap_clicked)
        self.heatmap.setMinimumHeight(220)

    def _build_token_plot(self) -> None:
        """The selected token across the layers: entropy (left axis) and top-1 probability (right axis)."""
        self.token_plot = static_plot(self, "Selected token across layers", "layer", "entropy (bits)")
        item = self.token_plot.getPlotItem()
        item.getAxis("left").setPen(ENTROPY_LINE)
        item.getAxis("left").setTextPen(ENTROPY_LINE)
        self._entropy_curve = pg.PlotDataItem([], [], pen=pg.mkPen(ENTROPY_LINE, width=2), symbol="o", symbolSize=5,
                                              symbolBrush=ENTROPY_LINE, symbolPen=None, connect="finite")
        self._layer_dot = pg.ScatterPlotItem(size=13, brush=SELECT_COLOR, pen=pg.mkPen("#000000"))
        self._exit_line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(EXIT_COLOR, width=2),
                                          label="answered", labelOpts={"position": 0.93, "color": EXIT_COLOR})
        self._replay_line = pg.InfiniteLine(angle=90, movable=False,
                                            pen=pg.mkPen("#000000", width=1.5, style=Qt.PenStyle.DashLine),
                                            label="replay", labelOpts={"position": 0.8, "color": "#000000"})
        for graphic in (self._entropy_curve, self._exit_line, self._replay_line, self._layer_dot):
            item.addItem(graphic)
        self._prob_box = pg.ViewBox()  # a second y axis on the right, sharing the layers
        item.showAxis("right")
        item.scene().addItem(self._prob_box)
        right = item.getAxis("right")
        right.linkToView(self._prob_box)
        right.setLabel("top-1 probability", color=TOP_PROB_LINE)
        right.setPen(TOP_PROB_LINE)
        right.setTextPen(TOP_PROB_LINE)
        self._prob_box.setXLink(item)
        self._prob_box.setMouseEnabled(x=False, y=False)
        self._prob_curve = pg.PlotDataItem([], [], pen=pg.mkPen(TOP_PROB_LINE, width=2, style=Qt.PenStyle.DashLine),
                                           symbol="s", symbolSize=5, symbolBrush=TOP_PROB_LINE, symbolPen=None,
                                           connect="finite")
        self._prob_box.addItem(self._prob_curve)
        self._prob_box.setYRange(0, 1.05, padding=0)
        item.getViewBox().sigResized.connect(self._align_prob_box)
        self.token_plot.setMinimumHeight(165)

    def _align_prob_box(self) -> None:
        self._prob_box.setGeometry(self.token_plot.getPlotItem().getViewBox().sceneBoundingRect())

    def _build_replay_controls(self) -> None:
        self.metric_box = QComboBox(self)
        self.metric_box.addItems(list(METRICS))
        self.metric_box.setToolTip("entropy: exit at the first layer at most this unsure; max-prob: whose top token "
                               "has at least this probability")
        self.threshold_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.threshold_slider.setMinimumWidth(80)
        self.threshold_label = QLabel(self)
        widest = self.threshold_label.fontMetrics().horizontalAdvance("entropy ≤ 16.00 bits")
        self.threshold_label.setMinimumWidth(widest)
        self.min_layer_box = QSpinBox(self)
        self.min_layer_box.setMinimum(1)
        self.min_layer_box.setToolTip("the first layer allowed to answer")
        self.metric_box.currentTextChanged.connect(self._metric_changed)
        self.threshold_slider.valueChanged.connect(self._replay_changed)
        self.min_layer_box.valueChanged.connect(self._replay_changed)

    def _build_layout(self) -> None:
        controls = QHBoxLayout()
        replay = QLabel("<b>Replay early exit</b> on", self)  # short: the row fits a 1280 x 800 window's dock
        replay.setToolTip("A what-if on the recorded lens: where each token would have left the layers under "
                          "another rule, read from the lens this run recorded; nothing is regenerated")
        controls.addWidget(replay)
        controls.addWidget(self.metric_box)
        controls.addWidget(self.threshold_label)
        controls.addWidget(self.threshold_slider, 1)
        controls.addWidget(QLabel("from layer", self))
        controls.addWidget(self.min_layer_box)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.heatmap, 1)
        left_layout.addLayout(controls)
        left_layout.addWidget(self.replay_note)
        left_layout.addWidget(self.figures)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.cell_panel)
        right_layout.addWidget(self.token_plot, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        split.setSizes([1000, 420])
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        for label in (self.header, self.explanation, self.legend):
            layout.addWidget(label)
        layout.addWidget(split, 1)
        fill_with_scroll(self, content)

    # --- the view interface ---------------------------------------------------------------------------------
    def applies_to(self, run: Run) -> bool:
        """Early-exit and layer-skip runs, and any run recorded with the lens (greedy/sample with --lens)."""
        return super().applies_to(run) or run.settings.group(LensSettings).lens

    def wants_front(self, run: Run) -> bool:
        """A run recorded with --lens comes here first: the lens is what its user asked to see."""
        return run.settings.group(LensSettings).lens

    def _forget(self) -> None:
        self.replay = None
        self.selected_token = self.selected_layer = None
        self.follow_live = True
        self._entropy_top = 4.0
        self._set_replay_controls(ENTROPY, 1.0, 1, layers=1)

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self.reset()
            started = self.state.started
            self.state.apply(event)
            if self.state.started is not started:  # the run's own exit rule is where the replay starts
                s: Any = self.state.started  # this run's start, just folded
                self._set_replay_controls(s.exit_metric, s.exit_threshold, s.min_exit_layer, s.layers)

    def _follow(self) -> None:
        if self.follow_live and self.state.tokens:
            self._select(len(self.state.tokens) - 1, None)

    def _ended(self) -> None:
        self.follow_live = False

    # --- selection and replay -------------------------------------------------------------------------------
    def select_cell(self, token: int, layer: int) -> None:
        """Show ``layer`` (1-based) of token ``token`` in the side panel (stops following the live token)."""
        if not (0 <= token < len(self.state.tokens) and 1 <= layer <= self.state.layers):
            return
        self.follow_live = False
        self._select(token, layer)
        self._draw_selection()

    def _select(self, token: int, layer: int | None) -> None:
        self.selected_token = token
        self.selected_layer = layer if layer is not None else self.state.tokens[token].answer_layer

    def _heatmap_clicked(self, event) -> None:
        box = self.heatmap.getPlotItem().getViewBox()
        if event.button() != Qt.MouseButton.LeftButton or not box.sceneBoundingRect().contains(event.scenePos()):
            return
        point = box.mapSceneToView(event.scenePos())
        self.select_cell(round(point.x()), round(point.y()))

    def _set_replay_controls(self, metric: str, threshold: float, min_layer: int, layers: int) -> None:
        for widget in (self.metric_box, self.threshold_slider, self.min_layer_box):
            widget.blockSignals(True)
        self.metric_box.setCurrentText(metric if metric in METRICS else ENTROPY)
        if self.metric_box.currentText() == ENTROPY:
            self._raise_entropy_top(threshold)  # a run's own threshold is always on the slider
        self._threshold_range()
        self.threshold_slider.setValue(round(threshold / SLIDER_STEPS[self.metric_box.currentText()]))
        self.min_layer_box.setMaximum(max(layers, 1))
        self.min_layer_box.setValue(min_layer)
        for widget in (self.metric_box, self.threshold_slider, self.min_layer_box):
            widget.blockSignals(False)

    def _raise_entropy_top(self, bits: float) -> None:
        """The colour bar and the entropy slider reach ``bits`` (whole bits; they grow, never shrink, in a run)."""
        if bits > self._entropy_top:
            self._entropy_top = float(math.ceil(bits))
            self.colorbar.setLevels((0.0, self._entropy_top))
            self._threshold_range()

    def _threshold_range(self) -> None:
        metric = self.metric_box.currentText()
        top = self._entropy_top if metric == ENTROPY else 1.0
        self.threshold_slider.setMaximum(round(top / SLIDER_STEPS[metric]))

    def threshold_value(self) -> float:
        return self.threshold_slider.value() * SLIDER_STEPS[self.metric_box.currentText()]

    def _metric_changed(self, metric: str) -> None:
        started = self.state.started
        if started is not None and started.exit_metric == metric:
            value = started.exit_threshold
        else:
            value = 1.0 if metric == ENTROPY else 0.5
        self.threshold_slider.blockSignals(True)
        self._threshold_range()
        self.threshold_slider.setValue(round(value / SLIDER_STEPS[metric]))
        self.threshold_slider.blockSignals(False)
        self._replay_changed()

    def _replay_changed(self) -> None:
        self._draw_replay()
        self._draw_selection()

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_heatmap()
        self._draw_replay()
        self._draw_selection()
        self._draw_texts()

    def _draw_heatmap(self) -> None:
        state = self.state
        entropy = state.entropy
        layers, n = entropy.shape if entropy.size else (max(state.layers, 1), 0)
        item = self.heatmap.getPlotItem()
        rect = QRectF(-0.5, 0.5, max(n, 1), layers)
        self._not_run.setRect(rect if n else QRectF())
        self.image.setVisible(n > 0)
        if n:
            finite = entropy[np.isfinite(entropy)]
            self._raise_entropy_top(float(finite.max()) if finite.size else 0.0)
            self.image.setImage(entropy.copy(), autoLevels=False, levels=(0.0, self._entropy_top))
            self.image.setRect(rect)
        early = [(j, t.answer_layer) for j, t in enumerate(state.tokens) if t.answer_layer < t.lens.layers_total]
        self._exit_marks.setData(x=[float(j) for j, _ in early], y=[float(layer) for _, layer in early])
        skipped_layers, skipped_tokens = np.nonzero(state.skipped) if n else ((), ())
        self._skipped.setData(x=np.asarray(skipped_tokens, dtype=float), y=np.asarray(skipped_layers, dtype=float) + 1)
        item.setXRange(-0.5, max(n, 1) - 0.5, padding=0)
        item.setYRange(0.5, layers + 0.5, padding=0)
        step = 1 if layers <= 16 else 5
        set_ticks(item.getAxis("left"), [[(float(v), str(v)) for v in range(1, layers + 1)
                                        if v == 1 or v % step == 0 or v == layers]])
        self._fit_to_cells()

    def _fit_to_cells(self) -> None:
        """Token texts under their columns (every one when they fit, else every k-th), and outlines as thick as
        the cells allow (narrow cells of a long run would drown in thick ones)."""
        tokens = self.state.tokens
        box = self.heatmap.getPlotItem().getViewBox()
        (low, high), (bottom, top) = box.viewRange()
        per_token = box.width() / max(high - low, 1.0)
        cell = min(per_token, box.height() / max(top - bottom, 1.0))
        widths = (min(3.0, max(1.0, cell / 8)), min(2.0, max(1.0, cell / 14)))
        if widths != self._pen_widths:
            self._pen_widths = widths
            self._exit_marks.setPen(pg.mkPen(EXIT_COLOR, width=widths[0]))
            self._selected.setPen(pg.mkPen(SELECT_COLOR, width=widths[0]))
        stride = max(1, math.ceil(62 / max(per_token, 1e-6)))  # a shortened label is ~60 px wide
        ticks = [(float(j), short_label(visible_token_text(t.text if t.text is not None else "…"), TICK_CHARS))
                 for j, t in enumerate(tokens) if j % stride == 0]
        set_ticks(self.heatmap.getPlotItem().getAxis("bottom"), [ticks])

    def _draw_replay(self) -> None:
        self.threshold_label.setText(self._threshold_text())
        state = self.state
        if not state.tokens:
            self.replay = None
            self._replay_under.setData([], [])
            self._replay_steps.setData([], [])
            self.replay_note.setText("")
            return
        replay = self.replay = replay_exit(state, self.metric_box.currentText(), self.threshold_value(),
                                           self.min_layer_box.value())
        xs, ys = replay_steps(replay.exits)
        self._replay_under.setData(xs, ys)
        self._replay_steps.setData(xs, ys)
        self.replay_note.setText(self._replay_html(replay))

    def _threshold_text(self) -> str:
        value = self.threshold_value()
        return f"entropy ≤ {value:.2f} bits" if self.metric_box.currentText() == ENTROPY else f"top-1 ≥ {value:.2f}"

    def _replay_html(self, replay: Replay) -> str:
        saved = format_percent(replay.compute_saved) if replay.compute_saved is not None else "—"
        unknown = (f" · <b>{replay.unknown}</b> unknown (the run did not compute the layers this rule needs)"
                   if replay.unknown else "")
        return (f"<i>What-if, nothing regenerated</i>: would save <b>{saved}</b> of layer compute "
                f"({replay.layers_computed} of {replay.layers_total} layer passes) · <b>{replay.changes}</b> of "
                f"{replay.known} tokens would change their top-1{unknown}. <i>First-order estimate: a changed token "
                "would also change the context of every later one.</i>")

    def _draw_selection(self) -> None:
        state, token, layer = self.state, self.selected_token, self.selected_layer
        if token is None or token >= len(state.tokens) or layer is None:
            self._selected.setData(x=[], y=[])
            self._entropy_curve.setData([], [])
            self._prob_curve.setData([], [])
            self._layer_dot.setData(x=[], y=[])
            self._exit_line.setVisible(False)
            self._replay_line.setVisible(False)
            self.cell_panel.setText("<b>Selected cell</b><br><i>Click a cell of the heatmap.</i>")
            return
        self._selected.setData(x=[float(token)], y=[float(layer)])
        record = state.tokens[token]
        layers = np.arange(1, state.layers + 1, dtype=float)
        entropy, top = state.entropy[:, token], state.top_prob[:, token]
        self._entropy_curve.setData(layers, entropy)
        self._prob_curve.setData(layers, top)
        self._layer_dot.setData(x=[float(layer)], y=[entropy[layer - 1]] if np.isfinite(entropy[layer - 1]) else [])
        self._exit_line.setValue(record.answer_layer)
        self._exit_line.setVisible(True)
        replayed = self.replay.exits[token] if self.replay is not None else None
        self._replay_line.setVisible(replayed is not None)
        if replayed is not None:
            self._replay_line.setValue(replayed)
        plot = self.token_plot.getPlotItem()
        plot.setXRange(0.5, state.layers + 0.5, padding=0)
        finite = entropy[np.isfinite(entropy)]
        plot.setYRange(0, max(float(finite.max()) if finite.size else 1.0, 1.0) * 1.1, padding=0)
        # The token's text is in the panel above: a title with it (up to 14 characters) made the plot wider than
        # its column in a small window.
        set_title(plot, f"Token {token} across layers", size="10pt")
        self._align_prob_box()
        self.cell_panel.setText(self._cell_html(record, token, layer))

    def _cell_html(self, record: LayerToken, token: int, layer: int) -> str:
        lens = record.lens
        text = html.escape(visible_token_text(record.text)) if record.text is not None else "…"
        head = (f"<b>Token {token}</b> “{text}” · <b>layer {layer}</b> of {lens.layers_total} · "
                f"answered by layer {record.answer_layer}")
        i = layer - 1
        if lens.layer_entropy[i] is None:
            why = "it was skipped" if layer in lens.skipped else f"the run exited at layer {record.answer_layer}"
            return f"{head}<br>Layer {layer} did not run for this token ({why})."
        agrees = lens.agrees_with_final[i]
        verdict = "—" if agrees is None else ("✓ same top token as" if agrees else "✗ another top token than")
        residual = lens.residual_update[i]
        rows = "".join(
            f"<tr><td>{rank}</td><td style='font-family:DejaVu Sans Mono'>{html.escape(visible_token_text(c.text))}"
            f"</td><td align='right'>{format_percent(c.prob)}</td></tr>"
            for rank, c in enumerate(lens.layer_top[i], start=1))
        return (f"{head}<br>entropy <b>{lens.layer_entropy[i]:.2f}</b> bits · top-1 "
                f"{format_percent(lens.layer_top_prob[i] or 0.0)} · {verdict} the answering layer"
                f"<br>residual update ‖Δh‖/‖h‖ = {'—' if residual is None else f'{residual:.3f}'}"
                f"{_kl_line(lens, i)}"
                f"<br><b>Layer {layer}'s top candidates</b> (softmax of its lens logits)"
                f"<table cellspacing='6'><tr><th>#</th><th align='left'>token</th><th>prob.</th></tr>{rows}</table>")

    def _draw_texts(self) -> None:
        state = self.state
        status = status_html(state, "waiting for the first token…", under_way=bool(state.tokens))
        if state.started is None and not state.tokens:
            return
        tuned = state.started is not None and state.started.lens_kind == "tuned"
        mode = {"lens": f"{'tuned' if tuned else 'logit'} lens (every layer runs)",
                "early-exit": "early exit · tuned lens" if tuned else "early exit",
                "layer-skip": "layer skip"}.get(state.mode, state.mode)
        self.header.setText(f"<b>Layers</b> · {mode} · {state.layers} layers · {len(state.tokens)} tokens · "
                            f"{status}")
        self.figures.setText(self._figures_html())

    def _figures_html(self) -> str:
        s = self.state
        saved = format_percent(s.compute_saved) if s.compute_saved is not None else "—"
        rows = [f"<b>This run</b>: {s.layers_computed} of {s.layers_total} layer passes computed · "
                f"<b>{saved}</b> of layer compute saved · {s.exits} of {len(s.tokens)} tokens exited early"]
        f = s.figures
        if "identical_fraction" in f:
            divergence = int(f.get("first_divergence", -1))
            where = "none" if divergence < 0 else f"at token {divergence}"
            timing = _timing_text(f.get("time_saved"))
            speeds = (f" ({s.tokens_per_s:.1f} tokens/s vs {f['full_tokens_per_s']:.1f} for the full model)"
                      if s.tokens_per_s and f.get("full_tokens_per_s") else "")
            rows.append(f"<b>Against the full model</b> (measured, same prompt, every layer): "
                        f"<b>{format_percent(f['identical_fraction'])}</b> of tokens identical · first divergence "
                        f"{where}{timing}{speeds}")
        elif s.mode != "lens" and s.ended:
            rows.append("Against the full model: not measured (the run skipped the comparison, or was stopped)")
        elif s.mode != "lens":
            rows.append("Against the full model: <i>measured at the end</i> (a full-model run follows)")
        kl = kl_summary(s.tokens)
        if kl:
            rows[0] += f" · {kl}"
        if s.started is not None and s.started.kv_fill and s.mode != "lens":
            rows.append(f"<b>KV cache</b>: {html.escape(s.started.kv_fill)}")
        return "<br>".join(rows)
