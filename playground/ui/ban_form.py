"""The phrase bans' entries in the settings form: one phrase (or pattern) a line, spaces kept (" heart of" with its
leading space bans the phrase mid-sentence only), ``|`` and commas kept (a pattern's alternatives)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QPlainTextEdit

from playground.config.table import Row
from playground.ui.style import mono_font

if TYPE_CHECKING:
    from playground.ui.controls import Binding


def ban_lines(text: str) -> tuple[str, ...]:
    """The entries of the editor's text: its non-empty lines, exactly as written."""
    return tuple(line for line in text.split("\n") if line.strip())


def lines_binding(row: Row) -> Binding:
    from playground.ui.controls import Binding  # (it imports this module)

    edit = QPlainTextEdit()
    edit.setFont(mono_font(10))
    edit.setPlaceholderText("one a line (spaces kept)")
    edit.setToolTip(row.spec.help + ". One entry a line; spaces are kept.")
    edit.setFixedHeight(52)
    return Binding(row, edit, lambda: ban_lines(edit.toPlainText()), lambda v: edit.setPlainText("\n".join(v)))
