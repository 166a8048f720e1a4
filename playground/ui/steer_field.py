"""The settings form's steering field: the ``--steer`` specs (``FILE[:STRENGTH]``, several separated by ``|``) and
a "Build…" button that asks the window for the "Build a steering vector" dialog (``playground.ui.steer_build_dialog``);
a vector built there is added to the field (``add``)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QPushButton, QWidget


class SteerField(QWidget):
    build_requested = Signal()  # "Build…": the window opens the dialog

    def __init__(self, help_text: str, parse: Callable[[str], tuple[str, ...]],
                 format_specs: Callable[[tuple[str, ...]], str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._parse, self._format = parse, format_specs
        self.line = QLineEdit()
        self.line.setPlaceholderText("FILE[:STRENGTH] | …")
        self.line.setToolTip(help_text)
        self.build_button = QPushButton("Build…")
        self.build_button.setToolTip("Build a steering vector from contrast examples on the loaded model (a shipped "
                                     "set or your own), with progress and Stop; it is added here")
        self.build_button.clicked.connect(self.build_requested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.line, stretch=1)
        layout.addWidget(self.build_button)

    @property
    def changed(self):
        return self.line.textChanged

    def specs(self) -> tuple[str, ...]:
        return self._parse(self.line.text())

    def set_specs(self, specs: tuple[str, ...]) -> None:
        self.line.setText(self._format(tuple(specs)))

    def add(self, spec: str) -> None:
        """Another vector, after those already there (one already there is not repeated)."""
        specs = self.specs()
        if spec not in specs:
            self.set_specs((*specs, spec))
