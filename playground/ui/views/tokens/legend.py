"""The tokens view's shading legend: the probability ramp with its ticks, GLTR's rank buckets, or a constrained run's
removed-mass ramp (white to red, as opaque as the share removed), whichever the shading shows."""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtGui import QColor, QPainter, QPixmap
from PySide6.QtWidgets import QWidget

from playground.state import shade_fraction
from playground.ui.style import SHADE_TICKS, shade_at
from playground.ui.views.tokens.constraint import removed_shade

# GLTR's rank buckets (here top 1 / 10 / 100 / the rest): (highest rank in the bucket, colour, the legend's words).
RANK_BUCKETS: tuple[tuple[float, str, str], ...] = (
    (1, "#A6DBA0", "top 1"),
    (10, "#B7D7F0", "top 10"),
    (100, "#F4A582", "top 100"),
    (float("inf"), "#B88AD6", "rest"),
)


def rank_bucket(rank: int) -> int:
    """Which of ``RANK_BUCKETS`` a raw rank (1 = top) falls in."""
    return next(i for i, (top, _, _) in enumerate(RANK_BUCKETS) if rank <= top)


class ShadeLegend(QWidget):
    """A gradient bar with probability ticks, and which distribution the shading shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(34)
        self.setMinimumWidth(260)
        self._ramp_cache: QPixmap | None = None
        self.ranks = False  # the rank buckets' swatches instead of the probability ramp
        self.removed = False  # the constraint's removed-mass ramp instead of the probability ramp

    def changeEvent(self, event) -> None:
        """A larger font (presentation mode) needs a taller legend: the ticks' labels sit under the 18 px ramp."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self.setMinimumHeight(max(34, 18 + self.fontMetrics().height() + 2))

    def show_ranks(self, ranks: bool) -> None:
        self.ranks = ranks
        self.update()

    def show_removed(self, removed: bool) -> None:
        self.removed = removed
        self.update()

    def _paint_removed(self, painter: QPainter) -> None:
        """White to red by the share of the raw probability the constraint removed, ticked 0-100%."""
        width = self.width() - 40
        left, top, bar_h = 20, 2, 12
        for x in range(width):
            painter.setPen(removed_shade(x / max(1, width - 1)))
            painter.drawLine(left + x, top, left + x, top + bar_h)
        painter.setPen(QColor("#555555"))
        painter.drawRect(left, top, width, bar_h)
        painter.setPen(self.palette().windowText().color())
        metrics = painter.fontMetrics()
        for share in (0.0, 0.25, 0.5, 0.75, 1.0):
            x = left + int(share * (width - 1))
            label = f"{share * 100:g}%" + (" removed" if share == 1.0 else "")
            painter.drawLine(x, top + bar_h, x, top + bar_h + 3)
            text_w = metrics.horizontalAdvance(label)
            painter.drawText(max(0, min(self.width() - text_w, x - text_w // 2)), top + bar_h + 4 + metrics.ascent(),
                             label)

    def _paint_buckets(self, painter: QPainter) -> None:
        """One swatch per rank bucket, with its words, across the width."""
        metrics = painter.fontMetrics()
        cell = (self.width() - 40) / len(RANK_BUCKETS)
        for i, (_, color, words) in enumerate(RANK_BUCKETS):
            x = 20 + int(i * cell)
            painter.fillRect(x, 2, int(cell) - 6, 12, QColor(color))
            painter.setPen(QColor("#555555"))
            painter.drawRect(x, 2, int(cell) - 6, 12)
            painter.setPen(self.palette().windowText().color())
            painter.drawText(x, 2 + 12 + 4 + metrics.ascent(), words)

    def _ramp(self, width: int, height: int) -> QPixmap:
        """The colour ramp, drawn once per width (a per-pixel loop on every repaint is slow)."""
        if self._ramp_cache is None or self._ramp_cache.width() != width:
            ramp = QPixmap(max(1, width), height)
            ramp_painter = QPainter(ramp)
            for x in range(width):
                ramp_painter.setPen(shade_at(x / max(1, width - 1)))
                ramp_painter.drawLine(x, 0, x, height)
            ramp_painter.end()
            self._ramp_cache = ramp
        return self._ramp_cache

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        if self.ranks or self.removed:
            (self._paint_buckets if self.ranks else self._paint_removed)(painter)
            painter.end()
            return
        width = self.width() - 40
        left, top, bar_h = 20, 2, 12
        painter.drawPixmap(left, top, self._ramp(width, bar_h))
        painter.setPen(QColor("#555555"))
        painter.drawRect(left, top, width, bar_h)
        painter.setPen(self.palette().windowText().color())
        metrics = painter.fontMetrics()
        for tick in SHADE_TICKS:
            x = left + int(shade_fraction(tick) * (width - 1))
            label = "≤0.1%" if tick == SHADE_TICKS[-1] else f"{tick * 100:g}%"
            painter.drawLine(x, top + bar_h, x, top + bar_h + 3)
            text_w = metrics.horizontalAdvance(label)
            painter.drawText(max(0, min(self.width() - text_w, x - text_w // 2)), top + bar_h + 4 + metrics.ascent(),
                             label)
        painter.end()
