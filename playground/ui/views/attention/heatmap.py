"""The attention view's layers × positions heatmap of one step (one head or the mean over heads), and the
weight of one clicked position in every layer."""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from playground.ui.views.drawing import set_ticks, set_title, static_plot

EVICTED_BRUSH = (150, 150, 150, 90)


class HeatmapPanel(QWidget):
    """Rows: layers (1 at the bottom); columns: positions (the prompt, then the output); brighter = more weight.
    Positions an evicting cache had dropped by this step are shaded grey below the map. Click: ``position_clicked``."""

    position_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = static_plot(self, "Attention of the selected token, per layer", "position (prompt, then output)",
                                "layer", min_height=160)
        item = self.plot.getPlotItem()
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=pg.colormap.get("magma"), label="weight",
                                        interactive=False, width=14)
        self.colorbar.setImageItem(self.image, insert_in=item)
        self.evicted = pg.BarGraphItem(x=[], height=[], width=1.0, y0=0.0, brush=EVICTED_BRUSH, pen=None)
        item.addItem(self.evicted)
        self.marker = pg.InfiniteLine(angle=90, pen=pg.mkPen((80, 160, 255), width=2))
        item.addItem(self.marker)
        self.plot.scene().sigMouseClicked.connect(self._clicked)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot)

    def draw(self, matrix: np.ndarray, evicted: list[int], selected: int | None) -> None:
        layers, positions = matrix.shape
        item = self.plot.getPlotItem()
        top = float(matrix.max()) if matrix.size and matrix.max() > 0 else 1.0
        self.colorbar.setLevels((0.0, top))
        self.image.setImage(matrix, autoLevels=False, levels=(0.0, top))
        self.image.setRect(QRectF(-0.5, 0.5, positions, layers))
        item.setXRange(-0.5, positions - 0.5, padding=0)
        item.setYRange(0.0, layers + 0.5, padding=0)
        step = 1 if layers <= 12 else 5
        set_ticks(item.getAxis("left"), [[(float(v), str(v)) for v in range(1, layers + 1)
                                        if v == 1 or v % step == 0 or v == layers]])
        self.evicted.setOpts(x=evicted, height=[0.5] * len(evicted), y0=0.0)
        self.marker.setVisible(selected is not None)
        if selected is not None:
            self.marker.setValue(selected)

    def _clicked(self, event) -> None:
        point = self.plot.getPlotItem().vb.mapSceneToView(event.scenePos())
        if self.image.image is not None and 0 <= round(point.x()) < self.image.image.shape[1]:
            self.position_clicked.emit(round(point.x()))


class LayerProfilePanel(QWidget):
    """The clicked position's weight in every layer (the selected head or the mean)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = static_plot(self, "Clicked position, per layer", "layer", "weight",
                                min_height=160)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=(80, 160, 255))
        self.plot.getPlotItem().addItem(self.bars)
        self.plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot)

    def draw(self, weights: np.ndarray, position: int | None, text: str) -> None:
        item = self.plot.getPlotItem()
        if position is None or weights.size == 0:
            self.bars.setOpts(x=[], height=[])
            set_title(item, "Click a position on the map: its weight in every layer", size="10pt")
            return
        layers = np.arange(1, weights.size + 1)
        self.bars.setOpts(x=layers, height=weights)
        item.setXRange(0.4, weights.size + 0.6, padding=0)
        every = 1 if weights.size <= 12 else 5
        set_ticks(item.getAxis("bottom"), [[(float(v), str(v)) for v in range(1, weights.size + 1)
                                          if v == 1 or v % every == 0 or v == weights.size]])
        item.setYRange(0.0, max(float(weights.max()), 1e-3) * 1.1, padding=0)
        # The title is rich text: a special token's text ("<|im_start|>") would be read as a tag and vanish.
        set_title(item, f"Position {position} ({html.escape(repr(text))}): its weight in every layer", size="10pt")
