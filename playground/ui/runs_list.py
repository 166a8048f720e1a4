"""The list of a session's runs: the original and every branch, click one to view it again."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from playground.state import Run, settings_summary


class RunsList(QListWidget):
    run_selected = Signal(int)  # run index

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip("Every run of this session; branches say where they came from. Click one to view it.")
        # Clicks and arrow keys alike: the views always show the highlighted run.
        self.currentRowChanged.connect(lambda row: row >= 0 and self.run_selected.emit(row))

    def update_run(self, run: Run) -> None:
        """Add or relabel ``run``'s row."""
        while self.count() <= run.index:
            self.addItem(QListWidgetItem())
        item = self.item(run.index)
        item.setText(run.label())
        detail = run.error or run.text[:500]
        item.setToolTip(f"{settings_summary(run.settings)}\nprompt: {run.settings.prompt[:200]}\n\n{detail}")

    def mark_selected(self, index: int) -> None:
        self.blockSignals(True)
        self.setCurrentRow(index)
        self.blockSignals(False)
