"""A thin strip over a run's steps, left to right, one column per step: labelled rows of cells, the charted step
outlined, a step's details on hover and a click to chart it. The what-if's strip and the constraint's strip are
two kinds of it (``what_if.WhatIfStrip``, ``constraint.ConstraintStrip``): each says what its rows are and draws
its cells; the columns, the labels, the selection and the mouse are here."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from playground.ui.style import MARK_COLOR


class StepStrip(QWidget):
    """``ROWS``: (key, words, colour) per row; ``marked[key]``: the steps with a cell in that row (counted in the
    row's label); ``paint_cells`` draws them."""

    step_clicked = Signal(int)
    ROWS: tuple[tuple[str, str, str], ...] = ()
    LABEL_W = 118
    ROW_H = 14

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(self.ROW_H * len(self.ROWS) + 6)
        font = self.font()
        font.setPointSize(8)
        self.setFont(font)
        self.marked: dict[str, list[int]] = {key: [] for key, _, _ in self.ROWS}
        self.steps = 0
        self.selected: int | None = None
        self.tip: Any = None  # step -> its hover text
        self.help = ""  # what the rows mean, on hover over the labels

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())

    def select(self, step: int | None) -> None:
        if step != self.selected:
            self.selected = step
            self.update()

    def row_top(self, row: int) -> int:
        return 3 + row * self.ROW_H

    def _column(self, step: int) -> QRect:
        width = max(1, self.width() - self.LABEL_W - 2)
        left = self.LABEL_W + int(step * width / max(1, self.steps))
        right = self.LABEL_W + int((step + 1) * width / max(1, self.steps))
        return QRect(left, 0, max(1, right - left), self.height())

    def cell_rect(self, row: int, step: int) -> QRect:
        """Where step ``step``'s cell in row ``row`` is drawn."""
        column = self._column(step)
        return QRect(column.left(), self.row_top(row) + 1, max(2, column.width() - 1), self.ROW_H - 2)

    def step_at(self, x: int) -> int | None:
        if self.steps == 0 or x < self.LABEL_W:
            return None
        width = max(1, self.width() - self.LABEL_W - 2)
        step = int((x - self.LABEL_W) * self.steps / width)
        return step if 0 <= step < self.steps else None

    def row_label(self, key: str, words: str) -> str:
        return f"{words} ({len(self.marked[key])})" if self.steps else words

    def paint_cells(self, painter: QPainter) -> None:
        """Draw the rows' cells (the background, labels, selection and frame are drawn around them)."""

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor("#FFFFFF"))
        metrics = painter.fontMetrics()
        for i, (key, words, color) in enumerate(self.ROWS):
            painter.setPen(QColor(color))
            painter.drawText(QRect(2, self.row_top(i), self.LABEL_W - 6, self.ROW_H), Qt.AlignmentFlag.AlignRight
                             | Qt.AlignmentFlag.AlignVCenter,
                             metrics.elidedText(self.row_label(key, words), Qt.TextElideMode.ElideRight,
                                                self.LABEL_W - 6))
        if self.selected is not None and 0 <= self.selected < self.steps:
            painter.fillRect(self._column(self.selected), QColor(MARK_COLOR))
        self.paint_cells(painter)
        painter.setPen(QColor("#BBBBBB"))
        painter.drawRect(self.LABEL_W, 0, self.width() - self.LABEL_W - 1, self.height() - 1)
        painter.end()

    def tooltip_at(self, step: int) -> str:
        return self.tip(step) if self.tip is not None else ""

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        x = int(event.position().x())
        step = self.step_at(x)
        if step is None and x < self.LABEL_W and self.help:
            QToolTip.showText(event.globalPosition().toPoint(), self.help, self)
        elif step is None or self.tip is None:
            QToolTip.hideText()
        else:
            QToolTip.showText(event.globalPosition().toPoint(), self.tooltip_at(step), self)
        super().mouseMoveEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        step = self.step_at(int(event.position().x()))
        if step is not None and event.button() == Qt.MouseButton.LeftButton:
            self.step_clicked.emit(step)
        super().mousePressEvent(event)
