"""The attribution's bar chart by layer, with each layer's heads expandable beneath it.

One row per layer: its attention's share of A − B (blue, upper bar) and its MLP's (orange, lower bar). Click a
layer's row (its bars or its ▸ label) and its heads open beneath it, one bar each (and the output projection's
bias, where the model has one: the heads and the bias add up to the attention's bar); click it again and they
close. Hovering a row shows its exact values. The chart is as tall as its rows (the dock scrolls).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QSizePolicy, QToolTip

from playground.events.dla import LogitAttribution
from playground.ui.style import PROCESSED_COLOR, RAW_COLOR
from playground.ui.views.drawing import LabelsAxis, set_ticks

HEAD_COLOR = "#88CCEE"  # a head's bar: a lighter blue than its layer's attention
BIAS_COLOR = "#BBBBBB"
BAR = 0.36  # a layer row holds two bars (attention above, MLP below)
HEAD_BAR = 0.6
ROW_PX = 17  # the chart's height per row
AXES_PX = 64  # the bottom axis, its label and the margins
EXPANDED, COLLAPSED = "▾", "▸"


@dataclass(frozen=True)
class Row:
    """One row of the chart: a layer (``head`` None) or one of its heads (``head`` -1: the projection's bias)."""

    layer: int  # 0-based
    head: int | None
    label: str
    attention: float  # the layer's attention, the head's or the bias's share of A − B
    mlp: float | None  # the layer's MLP (layer rows only)
    tip: str

    @property
    def is_layer(self) -> bool:
        return self.head is None


def attribution_rows(a: LogitAttribution, expanded: set[int]) -> list[Row]:
    """The chart's rows for ``a``: every layer, and beneath each layer in ``expanded`` its heads (and its attention
    bias, where it is not zero)."""
    rows: list[Row] = []
    pair = f"'{a.token_text}' − '{a.against_text}'"
    for i, attention in enumerate(a.attention):
        heads = a.heads[i] if i < len(a.heads) else ()
        bias = a.attention_bias[i] if i < len(a.attention_bias) else 0.0
        mark = EXPANDED if i in expanded else COLLAPSED
        bias_text = f" + bias {bias:+.6f}" if bias else ""
        tip = (f"Layer {i + 1}: attention {attention:+.6f} (its {len(heads)} heads {sum(heads):+.6f}{bias_text}), "
               f"MLP {a.mlp[i]:+.6f} logits of {pair}. Click to "
               f"{'hide' if i in expanded else 'show'} its heads.")
        rows.append(Row(i, None, f"{mark} L{i + 1}", attention, a.mlp[i], tip))
        if i not in expanded:
            continue
        for h, value in enumerate(heads):
            share = f" (the layer's attention: {attention:+.6f})"  # a share in % misleads where heads cancel
            branch = "└" if h == len(heads) - 1 and not bias else "├"
            rows.append(Row(i, h, f"{branch} H{h}", value, None,
                            f"Layer {i + 1}, head {h}: {value:+.6f} logits of {pair}{share}"))
        if bias:
            rows.append(Row(i, -1, "└ bias", bias, None,
                            f"Layer {i + 1}, the attention output's bias: {bias:+.6f} logits of {pair}"))
    return rows


class LayerBars(pg.PlotWidget):
    """``show(a)`` draws an attribution (None: none); a click on a layer's row opens or closes its heads."""

    toggled = Signal(int)  # layer (0-based) opened or closed

    def __init__(self) -> None:
        super().__init__(axisItems={"left": LabelsAxis("left")})
        self.attribution: LogitAttribution | None = None
        self.expanded: set[int] = set()
        self.rows: list[Row] = []
        item = self.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setMouseEnabled(x=False, y=False)
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.3)
        swatch = "<span style='color:{}'>■</span> {}".format
        # Short enough for the dock at 1280 × 800 (the axis label does not wrap).
        item.setLabel("bottom", "A − B (logits): " + " ".join(
            swatch(color, name) for color, name in ((RAW_COLOR, "attn"), (PROCESSED_COLOR, "MLP"),
                                                    (HEAD_COLOR, "head"), (BIAS_COLOR, "bias"))))
        left = item.getAxis("left")
        left.setStyle(tickFont=QFont("DejaVu Sans Mono", 8))
        left.setWidth(78)
        for side in ("left", "bottom"):
            item.getAxis(side).enableAutoSIPrefix(False)
        self.attn_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=RAW_COLOR, pen=pg.mkPen(None))
        self.mlp_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=PROCESSED_COLOR, pen=pg.mkPen(None))
        self.head_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=HEAD_COLOR, pen=pg.mkPen(None))
        self.bias_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=BIAS_COLOR, pen=pg.mkPen(None))
        for bars in (self.attn_bars, self.mlp_bars, self.head_bars, self.bias_bars):
            item.addItem(bars)
        item.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#666666", width=1)))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.scene().sigMouseClicked.connect(self._on_click)
        self.scene().sigMouseMoved.connect(self._on_move)
        self.show_attribution(None)

    def needed_height(self) -> int:
        return AXES_PX + ROW_PX * max(len(self.rows), 4)

    def toggle(self, layer: int) -> None:
        """Open ``layer``'s heads, or close them."""
        self.expanded ^= {layer}
        self.show_attribution(self.attribution)
        self.toggled.emit(layer)

    def expand(self, layer: int) -> None:
        if layer not in self.expanded:
            self.toggle(layer)

    def show_attribution(self, a: LogitAttribution | None) -> None:
        self.attribution = a
        self.rows = rows = attribution_rows(a, self.expanded) if a is not None else []
        layers = [(i, r) for i, r in enumerate(rows) if r.is_layer]
        heads = [(i, r) for i, r in enumerate(rows) if r.head is not None and r.head >= 0]
        biases = [(i, r) for i, r in enumerate(rows) if r.head == -1]

        def bars(item: pg.BarGraphItem, picked: list[tuple[int, Row]], values: list[float], offset: float,
                 height: float) -> None:
            item.setOpts(x0=[0.0] * len(picked), y=[i + offset - height / 2 for i, _ in picked], width=values,
                         height=[height] * len(picked))

        bars(self.attn_bars, layers, [r.attention for _, r in layers], -BAR / 2, BAR)
        bars(self.mlp_bars, layers, [r.mlp or 0.0 for _, r in layers], BAR / 2, BAR)
        bars(self.head_bars, heads, [r.attention for _, r in heads], 0.0, HEAD_BAR)
        bars(self.bias_bars, biases, [r.attention for _, r in biases], 0.0, HEAD_BAR)
        item = self.getPlotItem()
        set_ticks(item.getAxis("left"), [[(float(i), r.label) for i, r in enumerate(rows)]])
        values = [abs(r.attention) for r in rows] + [abs(r.mlp) for r in rows if r.mlp is not None]
        top = max(values, default=1.0) or 1.0
        item.setXRange(-top * 1.05, top * 1.05, padding=0)
        item.setYRange(-0.6, max(len(rows), 1) - 0.4, padding=0)
        height = self.needed_height()
        if self.height() != height:
            self.setFixedHeight(height)

    def head_values(self, layer: int) -> dict[int, float]:
        """The shown head bars of ``layer`` (0-based), by head: their lengths as drawn."""
        widths = self.head_bars.opts["width"]
        heads = [r for r in self.rows if r.head is not None and r.head >= 0]
        return {r.head: float(w) for r, w in zip(heads, widths, strict=True) if r.layer == layer and r.head is not None}

    # --- the mouse --------------------------------------------------------------------------------------------
    def row_at_scene(self, scene_pos: QPointF) -> int | None:
        """The row under ``scene_pos``, over its bars or its label on the left axis."""
        view = self.getPlotItem().getViewBox()
        box = view.sceneBoundingRect()
        if not (box.top() <= scene_pos.y() <= box.bottom()) or scene_pos.x() > box.right():
            return None
        row = round(view.mapSceneToView(scene_pos).y())
        return row if 0 <= row < len(self.rows) else None

    def row_scene_pos(self, row: int) -> QPointF:
        """The scene point of ``row``'s label (what a click on it hits)."""
        view = self.getPlotItem().getViewBox()
        point = view.mapViewToScene(QPointF(0.0, float(row)))
        return QPointF(view.sceneBoundingRect().left() - 20, point.y())

    def _on_click(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        row = self.row_at_scene(event.scenePos())
        if row is not None and self.rows[row].is_layer:
            event.accept()
            self.toggle(self.rows[row].layer)

    def _on_move(self, scene_pos: QPointF) -> None:
        row = self.row_at_scene(scene_pos)
        tip = self.rows[row].tip if row is not None else ""
        if tip != self.toolTip():
            self.setToolTip(tip)
            if tip:
                QToolTip.showText(self.mapToGlobal(self.mapFromScene(scene_pos)), tip, self)
            else:
                QToolTip.hideText()
