"""The contrastive view's DoLa plot (``--amateur dola`` runs): every step's premature layer (a dot) over the JSD of
each candidate layer from the final layer (colour), beside the steps strip (its x axis linked to the strip's)."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.state.contrastive import STEPS, ContrastiveState, dola_variant
from playground.ui.views.columns import Panel
from playground.ui.views.contrastive.style import SHORT_STRIP_HEIGHT, ContrastiveOwner
from playground.ui.views.drawing import set_ticks, set_title, static_plot


def dola_rows(state: ContrastiveState) -> tuple[tuple[int, ...], np.ndarray, list[int]]:
    """DoLa's candidate layers, the JSD image [layers, steps] (nats) and each step's chosen row (empty when the run
    is not DoLa)."""
    started = state.started
    layers = started.dola_layers if started is not None else ()
    steps = [r.contrast for r in state.steps if r.contrast.layer_jsd]
    if not layers or not steps:
        return layers, np.zeros((len(layers), 0)), []
    image = np.array([s.layer_jsd for s in steps], dtype=float).T  # [layers, steps]
    return layers, image, [layers.index(s.premature_layer) for s in steps]


class DolaPlot(Panel):
    """The JSD of each candidate layer from the final layer as an image (rows: the candidate layers, columns: the
    steps) and the chosen premature layer as a dot on its row; hidden for runs that are not DoLa."""

    shows = frozenset({STEPS})

    def __init__(self, view: ContrastiveOwner, parent: QWidget, strip: pg.PlotWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "DoLa", "generated token", "layer", min_height=SHORT_STRIP_HEIGHT)
        item = self.plot.getPlotItem()
        item.getAxis("left").setWidth(34)
        item.setXLink(strip.getPlotItem())
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("viridis"))
        self.dots = pg.ScatterPlotItem(size=6, brush=pg.mkBrush("#FFFFFF"), pen=pg.mkPen("#EE3377", width=1.5))
        item.addItem(self.image)
        item.addItem(self.dots)
        self.plot.setVisible(False)

    def draw(self) -> None:
        layers, image, rows = dola_rows(self.view.state)
        self.plot.setVisible(bool(layers))
        if not layers:
            return
        item = self.plot.getPlotItem()
        n = image.shape[1]
        if n:
            self.image.setImage(image, levels=(0.0, max(float(image.max()), 1e-9)))
            self.image.setRect(-0.5, -0.5, n, len(layers))
        else:
            self.image.clear()
        self.dots.setData(x=np.arange(n, dtype=float), y=np.array(rows, dtype=float))
        every = max(1, math.ceil(len(layers) / 4))  # a short plot has room for about four labels
        set_ticks(item.getAxis("left"), [[(i, str(layer)) for i, layer in enumerate(layers) if i % every == 0]])
        item.setYRange(-0.5, len(layers) - 0.5, padding=0)
        chosen = [layers[r] for r in rows]
        common = max(set(chosen), key=chosen.count) if chosen else None
        variant = dola_variant(self.view.state.started)
        measure = "JSD" if variant == "formula" else "divergence"
        top = f" · colour: {measure}, 0 to {image.max():.2g} nats" if n else ""
        most = f" (layer {common}: {chosen.count(common)} of {n})" if common is not None else ""
        full = f"DoLa, {variant} variant: ● premature layer{most}{top}"
        # a short dock's plot is ~300 px wide: the variant and the mark stay in the title, the figures on hover
        set_title(item, f"DoLa {variant}: ● premature layer" if self.view.short else full, size="10pt")
        self.plot.setToolTip(full if self.view.short else "")
