"""The contrastive view's strip of every step: where the contrast changed the expert's choice (this run's row) and
where it would at the what-if α (the second row); hover a step to see it, click to keep it."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QWidget

from playground.state import visible_token_text
from playground.state.contrastive import STEPS, TEXTS
from playground.ui.style import MARK_COLOR, format_percent
from playground.ui.views.columns import Panel
from playground.ui.views.contrastive.style import (
    CHANGED_COLOR,
    SAME_COLOR,
    STRIP_HEIGHT,
    TICK_CHARS,
    UNKNOWN_COLOR,
    ContrastiveOwner,
)
from playground.ui.views.drawing import clear_bars, set_ticks, set_title, static_plot
from playground.ui.views.texts import short_label

_BRUSHES: dict[tuple[bool, bool] | None, QBrush] = {}  # made once, shared by every step's bar


def step_brush(changed: bool | None, forced: bool) -> QBrush:
    """A step's bar: changed (magenta), kept (grey), forced (hatched grey), or unknown at the what-if (None)."""
    key = None if changed is None else (changed, forced)
    brush = _BRUSHES.get(key)
    if brush is None:
        if key is None:
            brush = pg.mkBrush(UNKNOWN_COLOR)
        elif forced:
            brush = QBrush(QColor(SAME_COLOR), Qt.BrushStyle.BDiagPattern)
        else:
            brush = pg.mkBrush(CHANGED_COLOR if changed else SAME_COLOR)
        _BRUSHES[key] = brush
    return brush


class StepsStrip(Panel):
    shows = frozenset({STEPS, TEXTS})

    def __init__(self, view: ContrastiveOwner, parent: QWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "Steps", "generated token (hover to see a step, click to keep it)", "",
                                min_height=STRIP_HEIGHT)
        item = self.plot.getPlotItem()
        item.setMouseEnabled(x=True, y=False)  # long runs: drag or wheel along the steps
        self.band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_COLOR, pen=pg.mkPen(None))
        self.run_row = pg.BarGraphItem(x=[], height=[], width=0.86, brushes=[], pen=pg.mkPen(None))
        self.what_if_row = pg.BarGraphItem(x=[], height=[], width=0.86, brushes=[], pen=pg.mkPen(None))
        for graphic in (self.band, self.run_row, self.what_if_row):
            item.addItem(graphic)
        set_ticks(item.getAxis("left"), [[(1.0, "this run"), (0.0, "what-if")]])
        item.getAxis("left").setWidth(64)
        self._ticks: list[tuple[float, str]] | None = None  # the labels last set (set again only when they change)
        item.getViewBox().sigResized.connect(self.draw_ticks)
        item.getViewBox().sigXRangeChanged.connect(self.draw_ticks)
        self.plot.scene().sigMouseClicked.connect(self._clicked)
        self.plot.scene().sigMouseMoved.connect(self._hovered)

    def draw(self) -> None:
        state, replay = self.view.state, self.view.replay
        n = len(state.steps)
        xs = np.arange(n, dtype=float)
        run_brushes = [step_brush(r.contrast.changed, r.contrast.forced) for r in state.steps]
        self.run_row.setOpts(x=xs, y0=np.full(n, 0.55), height=np.full(n, 0.9), width=0.86, brushes=run_brushes)
        if replay is not None:
            what_brushes = [step_brush(c, False) for c in replay.changed]
            self.what_if_row.setOpts(x=xs, y0=np.full(n, -0.45), height=np.full(n, 0.9), width=0.86,
                                     brushes=what_brushes)
        else:
            clear_bars(self.what_if_row)
        item = self.plot.getPlotItem()
        item.setXRange(-0.6, max(n, 12) - 0.4, padding=0)
        item.setYRange(-0.55, 1.55, padding=0)
        chosen = n - state.forced
        share = f" ({format_percent(state.changed / chosen)})" if chosen else ""
        set_title(item, f"Steps: the contrast changed the expert's choice at {state.changed} of {chosen}{share}" if n
                      else "Steps", size="10pt")
        self.draw_ticks()
        self.draw_band()

    def draw_ticks(self) -> None:
        """Token texts under the steps: every one when they fit, else every k-th (at the strip's current size)."""
        item = self.plot.getPlotItem()
        box = item.getViewBox()
        low, high = box.viewRange()[0]
        per_step = box.width() / max(high - low, 1.0)
        stride = max(1, math.ceil(56 / max(per_step, 1e-6)))  # a shortened label is ~55 px wide
        steps = self.view.state.steps
        ticks = [(float(j), short_label(visible_token_text(r.text if r.text is not None else "…"), TICK_CHARS))
                 for j, r in enumerate(steps) if j % stride == 0]
        if ticks != self._ticks:  # a new range re-labels the axis once (the range's signal and the draw both ask)
            self._ticks = ticks
            set_ticks(item.getAxis("bottom"), [ticks])

    def draw_band(self) -> None:
        shown = self.view.shown_step
        if shown is None:
            clear_bars(self.band)
        else:
            self.band.setOpts(x=[shown], y0=[-0.55], height=[2.1], width=1.0)

    def _step_at(self, scene_pos) -> int | None:
        box = self.plot.getPlotItem().getViewBox()
        if not box.sceneBoundingRect().contains(scene_pos):
            return None
        return round(box.mapSceneToView(scene_pos).x())

    def _clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        index = self._step_at(event.scenePos())
        if index is not None:
            self.view.select_step(index)

    def _hovered(self, scene_pos) -> None:
        self.view.hover_step(self._step_at(scene_pos))
