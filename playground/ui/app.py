"""Starting the desktop app: one window, the prompt prefilled, the model loading in the background."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from playground.config import ModelSettings, RunSettings

if TYPE_CHECKING:
    from playground.remote.source import RemoteSource

ORPHAN_GRACE_MS = 1000  # a stopped fetch ends pip within this (a model load cannot be interrupted at all)


def display_problem() -> str | None:
    """Why Qt could not open a window here (it would abort the process), or None if it can."""
    if os.environ.get("QT_QPA_PLATFORM") or not sys.platform.startswith("linux"):
        return None
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        return ("no display found (neither DISPLAY nor WAYLAND_DISPLAY is set). Run the app in a desktop session, "
                "or render a view headless with `playground shot --out view.png`")
    if not os.environ.get("WAYLAND_DISPLAY"):
        from playground.ui.system_libs import debian_package, missing_libraries

        missing = missing_libraries()
        if missing:
            packages = " ".join(sorted({debian_package(s) for s in missing}))
            return (f"Qt's X11 plugin needs system libraries that are missing ({', '.join(missing)}). Install them "
                    f"(Debian/Ubuntu: sudo apt-get install {packages}), or run `make run`, which does")
    return None


def launch(model_settings: ModelSettings | None, run_settings: RunSettings | None,
           open_run: str | os.PathLike | None = None, remote: RemoteSource | None = None) -> int:
    """Show the window and run the Qt event loop; returns the exit code.

    ``run_settings`` None: the user's last settings. ``open_run``: show that saved run and load no model.
    ``remote``: use the model on that server instead of loading one.
    """
    problem = display_problem()
    if problem is not None:
        print(f"playground: error: {problem}", file=sys.stderr)
        return 2
    if "torch" not in sys.modules:
        # torch's OpenMP threads spin-wait by default and starve next to a GUI thread (30x slower decoding).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from playground.resources import resources_dir
    from playground.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Decoding Playground")
    app.setOrganizationName("decoding-playground")
    QApplication.setDesktopFileName("decoding-playground")  # the entry `playground install-desktop` writes (its icon)
    QApplication.setWindowIcon(QIcon(str(resources_dir() / "icons" / "decoding-playground.svg")))
    window = MainWindow(model_settings, run_settings)
    window.resize(1500, 950)
    window.show()
    if open_run is not None:
        path = Path(open_run)
        QTimer.singleShot(0, lambda: window.open_run(path))
    elif remote is not None:
        QTimer.singleShot(0, lambda: window.connect_server(remote))
    else:
        # Load after the window is on screen, so the user sees progress (or the offer to fetch the default model).
        QTimer.singleShot(0, lambda: window.load_model(model_settings))
    return finish(app.exec())


def finish(code: int) -> int:
    """After the window closed: a job that could not be interrupted (a model load) must not keep the process
    alive. Give a stopping job a moment, then leave without waiting for the rest (it only reads files)."""
    from playground.ui.job_kinds import JobKind
    from playground.ui.main_window import running_orphans

    for job in running_orphans():  # each is a window's job, named by its kind
        if JobKind(job.name).cleans_up_at_exit:  # type: ignore[call-arg]  # a lookup by value, not JobKind.__new__  # a fetch: pip is terminated at once; let it clean up
            job.thread.wait(ORPHAN_GRACE_MS)
    if running_orphans():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
