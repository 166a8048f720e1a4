"""The list of a session's runs: the original and every branch, click one to view it again.

A running run's row is relabelled with every batch of tokens, so a relabel does no work that grows with the run.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from playground.state import Run, settings_summary

TOOLTIP_TEXT_CHARS = 500


def _text_start(run: Run, chars: int = TOOLTIP_TEXT_CHARS) -> str:
    """The first ``chars`` characters of ``run.text``, without joining every step of a long running run."""
    if run.finished is not None:
        return run.finished.text[:chars]
    parts, size = [], 0
    for step in run.steps:
        if size >= chars:
            break
        parts.append(step.text)
        size += len(step.text)
    return "".join(parts)[:chars]


class RunsList(QListWidget):
    run_selected = Signal(int)  # run index

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip("Every run of this session; branches say where they came from. Click one to view it.")
        # Clicks and arrow keys alike: the views always show the highlighted run.
        self.currentRowChanged.connect(lambda row: self.run_selected.emit(row) if row >= 0 else None)

    def update_run(self, run: Run) -> None:
        """Add or relabel ``run``'s row."""
        while self.count() <= run.index:
            self.addItem(QListWidgetItem())
        item = self.item(run.index)
        label = run.label()
        if item.text() != label:
            item.setText(label)
        detail = run.error or _text_start(run)
        tooltip = f"{settings_summary(run.settings)}\nprompt: {run.settings.prompt[:200]}\n\n{detail}"
        if item.toolTip() != tooltip:  # each change is a model update and a repaint of the row
            item.setToolTip(tooltip)

    def mark_selected(self, index: int) -> None:
        self.blockSignals(True)
        self.setCurrentRow(index)
        self.blockSignals(False)
