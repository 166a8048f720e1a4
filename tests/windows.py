"""Opening the real window for a test: its own settings file, a size, shown offscreen, a model if given; and
letting a job go at the end."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from playground.config import RunSettings


def open_window(qtbot, tmp_path=None, lm=None, run_settings: RunSettings | None = None,
                size: tuple[int, int] | None = (1500, 950), name: str = "settings.ini",
                store: QSettings | None = None):
    """A ``MainWindow`` registered with ``qtbot``, resized to ``size`` (``None``: its own default size) and shown,
    given ``lm`` if not ``None``. Its settings file is ``tmp_path / name`` unless ``store`` is given (a later launch
    reading the same settings as an earlier window)."""
    from playground.ui.main_window import MainWindow

    if store is None:
        assert tmp_path is not None, "a window's settings file: give tmp_path or store"
        store = QSettings(str(tmp_path / name), QSettings.Format.IniFormat)
    w = MainWindow(run_settings=run_settings, store=store)
    qtbot.addWidget(w)
    if size is not None:
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



def windows_opened_since(before: list) -> list:
    """The visible main windows that were not among ``before`` (``top_level_ids()``, taken earlier): the one a
    launch opened. Windows of earlier tests are never touched (a dying one can crash a call on it)."""
    from PySide6.QtWidgets import QApplication

    from playground.ui.main_window import MainWindow

    old = {id(x) for x in before}  # ``before`` holds them: no new window can take one of their ids
    return [x for x in QApplication.topLevelWidgets()
            if id(x) not in old and isinstance(x, MainWindow) and x.isVisible()]


def top_level_ids() -> list:
    """The top-level widgets now, held (so that their ids stay theirs) for ``windows_opened_since``."""
    from PySide6.QtWidgets import QApplication

    return list(QApplication.topLevelWidgets())


def module_window(folder, lm, run_settings: RunSettings | None = None, size: tuple[int, int] = (1500, 950)):
    """A window a whole test module shares (a window and its teardown cost about 0.7 s of CPU), its settings in
    ``folder``: yields it, then lets its job go and deletes it at once (dead here, not in a later test's loop).
    Use as ``yield from module_window(tmp_path_factory.mktemp(...), lm)`` in a module-scoped fixture."""
    from PySide6.QtCore import QCoreApplication, QEvent

    from playground.ui.main_window import MainWindow

    store = QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(run_settings=run_settings, store=store)
    w.resize(*size)
    w.show()
    w.set_model(lm)
    yield w
    let_go(w)
    w.close()
    w.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
