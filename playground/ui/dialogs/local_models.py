"""The picker's "On this computer…" dialog: every model in the local stores (the Hugging Face cache, LM Studio,
Ollama, the playground's own, the folders the user added), each with its family, size, quantization, the memory it
needs at the chosen dtype against what is free, and which views its family supports. Nothing is loaded to list them
(``playground.models.stores`` reads config.json and the GGUF headers); choosing one is a request to the picker.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import partial

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from playground.models.fit import FreeMemory, fast_bf16_cpu, fit_problem, free_memory
from playground.models.stores import (
    DTYPE_BYTES,
    Scan,
    Store,
    StoreEntry,
    StoreError,
    add_user_folder,
    all_stores,
    entry_row,
    human_bytes,
    remove_user_folder,
    scan,
    user_folders,
)
from playground.ui.style import ERROR_FG

COLUMNS = ("name", "store", "family", "parameters", "quantization", "file", "memory", "views")
PATH_ROLE = Qt.ItemDataRole.UserRole
MUTED = "#8A8A8A"


class LocalModelsDialog(QDialog):
    """The models found, a filter, the dtype the memory column is at; Load (or a double click) asks for one."""

    chosen = Signal(str, str)  # the model's path (what --model takes), the dtype to load it at

    def __init__(self, dtype: str = "float32", device: str = "cpu", stores: Sequence[Store] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models on this computer")
        self.resize(1100, 520)
        self._stores = stores  # None: every store (all_stores(), read again at each rescan)
        self._device = device
        self._bf16 = fast_bf16_cpu() if device == "cpu" else None
        self.found: Scan | None = None
        self.free: FreeMemory | None = None
        self.dtype = QComboBox()
        for name in DTYPE_BYTES:
            self.dtype.addItem(name)
            if name == "bfloat16":
                self.dtype.setItemData(self.dtype.count() - 1, bf16_note(self._bf16, device),
                                       Qt.ItemDataRole.ToolTipRole)
        self.dtype.setCurrentText(dtype if dtype in DTYPE_BYTES else "float32")
        self.dtype.setToolTip("The dtype the memory column is at, and the one Load uses")
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter: name, family, store, quantization…")
        self.filter.setClearButtonEnabled(True)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.table = QTreeWidget()
        self.table.setColumnCount(len(COLUMNS))
        self.table.setHeaderLabels([c.capitalize() for c in COLUMNS])
        self.table.setRootIsDecorated(False)
        self.table.setAlternatingRowColors(True)
        self.table.setSortingEnabled(True)
        self.table.setUniformRowHeights(True)
        self.table.sortByColumn(COLUMNS.index("store"), Qt.SortOrder.AscendingOrder)  # then by click on a header
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.add_folder = QPushButton("Add folder…")
        self.add_folder.setToolTip("Search a folder of your own for models (model folders and .gguf files)")
        self.remove_folder = QPushButton("Remove folder")
        self.remove_folder.setToolTip("Stop searching a folder you added")
        self.rescan = QPushButton("Rescan")
        self.load = QPushButton("Load")
        self.load.setDefault(True)
        self.close_button = QPushButton("Close")

        top = QHBoxLayout()
        top.addWidget(self.filter, 1)
        top.addWidget(QLabel("memory at"))
        top.addWidget(self.dtype)
        buttons = QHBoxLayout()
        for button in (self.add_folder, self.remove_folder, self.rescan):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.load)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.summary)
        layout.addLayout(buttons)

        self.filter.textChanged.connect(self._apply_filter)
        self.dtype.currentTextChanged.connect(lambda _text: self._fill())
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(lambda _item, _column: self._choose())
        self.load.clicked.connect(self._choose)
        self.rescan.clicked.connect(self.refresh)
        self.add_folder.clicked.connect(self._pick_folder)
        self.remove_folder.clicked.connect(self._remove_menu)
        self.close_button.clicked.connect(self.reject)
        self.refresh()

    # --- the list --------------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Look in the stores again (unchanged GGUFs are not read again) and redraw the list."""
        self.found = scan(all_stores() if self._stores is None else self._stores)
        self.free = free_memory(self._device)
        self._fill()

    def entries(self) -> tuple[StoreEntry, ...]:
        return self.found.entries if self.found else ()

    def _fill(self) -> None:
        dtype = self.dtype.currentText()
        self.table.setSortingEnabled(False)
        self.table.clear()
        self.table.headerItem().setText(COLUMNS.index("memory"), f"Memory ({dtype})")
        for entry in self.entries():
            row = entry_row(entry, dtype)
            values = [row[c] if c != "memory" else row[f"memory ({dtype})"] for c in COLUMNS]
            item = QTreeWidgetItem(values)
            item.setData(0, PATH_ROLE, str(entry.path))
            problem = entry.problem or fit_problem(entry, dtype, self.free, self._bf16)
            tip = f"{html.escape(str(entry.path))}"
            if entry.problem:
                tip += f"<br><b>cannot be opened here:</b> {html.escape(entry.problem)}"
                for column in range(len(COLUMNS)):
                    item.setForeground(column, QBrush(QColor(MUTED)))
            elif problem:
                tip += f"<br><b>does not fit:</b> {html.escape(problem)}"
                item.setForeground(COLUMNS.index("memory"), QBrush(QColor(ERROR_FG)))
                item.setText(COLUMNS.index("memory"), f"{values[COLUMNS.index('memory')]} (does not fit)")
            if entry.unsupported and not entry.problem:
                tip += "<br>not supported by this family: " + html.escape(", ".join(entry.unsupported))
            for column in range(len(COLUMNS)):
                item.setToolTip(column, tip)
            self.table.addTopLevelItem(item)
        self.table.setSortingEnabled(True)
        for column in range(len(COLUMNS) - 1):
            self.table.resizeColumnToContents(column)
            self.table.setColumnWidth(column, min(self.table.columnWidth(column), 340))  # long names elide
        self._apply_filter(self.filter.text())
        self._show_summary()
        self._update_buttons()

    def _show_summary(self) -> None:
        found = self.found
        if found is None:
            return
        looked = {s.kind for s in found.stores if s.root.is_dir()}
        parts = [f"{len(found.entries)} models in {found.seconds * 1000:.0f} ms"
                 + (f" from {', '.join(sorted(looked))}" if looked else " (no store found on this computer)")]
        if self.free is not None:
            parts.append(f"{human_bytes(self.free.bytes)} of {html.escape(self.free.where)} free")
        if self._bf16:
            parts.append(f"this CPU has fast bfloat16 ({self._bf16}): half float32's memory")
        if found.skipped:
            parts.append(f"{len(found.skipped)} files skipped (hover the Rescan button)")
            self.rescan.setToolTip("\n".join(found.skipped))
        self.summary.setText(" · ".join(parts))

    def _items(self) -> list[QTreeWidgetItem]:
        items = (self.table.topLevelItem(i) for i in range(self.table.topLevelItemCount()))
        return [item for item in items if item is not None]

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for item in self._items():
            haystack = " ".join(item.text(c) for c in range(len(COLUMNS))).lower() + " " + str(item.data(0, PATH_ROLE))
            item.setHidden(not all(w in haystack for w in words))

    def visible_paths(self) -> list[str]:
        return [str(item.data(0, PATH_ROLE)) for item in self._items() if not item.isHidden()]

    def select_path(self, path: str) -> None:
        for item in self._items():
            item.setSelected(item.data(0, PATH_ROLE) == path)
            if item.isSelected():
                self.table.setCurrentItem(item)

    def _selected(self) -> StoreEntry | None:
        items = self.table.selectedItems()
        if not items:
            return None
        path = items[0].data(0, PATH_ROLE)
        return next((e for e in self.entries() if str(e.path) == path), None)

    def _update_buttons(self) -> None:
        entry = self._selected()
        self.load.setEnabled(entry is not None and entry.problem is None)
        self.remove_folder.setEnabled(bool(user_folders()))

    # --- actions ---------------------------------------------------------------------------------------------------
    def _choose(self) -> None:
        entry = self._selected()
        if entry is None or entry.problem is not None:
            return
        self.chosen.emit(str(entry.path), self.dtype.currentText())
        self.accept()

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            self.add(folder)

    def add(self, folder: str) -> None:
        try:
            add_user_folder(folder)
        except StoreError as error:
            self.summary.setText(f"<span style='color:{ERROR_FG}'>{html.escape(str(error))}</span>")
            return
        if self._stores is not None:  # a fixed list (tests): the added folder joins it
            self._stores = [*self._stores, Store("folder", user_folders()[-1])]
        self.refresh()

    def remove(self, folder: str) -> None:
        remove_user_folder(folder)
        if self._stores is not None:
            self._stores = [s for s in self._stores if not (s.kind == "folder" and str(s.root) == folder)]
        self.refresh()

    def _remove_menu(self) -> None:
        menu = QMenu(self)
        for folder in user_folders():
            menu.addAction(str(folder), partial(self.remove, str(folder)))
        menu.exec(self.remove_folder.mapToGlobal(self.remove_folder.rect().bottomLeft()))


def bf16_note(flag: str | None, device: str) -> str:
    """What the dtype list says of bfloat16 here."""
    if device != "cpu":
        return "bfloat16: half float32's memory"
    if flag:
        return f"bfloat16: half float32's memory, and fast on this CPU ({flag})"
    return "bfloat16: half float32's memory, but slower than float32 on this CPU (no avx512_bf16 or AMX)"
