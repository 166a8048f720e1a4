"""What the speculative view's panels share: their least height, bars in the view's colours, dashed lines, labels
that stay inside a plot, and what they read of the view (``SpeculativeOwner``)."""

from __future__ import annotations

from typing import Protocol

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor

from playground.state.speculative import SpeculativeState

PLOT_HEIGHT = 110  # px: a plot's least height (its title, axis labels and a readable chart)
# A line's label to the left, under the line in the upper half of the plot and above it in the lower half (pyqtgraph
# picks the first anchor in the upper half): inside the plot wherever the line lies.
INSIDE_LEFT = [(1, 0), (1, 1)]
LABEL_FILL = (255, 255, 255, 200)  # behind a line's label that lies over bars or the curve
TICK_CHARS = 9  # a token's label under a bar


def bars(color: str, pattern: bool = False) -> pg.BarGraphItem:
    brush = QBrush(QColor(color), Qt.BrushStyle.BDiagPattern) if pattern else pg.mkBrush(color)
    pen = pg.mkPen(color, width=1) if pattern else pg.mkPen(None)
    return pg.BarGraphItem(x=[], height=[], width=0.8, brush=brush, pen=pen)


def dashed(color: str):
    return pg.mkPen(color, style=Qt.PenStyle.DashLine)


class SpeculativeOwner(Protocol):
    """What a panel of the speculative view reads of the view: the fold, the selected round, the dock's height, and
    what a panel asks of it (select a round, band it in the text, share the column between the round plots)."""

    state: SpeculativeState
    selected_round: int | None
    short: bool

    def select_round(self, index: int) -> None: ...

    def band_text(self) -> None: ...

    def stretch_rounds(self) -> None: ...
