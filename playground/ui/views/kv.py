"""The KV-cache view: what the cache holds, what it costs and what it saves.

- Cache size over the steps (log scale, MB): measured total and the formula (dashed; the two must agree), against
  the model's weights and the process's memory; the prefill marked. Beside it, a layers × steps heatmap of each
  layer's bytes.
- Latency per token with and without the cache (``KVCompare``), the ratio at the end.
- The paged cache's block map: one row per sequence, one cell per block (shared blocks in their own colour, the last
  block filled as far as it is used); for a contiguous cache, what reserving ``max_length`` up front would hold.
- The roofline: prefill and decode against the machine's measured compute ceiling and memory bandwidth.
- Throughput and per-step latency against the batch size (``KVSweep``).
- A figures line: tokens held, bytes per token measured vs the formula, cache, weights and process memory.

Events are folded into the Qt-free ``KVState``; the plot items are built once and updated with
``setData``/``setOpts``/``setImage``, at most every ``LIVE_DRAW_MS`` while streaming.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QScrollArea, QStackedWidget, QVBoxLayout, QWidget

from playground.events import Event, RunStarted
from playground.events.kv import KVStep
from playground.state import Run
from playground.state.kv import KVState
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.drawing import TextsInside, ThrottledDraw, static_plot

LIVE_DRAW_MS = 200  # while streaming, the plots redraw at most this often
MB = 1e6  # axes and figures in decimal megabytes (538 MB of fp32 weights for SmolLM2's 134.5 M parameters)
GIGA = 1e9
# Paul Tol's colour-blind-safe "bright" colours, one meaning each in this view.
TOTAL_COLOR = "#4477AA"  # the measured cache (and, in the block map, a sequence's own blocks)
FORMULA_COLOR = "#EE6677"  # the formula (dashed, over the measured line)
WEIGHTS_COLOR = "#555555"
PROCESS_COLOR = "#AA3377"
RESERVED_COLOR = "#CCBB44"
PREFILL_COLOR = "#228833"
DECODE_COLOR = "#4477AA"
CACHED_COLOR = "#4477AA"  # with the cache
UNCACHED_COLOR = "#EE6677"  # recomputing everything
SHARED_COLOR = "#EE7733"  # a block more than one sequence references
FREE_COLOR = "#DDDDDD"  # slots of an allocated block that hold nothing yet
ROOF_COLOR = "#333333"
THROUGHPUT_COLOR = "#4477AA"
STEP_MS_COLOR = "#EE7733"
MIN_LABEL_CELL_PX = 22  # block ids are written in cells at least this wide
THREE_COLUMNS_PX = 1060  # the panels sit in three columns from this width of the view, else in two
EXPLANATION = ("Each token's keys and values are kept for every layer, so later tokens attend to them instead of "
               "recomputing them: the cache grows by the same bytes per token (2 × layers × KV heads × head dim × "
               "bytes per element) while the weights stay fixed.")


def format_mb(n: float) -> str:
    """Bytes as MB (decimal), with the digits that matter: 538 MB, 46.1 MB, 7.70 MB, 0.046 MB."""
    mb = n / MB
    if abs(mb) >= 100:
        return f"{mb:,.0f} MB"
    if abs(mb) >= 10:
        return f"{mb:.1f} MB"
    if abs(mb) >= 0.1 or mb == 0:
        return f"{mb:.2f} MB"
    return f"{mb:.3g} MB"


def _line(color: str, width: float = 2, style: Qt.PenStyle = Qt.PenStyle.SolidLine, **symbol) -> pg.PlotDataItem:
    return pg.PlotDataItem([], [], pen=pg.mkPen(color, width=width, style=style), **symbol)


def _points(color: str, symbol: str) -> pg.PlotDataItem:
    """Markers only, as a PlotDataItem (it follows the plot's log mode; a bare scatter item would not)."""
    return pg.PlotDataItem([], [], pen=None, symbol=symbol, symbolSize=13, symbolBrush=color,
                           symbolPen=pg.mkPen("#000000"))


def _legend(plot: pg.PlotWidget, offset: tuple[int, int]) -> pg.LegendItem:
    legend = plot.getPlotItem().addLegend(offset=offset, labelTextSize="8pt", verSpacing=-6)
    legend.setBrush(pg.mkBrush(255, 255, 255, 215))
    return legend


def _unbroken(text: str) -> str:
    """A figure and its unit kept on one line in a wrapped label (Qt's line breaking ignores <nobr> there and breaks
    after a slash): non-breaking spaces, and a word joiner after each slash."""
    return html.escape(text).replace(" ", "&nbsp;").replace("/", "/\u2060")


def _log10(value: float) -> float:
    return math.log10(value) if value > 0 else 0.0


def _plain_number(value: float) -> str:
    """1000 → "1,000", 0.1 → "0.1", 20 → "20": tick labels a newcomer reads without exponents."""
    return f"{value:,.0f}" if value >= 1 else f"{value:.4g}"


def log_ticks(low: float, high: float) -> list[list[tuple[float, str]]]:
    """Ticks of a log axis whose view runs from ``low`` to ``high`` (log10 units): every decade labelled with the
    plain number, 2× and 5× as minor ticks (labelled too when the range spans at most two decades)."""
    major, minor = [], []
    label_minor = high - low <= 2.0
    for k in range(math.floor(low), math.ceil(high) + 1):
        if low <= k <= high:
            major.append((float(k), _plain_number(10.0 ** k)))
        for m in (2, 5):
            v = k + math.log10(m)
            if low <= v <= high:
                minor.append((v, _plain_number(m * 10.0 ** k) if label_minor else ""))
    return [major, minor]


def _set_log_range(item: pg.PlotItem, axis: str, low: float, high: float) -> None:
    """Show ``low`` … ``high`` (data units, both > 0) on a log axis, with plain-number ticks."""
    a, b = math.log10(low), math.log10(high)
    if axis == "left":
        item.setYRange(a, b, padding=0)
    else:
        item.setXRange(a, b, padding=0)
    item.getAxis(axis).setTicks(log_ticks(a, b))


class _Panel(QWidget):
    """A plot, or a note in its place (never an empty plot), with a caption under it."""

    def __init__(self, plot: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = plot
        self.note = rich_label(self)
        self.note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.note.setMargin(16)
        self.note.setFrameShape(QFrame.Shape.StyledPanel)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(plot)
        self.stack.addWidget(self.note)
        self.caption = rich_label(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.stack, 1)
        layout.addWidget(self.caption)

    def show_plot(self, caption: str) -> None:
        self.stack.setCurrentWidget(self.plot)
        self.caption.setText(caption)

    def show_note(self, note: str, caption: str = "") -> None:
        self.note.setText(note)
        self.stack.setCurrentWidget(self.note)
        self.caption.setText(caption)

    @property
    def showing_note(self) -> bool:
        return self.stack.currentWidget() is self.note


@register_view
class KVView(View):
    name = "kv"
    title = "KV cache"
    consumes = (KVStep,)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = KVState()
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(f"<i>{EXPLANATION}</i>")
        self.figures = rich_label(self)
        self._build_size_plot()
        self._build_layer_plot()
        self._build_compare_plot()
        self._build_block_map()
        self._build_roofline()
        self._build_sweep_plot()
        self._build_layout()
        self._redraw = ThrottledDraw(self, LIVE_DRAW_MS, self._draw)
        self.reset()

    # --- building -------------------------------------------------------------------------------------------
    def _build_size_plot(self) -> None:
        self.size_plot = static_plot(self, "KV cache size after each step (log scale)", "decoding step",
                                     "MB (log scale)", min_height=200)
        item = self.size_plot.getPlotItem()
        item.setLogMode(x=False, y=True)
        item.showGrid(y=True, alpha=0.2)
        self._process_curve = _line(PROCESS_COLOR, 2, Qt.PenStyle.DotLine)
        self._reserved_curve = _line(RESERVED_COLOR, 2, Qt.PenStyle.DotLine)
        self._weights_curve = _line(WEIGHTS_COLOR, 2, Qt.PenStyle.DashDotLine)
        self._total_curve = _line(TOTAL_COLOR, 4)
        self._formula_curve = _line(FORMULA_COLOR, 2, Qt.PenStyle.DashLine)
        self._prefill_line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(PREFILL_COLOR, width=2),
                                             label="prefill", labelOpts={"position": 0.55, "color": PREFILL_COLOR,
                                                                         "anchors": [(0, 1), (0, 1)]})
        for curve in (self._weights_curve, self._process_curve, self._reserved_curve, self._total_curve,
                      self._formula_curve):
            item.addItem(curve)
        item.addItem(self._prefill_line)

    def _build_layer_plot(self) -> None:
        self.layer_plot = static_plot(self, "Bytes held by each layer (MB)", "decoding step", "layer",
                                      min_height=200)
        item = self.layer_plot.getPlotItem()
        self.layer_image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.layer_image)
        self.layer_colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=pg.colormap.get("viridis"),
                                              label="MB per layer", interactive=False, width=14)
        self.layer_colorbar.setImageItem(self.layer_image, insert_in=item)

    def _build_compare_plot(self) -> None:
        plot = static_plot(self, "Time per token, with and without the cache", "generated token", "ms per token",
                           min_height=200)
        plot.getPlotItem().showGrid(y=True, alpha=0.2)
        legend = _legend(plot, (8, 4))
        self._cached_curve = _line(CACHED_COLOR, 2)
        self._uncached_curve = _line(UNCACHED_COLOR, 2)
        self._ratio_label = pg.TextItem("", color=UNCACHED_COLOR, anchor=(1.0, 1.15), fill=(255, 255, 255, 210))
        for curve, name in ((self._uncached_curve, "without cache (recompute all)"),
                            (self._cached_curve, "with cache")):
            plot.addItem(curve)
            legend.addItem(curve, name)
        plot.addItem(self._ratio_label)
        self.compare_panel = _Panel(plot, self)

    def _build_block_map(self) -> None:
        plot = static_plot(self, "Paged cache: each sequence's block table", "position in the block table",
                           "sequence", min_height=200)
        item = plot.getPlotItem()
        item.invertY(True)  # sequence 0 on top
        self._block_cells = pg.BarGraphItem(x0=[], y0=[], width=[], height=[], pen=pg.mkPen("#FFFFFF", width=1))
        self._block_fill = pg.BarGraphItem(x0=[], y0=[], width=[], height=[], pen=pg.mkPen("#FFFFFF", width=1))
        item.addItem(self._block_cells)
        item.addItem(self._block_fill)
        self._block_labels: list[pg.TextItem] = []
        self._block_ids: list[int] = []  # per cell, in the order of the bars
        plot.getPlotItem().getViewBox().sigResized.connect(self._fit_block_labels)
        self.block_panel = _Panel(plot, self)

    def _build_roofline(self) -> None:
        plot = static_plot(self, "Roofline: prefill and decode here", "FLOP per byte moved (log)",
                           "GFLOP/s (log)", min_height=200)
        item = plot.getPlotItem()
        item.setLogMode(x=True, y=True)
        item.showGrid(x=True, y=True, alpha=0.15)
        self._roof_curve = _line(ROOF_COLOR, 2)
        self._compute_label = pg.TextItem("", color=ROOF_COLOR, anchor=(1.0, 1.0))
        # Along the slope (it rotates with the axes' direction (1, 1), whatever the plot's aspect).
        self._bandwidth_label = pg.TextItem("", color=ROOF_COLOR, anchor=(0.0, 1.0), rotateAxis=(1, 1))
        self._prefill_point = _points(PREFILL_COLOR, "o")
        self._decode_point = _points(DECODE_COLOR, "s")
        # One line each, centred under its point (their figures are in the caption): prefill sits higher and further
        # right than decode, under the roof, so the two do not meet and neither crosses the roof.
        self._prefill_label = pg.TextItem("", color=PREFILL_COLOR, anchor=(0.5, -0.15))
        self._decode_label = pg.TextItem("", color=DECODE_COLOR, anchor=(0.5, -0.15))
        for graphic in (self._roof_curve, self._compute_label, self._bandwidth_label, self._prefill_point,
                        self._decode_point, self._prefill_label, self._decode_label):
            item.addItem(graphic)
        self._roof_texts = TextsInside(item.getViewBox())  # the labels stay whole whatever the plot's size
        self.roofline_panel = _Panel(plot, self)

    def _build_sweep_plot(self) -> None:
        plot = static_plot(self, "Batching: throughput, step time", "sequences in the batch (log)",
                           "tokens/s", min_height=200)
        item = plot.getPlotItem()
        item.setLogMode(x=True, y=False)
        item.showGrid(y=True, alpha=0.2)
        left = item.getAxis("left")
        left.setPen(THROUGHPUT_COLOR)
        left.setTextPen(THROUGHPUT_COLOR)
        self._throughput_curve = _line(THROUGHPUT_COLOR, 2, symbol="o", symbolSize=7, symbolBrush=THROUGHPUT_COLOR,
                                       symbolPen=None)
        item.addItem(self._throughput_curve)
        self._step_box = pg.ViewBox()  # a second y axis on the right: ms per step
        item.showAxis("right")
        item.scene().addItem(self._step_box)
        right = item.getAxis("right")
        right.linkToView(self._step_box)
        right.setLabel("ms per step", color=STEP_MS_COLOR)
        right.setPen(STEP_MS_COLOR)
        right.setTextPen(STEP_MS_COLOR)
        self._step_box.setXLink(item)
        self._step_box.setMouseEnabled(x=False, y=False)
        self._step_ms_curve = _line(STEP_MS_COLOR, 2, Qt.PenStyle.DashLine, symbol="s", symbolSize=7,
                                    symbolBrush=STEP_MS_COLOR, symbolPen=None)
        self._step_ms_curve.setLogMode(True, False)  # its box is not the plot's: give it the plot's x mapping
        self._step_box.addItem(self._step_ms_curve)
        item.getViewBox().sigResized.connect(self._align_step_box)
        self.sweep_plot = plot
        self.sweep_panel = _Panel(plot, self)

    def _align_step_box(self) -> None:
        self._step_box.setGeometry(self.sweep_plot.getPlotItem().getViewBox().sceneBoundingRect())

    def _build_layout(self) -> None:
        self.size_panel = _Panel(self.size_plot, self)
        self.layer_panel = _Panel(self.layer_plot, self)
        self._grid = grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(8)
        self._columns = 0
        self._arrange(3)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.explanation)
        layout.addLayout(grid, 1)
        layout.addWidget(self.figures)
        scroll = QScrollArea(self)  # a small dock scrolls instead of squeezing the plots
        scroll.setWidget(content)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # two columns when narrow
        content.setMinimumWidth(620)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

    def _arrange(self, columns: int) -> None:
        """The six panels in three columns (two rows), or in two columns (three rows) in a narrow dock, where three
        would cut their plots' titles and labels."""
        if columns == self._columns:
            return
        self._columns = columns
        panels = (self.size_panel, self.layer_panel, self.block_panel, self.compare_panel, self.roofline_panel,
                  self.sweep_panel)
        for panel in panels:
            self._grid.removeWidget(panel)
        for index, panel in enumerate(panels):
            self._grid.addWidget(panel, index // columns, index % columns)
        for column, stretch in enumerate((4, 3, 3) if columns == 3 else (1, 1, 0)):
            self._grid.setColumnStretch(column, stretch)

    def resizeEvent(self, event) -> None:
        self._arrange(3 if event.size().width() >= THREE_COLUMNS_PX else 2)
        super().resizeEvent(event)

    def remote_note(self, run: Run) -> str:
        """A server tells only how full its cache is: llama-server's slot (tokens of its context), vLLM's usage."""
        figures = run.finished.figures if run.finished is not None else {}
        if "kv_tokens" in figures and figures.get("n_ctx"):
            tokens, n_ctx = figures["kv_tokens"], figures["n_ctx"]
            return (f"The server's KV cache after run #{run.index + 1}: {tokens:.0f} of the {n_ctx:.0f} tokens its "
                    f"slot holds ({tokens / n_ctx:.1%}), as its /slots reports.")
        if "kv_cache_usage" in figures:
            return (f"The server's KV cache after run #{run.index + 1}: {figures['kv_cache_usage']:.1%} of its "
                    "blocks in use (vLLM's kv_cache_usage_perc, across every request it serves).")
        return ""

    # --- the view interface ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self._redraw.cancel()
        self.state.reset()
        self._draw()
        self.header.setText("<b>KV cache</b> — choose the kv-cache strategy and generate: what the cache holds, "
                            "costs and saves appears here.")

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self.reset()
            self.state.apply(event)

    def flush(self) -> None:
        self._redraw.request(streaming=not self.state.ended)

    def end(self, run: Run) -> None:
        self._redraw.cancel()
        if not self.state.ended:
            self.state.end(run.status)
        self._draw()

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_size()
        self._draw_layers()
        self._draw_compare()
        self._draw_blocks()
        self._draw_roofline()
        self._draw_sweep()
        self._draw_texts()

    def _draw_size(self) -> None:
        s = self.state
        steps = s.steps.astype(float)
        self._total_curve.setData(steps, s.total_bytes / MB)
        self._formula_curve.setData(steps, s.formula_bytes / MB)
        self._process_curve.setData(steps, s.process_bytes / MB)
        reserved = s.reserved_bytes
        shown = bool(reserved.size and reserved.any())
        self._reserved_curve.setData(steps if shown else [], reserved / MB if shown else [])
        self._reserved_curve.setVisible(shown)
        weights = s.started.weights_bytes if s.started is not None else 0
        if steps.size and weights > 0:
            self._weights_curve.setData([steps[0], steps[-1]], [weights / MB, weights / MB])
        else:
            self._weights_curve.setData([], [])
        position = s.prefill_position
        self._prefill_line.setVisible(position is not None and steps.size > 0)
        if position is not None:
            # Between the last step before the prefill ended and the first after it.
            self._prefill_line.setValue(float(steps[position]) - 0.5 if position < steps.size else
                                        (float(steps[-1]) + 0.5 if steps.size else -0.5))
            prompt = s.prefill.prompt_tokens if s.prefill is not None else 0
            self._prefill_line.label.setFormat(f"prefill: {prompt} prompt tokens")
        item = self.size_plot.getPlotItem()
        if steps.size:
            item.setXRange(float(steps[0]) - 1, float(steps[-1]) + 1, padding=0.02)
            values = np.concatenate([s.total_bytes, s.formula_bytes, s.process_bytes, reserved, [weights]]) / MB
            positive = values[values > 0]
            if positive.size:
                _set_log_range(item, "left", float(positive.min()) / 1.6, float(positive.max()) * 1.6)
        entries = [(TOTAL_COLOR, "━━", "KV cache, measured"), (FORMULA_COLOR, "╌╌", "formula"),
                   (WEIGHTS_COLOR, "─·─", "model weights"), (PROCESS_COLOR, "┈┈", "process memory")]
        if shown:
            entries.append((RESERVED_COLOR, "┈┈", "device memory reserved"))
        legend = " &nbsp; ".join(f"<span style='color:{color}'><b>{glyph}</b></span> {name}"
                                 for color, glyph, name in entries)
        self.size_panel.show_plot(f"{legend}<br>{self._agreement_text()}")

    def _agreement_text(self) -> str:
        """Whether the measured bytes are the formula's, and why not where they are not."""
        s = self.state
        total, formula = s.total_bytes, s.formula_bytes
        if s.holder == "none":
            return "No cache: nothing is held at any step; the lines left are the weights and the process."
        if not total.size:
            return "Measured and formula lie on each other when the cache holds exactly what the formula counts."
        if np.array_equal(total, formula):
            return "Measured = formula at every step ✓ (the dashed line lies on the solid one)."
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(formula > 0, (total - formula) / np.maximum(formula, 1), np.inf)
        worst = int(np.argmax(np.abs(relative)))
        off = float(relative[worst])
        why = {"paged": "a paged cache allocates whole blocks (more) and stores a shared block once (less)",
               "none": "nothing is kept"}.get(s.holder, "")
        if s.started is not None and s.started.kv_dtype != "model":
            why = "the quantization scales are stored too"
        gap = f"{off:+.1%}" if math.isfinite(off) else "all"
        return (f"Measured differs from the formula (most: {gap} at step {int(s.steps[worst])})"
                + (f": {why}." if why else "."))

    def _draw_layers(self) -> None:
        s = self.state
        matrix = s.layer_bytes
        layers, n = matrix.shape
        self.layer_image.setVisible(n > 0)
        item = self.layer_plot.getPlotItem()
        if s.holder == "none":
            self.layer_image.clear()
            self.layer_panel.show_note("<b>No cache in this run</b><br>No layer keeps keys or values: every step "
                                       "computes them again for the whole sequence, in every layer.")
            return
        if n:
            values = matrix / MB  # layers × steps, row 0 = layer 1 (drawn at the bottom)
            top = float(values.max()) if values.size else 0.0
            top = top if top > 0 else 1.0
            self.layer_colorbar.setLevels((0.0, top))
            self.layer_image.setImage(values, autoLevels=False, levels=(0.0, top))
            first = float(s.steps[0])
            self.layer_image.setRect(QRectF(first - 0.5, 0.5, n, layers))
            item.setXRange(first - 0.5, first + n - 0.5, padding=0)
            item.setYRange(0.5, layers + 0.5, padding=0)
            step = 1 if layers <= 12 else 5
            item.getAxis("left").setTicks([[(float(v), str(v)) for v in range(1, layers + 1)
                                            if v == 1 or v % step == 0 or v == layers]])
        last = s.last
        if last is not None and layers:
            per_layer = last.layer_bytes
            alike = len(set(per_layer)) == 1
            caption = (f"Step {last.step}: {format_mb(per_layer[0])} in each of the {layers} layers (all alike)"
                       if alike else f"Step {last.step}: {format_mb(min(per_layer))} to {format_mb(max(per_layer))} "
                       f"per layer")
        else:
            caption = "Each layer keeps its own keys and values: one row per layer, brighter = more bytes."
        self.layer_panel.show_plot(caption)

    def _draw_compare(self) -> None:
        s, panel = self.state, self.compare_panel
        c = s.compare
        if c is None or not c.cached_ms:
            self._cached_curve.setData([], [])
            self._uncached_curve.setData([], [])
            self._ratio_label.setText("")
            when = ("is measured after the run when “compare without cache” is on" if not s.ended
                    else "was not measured in this run (switch on “compare without cache”)")
            panel.show_note(f"<b>With vs without the cache</b><br>The time per token without a cache {when}: the "
                            "same tokens decoded again, recomputing every position at every step.")
            return
        self._cached_curve.setData(np.arange(len(c.cached_ms), dtype=float), np.asarray(c.cached_ms, dtype=float))
        self._uncached_curve.setData(np.arange(len(c.uncached_ms), dtype=float),
                                     np.asarray(c.uncached_ms, dtype=float))
        ratio = s.compare_ratio()
        n = min(len(c.cached_ms), len(c.uncached_ms))
        top = max(max(c.cached_ms, default=0.0), max(c.uncached_ms, default=0.0))
        plot = panel.plot.getPlotItem()
        plot.setYRange(0, (top if top > 0 else 1.0) * 1.15, padding=0)  # room for the ratio above the last point
        plot.setXRange(0, max(n - 1, 1), padding=0.03)
        if ratio is not None:
            last, overall = ratio
            self._ratio_label.setText(f"×{last:.1f}")
            self._ratio_label.setPos(float(n - 1), float(c.uncached_ms[n - 1]))
            text = (f"Token {n - 1}: <b>{c.uncached_ms[n - 1]:.1f} ms</b> without the cache vs "
                    f"<b>{c.cached_ms[n - 1]:.1f} ms</b> with it: <b>×{last:.1f}</b> (×{overall:.1f} over all "
                    f"{n} tokens; token 0 reads the whole prompt both ways).")
        else:
            self._ratio_label.setText("")
            text = ""
        same = ("Same tokens with and without the cache ✓" if c.identical
                else "<b>The recomputed run chose other tokens</b> (numerics differ)")
        panel.show_plot(f"{text} {same}")

    def _draw_blocks(self) -> None:
        s, panel = self.state, self.block_panel
        started, blocks = s.started, s.blocks
        if blocks is None or started is None or started.holder != "paged":
            self._set_block_cells([], [], [], [], [])
            panel.show_note(self._no_blocks_note())
            return
        shared = set(blocks.shared)
        fill = s.last_block_fill()
        size = max(started.block_size, 1)
        x0, y0, brushes, ids, fills = [], [], [], [], []
        for row, table in enumerate(blocks.tables):
            for position, block in enumerate(table):
                if block < 0:  # a sliding window's block given back: its positions are out of every later window
                    continue
                color = SHARED_COLOR if block in shared else TOTAL_COLOR
                partial = position == len(table) - 1 and fill[row] < size
                if partial:  # the used part of the last block, drawn over its free slots
                    fills.append((len(x0), fill[row] / size, color))
                x0.append(float(position))
                y0.append(float(row))
                brushes.append(FREE_COLOR if partial else color)
                ids.append(block)
        self._set_block_cells(x0, y0, brushes, ids, fills)
        columns = max((len(t) for t in blocks.tables), default=0)
        item = self.block_panel.plot.getPlotItem()
        item.setXRange(-0.05, max(columns, 1) + 0.05, padding=0)
        item.setYRange(-0.05, max(len(blocks.tables), 3) + 0.05, padding=0)  # one sequence: a row, not slabs
        item.getAxis("left").setTicks([[(row + 0.5, str(row)) for row in range(len(blocks.tables))]])
        stride = max(1, math.ceil(columns / 16))
        item.getAxis("bottom").setTicks([[(c + 0.5, str(c)) for c in range(0, columns, stride)]])
        free = blocks.slots_allocated - blocks.slots_used
        caption = ("Positions map to fixed-size blocks of a shared pool: a sequence wastes at most its last "
                   "block's free slots.<br>"
                   f"<span style='color:{TOTAL_COLOR}'>■</span> own block &nbsp; "
                   f"<span style='color:{SHARED_COLOR}'>■</span> shared &nbsp; "
                   f"<span style='color:{FREE_COLOR}'>■</span> free slots<br>"
                   f"{len(blocks.tables)} sequence{'s' if len(blocks.tables) != 1 else ''} · "
                   f"<b>{blocks.blocks_allocated}</b> blocks of {started.block_size} tokens allocated "
                   f"({blocks.slots_allocated} slots), {blocks.slots_used} used, <b>{free} free</b> · fragmentation "
                   f"<b>{format_percent(blocks.fragmentation)}</b> · {len(shared)} shared")
        panel.show_plot(caption)

    def _no_blocks_note(self) -> str:
        s = self.state
        started = s.started
        if started is None:
            return "<b>Block map</b><br>The paged cache's blocks appear here during a kv-cache run."
        if started.holder == "none":
            return ("<b>No cache in this run</b><br>Every step recomputed the keys and values of the whole "
                    "sequence: nothing was kept, so there are no blocks to show.")
        if started.holder == "paged":
            return "<b>Paged cache</b><br>The block tables appear with the first step."
        reserved = s.contiguous_reserved_bytes()
        held = s.last.total_bytes if s.last is not None else 0
        reserve = (f"A contiguous cache reserved up front for max_length = {started.max_length} tokens (prompt + "
                   f"max new tokens) would hold <b>{format_mb(reserved)}</b>"
                   + (f", of which this run used {format_mb(held)} ({format_percent(held / reserved)})"
                      if reserved and s.last is not None else "") + "." if reserved else "")
        return ("<b>Contiguous cache: no blocks</b><br>This run kept one growing tensor per layer, not fixed-size "
                f"blocks (switch on “paged cache” to see a block table).<br>{reserve}")

    def _set_block_cells(self, x0: list[float], y0: list[float], brushes: list[str], ids: list[int],
                         fills: list[tuple[int, float, str]]) -> None:
        """One cell per block at (x0, y0); ``fills``: (cell, used share, colour) of partly used last blocks."""
        n = len(x0)
        self._block_cells.setOpts(x0=np.asarray(x0, dtype=float), y0=np.asarray(y0, dtype=float) + 0.08,
                                  width=np.full(n, 0.94), height=np.full(n, 0.84),
                                  brushes=[pg.mkBrush(b) for b in brushes])
        cells = [cell for cell, _share, _color in fills]
        self._block_fill.setOpts(x0=np.asarray([x0[c] for c in cells], dtype=float),
                                 y0=np.asarray([y0[c] for c in cells], dtype=float) + 0.08,
                                 width=np.asarray([share for _c, share, _color in fills], dtype=float) * 0.94,
                                 height=np.full(len(fills), 0.84),
                                 brushes=[pg.mkBrush(color) for _c, _share, color in fills])
        self._block_ids = list(ids)
        fill_share = {cell: share for cell, share, _color in fills}
        while len(self._block_labels) < n:
            label = pg.TextItem("", color="#FFFFFF", anchor=(0.5, 0.5))
            self.block_panel.plot.getPlotItem().addItem(label)
            self._block_labels.append(label)
        for i, label in enumerate(self._block_labels):
            if i < n:
                label.setText(str(ids[i]))
                label.setColor("#333333" if brushes[i] == FREE_COLOR and fill_share.get(i, 0.0) <= 0.5
                               else "#FFFFFF")
                label.setPos(x0[i] + 0.47, y0[i] + 0.5)
        self._fit_block_labels()

    def _fit_block_labels(self) -> None:
        """Block ids in their cells when the cells are wide enough to hold them."""
        n = len(self._block_ids)
        box = self.block_panel.plot.getPlotItem().getViewBox()
        (low, high), _ = box.viewRange()
        wide = n > 0 and box.width() / max(high - low, 1.0) >= MIN_LABEL_CELL_PX
        for i, label in enumerate(self._block_labels):
            label.setVisible(wide and i < n)

    def _draw_roofline(self) -> None:
        s, panel = self.state, self.roofline_panel
        started, phases = s.started, s.phases
        if not phases:
            for point in (self._prefill_point, self._decode_point, self._roof_curve):
                point.setData([], [])
            for label in (self._prefill_label, self._decode_label, self._compute_label, self._bandwidth_label):
                label.setText("")
            panel.show_note("<b>Roofline</b><br>Prefill and decode are placed against this machine's measured "
                            "compute and memory limits once each phase has ended.")
            return
        xs, figures = [], []
        for phase, point, label in (("prefill", self._prefill_point, self._prefill_label),
                                    ("decode", self._decode_point, self._decode_label)):
            event = phases.get(phase)
            if event is None or event.bytes_moved <= 0 or event.achieved_flops <= 0:
                point.setData([], [])
                label.setText("")
                continue
            x, y = event.flops / event.bytes_moved, event.achieved_flops / GIGA
            xs.append(x)
            point.setData([x], [y])
            label.setText(f"{event.phase} ({event.tokens} tokens)")
            self._roof_texts.place(label, _log10(x), _log10(y))
            speed = f"{y:,.1f}" if y >= 1 else f"{y:.2g}"
            figures.append(f"{event.phase} <b>{_unbroken(f'{speed} GFLOP/s')}</b> at {_unbroken(f'{x:.2g} FLOP/B')}")
        peak_flops = started.peak_flops if started is not None else 0.0
        peak_bw = started.peak_bytes_per_s if started is not None else 0.0
        measured = peak_flops > 0 and peak_bw > 0
        if measured:
            ridge = peak_flops / peak_bw
            xs.append(ridge)
        low, high = min(xs) / 10, max(xs) * 10
        item = panel.plot.getPlotItem()
        point_ys = [y for p in (self._prefill_point, self._decode_point) for y in (p.yData if p.yData is not None
                                                                                  else [])]
        if measured:
            roof_x = np.logspace(math.log10(low), math.log10(high), 121)
            roof_x = np.union1d(roof_x, [ridge])
            self._roof_curve.setData(roof_x, np.minimum(peak_flops, peak_bw * roof_x) / GIGA)
            # Short labels on the lines (the caption says which is which): they fit a narrow plot.
            self._compute_label.setText(f"{peak_flops / GIGA:,.0f} GFLOP/s")
            self._bandwidth_label.setText(f"{peak_bw / GIGA:,.1f} GB/s")
            start = low * 1.5
            self._roof_texts.place(self._compute_label, math.log10(high), math.log10(peak_flops / GIGA))
            self._roof_texts.place(self._bandwidth_label, math.log10(start), math.log10(peak_bw * start / GIGA))
            point_ys += [peak_bw * low / GIGA, peak_flops / GIGA]
        else:
            self._roof_curve.setData([], [])
            self._compute_label.setText("")
            self._bandwidth_label.setText("")
        _set_log_range(item, "bottom", low, high)
        # A decade above the roof and below the lowest point: room for the labels there.
        _set_log_range(item, "left", min(point_ys) / 10, max(point_ys) * 10)
        self._roof_texts.refit()
        caption = (" · ".join(figures) + ". The slope is the memory bandwidth, the flat roof the compute ceiling. "
                   "Decode reads every weight for one token per sequence; prefill reuses them for the whole prompt. "
                   "<i>FLOPs and bytes estimated, times measured.</i>")
        if not measured:
            caption += " <b>The machine's ceilings were not measured.</b>"
        panel.show_plot(caption)

    def _draw_sweep(self) -> None:
        s, panel = self.state, self.sweep_panel
        sweep = s.sweep
        if sweep is None or not sweep.batch_sizes:
            self._throughput_curve.setData([], [])
            self._step_ms_curve.setData([], [])
            when = ("is measured after the run when “batch sweep” lists batch sizes" if not s.ended
                    else "was not run (set “batch sweep”, e.g. 1,2,4,8,16)")
            panel.show_note(f"<b>Batching</b><br>A sweep over batch sizes {when}: N copies of the prompt decoded "
                            "together share each read of the weights.")
            return
        sizes = np.asarray(sweep.batch_sizes, dtype=float)
        self._throughput_curve.setData(sizes, np.asarray(sweep.tokens_per_s, dtype=float))
        self._step_ms_curve.setData(sizes, np.asarray(sweep.ms_per_step, dtype=float))
        item = self.sweep_plot.getPlotItem()
        item.getAxis("bottom").setTicks([[(math.log10(n), str(n)) for n in sweep.batch_sizes if n > 0]])
        positive = sizes[sizes > 0]
        if positive.size:
            item.setXRange(math.log10(positive.min()), math.log10(positive.max()), padding=0.08)
        item.setYRange(0, max(sweep.tokens_per_s, default=1.0) * 1.1, padding=0)
        self._step_box.setYRange(0, max(sweep.ms_per_step, default=1.0) * 1.1, padding=0)
        self._align_step_box()
        first, last = 0, len(sweep.batch_sizes) - 1
        speed = sweep.tokens_per_s[last] / sweep.tokens_per_s[first] if sweep.tokens_per_s[first] > 0 else 0.0
        slower = sweep.ms_per_step[last] / sweep.ms_per_step[first] if sweep.ms_per_step[first] > 0 else 0.0
        cache = f"; its cache {format_mb(sweep.kv_bytes[last])}" if len(sweep.kv_bytes) > last else ""
        panel.show_plot(
            f"<span style='color:{THROUGHPUT_COLOR}'>━ tokens/s</span> &nbsp; "
            f"<span style='color:{STEP_MS_COLOR}'>╌ ms per step</span><br>Batch {sweep.batch_sizes[last]}: "
            f"<b>{sweep.tokens_per_s[last]:,.0f} tokens/s</b> (×{speed:.1f} batch {sweep.batch_sizes[first]}) at "
            f"{sweep.ms_per_step[last]:.1f} ms per step (×{slower:.1f}){cache}.")

    def _draw_texts(self) -> None:
        s = self.state
        started = s.started
        if started is None and s.last is None:
            self.figures.setText("")
            return
        if s.stop_reason:
            status = f"finished ({html.escape(s.stop_reason)})"
        elif s.ended_status:
            status = f"<b>{html.escape(s.ended_status)}</b>"
        else:
            status = "running…" if s.count else "waiting for the first token…"
        parts = ["<b>KV cache</b>"]
        if started is not None:
            holder = {"contiguous": "contiguous cache", "none": "no cache",
                      "paged": f"paged cache ({started.block_size}-token blocks)"}.get(started.holder,
                                                                                      started.holder)
            parts.append(holder)
            if started.holder != "none":
                parts.append(self._kv_dtype_text(started.kv_dtype))
            parts += [f"attention {html.escape(started.attn)}",
                      f"{started.layers} layers × {started.kv_heads} KV heads × head dim {started.head_dim}"]
        parts += [f"{s.count} steps", status]
        self.header.setText(" · ".join(parts))
        self.figures.setText(self._figures_html())

    def _windowed_formula_per_token(self) -> float | None:
        """The latest step's formula per token held, where it is below the every-layer-every-token figure (a model
        with sliding-window layers past its window; the step's formula counts each layer by its type)."""
        s = self.state
        started, last = s.started, s.last
        if started is None or last is None or last.tokens <= 0 or s.holder == "none":
            return None
        if last.formula_bytes >= round(started.formula_bytes_per_token * last.tokens * started.sequences):
            return None
        return last.formula_bytes / (last.tokens * s.sequences)

    def _kv_dtype_text(self, kv_dtype: str) -> str:
        if kv_dtype == "model":
            model = f" ({html.escape(self.state.model_dtype)})" if self.state.model_dtype else ""
            return f"keys and values in the model's dtype{model}"
        return f"keys and values quantized to {html.escape(kv_dtype)}"

    def _figures_html(self) -> str:
        s = self.state
        started, last = s.started, s.last
        parts = []
        if s.holder == "none":
            steps = f" for each of {s.count} steps" if s.count else ""
            parts.append(f"<b>No cache</b>: nothing held; the whole sequence was recomputed{steps}")
            last = None  # no bytes per token or cache size to speak of
        if last is not None:
            held = last.tokens * s.sequences
            parts.append(f"<b>{held:,}</b> tokens held" + (f" ({s.sequences} sequences × {last.tokens})"
                                                            if s.sequences > 1 else ""))
        measured = s.measured_bytes_per_token()
        if started is not None:
            every = (f"2 × {started.layers} layers × {started.kv_heads} KV heads × {started.head_dim} × "
                     f"{started.bytes_per_element:g} B")
            formula = f"{started.formula_bytes_per_token:,.0f} B by the formula ({every})"
            target = started.formula_bytes_per_token
            windowed = self._windowed_formula_per_token()
            if windowed is not None and last is not None:  # sliding-window layers hold their window only
                target = windowed
                formula = (f"{windowed:,.0f} B by the formula at {last.tokens:,} tokens (sliding-window layers hold "
                           f"only their window; {started.formula_bytes_per_token:,.0f} B while every layer holds "
                           f"every token: {every})")
            if measured is not None:
                agree = "✓" if math.isclose(measured, target, rel_tol=1e-9) else "≠"
                parts.append(f"bytes per token: <b>{measured:,.0f} B measured</b> {agree} {formula}")
            else:
                would = " a cache would hold" if s.holder == "none" else ""
                parts.append(f"bytes per token{would}: {formula}")
        if last is not None:
            parts.append(f"KV cache <b>{format_mb(last.total_bytes)}</b>")
        if started is not None and started.weights_bytes > 0:
            share = (f" (the cache is {format_percent(last.total_bytes / started.weights_bytes)} of them)"
                     if last is not None else "")
            parts.append(f"weights {format_mb(started.weights_bytes)}{share}")
        if last is not None and last.process_bytes > 0:
            parts.append(f"process memory {format_mb(last.process_bytes)}")
        if last is not None and last.device_reserved_bytes > 0:
            parts.append(f"device memory reserved {format_mb(last.device_reserved_bytes)}")
        return " · ".join(parts)
