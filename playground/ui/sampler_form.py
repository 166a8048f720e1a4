"""The settings form's sampler widgets: the chain as a list to reorder, the logit-bias editor, the guidance box.

The chain list holds every sampler in the run's order (``RunSettings.samplers``, llama.cpp's ``--samplers``): drag
a row or use ↑/↓ to move it, untick it to leave it out of the order (a sampler that is switched on but left out is
refused by the run, never silently skipped), "transformers' order" puts the default back. Each row says whether the
settings switch it on (``config.samplers.sampler_chain``) and whether the chosen strategy applies it at all (greedy
skips the sampling-only ones). The order transformers uses is written as "" so default settings stay equal.

The logit-bias editor takes one ``TOKEN=BIAS`` entry a line and keeps every space (`` Paris`` is a different token
from ``Paris``); below it, what each entry resolves to for the loaded tokenizer (ids and their texts).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from playground.config import ConfigError
from playground.config.samplers import SPECS, default_order, parse_logit_bias, parse_sampler_order, sampler_is_on
from playground.state import visible_token_text
from playground.ui.style import mono_font

ON_COLOR = "#1B5E20"
OFF_COLOR = "#757575"
SKIPPED_COLOR = "#9E9E9E"
REFUSED_COLOR = "#B71C1C"  # on, but left out of the order: the run refuses it


def order_text(order: tuple[str, ...]) -> str:
    """The settings' ``samplers`` value for ``order``: blank for transformers' order."""
    return "" if tuple(order) == default_order() else ";".join(order)


class SamplerChainList(QWidget):
    """The sampler chain, in order, reorderable; ``order_changed`` after every move, tick or reset."""

    order_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QListWidget(self)
        self.list.setDragDropMode(QAbstractItemView.DragDropMode.InternalMove)
        self.list.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setToolTip("The order the samplers run in, top first: drag a row or use ↑/↓; untick a row to leave "
                             "it out of the order. Green = on with these settings; grey = off; pale = this strategy "
                             "skips it (greedy uses only the penalties, DRY, logit bias and guidance).")
        self.list.model().rowsMoved.connect(lambda *_: self._changed())
        self.list.itemChanged.connect(lambda _item: self._changed())
        self.up = QPushButton("↑")
        self.down = QPushButton("↓")
        self.reset = QPushButton("transformers' order")
        self.up.setToolTip("Move the selected sampler one place earlier")
        self.down.setToolTip("Move the selected sampler one place later")
        self.reset.setToolTip("Every sampler, in transformers' order (generate()'s processors, then llama.cpp's): "
                              + " → ".join(default_order()))
        for button in (self.up, self.down):
            button.setFixedWidth(32)
        self.up.clicked.connect(lambda: self.move_selected(-1))
        self.down.clicked.connect(lambda: self.move_selected(1))
        self.reset.clicked.connect(lambda: self.set_order(default_order()))
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.up)
        buttons.addWidget(self.down)
        buttons.addStretch(1)
        buttons.addWidget(self.reset)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        layout.addLayout(buttons)
        self._updating = False
        self._settings: Any = None
        self._sampling = True
        self.set_order(default_order())
        # Every row in view, without a scroll bar: the order reads at a glance.
        self.list.setMinimumHeight(self.list.sizeHintForRow(0) * self.list.count() + 2 * self.list.frameWidth() + 4)

    # --- the order ------------------------------------------------------------------------------------------
    def order(self) -> tuple[str, ...]:
        """The ticked samplers, top first."""
        items = [self.list.item(i) for i in range(self.list.count())]
        return tuple(item.data(Qt.ItemDataRole.UserRole) for item in items
                     if item.checkState() == Qt.CheckState.Checked)

    def text(self) -> str:
        return order_text(self.order())

    def set_text(self, text: str) -> None:
        try:
            order = parse_sampler_order(text)
        except ConfigError:  # a saved run's order the run would refuse: show the default (the run said why)
            order = default_order()
        self.set_order(order)

    def set_order(self, order: tuple[str, ...]) -> None:
        self._updating = True
        self.list.clear()
        left_out = [name for name in SPECS if name not in order]
        for name in (*order, *left_out):
            item = QListWidgetItem(name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDragEnabled
                          | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name in order else Qt.CheckState.Unchecked)
            self.list.addItem(item)
        self._updating = False
        self._restyle()
        self.order_changed.emit()

    def move_selected(self, delta: int) -> None:
        row = self.list.currentRow()
        target = row + delta
        if row < 0 or not 0 <= target < self.list.count():
            return
        self._updating = True
        item = self.list.takeItem(row)
        self.list.insertItem(target, item)
        self.list.setCurrentRow(target)
        self._updating = False
        self._changed()

    def _changed(self) -> None:
        if self._updating:
            return
        self._restyle()
        self.order_changed.emit()

    # --- which are on ---------------------------------------------------------------------------------------
    def show_settings(self, settings: Any, sampling: bool) -> None:
        """Mark each row on or off for ``settings`` (a ``RunSettings``); ``sampling``: whether the strategy
        applies the sampling-only samplers."""
        self._settings, self._sampling = settings, sampling
        self._restyle()

    def _restyle(self) -> None:
        self._updating = True
        position = 0
        for i in range(self.list.count()):
            item = self.list.item(i)
            name = item.data(Qt.ItemDataRole.UserRole)
            in_order = item.checkState() == Qt.CheckState.Checked
            on = self._settings is not None and sampler_is_on(self._settings, name)
            skipped = SPECS[name].sampling_only and not self._sampling
            if in_order:
                position += 1
            state = "skipped by this strategy" if skipped else ("on" if on else "off")
            if on and not in_order and not skipped:
                state = "on but left out: the run refuses it"
            label = f"{position:>2}. {name}" if in_order else f"  –  {name} (left out)"
            item.setText(f"{label}   · {state}")
            font = QFont(item.font())
            font.setBold(on and not skipped and in_order)
            item.setFont(font)
            color = SKIPPED_COLOR if skipped or not in_order else (ON_COLOR if on else OFF_COLOR)
            if on and not in_order and not skipped:
                color = REFUSED_COLOR
            item.setForeground(QColor(color))
            last = " (draws the token itself: it runs last whatever its row)" if SPECS[name].selecting else ""
            item.setToolTip(f"{name}: {SPECS[name].help}{last} — {state}")
        self._updating = False

    def row_states(self) -> list[tuple[str, str]]:
        """(name, the row's text) top first: what the list shows."""
        return [(self.list.item(i).data(Qt.ItemDataRole.UserRole), self.list.item(i).text())
                for i in range(self.list.count())]


def bias_lines(text: str) -> tuple[str, ...]:
    """The editor's text as entries: one a line, every space kept, blank lines dropped."""
    return tuple(line for line in text.split("\n") if line.strip())


class LogitBiasEditor(QWidget):
    """``TOKEN=BIAS`` entries one a line (spaces kept) and what each resolves to for the loaded tokenizer."""

    changed = Signal()

    def __init__(self, help_text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.edit = QPlainTextEdit(self)
        self.edit.setFont(mono_font(10))
        self.edit.setPlaceholderText("one a line: TOKEN=BIAS\n Paris=-inf   (leading space kept)\n42=+5")
        self.edit.setToolTip(help_text + ". One entry a line; spaces are kept: ' Paris' (with its space, as a word "
                             "mid-sentence) is another token than 'Paris'.")
        self.edit.setFixedHeight(58)
        self.resolved = QLabel(self)
        self.resolved.setWordWrap(True)
        self.resolved.setTextFormat(Qt.TextFormat.PlainText)
        self.resolved.setFont(mono_font(9))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit)
        layout.addWidget(self.resolved)
        self.tokenizer: Any = None
        self.edit.textChanged.connect(self._text_changed)
        self._show_resolution()

    def entries(self) -> tuple[str, ...]:
        return bias_lines(self.edit.toPlainText())

    def set_entries(self, entries: tuple[str, ...]) -> None:
        self.edit.setPlainText("\n".join(entries))

    def set_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._show_resolution()

    def _text_changed(self) -> None:
        self._show_resolution()
        self.changed.emit()

    def resolution_lines(self) -> list[str]:
        """One line an entry: what it resolves to (ids and texts), or why it cannot."""
        lines = []
        for entry in self.entries():
            try:
                ((key, value),) = parse_logit_bias((entry,))
            except ConfigError as error:
                lines.append(f"✗ {error}")
                continue
            shown = "ban" if value == float("-inf") else f"{value:+g}"
            if isinstance(key, int):
                text = self._token_text(key)
                lines.append(f"id {key}{f' {text}' if text else ''} → {shown}")
            elif self.tokenizer is None:
                lines.append(f"{visible_token_text(key)} → {shown} (load a model to see its tokens)")
            else:
                ids = self.tokenizer.encode(key, add_special_tokens=False)
                pieces = " + ".join(f"{t} {self._token_text(t)}" for t in ids) or "no token"
                lines.append(f"{visible_token_text(key)} = {pieces} → {shown}"
                             + (" (on its last token, after the others)" if len(ids) > 1 else ""))
        return lines

    def _token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return ""
        return repr(visible_token_text(self.tokenizer.decode([token_id])))

    def _show_resolution(self) -> None:
        lines = self.resolution_lines()
        self.resolved.setText("\n".join(lines))
        self.resolved.setVisible(bool(lines))
