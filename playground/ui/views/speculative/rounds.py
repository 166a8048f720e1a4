"""The speculative view's timeline of rounds: one stacked bar per round (accepted, the target's own, rejected), the
selected round banded; click a round to inspect it."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from playground.state.speculative import ACCEPTED, REJECTED, ROUNDS, TARGET
from playground.ui.style import MARK_BAND_COLOR
from playground.ui.views.columns import Panel
from playground.ui.views.drawing import set_title, static_plot
from playground.ui.views.speculative.plots import PLOT_HEIGHT, SpeculativeOwner, bars, dashed
from playground.ui.views.speculative.text import ACCEPTED_COLOR, REJECTED_COLOR, TARGET_COLOR

TIMELINE_AXIS = "round (click one to inspect it)"


class RoundsTimeline(Panel):
    """One stacked bar per round, grown by the new rounds only."""

    shows = frozenset({ROUNDS})

    def __init__(self, view: SpeculativeOwner, parent: QWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "Rounds", TIMELINE_AXIS, "tokens", min_height=PLOT_HEIGHT)
        self.plot.getPlotItem().showGrid(y=True, alpha=0.2)
        self.band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
        self.bars = {ACCEPTED: bars(ACCEPTED_COLOR), TARGET: bars(TARGET_COLOR),
                     REJECTED: bars(REJECTED_COLOR, pattern=True)}
        self.k_line = pg.InfiniteLine(angle=0, movable=False, pen=dashed("#555555"))
        for item in (self.band, *self.bars.values(), self.k_line):
            self.plot.addItem(item)
        self._drawn = 0
        self._x: list[int] = []
        self._counts: dict[str, list[int]] = {kind: [] for kind in self.bars}
        self.plot.scene().sigMouseClicked.connect(self._clicked)

    def clear(self) -> None:
        self._drawn = 0
        self._x.clear()
        for counts in self._counts.values():
            counts.clear()

    def draw(self) -> None:
        state = self.view.state
        for index in range(self._drawn, len(state.rounds)):
            self._x.append(index)
            for kind, count in zip((ACCEPTED, REJECTED, TARGET), state.round_counts(index), strict=True):
                self._counts[kind].append(count)
        self._drawn = len(state.rounds)
        x = np.asarray(self._x, dtype=float)
        base = np.zeros(len(x))
        for kind in (ACCEPTED, TARGET, REJECTED):  # stacked bottom to top
            height = np.asarray(self._counts[kind], dtype=float)
            self.bars[kind].setOpts(x=x, y0=base.copy(), height=height, width=0.8)
            base = base + height
        drafts = state.tree_nodes if state.is_tree else state.draft_k  # the most a round drafts
        k = max(drafts, int(base.max()) if len(base) else 0)
        self.k_line.setValue(drafts)
        self.k_line.setVisible(drafts > 0)
        if state.is_tree:
            title = f"Rounds: tokens, stacked (dashed: ≤ {drafts} nodes)"
        elif drafts:
            title = f"Rounds: tokens, stacked (dashed: k = {drafts} drafted)"
        else:
            title = "Rounds: tokens, stacked"
        set_title(self.plot.getPlotItem(), title, size="10pt")
        selected = self.view.selected_round
        if selected is None:
            self.band.setOpts(x=[], height=[])
        else:
            self.band.setOpts(x=[selected], y0=[-0.3], height=[k + 1.6], width=1.0)
        n = len(x)
        item = self.plot.getPlotItem()
        item.setXRange(-0.7, max(n, 10) - 0.3, padding=0)
        item.setYRange(0, k + 1.3, padding=0)
        self.view.band_text()

    def _clicked(self, event) -> None:
        box = self.plot.getPlotItem().getViewBox()
        if event.button() != Qt.MouseButton.LeftButton or not box.sceneBoundingRect().contains(event.scenePos()):
            return
        self.view.select_round(round(box.mapSceneToView(event.scenePos()).x()))
