"""A text of marks appended at its end in constant time: the base of the tokens view's output, the speculative and
cascade texts and the side-by-side panes.

The text lives in one QTextEdit document (a widget per token would crawl on long outputs); each mark's character
range is recorded so hover, click and the context menu can find the mark under the mouse.

Appending a token costs work proportional to the line being written, not to the output: Qt lays out a whole
paragraph again whenever text is added to it, and a model can write a paragraph of thousands of tokens (at 4,000
tokens one append took ~9 ms of the GUI thread, taken from the model's CPU). So the paragraph being written is
kept to a few lines: when it reaches SPLIT_LINES lines, the lines above its last one become a block of their own,
split exactly where Qt wrapped the line anyway, so the text looks the same. A split is layout only (a mark's range
may then span the block break, after its leading space): the recorded marks say what the model wrote, and a change
of width lays the text out again from them.
"""

from __future__ import annotations

import bisect

from PySide6.QtCore import QPoint, QPointF, Qt, QTimer
from PySide6.QtGui import QResizeEvent, QTextCursor, QTextDocument
from PySide6.QtWidgets import QTextEdit, QWidget

# The paragraph being written is split once it has this many lines (so short outputs are never split).
SPLIT_LINES = 8
# After the view's width changes, how long to wait (for the resize to settle) before laying the text out again.
RELAYOUT_MS = 150


def split_wrapped_paragraph(document: QTextDocument, floor: int = 0) -> int | None:
    """If the document's last paragraph has grown to SPLIT_LINES lines, end its block where its last line starts
    (where Qt wrapped the line anyway, often just after a token's leading space): the text above keeps its lines, and
    later appends lay out only the last line. Returns the position split at (None: no split; never at or before
    ``floor``)."""
    block = document.lastBlock()
    layout = block.layout()
    if layout is None or layout.lineCount() < SPLIT_LINES:
        return None
    split = block.position() + layout.lineAt(layout.lineCount() - 1).textStart()
    if split <= max(block.position(), floor):
        return None
    cursor = QTextCursor(document)
    cursor.setPosition(split)
    cursor.insertBlock()
    return split


def shift_ranges(starts: list[int], ends: list[int], split: int) -> None:
    """Move the recorded character ranges past ``split`` by the block break inserted there (a range that spans it
    keeps its start and grows by the break)."""
    for i in range(bisect.bisect_right(ends, split), len(starts)):
        if starts[i] >= split:
            starts[i] += 1
        ends[i] += 1


class MarkedTextEdit(QTextEdit):
    """A read-only text of marks appended at its end, each mark's character range recorded (``starts``, ``ends``)
    so the mark under the mouse can be found. Its paragraph being written is kept short as the token view keeps its
    own (``split_paragraph`` after each append: work per append proportional to what is new, not to the output);
    when the width changes, the text is drawn again by ``redraw`` once the resize settles (lines split for the old
    width would end early or wrap twice), keeping the end or the top mark in view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.starts: list[int] = []  # document position of each drawn mark (an empty range for a hidden one)
        self.ends: list[int] = []
        self._split_width: float | None = None  # the text width the splits were made for (None: no splits)
        self._view_before_relayout: tuple[bool, int | None] = (True, None)  # following the end; top mark
        self._relayout_timer = QTimer(self)
        self._relayout_timer.setSingleShot(True)
        self._relayout_timer.setInterval(RELAYOUT_MS)
        self._relayout_timer.timeout.connect(self._relayout)

    @property
    def drawn(self) -> int:
        return len(self.starts)

    def clear_marks(self) -> None:
        self.clear()
        self.starts.clear()
        self.ends.clear()
        self._split_width = None

    def split_paragraph(self) -> None:
        """After an append: split the paragraph being written once it is SPLIT_LINES lines long."""
        split = split_wrapped_paragraph(self.document())
        if split is not None:
            shift_ranges(self.starts, self.ends, split)
            self._split_width = self.document().textWidth()

    def redraw(self) -> None:
        """Draw every drawn mark again from scratch (after a change of width)."""
        raise NotImplementedError

    def mark_at(self, point: QPoint) -> int | None:
        doc_point = QPointF(point.x() + self.horizontalScrollBar().value(),
                            point.y() + self.verticalScrollBar().value())
        position = self.document().documentLayout().hitTest(doc_point, Qt.HitTestAccuracy.ExactHit)
        index = bisect.bisect_right(self.starts, position) - 1
        if 0 <= index < self.drawn and position < self.ends[index]:
            return index
        return None

    def resizeEvent(self, event: QResizeEvent) -> None:
        if self._split_width is not None and not self._relayout_timer.isActive():
            bar = self.verticalScrollBar()  # where the reader was, before the new width moves the lines
            top = bisect.bisect_right(self.starts, self.cursorForPosition(QPoint(4, 4)).position()) - 1
            self._view_before_relayout = (bar.value() >= bar.maximum() - 40, top if top >= 0 else None)
        super().resizeEvent(event)
        if self._split_width is not None and self.document().textWidth() != self._split_width:
            self._relayout_timer.start()

    def _relayout(self) -> None:
        if self._split_width is None or self.document().textWidth() == self._split_width:
            return
        at_end, top = self._view_before_relayout
        self.redraw()
        bar = self.verticalScrollBar()
        if at_end:
            bar.setValue(bar.maximum())
        elif top is not None and top < self.drawn:
            cursor = QTextCursor(self.document())
            cursor.setPosition(self.starts[top])
            bar.setValue(bar.value() + self.cursorRect(cursor).top())
