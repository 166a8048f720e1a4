"""A PNG of the real window after a real run: for the README, bug reports, and checking what users see."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from playground.config import ModelSettings, RunSettings
from playground.errors import ScreenshotError
from playground.models.loaded import LoadedModel


def _ensure_platform() -> None:
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")  # offscreen's harmless size-hint chatter
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def wait_until_idle(window, timeout_s: float) -> None:
    """Process events until the window's background job has ended."""
    from PySide6.QtCore import QCoreApplication, QEventLoop

    deadline = time.monotonic() + timeout_s
    while window.busy:
        if time.monotonic() > deadline:
            window.stop()
            raise ScreenshotError(f"the window's {window.job_kind} job did not finish within {timeout_s:.0f} s")
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.005)
    QCoreApplication.processEvents()


def _paint_hover_tooltip(window, pixmap) -> None:
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QPainter
    from PySide6.QtWidgets import QLabel

    from playground.ui.token_view import token_tooltip_html

    run, index = window.session.selected, window.chart_index
    if run is None or index is None or not 0 <= index < len(run.steps):
        return
    view = window.token_view.text
    rect = view.step_rect(index)
    window.grab()  # repaint after the scroll, then take the picture again
    pixmap.swap(window.grab())
    tip = QLabel(token_tooltip_html(run.steps[index]))
    tip.setStyleSheet("QLabel { background: #FFFFE8; color: #000; border: 1px solid #777; padding: 5px; }")
    tip.adjustSize()
    anchor = view.viewport().mapTo(window, rect.bottomLeft() + QPoint(12, 6))
    # Keep it over the output, clear of the chart.
    right = view.viewport().mapTo(window, view.viewport().rect().topRight()).x()
    x = max(0, min(anchor.x(), right - tip.width() - 4))
    y = anchor.y() if anchor.y() + tip.height() < pixmap.height() else max(0, anchor.y() - rect.height() - 12
                                                                             - tip.height())
    painter = QPainter(pixmap)
    tip.render(painter, QPoint(x, y))
    painter.end()


def render_screenshot(model_settings: ModelSettings, run_settings: RunSettings, out_path: str | Path,
                      width: int = 1500, height: int = 950, *, lm: LoadedModel | None = None,
                      timeout_s: float = 600.0, hover: bool = True) -> Path:
    """Build the window offscreen, load the model (or use ``lm``), generate to the end, save a PNG.

    The chart shows the run's least certain step; with ``hover`` the picture also shows the tooltip a user sees
    when hovering that token (tooltips are separate windows that a window grab would miss).

    Raises ``ModelLoadError`` when the model cannot be loaded and ``ScreenshotError`` when the run fails.
    """
    _ensure_platform()
    from PySide6.QtCore import QCoreApplication, QSettings
    from PySide6.QtWidgets import QApplication

    from playground.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory() as tmp:
        store = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)  # leave the user's alone
        window = MainWindow(model_settings, run_settings, store=store)
        try:
            window.resize(width, height)
            window.show()
            if lm is None:
                from playground.models.loading import load_model

                lm = load_model(model_settings)  # headless: load here, and let its error speak for itself
            window.set_model(lm)
            window.generate()
            wait_until_idle(window, timeout_s)
            run = window.session.selected
            if run is None or run.error is not None:
                message = run.error if run is not None else window.banner.label.text()
                raise ScreenshotError(f"the run failed: {message.removeprefix('<b>Error:</b> ')}")
            window._flush_beam_panel()
            for _ in range(5):  # let layouts and the plot settle
                app.processEvents()
            out = Path(out_path)
            out.parent.mkdir(parents=True, exist_ok=True)
            pixmap = window.grab()
            if hover:
                _paint_hover_tooltip(window, pixmap)
            if not pixmap.save(str(out)):
                raise ScreenshotError(f"could not write {out}")
            return out
        finally:
            window.close()
            window.deleteLater()
            QCoreApplication.processEvents()
