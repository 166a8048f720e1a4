"""A PNG of the real window after a real run: for the README, bug reports, and checking what users see."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from playground.config import ModelSettings, RunSettings
from playground.errors import ScreenshotError
from playground.models.loaded import LoadedModel

if TYPE_CHECKING:
    from playground.remote.source import RemoteSource
    from playground.ui.animation import AnimationResult


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


def _settle(app) -> None:
    for _ in range(5):  # let layouts and the plots settle
        app.processEvents()


def shown_texts(window) -> list[str]:
    """Every text the window can draw for the selected run: its widgets' texts and the run's token texts (chart
    labels, tooltips and trees draw those)."""
    import dataclasses

    from PySide6.QtWidgets import QComboBox, QLabel, QLineEdit, QPlainTextEdit, QTextEdit

    texts = [w.text() for w in window.findChildren(QLabel)] + [w.text() for w in window.findChildren(QLineEdit)]
    texts += [w.toPlainText() for kind in (QPlainTextEdit, QTextEdit) for w in window.findChildren(kind)]
    texts += [w.currentText() for w in window.findChildren(QComboBox)]

    def walk(value) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))
        elif isinstance(value, (tuple, list)):
            for item in value:
                walk(item)

    run = window.session.selected
    for event in run.events if run is not None else ():
        walk(event)
    return texts


def warn_uncovered(window) -> list[str]:
    """Name, on stderr, the characters of the picture that no installed font can draw (they come out as boxes)."""
    from playground.ui.fonts import describe, uncovered_characters

    missing = uncovered_characters(shown_texts(window))
    if missing:
        print(f"playground: warning: no installed font can draw {describe(missing)}: the picture shows boxes "
              "for them (install a font that covers them, e.g. Debian's fonts-noto-cjk for Chinese, Japanese and "
              "Korean)", file=sys.stderr)
    return missing


def save_picture(window, out_path: str | Path, view: str | None, hover: bool) -> Path:
    """The whole window (``view`` None) or one view, as PNG or SVG by the file's extension."""
    from PySide6.QtWidgets import QApplication

    from playground.ui.views.base import ExportError, save_widget_picture

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ScreenshotError(f"the picture must be a .png or .svg file, not {out.name}")
    if view is not None and view not in window.views:
        raise ScreenshotError(f"no view named {view!r} (views: {', '.join(window.views)})")
    widget = window.views[view] if view is not None else window
    if view is not None:
        window.docks[view].show()
        window.docks[view].raise_()
        _settle(QApplication.instance())
    warn_uncovered(window)
    try:
        if out.suffix.lower() == ".png" and hover:
            widget.grab()  # a first grab lays out and scrolls; the second is the picture
            pixmap = widget.grab()
            for shown in window.shown_views():
                if widget is window or shown is widget:  # only what lies inside the picture
                    shown.paint_overlay(pixmap, widget)
            save_widget_picture(widget, out, pixmap)
        else:
            save_widget_picture(widget, out)
    except ExportError as error:
        raise ScreenshotError(str(error)) from error
    return out


def _window(model_settings: ModelSettings | None, run_settings: RunSettings | None, tmp: str, width: int,
            height: int):
    from PySide6.QtCore import QSettings

    from playground.ui.main_window import MainWindow

    store = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)  # leave the user's alone
    window = MainWindow(model_settings, run_settings or RunSettings(), store=store)
    window.resize(width, height)
    window.show()
    return window


def _close(window) -> None:
    from PySide6.QtCore import QCoreApplication

    window.close()
    window.deleteLater()
    QCoreApplication.processEvents()


def render_screenshot(model_settings: ModelSettings, run_settings: RunSettings, out_path: str | Path,
                      width: int = 1500, height: int = 950, *, lm: LoadedModel | None = None,
                      timeout_s: float = 600.0, hover: bool = True, view: str | None = None,
                      remote: RemoteSource | None = None) -> Path:
    """Build the window offscreen, load the model (or use ``lm``, or connect to the server ``remote``), generate
    to the end, save the picture.

    The tokens chart shows the run's least certain step; with ``hover`` the picture also shows the tooltip a user
    sees when hovering that token (tooltips are separate windows that a window grab would miss).

    Raises ``ModelLoadError`` when the model cannot be loaded and ``ScreenshotError`` when the run fails.
    """
    _ensure_platform()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory() as tmp:
        window = _window(model_settings, run_settings, tmp, width, height)
        try:
            if remote is not None:
                window.connect_server(remote)
                wait_until_idle(window, timeout_s)
                if window.remote is None:
                    message = window.banner.label.text().removeprefix("<b>Error:</b> ")
                    raise ScreenshotError(message or "could not connect to the server")
            else:
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
            _settle(app)
            return save_picture(window, out_path, view, hover)
        finally:
            _close(window)


def render_trace(trace_path: str | Path, out_path: str | Path, width: int = 1500, height: int = 950, *,
                 hover: bool = True, view: str | None = None) -> tuple[Path, str]:
    """A saved run in the window, no model loaded: the same picture every time. Returns the path and what of the
    trace could not be read (empty when all of it was)."""
    _ensure_platform()
    from PySide6.QtWidgets import QApplication

    from playground.traces import TraceError, read_trace

    app = QApplication.instance() or QApplication(sys.argv[:1])
    try:
        trace = read_trace(trace_path)
    except TraceError as error:
        raise ScreenshotError(str(error)) from error
    settings, _unknown = RunSettings.from_plain_dict(trace.events[0].settings)
    with tempfile.TemporaryDirectory() as tmp:
        window = _window(None, settings, tmp, width, height)
        try:
            window.open_run(trace_path)
            _settle(app)
            return save_picture(window, out_path, view, hover), trace.problems()
        finally:
            _close(window)


def render_animation(trace_path: str | Path, out_path: str | Path, width: int = 1500, height: int = 950, *,
                     view: str | None = None, fps: float | None = None, speed: float = 1.0, hover: bool = True,
                     max_frames: int | None = None, quiet: bool = False) -> tuple[AnimationResult, str]:
    """``shot --from-trace RUN --out run.gif``: the saved run replayed offscreen (``playground.ui.animation``);
    returns the result and what of the trace could not be read."""
    from PySide6.QtWidgets import QApplication

    from playground.traces import TraceError, read_trace
    from playground.ui.animation import MAX_FRAMES, AnimationPlan, check_output, export_animation

    _ensure_platform()
    check_output(Path(out_path))
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.processEvents()
    try:
        trace = read_trace(trace_path)
    except TraceError as error:
        raise ScreenshotError(str(error)) from error
    settings, _unknown = RunSettings.from_plain_dict(trace.events[0].settings)

    def told(plan: AnimationPlan) -> None:
        if not quiet:
            print(f"playground: animating {plan.describe()}", file=sys.stderr, flush=True)

    def progress(done: int, total: int) -> None:
        if not quiet and (done == total or done % max(1, total // 10) == 0):
            print(f"[{done / total:4.0%}] frame {done} of {total}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        window = _window(None, settings, tmp, width, height)
        try:
            result = export_animation(window, trace.events, out_path, view=view, fps=fps, speed=speed, hover=hover,
                                      max_frames=max_frames or MAX_FRAMES, size=(width, height) if view else None,
                                      plan_told=told, progress=progress)
        finally:
            _close(window)
    assert result is not None
    return result, trace.problems()
