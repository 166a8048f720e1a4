"""The representation reading: a decoder blocks × generated tokens heat map of the residual's projection onto a
steering vector's unit direction (how far along the vector — how "happy", how "formal" — the model is at each
token, block by block), on a diverging scale centred on 0 with its colour bar."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QWidget

from playground.state import visible_token_text
from playground.state.steering import SteeringState
from playground.ui.views.drawing import set_ticks, static_plot
from playground.ui.views.texts import short_label

NEGATIVE, ZERO, POSITIVE = "#2166AC", "#F7F7F7", "#B2182B"  # ColorBrewer's RdBu ends and middle
TICK_CHARS = 8
CHANGE_COLOR = "#AA3377"  # a live strength change (Tol's purple), as in the text and the plots


def diverging_colormap() -> pg.ColorMap:
    return pg.ColorMap([0.0, 0.5, 1.0], [pg.mkColor(NEGATIVE), pg.mkColor(ZERO), pg.mkColor(POSITIVE)])


def symmetric_top(values: np.ndarray) -> float:
    """The colour scale's end: the largest |projection| rounded up to 2 significant digits (≥ a tiny floor)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 1.0
    if top <= 0:
        return 1.0
    scale = 10 ** (math.floor(math.log10(top)) - 1)
    return math.ceil(top / scale) * scale


class ProjectionMap:
    """The heat map's plot, image, colour bar and change lines: built once, updated by ``draw``."""

    def __init__(self, parent: QWidget) -> None:
        self.plot = static_plot(parent, "Residual · steering vector (representation reading)",
                                "generated token", "block N")
        item = self.plot.getPlotItem()
        item.setMouseEnabled(x=True, y=False)
        item.getAxis("left").enableAutoSIPrefix(False)  # the ticks are block numbers, not a scaled quantity
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        self.changes = pg.PlotDataItem([], [], pen=pg.mkPen(CHANGE_COLOR, width=2), connect="pairs")
        item.addItem(self.changes)
        self.top = 1.0
        self.colorbar = pg.ColorBarItem(values=(-1.0, 1.0), colorMap=diverging_colormap(),
                                        label="projection",
                                        interactive=False, width=18)
        self.colorbar.setImageItem(self.image, insert_in=item)
        self.values = np.zeros((0, 0))  # what the image shows: blocks (rows, ascending) × tokens
        self.plot.setMinimumHeight(190)

    def draw(self, state: SteeringState, vector: int) -> None:
        values = state.projection_map(vector)
        layers = state.layers or tuple(range(values.shape[0]))
        rows, n = values.shape
        item = self.plot.getPlotItem()
        self.values = values
        self.image.setVisible(n > 0 and rows > 0)
        if n and rows:
            self.top = symmetric_top(values)
            self.colorbar.setLevels((-self.top, self.top))
            self.image.setImage(values, autoLevels=False, levels=(-self.top, self.top))
            self.image.setRect(QRectF(-0.5, -0.5, n, rows))
        xs: list[float] = []
        ys: list[float] = []
        for change in state.changes:
            xs += [change.token - 0.5, change.token - 0.5]
            ys += [-0.5, rows - 0.5]
        self.changes.setData(xs, ys)
        item.setXRange(-0.5, max(n, 1) - 0.5, padding=0)
        item.setYRange(-0.5, max(rows, 1) - 0.5, padding=0)
        step = 1 if rows <= 16 else max(1, rows // 10)
        set_ticks(item.getAxis("left"), [[(float(i), str(layer)) for i, layer in enumerate(layers)
                                         if i % step == 0 or i == rows - 1]])
        box = item.getViewBox()
        per_token = box.width() / max(n, 1)
        stride = max(1, math.ceil(62 / max(per_token, 1e-6)))
        ticks = [(float(j), short_label(visible_token_text(t.text if t.text is not None else "…"), TICK_CHARS))
                 for j, t in enumerate(state.tokens) if j % stride == 0]
        set_ticks(item.getAxis("bottom"), [ticks])
