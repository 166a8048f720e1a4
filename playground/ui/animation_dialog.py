"""File ▸ Export animation: the selected run replayed in a second window that is never on screen (the user's
window stays as it is), with a progress dialog whose Stop ends it and writes nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QFileDialog, QMainWindow, QProgressDialog

from playground.errors import ScreenshotError
from playground.ui.animation import AnimationPlan, AnimationResult, export_animation


def export_animation_dialog(window: QMainWindow, view: str | None) -> None:
    """Ask where, then export the selected run as an animation of ``view`` (None: the whole window)."""
    if _ended_run(window) is None:
        return
    path, _ = QFileDialog.getSaveFileName(window, "Export an animation of the run", "run.gif",
                                          "GIF (*.gif);;WebP, lossless (*.webp);;MP4, needs ffmpeg (*.mp4)")
    if path:
        export_selected_run(window, path, view)


def _ended_run(window):
    run = window.session.selected
    if run is None or run.running:
        window.banner.show_info("An animation replays a run that has ended: open a saved run (File ▸ Open run…) or "
                                "let this one finish, then export it.")
        return None
    return run


def export_selected_run(window, path: str | Path, view: str | None = None,
                        size: tuple[int, int] | None = None) -> AnimationResult | None:
    """The selected run to ``path``, replayed at the window's size (or ``size``); None when stopped or refused
    (the banner says why)."""
    run = _ended_run(window)
    if run is None:
        return None
    dialog = QProgressDialog("Preparing the replay…", "Stop", 0, 1, window)
    dialog.setWindowTitle("Export animation")
    dialog.setWindowModality(Qt.WindowModality.WindowModal)
    dialog.setMinimumDuration(0)

    def told(plan: AnimationPlan) -> None:
        dialog.setLabelText(f"Exporting {plan.describe()}")
        dialog.setMaximum(plan.frames)

    with tempfile.TemporaryDirectory() as tmp:
        store = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        replayer = type(window)(None, run.settings, store=store)  # a window of the same kind, never on screen
        replayer.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)
        width, height = size or (window.width(), window.height())
        replayer.resize(width, height)
        replayer.show()
        try:
            result = export_animation(replayer, list(run.events), path, view=view,
                                      size=(width, height) if view else None, plan_told=told,
                                      progress=lambda done, total: dialog.setValue(done),
                                      should_stop=dialog.wasCanceled)
        except (ScreenshotError, OSError) as error:
            window.banner.show_error(f"Could not export the animation: {error}")
            return None
        finally:
            dialog.reset()
            replayer.close()
            replayer.deleteLater()
    if result is None:
        window.status.showMessage("Export stopped: nothing written", 10000)
        return None
    window.status.showMessage(f"Exported {result.path}: {result.frames} frames, {result.bytes / 1e6:.2f} MB, in "
                              f"{result.seconds:.1f} s", 15000)
    return result
