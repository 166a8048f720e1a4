"""The window's File and View menus (the Presets menu is ``playground.ui.presets_menu``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMenuBar

from playground.ui.views.base import View


def add_file_menu(menu_bar: QMenuBar, views: Iterable[View], open_run: Callable[[], None],
                  save_run: Callable[[], None], export_view: Callable[[View], None],
                  quit_window: Callable[[], object]) -> tuple[QAction, QAction]:
    """Open run…, Save run…, Export view (one entry per view), Quit; the open and save actions."""
    file_menu = menu_bar.addMenu("&File")
    open_action = file_menu.addAction("&Open run…", QKeySequence.StandardKey.Open, open_run)
    save_action = file_menu.addAction("&Save run…", QKeySequence.StandardKey.Save, save_run)
    export = file_menu.addMenu("&Export view")
    for view in views:
        def export_this(v: View = view) -> None:
            export_view(v)

        export.addAction(f"{view.title}…", export_this)
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
    return action, steer


def add_view_menu(menu_bar: QMenuBar, docks: Iterable[QDockWidget], side_by_side: Callable[[], None],
                  reset_layout: Callable[[], None]) -> QAction:
    """A show/hide entry per dock, Views side by side, Reset layout; the reset action."""
    view_menu = menu_bar.addMenu("&View")
    for dock in docks:
        view_menu.addAction(dock.toggleViewAction())
    view_menu.addSeparator()
    view_menu.addAction("Views &side by side", side_by_side)
    return view_menu.addAction("&Reset layout", reset_layout)
