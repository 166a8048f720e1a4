"""The steered output, token by token, with a mark where the live strength changed (hover it: old → new).

Tokens are appended as they come (nothing drawn is rewritten); a change mark is a small "▶ +8" anchor before the
first token that used the new strength, its tooltip saying the old and new strengths and that the earlier tokens'
cache was not recomputed.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QHelpEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from playground.state import flowing_token_text
from playground.state.steering import SteeringState, StrengthChange, format_strengths
from playground.ui.style import mono_font
from playground.ui.views.steering.heatmap import CHANGE_COLOR

CHANGE_PREFIX = "change:"


def change_tooltip(change: StrengthChange) -> str:
    return (f"Strength changed {format_strengths(change.before)} → {format_strengths(change.after)} from this "
            "token on (the live slider). The tokens before keep the cache computed at the old strength: it is "
            "not recomputed.")


def change_mark(change: StrengthChange) -> str:
    return f"▶{format_strengths(change.after)}"


class SteeredText(QTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFont(mono_font(11))
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._plain = QTextCharFormat()
        self._plain.setForeground(QColor("#222222"))
        self.changes: dict[str, StrengthChange] = {}  # anchor -> the change it marks
        self.forget()

    def forget(self) -> None:
        self.clear()
        self.changes = {}
        self._drawn = 0  # tokens with their text in the document
        self._state: SteeringState | None = None

    def draw(self, state: SteeringState) -> None:
        """Append the tokens whose text has come since the last draw (a new run's state starts over)."""
        if state is not self._state or len(state.tokens) < self._drawn:
            self.forget()
            self._state = state
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        while self._drawn < len(state.tokens) and state.tokens[self._drawn].text is not None:
            index = self._drawn
            change = state.change_at(index)
            if change is not None:
                anchor = f"{CHANGE_PREFIX}{index}"
                self.changes[anchor] = change
                mark = QTextCharFormat()
                mark.setForeground(QColor("#FFFFFF"))
                mark.setBackground(QColor(CHANGE_COLOR))
                mark.setFontWeight(700)
                mark.setAnchor(True)
                mark.setAnchorHref(anchor)
                mark.setToolTip(change_tooltip(change))
                cursor.insertText(change_mark(change), mark)
            cursor.insertText(flowing_token_text(state.tokens[index].text or ""), self._plain)
            self._drawn += 1
        cursor.endEditBlock()
        if not state.ended:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def tooltip_at(self, x: int, y: int) -> str:
        """The tooltip of what is under viewport point (x, y) ("" when nothing: plain text)."""
        from PySide6.QtCore import QPoint

        anchor = self.anchorAt(QPoint(x, y))
        change = self.changes.get(anchor)
        return change_tooltip(change) if change is not None else ""

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            help_event = event if isinstance(event, QHelpEvent) else None
            if help_event is not None:
                text = self.tooltip_at(help_event.pos().x(), help_event.pos().y())
                if text:
                    QToolTip.showText(help_event.globalPos(), text, self)
                else:
                    QToolTip.hideText()
                return True
        return super().viewportEvent(event)
