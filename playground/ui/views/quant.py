"""The quantization lab: the float reference and its quantized copy decoding side by side, and where they part.

- Top: what was built (method, how the weights are stored, true sizes, build time or "from the cache") and caveats.
- The two panes (the shared side-by-side component): same prompt, strategy, settings and seed; tokens that differ
  tinted, the first divergence in red.
- Per-token KL(reference ‖ quantized) under teacher forcing (both models read the reference's tokens), with the steps
  where the quantized model's top token differs marked, and the free-running first divergence as a line.
- Which layers suffer most: each linear layer's relative weight error ‖W_q − W‖ / ‖W‖, by decoder layer and kind.
- Outlier channels: per input channel, the largest |activation| on the calibration text before and after
  SmoothQuant's/AWQ's scaling, and the scales themselves (for plain round-to-nearest there are none).
- The methods table: size, perplexity on the evaluation text, tokens/s, KL and agreement of every method compared on
  this model so far.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from playground.config import QuantSettings
from playground.events import Event
from playground.events.quant import QuantReady, QuantStep
from playground.state import Run
from playground.state.fold import Fold
from playground.state.panes import PaneRecord, PanesState
from playground.state.quant import QuantState
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.columns import SHORT_DOCK
from playground.ui.views.drawing import LeastHeight, fill_with_scroll, static_plot
from playground.ui.views.side_by_side import DIVERGE_BG, SideBySidePanes

PLOT_HEIGHT = 110  # px: a plot's least height (title, axis, a readable curve)
PANES_HEIGHT = 175  # px the two panes take at most; in a short dock (1280 x 800's) less, so the plots stay readable
SHORT_PANES_HEIGHT = 138
KL_COLOR = "#0077BB"
DISAGREE_COLOR = "#CC3311"
BEFORE_COLOR = "#9E9E9E"
AFTER_COLOR = "#0077BB"
SCALE_COLOR = "#EE7733"
# A layer's projection kinds take these colours in forward order (Llama's q, k, v, o, gate, up, down; a fused family's
# fewer kinds the first few), whatever the family calls them.
KIND_PALETTE = ("#0077BB", "#33BBEE", "#009988", "#EE7733", "#CC3311", "#EE3377", "#555555", "#AA4499", "#999933")


def kind_label(kind: str) -> str:
    """A legend's name for a projection kind: "q_proj" -> "q", "gate_up_proj" -> "gate_up", "attn.c_proj" as is."""
    return kind if "." in kind else kind.removesuffix("_proj")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@register_view
