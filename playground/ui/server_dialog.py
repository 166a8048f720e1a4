"""The "Server…" dialog: where a remote model lives (URL, model, the NAME of the API key's variable) and a test.

The form is built from ``RemoteSource``'s settings table, as the settings form is from ``RunSettings``'s. The dialog
never talks to the server itself: "Test connection" and "Connect" are requests (signals) the window answers with
a background job, and the window hands the answer back (``show_models`` / ``show_error``), so nothing here can
block the GUI thread or outlive the window.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from playground.config import ConfigError, rows
from playground.remote.source import RemoteSource
from playground.ui.controls import Binding, make_binding
from playground.ui.style import ERROR_FG, INFO_FG


class ServerDialog(QDialog):
    """Fields of ``RemoteSource``, a connection test that lists the server's models, and Connect."""

    test_requested = Signal(object)  # RemoteSource: check it, answer with show_models / show_error
    connect_requested = Signal(object)  # RemoteSource: use it as the window's model
    # The connection test's answer. It hides QDialog.result() (the dialog's result code, which nothing here reads).
    result: QLabel  # type: ignore[assignment]

    def __init__(self, source: RemoteSource | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Use a model on a server")
        self.setMinimumWidth(520)
        self.bindings: dict[str, Binding] = {row.name: make_binding(row) for row in rows(RemoteSource)}
        intro = QLabel("Stream runs from an OpenAI-compatible server (llama.cpp's <code>llama-server</code>, vLLM, "
                       "…). The tokens view, its chart and branching work with a server; views that need the "
                       "model's insides (beam tree, layers, KV cache, quantization) need a local model. The API "
                       "key is read from the environment variable you name here; the key itself is never stored.")
        intro.setWordWrap(True)
        form = QFormLayout()
        for binding in self.bindings.values():
            binding.widget.setToolTip(binding.row.spec.help)
            if isinstance(binding.widget, QCheckBox):
                form.addRow(binding.widget)
            else:
                form.addRow(binding.row.spec.label, binding.widget)
        self.base_url.setPlaceholderText("http://127.0.0.1:8080/v1")
        self.model.setPlaceholderText("empty: the server's only model")
        self.api_key_env.setPlaceholderText("e.g. VLLM_API_KEY (empty: no key)")

        self.test_button = QPushButton("Test connection")
        self.test_button.setToolTip("Ask the server what it is and which models it serves (nothing is generated)")
        self.result = QLabel("")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.TextFormat.RichText)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.models = QListWidget()
        self.models.setToolTip("The server's models: click one to use it")
        self.models.setMaximumHeight(110)
        self.models.hide()
        test_row = QHBoxLayout()
        test_row.addWidget(self.test_button)
        test_row.addWidget(self.result, 1)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = self.buttons.addButton("Connect", QDialogButtonBox.ButtonRole.AcceptRole)
        self.connect_button.setToolTip("Use this server's model for the next runs (replaces a loaded model)")
        self.connect_button.setDefault(True)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addLayout(test_row)
        layout.addWidget(self.models)
        layout.addWidget(self.buttons)

        self.test_button.clicked.connect(self.test_connection)
        self.buttons.accepted.connect(self.connect_server)
        self.buttons.rejected.connect(self.reject)
        self.models.itemClicked.connect(self._pick_model)
        self.set_source(source or RemoteSource())

    # --- fields ---------------------------------------------------------------------------------------------
    def _field(self, name: str) -> Any:
        return self.bindings[name].widget

    @property
    def base_url(self) -> Any:
        return self._field("base_url")

    @property
    def model(self) -> Any:
        return self._field("model")

    @property
    def api_key_env(self) -> Any:
        return self._field("api_key_env")

    def set_source(self, source: RemoteSource) -> None:
        for name, binding in self.bindings.items():
            binding.set(getattr(source, name))

    def source(self) -> RemoteSource:
        """The fields as a checked source; ``ConfigError`` says what is wrong with them."""
        values = {name: binding.get() for name, binding in self.bindings.items()}
        values = {name: value.strip() if isinstance(value, str) else value for name, value in values.items()}
        return RemoteSource(**values).validate()

    def _pick_model(self, item: QListWidgetItem) -> None:
        self.model.setText(item.text())

    # --- requests and answers -------------------------------------------------------------------------------
    def test_connection(self) -> None:
        try:
            source = self.source()
        except ConfigError as error:
            self.show_error(str(error))
            return
        self.set_testing(True)
        self.result.setText(f"Connecting to {html.escape(source.api_url)}…")
        self.test_requested.emit(source)

    def connect_server(self) -> None:
        try:
            source = self.source()
        except ConfigError as error:
            self.show_error(str(error))
            return
        self.connect_requested.emit(source)
        self.accept()

    def set_testing(self, testing: bool) -> None:
        self.test_button.setEnabled(not testing)
        self.test_button.setText("Testing…" if testing else "Test connection")

    def show_models(self, engine: str, version: str, models: tuple[str, ...], chosen: str) -> None:
        """The test's answer: which engine, and its models (the one a run would use selected)."""
        self.set_testing(False)
        self.models.clear()
        for name in models:
            self.models.addItem(name)
            if name == chosen:
                self.models.setCurrentRow(self.models.count() - 1)
        self.models.setVisible(bool(models))
        build = f" ({html.escape(version)})" if version else ""
        count = f"{len(models)} model{'s' if len(models) != 1 else ''}"
        self.result.setText(f"<span style='color:{INFO_FG}'><b>Connected:</b> {html.escape(engine)}{build} serves "
                            f"{count}; a run would use <code>{html.escape(chosen)}</code>.</span>")

    def show_error(self, message: str) -> None:
        self.set_testing(False)
        self.models.clear()
        self.models.hide()
        self.result.setText(f"<span style='color:{ERROR_FG}'><b>Error:</b> {html.escape(message)}</span>")
