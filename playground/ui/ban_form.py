"""The phrase bans' entries in the settings form: one phrase (or pattern) a line, spaces kept (" heart of" with its
leading space bans the phrase mid-sentence only), ``|`` and commas kept (a pattern's alternatives)."""

from __future__ import annotations

from PySide6.QtWidgets import QPlainTextEdit, QWidget

from playground.ui.style import mono_font


def ban_lines(text: str) -> tuple[str, ...]:
    """The entries of the editor's text: its non-empty lines, exactly as written."""
    return tuple(line for line in text.split("\n") if line.strip())


class BanLines(QPlainTextEdit):
    """One entry a line (its ``textChanged`` is the form's change signal)."""

    def __init__(self, help_text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFont(mono_font(10))
        self.setPlaceholderText("one a line (spaces kept)")
        self.setToolTip(help_text + ". One entry a line; spaces are kept.")
        self.setFixedHeight(52)

    def entries(self) -> tuple[str, ...]:
        return ban_lines(self.toPlainText())

    def set_entries(self, entries: tuple[str, ...]) -> None:
        self.setPlainText("\n".join(entries))
