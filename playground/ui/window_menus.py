"""The window's File and View menus (the Presets menu is ``playground.ui.presets_menu``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMenu, QMenuBar

from playground.ui.views.base import View


def add_file_menu(menu_bar: QMenuBar, views: Iterable[View], open_run: Callable[[], None],
                  save_run: Callable[[], None], export_view: Callable[[View], None],
                  quit_window: Callable[[], object],
                  export_animation: Callable[[str | None], None],
                  export_page: Callable[[], None]) -> tuple[QAction, QAction]:
    """Open run…, Save run…, Export view (one entry per view), Export animation (the window, or one view), Export
    web page, Quit; the open and save actions."""
    file_menu = menu_bar.addMenu("&File")
    open_action = file_menu.addAction("&Open run…", QKeySequence.StandardKey.Open, open_run)
    save_action = file_menu.addAction("&Save run…", QKeySequence.StandardKey.Save, save_run)
    export = file_menu.addMenu("&Export view")
    for view in views:
        def export_this(v: View = view) -> None:
            export_view(v)

        export.addAction(f"{view.title}…", export_this)
    animate = file_menu.addMenu("Export &animation")
    animate.setToolTip("The selected run replayed step by step as it streamed: GIF, lossless WebP, or MP4")
    animate.addAction("The whole window…", lambda: export_animation(None))
    for view in views:
        def animate_this(v: View = view) -> None:
            export_animation(v.name)

        animate.addAction(f"{view.title}…", animate_this)
    page = file_menu.addAction("Export &web page…", export_page)
    page.setToolTip("The selected run as one self-contained HTML file: the output shaded, each token's candidates "
                    "on hover or tap, readable on a phone")
    file_menu.addSeparator()
    file_menu.addAction("&Quit", QKeySequence.StandardKey.Quit, quit_window)
    return open_action, save_action


def add_tools_menu(menu_bar: QMenuBar, train_tuned_lens: Callable[[], None],
                   build_steering_vector: Callable[[], None]) -> tuple[QAction, QAction]:
    """Tools: Train tuned lens, Build steering vector (background jobs with progress and Stop); the actions."""
    tools = menu_bar.addMenu("&Tools")
    action = tools.addAction("Train &tuned lens", train_tuned_lens)
    action.setToolTip("Train the loaded model's tuned lens on the shipped calibration text (a few minutes for "
                      "SmolLM2 on a CPU) and keep it in the user cache for --lens-kind tuned")
    steer = tools.addAction("Build &steering vector…", build_steering_vector)
    steer.setToolTip("Build a steering vector from contrast examples on the loaded model and put it into the "
                     "steering settings (as playground steer-build does)")
    _add_cache_entry(tools)
    return action, steer


def _add_cache_entry(tools: QMenu) -> None:
    """Tools → Clear the GGUF conversion cache (its size in the entry, read each time the menu opens)."""
    from playground.models.conversion_cache import cache_dir, cache_size, clear_cache, describe_size

    tools.addSeparator()
    entry = tools.addAction("Clear the GGUF conversion cache")
    entry.setToolTip("Each .gguf opened here is converted once into a float model kept in the user cache, so that "
                     "later loads take seconds; clearing it frees the disk space (the next load converts again)")

    def show_size() -> None:
        size = cache_size()
        entry.setText(f"Clear the GGUF conversion cache ({describe_size(size)})" if size
                      else "GGUF conversion cache: empty")
        entry.setEnabled(size > 0)
        entry.setStatusTip(str(cache_dir()))

    def clear() -> None:
        freed = clear_cache()
        entry.setText(f"GGUF conversion cache cleared ({describe_size(freed)} freed)")
        entry.setEnabled(False)

    entry.triggered.connect(clear)
    tools.aboutToShow.connect(show_size)
    tools.setToolTipsVisible(True)


def add_view_menu(menu_bar: QMenuBar, docks: Iterable[QDockWidget], side_by_side: Callable[[], None],
                  reset_layout: Callable[[], None], present: Callable[[], None]) -> QAction:
    """A show/hide entry per dock, Views side by side, Present (F11), Reset layout; the reset action."""
    view_menu = menu_bar.addMenu("&View")
    for dock in docks:
        view_menu.addAction(dock.toggleViewAction())
    view_menu.addSeparator()
    view_menu.addAction("Views &side by side", side_by_side)
    present_action = view_menu.addAction("&Present", QKeySequence("F11"), present)
    present_action.setToolTip("The selected run's view alone, full screen, in large type: → and ← step through "
                              "the run, Esc leaves")
    return view_menu.addAction("&Reset layout", reset_layout)
