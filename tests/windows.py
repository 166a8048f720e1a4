"""Opening the real window for a test: its own settings file, a size, shown offscreen, a model if given; and
letting a job go at the end."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from playground.config import RunSettings


def open_window(qtbot, tmp_path, lm=None, run_settings: RunSettings | None = None, size: tuple[int, int] = (1500, 950),
                name: str = "settings.ini"):
    from playground.ui.main_window import MainWindow

    store = QSettings(str(tmp_path / name), QSettings.Format.IniFormat)
    w = MainWindow(run_settings=run_settings, store=store)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    if lm is not None:
        w.set_model(lm)
    return w


def let_go(w, wait_ms: int = 10000) -> None:
    """Stop a job the test left running and wait for it (a running thread must not outlive its window)."""
    if w.job is not None:
        w.job.stop()
        w.job.wait(wait_ms)
