"""The KV view's layers × steps heatmap: the bytes each layer holds after each step."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QWidget

from playground.state.kv import KVState
from playground.ui.views.drawing import set_ticks, static_plot
from playground.ui.views.kv.panel import MB, Panel, format_mb


class LayerPanel(Panel):
    """Bytes per layer."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, "Bytes held by each layer (MB)", "decoding step", "layer", min_height=200)
        super().__init__(plot, parent)
        item = plot.getPlotItem()
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=pg.colormap.get("viridis"),
                                        label="MB per layer", interactive=False, width=14)
        self.colorbar.setImageItem(self.image, insert_in=item)

    def draw(self, s: KVState) -> None:
        matrix = s.layer_bytes
        layers, n = matrix.shape
        self.image.setVisible(n > 0)
        item = self.plot.getPlotItem()
        if s.holder == "none":
            self.image.clear()
            self.show_note("<b>No cache in this run</b><br>No layer keeps keys or values: every step computes them "
                           "again for the whole sequence, in every layer.")
            return
        if n:
            values = matrix / MB  # layers × steps, row 0 = layer 1 (drawn at the bottom)
            top = float(values.max()) if values.size else 0.0
            top = top if top > 0 else 1.0
            self.colorbar.setLevels((0.0, top))
            self.image.setImage(values, autoLevels=False, levels=(0.0, top))
            first = float(s.steps[0])
            self.image.setRect(QRectF(first - 0.5, 0.5, n, layers))
            item.setXRange(first - 0.5, first + n - 0.5, padding=0)
            item.setYRange(0.5, layers + 0.5, padding=0)
            step = 1 if layers <= 12 else 5
            set_ticks(item.getAxis("left"), [[(float(v), str(v)) for v in range(1, layers + 1)
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
        self.show_plot(caption)
