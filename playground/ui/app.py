"""Starting the desktop app: one window, the prompt prefilled, the model loading in the background."""

from __future__ import annotations

import os
import sys

from playground.config import ModelSettings, RunSettings


def launch(model_settings: ModelSettings, run_settings: RunSettings) -> int:
    """Show the window and run the Qt event loop; returns the exit code."""
    if "torch" not in sys.modules:
        # torch's OpenMP threads spin-wait by default and starve next to a GUI thread (30x slower decoding).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from playground.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Decoding Playground")
    app.setOrganizationName("decoding-playground")
    window = MainWindow(model_settings, run_settings)
    window.resize(1500, 950)
    window.show()
    # Load after the window is on screen, so the user sees progress (or the offer to fetch the default model).
    QTimer.singleShot(0, lambda: window.load_model(model_settings))
    return app.exec()
