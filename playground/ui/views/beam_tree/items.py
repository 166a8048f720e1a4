"""The beam tree's drawing pieces: colours and sizes, per-chunk plot items, token labels, hover, the fill ramp.

Drawing costs what the new nodes cost: nodes and edges live in one set of plot items per ``CHUNK_STEPS`` steps,
pens and brushes are shared, and labels are appended to growing arrays.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QGradient, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QWidget

from playground.state import shade_fraction
from playground.state.beam_tree import FINISHED, PRUNED, ROOT, SURVIVING
from playground.ui.style import SHADE_TICKS, shade_for_prob

BEST_COLOR = "#CC3311"  # the run's best sequence (Tol vibrant red)
RERANK_COLOR = "#33BBEE"  # best hypothesis under the slider's what-if penalty (Tol vibrant cyan)
FINISHED_COLOR = "#009988"  # finished hypotheses (Tol vibrant teal)
PRUNED_COLOR = "#BBBBBB"
PRUNED_LABEL_COLOR = "#999999"
SURVIVOR_EDGE = "#555555"

# Diverse beam search: one colour per beam group (Paul Tol's palettes, away from the red, teal and cyan above);
# more groups than colours reuse them in turn.
GROUP_COLORS = ("#0077BB", "#EE7733", "#AA4499", "#117733", "#332288", "#999933", "#882255", "#DDAA33")

CHUNK_STEPS = 16  # steps per set of plot items

NODE_SIZE = {ROOT: 12, SURVIVING: 10, PRUNED: 6, FINISHED: 12}
NODE_SYMBOL = {ROOT: "s", SURVIVING: "o", PRUNED: "o", FINISHED: "d"}
BEST_GROWTH = 3  # px added to the best path's nodes

# Stacking order, bottom to top.
Z_PRUNED_EDGES, Z_BEAM_EDGES, Z_RERANK_PATH, Z_BEST_PATH, Z_NODES, Z_BEST_NODES, Z_LABELS = range(7)


class TokenLabels(pg.GraphicsObject):
    """All node labels in one item, drawn at a fixed pixel size next to their nodes.

    Labels arrive in step order (x never decreases), so the visible ones are found by binary search. Level of
    detail: labels are elided to the space before the next column, and when rows get too close only the beams'
    (then only the best path's) labels are drawn.
    """

    def __init__(self) -> None:
        super().__init__()
        self.font = QFont("DejaVu Sans Mono", 9)
        self.bold_font = QFont(self.font)
        self.bold_font.setBold(True)
        self._metrics = QFontMetrics(self.font)
        self._bold_metrics = QFontMetrics(self.bold_font)
        self.clear()

    def clear(self) -> None:
        self.prepareGeometryChange()
        self._n = 0
        self._x = np.empty(1024)
        self._y = np.empty(1024)
        self._tiers = np.empty(1024, dtype=int)  # 0 = best path, 1 = beams and finished, 2 = pruned
        self._bold = np.zeros(1024, dtype=bool)
        self._texts: list[str] = []
        self._colors: list[QColor] = []
        self._extent: tuple[float, float, float, float] | None = None  # x min, x max, y min, y max
        self._bounds = QRectF()
        self.update()

    def __len__(self) -> int:
        return self._n

    def append(self, x: list[float], y: list[float], texts: list[str], tiers: list[int], colors: list[QColor],
               bold: list[bool]) -> None:
        k = len(texts)
        if k == 0:
            return
        n = self._n
        if n + k > len(self._x):  # grow geometrically: appending stays O(new labels) on average
            size = max(2 * len(self._x), n + k)
            self._x, self._y = np.resize(self._x, size), np.resize(self._y, size)
            self._tiers, self._bold = np.resize(self._tiers, size), np.resize(self._bold, size)
        self._x[n : n + k] = x
        self._y[n : n + k] = y
        self._tiers[n : n + k] = tiers
        self._bold[n : n + k] = bold
        self._texts.extend(texts)
        self._colors.extend(colors)
        self._n = n + k
        new = (min(x), max(x), min(y), max(y))
        old = self._extent or new
        extent = (min(old[0], new[0]), max(old[1], new[1]), min(old[2], new[2]), max(old[3], new[3]))
        if extent != self._extent:
            # One column and one row of margin: the labels sit to the right of their nodes.
            self.prepareGeometryChange()
            self._extent = extent
            self._bounds = QRectF(extent[0], extent[2] - 1, extent[1] - extent[0] + 2, extent[3] - extent[2] + 2)
        self.update()

    def restyle(self, index: int, tier: int, color: QColor, bold: bool) -> None:
        self._tiers[index], self._colors[index], self._bold[index] = tier, color, bold
        self.update()

    def set_text(self, index: int, text: str) -> None:
        self._texts[index] = text
        self.update()

    def style(self, index: int) -> tuple[int, QColor, bool]:
        return int(self._tiers[index]), self._colors[index], bool(self._bold[index])

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter: QPainter, option, widget=None) -> None:
        n = self._n
        if not n:
            return
        transform = painter.transform()
        px_x = abs(transform.m11()) or 1.0  # pixels per step
        px_y = abs(transform.m22()) or 1.0  # pixels per row
        room = px_x - 16  # pixels between a node and the next column
        if room < 14:
            return
        max_tier = 2 if px_y >= 17 else 1 if px_y >= 8 else 0
        view = self.getViewBox()
        visible = view.viewRect() if view is not None else self._bounds
        xs = self._x[:n]
        lo = int(np.searchsorted(xs, visible.left() - 1, side="left"))
        hi = int(np.searchsorted(xs, visible.right(), side="right"))
        ys = self._y[lo:hi]
        mask = (self._tiers[lo:hi] <= max_tier) & (ys >= visible.top() - 1) & (ys <= visible.bottom() + 1)
        painter.save()
        painter.resetTransform()
        half = self._metrics.ascent() / 2 - 1
        height = self._metrics.height()
        backdrop = QColor(255, 255, 255, 210)  # keeps labels readable over the edges
        for i in lo + np.flatnonzero(mask):
            point = transform.map(QPointF(float(self._x[i]), float(self._y[i])))
            bold = bool(self._bold[i])
            font, metrics = (self.bold_font, self._bold_metrics) if bold else (self.font, self._metrics)
            text = metrics.elidedText(self._texts[i], Qt.TextElideMode.ElideRight, int(room))
            left = point.x() + 8
            painter.fillRect(QRectF(left - 1, point.y() - height / 2, metrics.horizontalAdvance(text) + 2, height),
                             backdrop)
            painter.setFont(font)
            painter.setPen(QPen(self._colors[i]))
            painter.drawText(QPointF(left, point.y() + half), text)
        painter.restore()


class HoverTip:
    """Which chunk's nodes set the view's tooltip (the chunks share one tooltip, on the view)."""

    def __init__(self) -> None:
        self.owner: NodeScatter | None = None


class NodeScatter(pg.ScatterPlotItem):
    """One chunk's nodes, with hover tips on the view that clear only when this chunk set them (pyqtgraph's own
    hover would let the chunk the mouse just left wipe the tip the next chunk had set)."""

    TIPS_SHOWN = 3

    def __init__(self, tip, shared: HoverTip) -> None:
        super().__init__(pxMode=True, hoverable=True, tip=tip)
        self._shared = shared

    def hoverEvent(self, ev) -> None:
        view = self.getViewBox()
        if view is None:
            return
        points = [] if ev.exit else self.pointsAt(ev.pos())
        if len(points):
            tips = [self.opts["tip"](x=p.pos().x(), y=p.pos().y(), data=p.data()) for p in points[: self.TIPS_SHOWN]]
            if len(points) > self.TIPS_SHOWN:
                tips.append(f"({len(points) - self.TIPS_SHOWN} others...)")
            view.setToolTip("\n\n".join(tips))
            self._shared.owner = self
        elif self._shared.owner is self:
            view.setToolTip("")
            self._shared.owner = None


def group_color(group: int) -> str:
    return GROUP_COLORS[group % len(GROUP_COLORS)]


class StepChunk:
    """The nodes and edges of ``CHUNK_STEPS`` consecutive steps, in their own plot items (a diverse beam search's
    beams' edges: one item per beam group, in its colour)."""

    def __init__(self, view: pg.ViewBox, tip, hover: HoverTip, beam_pen: QPen, pruned_pen: QPen,
                 group_pens: dict[int, QPen] | None = None) -> None:
        self._view = view
        self._group_pens = group_pens if group_pens is not None else {}
        self.group_edges: dict[int, tuple[pg.PlotCurveItem, list[float]]] = {}
        self.nodes = NodeScatter(tip, hover)
        self.beam_edges = pg.PlotCurveItem(pen=beam_pen, connect="pairs")
        # Separate lines, not one path: Qt strokes a wide antialiased path of fanning, overlapping segments ~6x
        # slower. The segments overlap only at a parent, under its node.
        self.beam_edges.setSegmentedLineMode("on")
        self.pruned_edges = pg.PlotCurveItem(pen=pruned_pen, connect="pairs")
        self.beam_xy: list[float] = []  # x0, y0, x1, y1 of each segment
        self.pruned_xy: list[float] = []
        for z, item in ((Z_PRUNED_EDGES, self.pruned_edges), (Z_BEAM_EDGES, self.beam_edges),
                        (Z_NODES, self.nodes)):
            item.setZValue(z)
            view.addItem(item)

    def items(self) -> tuple[pg.GraphicsObject, ...]:
        return self.pruned_edges, self.beam_edges, self.nodes, *(curve for curve, _ in self.group_edges.values())

    def group_xy(self, group: int) -> list[float]:
        """The segments of a beam group's edges (its plot item is made on first use)."""
        if group not in self.group_edges:
            pen = self._group_pens.get(group)
            if pen is None:
                pen = self._group_pens[group] = pg.mkPen(group_color(group), width=2)
            curve = pg.PlotCurveItem(pen=pen, connect="pairs")
            curve.setSegmentedLineMode("on")
            curve.setZValue(Z_BEAM_EDGES)
            self._view.addItem(curve)
            self.group_edges[group] = (curve, [])
        return self.group_edges[group][1]

    def set_edges(self) -> None:
        for curve, xy in ((self.beam_edges, self.beam_xy), (self.pruned_edges, self.pruned_xy),
                          *self.group_edges.values()):
            pairs = np.array(xy, dtype=float).reshape(-1, 2)
            curve.setData(pairs[:, 0], pairs[:, 1], connect="pairs")


class ProbabilityRamp(QWidget):
    """The colour scale of the beams' fill: a gradient bar with probability ticks.

    The gradient is built once from ``shade_for_prob`` (the ramp is linear between its stops, so a linear gradient
    through samples of it is exact); a paint is one fill plus the ticks.
    """

    SAMPLES = 31

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        gradient = QLinearGradient(0.0, 0.0, 1.0, 0.0)
        gradient.setCoordinateMode(QGradient.CoordinateMode.ObjectBoundingMode)
        floor = SHADE_TICKS[-1]  # the darkest shade: this probability or less
        for k in range(self.SAMPLES):
            prob = floor ** (k / (self.SAMPLES - 1))  # 100 % … 0.1 %, evenly spaced in log-prob
            gradient.setColorAt(shade_fraction(prob), shade_for_prob(prob))
        self._brush = QBrush(gradient)
        self._labels = ["≤0.1%" if tick == floor else f"{tick * 100:g}%" for tick in SHADE_TICKS]
        self.setFixedSize(200, 30)
        self.setToolTip("Fill of the surviving beams' nodes: the token's probability given its beam")

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        metrics = painter.fontMetrics()
        margin = 16
        width = self.width() - 2 * margin
        top, bar_h = 2, 11
        bar = QRectF(margin, top, width, bar_h)
        painter.fillRect(bar, self._brush)
        painter.setPen(QColor("#555555"))
        painter.drawRect(bar)
        painter.setPen(self.palette().windowText().color())
        for tick, label in zip(SHADE_TICKS, self._labels, strict=True):
            x = margin + round(shade_fraction(tick) * width)
            painter.drawLine(x, top + bar_h, x, top + bar_h + 3)
            text_w = metrics.horizontalAdvance(label)
            painter.drawText(max(0, min(self.width() - text_w, x - text_w // 2)), top + bar_h + 4 + metrics.ascent(),
                             label)
        painter.end()
