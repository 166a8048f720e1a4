"""An inline message strip (errors, notices) instead of modal dialogs: the app never blocks on a message."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from playground.ui.style import ERROR_BG, ERROR_FG, INFO_BG, INFO_FG


class MessageBanner(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel(self)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action = QPushButton(self)
        self.action.hide()
        self.close_button = QPushButton("✕", self)
        self.close_button.setFlat(True)
        self.close_button.setFixedWidth(28)
        self.close_button.setToolTip("Dismiss")
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        layout.addWidget(self.close_button)
        self._callback: Callable[[], None] | None = None
        self.action.clicked.connect(self._run_action)
        self.kind = ""
        self.hide()

    def _show(self, kind: str, text: str, background: str, foreground: str,
              action: tuple[str, Callable[[], None]] | None) -> None:
        self.kind = kind
        self.setStyleSheet(f"MessageBanner {{ background: {background}; border: 1px solid {foreground}; "
                           f"border-radius: 3px; }} QLabel {{ color: {foreground}; }}")
        self.label.setText(text)
        if action is None:
            self.action.hide()
            self._callback = None
        else:
            self.action.setText(action[0])
            self._callback = action[1]
            self.action.show()
        self.show()

    def show_error(self, text: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        self._show("error", f"<b>Error:</b> {text}", ERROR_BG, ERROR_FG, action)

    def show_info(self, text: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        self._show("info", text, INFO_BG, INFO_FG, action)

    def _run_action(self) -> None:
        callback = self._callback
        self.hide()
        if callback is not None:
            callback()