class QuantView(FoldView):
    name = "quant"
    title = "Quantization"
    consumes = (QuantStep,)
    live_draw_ms = 200

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.state: QuantState = QuantState()
        self.panes_state = PanesState()
        self.header = rich_label(self)
        self.panes = SideBySidePanes(self.panes_state, self._pane_figures, self)

        self.kl_plot = static_plot(self, "KL(reference ‖ quantized)", "generated token",
                                   "nats", min_height=PLOT_HEIGHT)
        self.kl_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=KL_COLOR, pen=None)
        self.kl_plot.addItem(self.kl_bars)
        self.disagree = pg.ScatterPlotItem(symbol="x", size=11, pen=pg.mkPen(DISAGREE_COLOR, width=2), brush=None)
        self.kl_plot.addItem(self.disagree)
        self.divergence_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(DIVERGE_BG, width=2,
                                                                    style=Qt.PenStyle.DashLine))
        self.kl_plot.addItem(self.divergence_line)
        self.divergence_line.hide()
        self.kl_legend = rich_label(self)
        self.kl_legend.setText(  # each symbol kept with its words
            f"<span style='color:{KL_COLOR}'>■</span>&nbsp;KL at each token, teacher-forced (0 = same distribution) · "
            f"<b style='color:{DISAGREE_COLOR}'>×</b>&nbsp;the quantized model's top token differs · "
            f"<span style='color:{DIVERGE_BG}'>┆</span>&nbsp;free-running outputs&nbsp;diverge")

        self.error_plot = static_plot(self, "Layer error ‖W_q − W‖ / ‖W‖", "decoder layer",
                                      "ratio", min_height=PLOT_HEIGHT)
        for plot in (self.kl_plot, self.error_plot):  # "KL (nats) (x0.001)" was longer than a short plot's axis
            plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        self.error_curves: dict[str, pg.PlotDataItem] = {}  # by kind, made when a model first shows that kind
        self._legend_kinds: list[str] | None = None
        self.error_legend = rich_label(self)

        self.layer_choice = QComboBox(self)
        self.layer_choice.currentIndexChanged.connect(lambda _: self._draw_channels())
        self.channel_plot = static_plot(
            self, f"max |x|, <span style='color:{BEFORE_COLOR}'>before</span> / "
            f"<span style='color:{AFTER_COLOR}'>after</span> scaling", "input channel", "|x|",
            min_height=PLOT_HEIGHT - 20)
        self.before_curve = self.channel_plot.plot([], [], pen=pg.mkPen(BEFORE_COLOR, width=3))
        self.after_curve = self.channel_plot.plot([], [], pen=pg.mkPen(AFTER_COLOR, width=1))
        self.scale_plot = static_plot(self, "the method's per-channel scales s", "input channel", "scale",
                                      min_height=60)
        self.scale_curve = self.scale_plot.plot([], [], pen=pg.mkPen(SCALE_COLOR, width=1))
        self.channel_note = rich_label(self)

        self.table = QTableWidget(self)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumHeight(80)  # its header and two rows (the reference and this run's method)
        self.table.verticalHeader().hide()
        self.table.setMaximumHeight(150)
        self.panes.setMaximumHeight(PANES_HEIGHT)
        self.figures = rich_label(self)

        grid = QGridLayout()
        grid.addWidget(self.kl_plot, 0, 0)
        grid.addWidget(self.kl_legend, 1, 0)
        grid.addWidget(self.error_plot, 0, 1)
        grid.addWidget(self.error_legend, 1, 1)
        channels = QVBoxLayout()
        channels.setSpacing(0)
        channels.addWidget(self.layer_choice)
        channels.addWidget(self.channel_plot, 3)
        channels.addWidget(self.scale_plot, 2)
        grid.addLayout(channels, 0, 2)
        grid.addWidget(self.channel_note, 1, 2)
        for column in range(3):
            grid.setColumnStretch(column, 1)
        content = LeastHeight()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.panes, 3)
        layout.addWidget(self.figures)
        layout.addLayout(grid, 3)
        layout.addWidget(self.table, 1)
        # Three plots side by side down to 1280 x 800's dock, and everything in its height (the minimum heights
        # above sum to what that dock holds: it scrolls only in a smaller one).
        content.setMinimumWidth(820)
        fill_with_scroll(self, content)
        self._channels_of: QuantReady | None = None  # the QuantReady whose layers the combo lists
        self._start_drawing()

    def resizeEvent(self, event) -> None:
        self.panes.setMaximumHeight(PANES_HEIGHT if event.size().height() >= SHORT_DOCK else SHORT_PANES_HEIGHT)
        super().resizeEvent(event)

    def wants_front(self, run: Run) -> bool:
        return run.settings.group(QuantSettings).compare

    def empty_text(self, run: Run | None) -> str:
        return ("The quantization lab: pick a quantization method, switch compare on and generate — the float model "
                "and its quantized copy then decode side by side here.")

    # --- the view interface -----------------------------------------------------------------------------------
    # Two folds: the lab's own (the copy, the teacher-forced steps, the summary) and the panes'; the run streams
    # until its summary comes or its panes end.
    def _folds(self) -> tuple[Fold, ...]:
        return (self.state, self.panes_state)

    def _fold(self, event: Event) -> None:
        self.state.apply(event)
        self.panes_state.apply(event)

    def _streaming(self) -> bool:
        return self.state.summary is None and not self.panes_state.ended

    def _end_fold(self, status: str) -> None:
        self.panes_state.end(status)

    # --- drawing ----------------------------------------------------------------------------------------------
    def _pane_figures(self, index: int, pane: PaneRecord) -> str:
        ready = self.state.ready
        if ready is None:
            return ""
        size = ready.reference_weight_bytes if index == 0 else ready.weight_bytes
        speed = f" · {pane.finished.tokens_per_s:.1f} tok/s" if pane.finished is not None else ""
        return f"<span style='color:#333'>weights {_mb(size)}{speed}</span>"

    def _draw(self) -> None:
        self._draw_header()
        self.panes.refresh()
        self._draw_kl()
        self._draw_errors()
        if self._channels_of is not self.state.ready:
            self._fill_layer_choice()
        self._draw_table()

    def _draw_header(self) -> None:
        ready = self.state.ready
        if ready is None:
            self.header.setText("<b>Quantization lab</b> — the reference and its quantized copy, side by side, "
                                "appear here.")
            self.figures.setText("")
            return
        group = f", group {ready.group_size}" if ready.group_size else ", per channel"
        ratio = ready.reference_weight_bytes / ready.weight_bytes if ready.weight_bytes else 0.0
        built = "from the cache" if ready.cached else f"built in {ready.seconds:.1f} s"
        ppl = " · ".join(f"{name} {value:.2f}" for name, value in ready.perplexity.items())
        lines = [f"<b>Quantization lab</b> — <b>{html.escape(ready.method)}</b>{group}: weights stored as "
                 f"{html.escape(ready.stored)}, {_mb(ready.weight_bytes)} vs {_mb(ready.reference_weight_bytes)} "
                 f"{html.escape(ready.reference_dtype)}{f' ({ratio:.1f}× smaller)' if ratio > 1.05 else ''} · {built}"]
        if ppl:
            lines.append(f"perplexity on the evaluation text: {ppl}")
        if ready.note:
            lines.append(f"<span style='color:#555'>{html.escape(ready.note)}</span>")
        self.header.setText("<br>".join(lines))
        steps = self.state.steps
        if steps:
            kl = self.state.kl
            agree = self.state.running_agreement() or 0.0
            text = (f"teacher-forced over {len(steps)} tokens: mean KL <b>{kl.mean():.4f}</b> nats, max "
                    f"{kl.max():.3f} · top-1 agreement <b>{format_percent(agree)}</b>")
            summary = self.state.summary
            if summary is not None:
                diverged = ("never diverged" if summary.first_divergence < 0
                            else f"first divergence at token {summary.first_divergence + 1}")
                text += (f" · median {summary.kl_median:.4f}, p99 {summary.kl_p99:.3f} · free-running: {diverged}"
                         f" · {summary.reference_tokens_per_s:.1f} vs {summary.quantized_tokens_per_s:.1f} tok/s")
            self.figures.setText(text)
        else:
            self.figures.setText("")

    def _draw_kl(self) -> None:
        steps = self.state.steps
        x = np.arange(len(steps), dtype=float)
        self.kl_bars.setOpts(x=x, height=self.state.kl, width=0.8)
        bad = np.asarray(self.state.disagreements, dtype=float)
        top = float(self.state.kl.max()) if steps else 1.0
        self.disagree.setData(x=bad, y=np.full(len(bad), top * 1.05))
        summary = self.state.summary
        if summary is not None and summary.first_divergence >= 0:
            self.divergence_line.setValue(summary.first_divergence)
            self.divergence_line.show()
        else:
            self.divergence_line.hide()

    def _error_curve(self, kind: str, color: str) -> pg.PlotDataItem:
        curve = self.error_curves.get(kind)
        if curve is None:
            curve = self.error_curves[kind] = self.error_plot.plot([], [], symbol="o", symbolSize=4, symbolPen=None)
        curve.setPen(pg.mkPen(color, width=2))
        curve.setSymbolBrush(color)
        return curve

    def _draw_errors(self) -> None:
        kinds, series = self.state.layer_errors_by_layer()
        if kinds != self._legend_kinds:  # a new model's kinds: colours in forward order, legend to match
            self._legend_kinds = kinds
            colors = {kind: KIND_PALETTE[i % len(KIND_PALETTE)] for i, kind in enumerate(kinds)}
            for kind, color in colors.items():
                self._error_curve(kind, color)
            self.error_legend.setText(" ".join(f"<span style='color:{color}'>━ {html.escape(kind_label(kind))}</span>"
                                               for kind, color in colors.items()))
        for kind, curve in self.error_curves.items():
            values = series.get(kind)
            if values is None:
                curve.setData([], [])
            else:
                curve.setData(np.arange(1, len(values) + 1, dtype=float), values)

    def _fill_layer_choice(self) -> None:
        self._channels_of = self.state.ready
        self.layer_choice.blockSignals(True)
        self.layer_choice.clear()
        for channel in self.state.ready.channels if self.state.ready is not None else ():
            self.layer_choice.addItem(f"input of {channel.name}")
        self.layer_choice.blockSignals(False)
        self._draw_channels()

    def _draw_channels(self) -> None:
        ready = self.state.ready
        index = self.layer_choice.currentIndex()
        if ready is None or not (0 <= index < len(ready.channels)):
            for curve in (self.before_curve, self.after_curve, self.scale_curve):
                curve.setData([], [])
            self.channel_note.setText("")
            return
        channel = ready.channels[index]
        before = np.asarray(channel.act_max_before, dtype=float)
        after = np.asarray(channel.act_max_after, dtype=float)
        self.before_curve.setData(np.arange(len(before), dtype=float), before)
        self.after_curve.setData(np.arange(len(after), dtype=float), after)
        scales = np.asarray(channel.scales, dtype=float)
        self.scale_curve.setData(np.arange(len(scales), dtype=float), scales)
        self.scale_plot.setVisible(len(scales) > 0)  # round-to-nearest has no scales: no empty plot
        if len(before):
            ratio_before = before.max() / max(np.median(before), 1e-12)
            ratio_after = after.max() / max(np.median(after), 1e-12) if len(after) else 0.0
            note = (f"largest channel / median channel: {ratio_before:.0f}× before, {ratio_after:.0f}× after "
                    "scaling")
            if not len(scales):
                note += " · no scales: plain round-to-nearest leaves the activations as they are"
            self.channel_note.setText(f"<span style='color:#333'>{note}</span>")

    def _draw_table(self) -> None:
        table = self.state.table
        headers = ["method", "stored", "weights", "perplexity", "tokens/s", "mean KL", "top-1 agreement",
                   "first divergence"]
        rows = table.rows if table is not None else ()
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            cells = [row.method, row.stored, _mb(row.weight_bytes),
                     "" if row.perplexity is None else f"{row.perplexity:.2f}", f"{row.tokens_per_s:.1f}",
                     f"{row.kl_mean:.4f}", format_percent(row.top1_agreement),
                     "—" if row.method == "reference" else "never" if row.first_divergence < 0
                     else str(row.first_divergence + 1)]
            for c, text in enumerate(cells):
                self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.setVisible(bool(rows))

