"""Every step of a contrastive-search run as one cell: magenta where the degeneration penalty overturned the model's
top choice, grey where it did not, hatched where the token was forced; the shown step outlined. Hover a cell to see
its step, click to keep it."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QMouseEvent, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

OVERTURNED_COLOR = "#EE3377"  # Tol's magenta: as the contrastive view's "changed the choice"
KEPT_COLOR = "#BBBBBB"
CELL_MAX = 22.0  # px: a cell's widest (short runs)
STRIP_HEIGHT = 26


class OverturnStrip(QWidget):
    """One row of cells; ``steps`` are (overturned, forced) per step."""

    def __init__(self, hovered: Callable[[int | None], None], clicked: Callable[[int], None],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.steps: list[tuple[bool, bool]] = []
        self.shown: int | None = None
        self._hovered, self._clicked = hovered, clicked
        self.setMouseTracking(True)
        self.setMinimumHeight(STRIP_HEIGHT)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_steps(self, steps: list[tuple[bool, bool]], shown: int | None) -> None:
        self.steps, self.shown = steps, shown
        self.update()

    def _cell(self) -> float:
        return min(CELL_MAX, self.width() / max(len(self.steps), 1))

    def step_at(self, x: float) -> int | None:
        index = int(x // self._cell()) if self.steps else -1
        return index if 0 <= index < len(self.steps) else None

    def paintEvent(self, event) -> None:  # Qt's name
        painter = QPainter(self)
        cell, height = self._cell(), float(self.height())
        hatch = QBrush(QColor(KEPT_COLOR), Qt.BrushStyle.BDiagPattern)
        for i, (overturned, forced) in enumerate(self.steps):
            rect = QRectF(i * cell + 0.5, 2.0, max(cell - 1.5, 1.0), height - 4.0)
            brush = hatch if forced else QBrush(QColor(OVERTURNED_COLOR if overturned else KEPT_COLOR))
            painter.fillRect(rect, brush)
        if self.shown is not None and 0 <= self.shown < len(self.steps):
            painter.setPen(QPen(QColor("#222222"), 2.0))
            painter.drawRect(QRectF(self.shown * cell + 1.0, 1.0, max(cell - 2.0, 2.0), height - 2.0))
        painter.end()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # Qt's name
        self._hovered(self.step_at(event.position().x()))

    def leaveEvent(self, event) -> None:  # Qt's name
        self._hovered(None)
        super().leaveEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:  # Qt's name
        index = self.step_at(event.position().x())
        if index is not None:
            self._clicked(index)
