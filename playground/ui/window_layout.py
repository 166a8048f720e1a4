"""Where the window's parts sit: a dock per view, the prompt on top, settings on the left, runs at the bottom.

The default layout puts the views as tabs below the prompt; ``arrange_side_by_side`` puts every open view next to
the others. The layout a user made is kept between sessions by ``playground.ui.window_state``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from playground.state import Run
from playground.ui.views import view_classes
from playground.ui.views.base import View, needs_local_model_text


class ViewDock(QDockWidget):
    """A view in a dock, with a message in its place when the shown run has nothing for it."""

    def __init__(self, view: View, parent: QWidget) -> None:
        super().__init__(view.title, parent)
        self.view = view
        self.setObjectName(f"view-{view.name}")  # saveState/restoreState find docks by name
        self.empty = QLabel(view.empty_text(None))
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.pages = QStackedWidget()
        self.pages.addWidget(view)
        self.pages.addWidget(self.empty)
        self.pages.setCurrentWidget(view)  # before any run: the view, empty
        self.setWidget(self.pages)
        # Qt says so when the dock's tab goes behind another or comes to the front (a tabbed-behind dock's widgets
        # keep isVisible() true): the view holds its streaming draws meanwhile.
        self.visibilityChanged.connect(lambda visible: view.set_behind(not visible))

    def show_view(self, shown: bool, run: Run | None) -> None:
        if not shown:
            # A server's run: every view it cannot feed says so, whatever its own empty text.
            self.empty.setText(needs_local_model_text(self.view, run) or self.view.empty_text(run))
        self.pages.setCurrentWidget(self.view if shown else self.empty)

    def show_failure(self, message: str) -> None:
        """The view raised while drawing: say so in its place (the window and the other views go on)."""
        self.empty.setText(message)
        self.pages.setCurrentWidget(self.empty)


def view_docks(window: QMainWindow) -> tuple[dict[str, View], dict[str, ViewDock]]:
    """Every registered view, each in its dock, by name (in the registry's order)."""
    views: dict[str, View] = {}
    docks: dict[str, ViewDock] = {}
    for cls in view_classes():
        view = cls(window)
        views[cls.name] = view
        docks[cls.name] = ViewDock(view, window)
    return views, docks


def titled_dock(window: QMainWindow, title: str, name: str, widget: QWidget) -> QDockWidget:
    dock = QDockWidget(title, window)
    dock.setObjectName(name)  # saveState/restoreState find docks by name
    dock.setWidget(widget)
    return dock


def prompt_area(banner: QWidget, prompt: QPlainTextEdit, generate_button: QPushButton,
                stop_button: QPushButton, *extra: QWidget) -> QWidget:
    """The window's centre: the message banner over the prompt, with Generate and Stop (and ``extra``) beside it."""
    buttons = QVBoxLayout()
    buttons.setSpacing(2)
    buttons.addWidget(generate_button)
    buttons.addWidget(stop_button)
    for widget in extra:
        buttons.addWidget(widget)
    buttons.addStretch(1)
    prompt_row = QHBoxLayout()
    prompt_row.addWidget(prompt, 1)
    prompt_row.addLayout(buttons)
    top = QWidget()
    top_layout = QVBoxLayout(top)
    top_layout.setContentsMargins(4, 4, 4, 0)
    top_layout.addWidget(banner)
    top_layout.addLayout(prompt_row)
    top.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
    return top


def settings_panel(picker: QWidget, controls: QWidget) -> QScrollArea:
    """The model picker over the run settings, scrolling up and down (never sideways)."""
    left = QWidget()
    left_layout = QVBoxLayout(left)
    left_layout.setContentsMargins(4, 4, 4, 4)
    left_layout.addWidget(picker)
    left_layout.addWidget(controls, 1)
    scroll = QScrollArea()
    scroll.setWidget(left)
    scroll.setWidgetResizable(True)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setMinimumWidth(330)
    return scroll


def runs_panel(runs_list: QWidget) -> QWidget:
    runs = QWidget()
    runs_layout = QVBoxLayout(runs)
    runs_layout.setContentsMargins(4, 0, 4, 0)
    runs_layout.addWidget(QLabel("Click a run to view it again; branches and opened runs come back here"))
    runs_layout.addWidget(runs_list)
    return runs


def prepare_docking(window: QMainWindow, centre: QWidget) -> None:
    """``centre`` in the middle; docks may nest, and the left column runs the window's full height."""
    window.setCentralWidget(centre)
    window.setDockNestingEnabled(True)
    window.setCorner(Qt.Corner.TopLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
    window.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)


def arrange_default(window: QMainWindow, settings_dock: QDockWidget, docks: Sequence[QDockWidget],
                    runs_dock: QDockWidget) -> None:
    """Settings on the left; the view ``docks`` as tabs below the prompt (the first at the front); runs at the
    bottom."""
    window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, settings_dock)
    for dock in docks:
        dock.setFloating(False)
        dock.show()
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, runs_dock)
    if docks:
        window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, docks[0])
        window.splitDockWidget(docks[0], runs_dock, Qt.Orientation.Vertical)
        for other in docks[1:]:
            window.tabifyDockWidget(docks[0], other)
        docks[0].raise_()
        window.resizeDocks([docks[0], runs_dock], [700, 110], Qt.Orientation.Vertical)
    settings_dock.show()
    runs_dock.show()


def arrange_side_by_side(window: QMainWindow, docks: Sequence[QDockWidget]) -> None:
    """Every open dock of ``docks`` next to the others, left to right, sharing the width."""
    docks = [d for d in docks if d.isVisible() or not d.isHidden()]
    if len(docks) < 2:
        return
    for dock in docks:
        dock.setFloating(False)
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, docks[0])
    for left, right in itertools.pairwise(docks):
        window.splitDockWidget(left, right, Qt.Orientation.Horizontal)
    window.resizeDocks(docks, [1000] * len(docks), Qt.Orientation.Horizontal)
