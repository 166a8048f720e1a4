"""The "Build steering vector" dialog: a contrast set (shipped or a JSON file), the method, the blocks and the
file to write; Build and Stop, with the build's progress.

As the server dialog does, the dialog never touches the model: Build is a request (``build_requested``, the fields
as a ``BuildRequest``) that the window has the local model source check and then answers with its one background
job (off the GUI thread; the model is never read by two jobs at once); Stop asks the window to stop it, and the
window hands back the start, the progress, a failure, and the file written (``show_started`` / ``show_progress`` /
``show_error`` / ``show_done``); the window then puts the file into the form's steering field.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from playground.models.paths import steering_dir
from playground.presets import RESOURCES_DIR
from playground.ui.style import ERROR_FG, INFO_FG

OWN_METHOD = "the set's own"
METHODS = (OWN_METHOD, "mean", "pca", "actadd")
METHOD_HELP = ("mean: the mean difference of the examples' last-token residuals (CAA) · pca: the first principal "
               "component of the pairs' differences, unit norm (repeng) · actadd: the first pair's difference at "
               "every position, added at the front (Turner et al.; .safetensors only)")


def shipped_names() -> list[str]:
    """The contrast sets shipped in resources/steering/ (``playground steer-build --set NAME``)."""
    return sorted(p.stem for p in (RESOURCES_DIR / "steering").glob("*.json"))


@dataclass(frozen=True)
class BuildRequest:
    contrast: str  # a shipped set's name or a JSON file
    method: str | None  # None: the set's own
    layers: str  # "A-B", "N" or "" (every block but the first)
    out: str


class SteerBuildDialog(QDialog):
    build_requested = Signal(object)  # a BuildRequest: the window checks it, builds and saves (a background job)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Build a steering vector")
        self.setMinimumWidth(520)
        self.building = False
        self.written: Path | None = None  # the last file built
        self.failed = False  # the last build failed (its message is shown)
        intro = QLabel("Read the loaded model's residual stream on contrast examples and save the direction "
                       "between them: a <b>.gguf</b> is a llama.cpp control vector (llama-server "
                       "<tt>--control-vector-scaled FILE:SCALE</tt> reads it), a <b>.safetensors</b> is ours. The "
                       "file goes into the steering field of the settings.")
        intro.setWordWrap(True)
        self.contrast = QComboBox()
        self.contrast.setEditable(True)
        self.contrast.addItems(shipped_names())
        self.contrast.setCurrentText("happy-sad")  # the README's example (any shipped set or a file)
        self.contrast.setToolTip("A shipped contrast set, or a JSON file of the same form (positive and negative "
                                 "examples: resources/steering/*.json)")
        browse_set = QPushButton("File…")
        browse_set.clicked.connect(self._browse_set)
        self.method = QComboBox()
        self.method.addItems(METHODS)
        self.method.setToolTip(METHOD_HELP)
        self.layers = QLineEdit()
        self.layers.setPlaceholderText("every block but the first, or e.g. 10-12")
        self.layers.setToolTip("The decoder blocks N to build a direction for, numbered from 0 (llama.cpp's "
                               "direction.N), both ends included, as --steer-layers")
        self.out = QLineEdit()
        self.out.setToolTip("The file to write: .gguf (llama.cpp) or .safetensors")
        browse_out = QPushButton("…")
        browse_out.clicked.connect(self._browse_out)
        form = QFormLayout()
        form.addRow("Contrast set", _row(self.contrast, browse_set))
        form.addRow("Method", self.method)
        form.addRow("Blocks", self.layers)
        form.addRow("Save as", _row(self.out, browse_out))
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.build_button = QPushButton("Build")
        self.build_button.setDefault(True)
        self.build_button.clicked.connect(self._build)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the example being read: nothing is saved")
        self.stop_button.clicked.connect(self.stop_requested)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.build_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.stop_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addWidget(buttons)
        self.contrast.currentTextChanged.connect(self._suggest_out)
        self.method.currentTextChanged.connect(self._suggest_out)
        self._suggested = ""
        self._suggest_out()
        self._set_building(False)

    # --- the fields -------------------------------------------------------------------------------------------
    def _suggest_out(self) -> None:
        """A file name from the set and the method, in the user cache, until the user types one of their own."""
        if self.out.text() not in ("", self._suggested):
            return
        name = Path(self.contrast.currentText().strip() or "vector").stem
        method = self.method.currentText()
        suffix = ".safetensors" if method == "actadd" else ".gguf"
        tail = "" if method == OWN_METHOD else f"-{method}"
        self._suggested = str(steering_dir() / f"{name}{tail}{suffix}")
        self.out.setText(self._suggested)

    def _browse_set(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Contrast set", "", "Contrast sets (*.json)")
        if path:
            self.contrast.setCurrentText(path)

    def _browse_out(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the steering vector as", self.out.text(),
                                              "llama.cpp control vector (*.gguf);;Safetensors (*.safetensors)")
        if path:
            self.out.setText(path)

    def request(self) -> BuildRequest:
        """What the fields ask for (the window has it checked)."""
        method = self.method.currentText()
        return BuildRequest(self.contrast.currentText().strip(), None if method == OWN_METHOD else method,
                            self.layers.text(), self.out.text().strip())

    # --- build and stop ---------------------------------------------------------------------------------------
    def _build(self) -> None:
        self.written, self.failed = None, False
        self.build_requested.emit(self.request())

    def _set_building(self, on: bool) -> None:
        self.building = on
        self.build_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        for field in (self.contrast, self.method, self.layers, self.out):
            field.setEnabled(not on)

    def _say(self, text: str, color: str) -> None:
        self.message.setText(f"<span style='color:{color}'>{text}</span>")

    # --- the window's answers ---------------------------------------------------------------------------------
    def show_started(self) -> None:
        """The fields were checked and the build is under way."""
        self.progress.setValue(0)
        self._say("Starting…", INFO_FG)
        self._set_building(True)

    def show_progress(self, message: str, fraction: float) -> None:
        self.progress.setValue(round(max(0.0, min(1.0, fraction)) * 1000))
        self._say(html.escape(message), INFO_FG)

    def show_error(self, message: str) -> None:
        self.failed = True
        self._set_building(False)
        self._say(html.escape(message), ERROR_FG)

    def show_done(self, path: Path) -> None:
        """The vector is saved at ``path`` (the window has put it into the steering field)."""
        self.written = Path(path)
        self.progress.setValue(1000)
        self._say(f"Saved <b>{html.escape(str(path))}</b>; it is in the settings' steering field (strength 1: "
                  "change it after the colon).", INFO_FG)

    def job_ended(self) -> None:
        """The build's job is over: done, failed, or stopped (then nothing was saved)."""
        if self.building and self.written is None and not self.failed:
            self.progress.setValue(0)
            self._say("Stopped: nothing was saved.", INFO_FG)
        self._set_building(False)

    def reject(self) -> None:
        """Close: a build under way is stopped first (nothing saved)."""
        if self.building:
            self.stop_requested.emit()
        super().reject()


def _row(field: QWidget, button: QPushButton) -> QWidget:
    box = QWidget()
    layout = QHBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(field, stretch=1)
    layout.addWidget(button)
    return box
