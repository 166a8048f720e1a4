"""Presentation mode (View ▸ Present, F11): the selected run's view alone, full screen, in large type, stepped
through with the keys, so a teacher replays a run in front of a class.

→, Space or Page Down show the next step; ←, Backspace or Page Up the one before; Home the prompt, End the whole
run; Esc or F11 leave and give the window back as it was (its docks, its fonts, the whole run in the views).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, QObject, Qt
from PySide6.QtGui import QFont, QKeyEvent
from PySide6.QtWidgets import QDockWidget, QWidget

from playground.ui.replay import Replay

FONT_SCALE = 1.6  # the type on a projector at the back of a room
NEXT_KEYS = {Qt.Key.Key_Right, Qt.Key.Key_Space, Qt.Key.Key_PageDown, Qt.Key.Key_Down}
BACK_KEYS = {Qt.Key.Key_Left, Qt.Key.Key_Backspace, Qt.Key.Key_PageUp, Qt.Key.Key_Up}
LEAVE_KEYS = {Qt.Key.Key_Escape, Qt.Key.Key_F11}


def _scaled(font: QFont, scale: float) -> QFont:
    bigger = QFont(font)
    if font.pointSizeF() > 0:
        bigger.setPointSizeF(font.pointSizeF() * scale)
    elif font.pixelSize() > 0:
        bigger.setPixelSize(round(font.pixelSize() * scale))
    return bigger


def _application() -> QCoreApplication:
    app = QCoreApplication.instance()
    assert app is not None  # a window exists
    return app


class Presenter(QObject):
    """Presents ``window``'s selected run; ``active`` while it does. The window's own state is kept and put back."""

    def __init__(self, window: Any) -> None:  # the main window (whose module imports this one)
        super().__init__(window)
        self.window = window
        self.replay: Replay | None = None
        self.view_name: str | None = None
        self._saved_state = QByteArray()
        self._was_full_screen = False
        self._fonts: list[tuple[QWidget, QFont]] = []
        self._axes: list[tuple[Any, QFont | None, QFont]] = []  # (axis, its tick font, its title's font)
        self._hidden: list[QWidget] = []

    @property
    def active(self) -> bool:
        return self.replay is not None

    def toggle(self) -> None:
        if self.active:
            self.leave()
        else:
            self.enter()

    def enter(self) -> bool:
        """Start presenting; False (and why, in the banner) when there is no ended run to step through."""
        w = self.window
        run = w.session.selected
        if run is None or run.running or not run.events:
            w.banner.show_info("Presentation mode steps through a run that has ended: open a saved run (File ▸ "
                               "Open run…) or let this one finish, then View ▸ Present (F11).")
            return False
        name = w.run_views.front_view(run)
        if name is None:
            w.banner.show_info(f"Run #{run.index + 1} has no view to present.")
            return False
        self.view_name = name
        self._saved_state = w.saveState()
        self._was_full_screen = w.isFullScreen()
        self._hidden = [widget for widget in (w.centralWidget(), w.menuBar()) if widget is not None and
                        widget.isVisible()]
        for widget in self._hidden:
            widget.hide()
        for dock in w.findChildren(QDockWidget):
            if dock is not w.docks[name]:
                dock.hide()
        dock = w.docks[name]
        dock.setFloating(False)
        dock.show()
        dock.raise_()
        self._scale_fonts(dock, FONT_SCALE)
        self.replay = Replay(w.run_views, run.events, index=run.index, source=run.source, settle_in=w,
                             on_shown=w.status.show_run)
        self.replay.show(0)
        self._tell()
        _application().installEventFilter(self)
        w.showFullScreen()
        return True

    def leave(self) -> None:
        if self.replay is None:
            return
        w = self.window
        _application().removeEventFilter(self)
        self.replay = None
        for widget, font in self._fonts:
            widget.setFont(font)
        self._fonts = []
        for axis, tick, label in self._axes:
            axis.setStyle(tickFont=tick)
            axis.label.setFont(label)
        self._axes = []
        for widget in self._hidden:
            widget.show()
        self._hidden = []
        w.restoreState(self._saved_state)
        if not self._was_full_screen:
            w.showNormal()
        run = w.session.selected
        if run is not None:
            w.select_run(run.index)  # the whole run again, in every view that applies
        w.status.showMessage("Left presentation mode", 5000)

    def step(self, delta: int) -> None:
        if self.replay is not None:
            self.go_to(self.replay.position + delta)

    def go_to(self, position: int) -> None:
        if self.replay is not None:
            self.replay.show(position)
            self._tell()

    def _tell(self) -> None:
        replay = self.replay
        assert replay is not None
        frame = replay.frames[replay.position]
        where = "the prompt" if frame.step is None else f"step {frame.step + 1}"
        self.window.status.showMessage(f"Presenting: {where} ({replay.position} of {len(replay) - 1}) · → next, "
                                       "← back, Home/End, Esc leaves")

    def _scale_fonts(self, root: QWidget, scale: float) -> None:
        """Every widget under ``root`` in type ``scale`` times larger. Each one's font is read before any is set (a
        child inherits its parent's), and kept to put back: its own where it had one, else none (it inherits)."""
        widgets = [root, *root.findChildren(QWidget)]
        fonts = [(widget, QFont(widget.font()), widget.testAttribute(Qt.WidgetAttribute.WA_SetFont))
                 for widget in widgets]
        for widget, font, own in fonts:
            self._fonts.append((widget, QFont(font) if own else QFont()))
            widget.setFont(_scaled(font, scale))
        # The charts draw their axes' ticks and titles with fonts of their own: the value axes' grow (a left axis
        # of token labels keeps its size, as its chart sizes it to the longest label).
        import pyqtgraph as pg

        for plot in root.findChildren(pg.PlotWidget):
            for name, entry in plot.getPlotItem().axes.items():
                if name != "bottom":
                    continue
                axis = entry["item"]
                tick = axis.style.get("tickFont")
                self._axes.append((axis, tick, QFont(axis.label.font())))
                axis.setStyle(tickFont=_scaled(QFont(tick) if tick is not None else QFont(plot.font()), scale))
                axis.label.setFont(_scaled(axis.label.font(), scale))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.KeyPress or self.replay is None:
            return False
        if not isinstance(event, QKeyEvent):
            return False
        key = Qt.Key(event.key())
        if key in NEXT_KEYS:
            self.step(1)
        elif key in BACK_KEYS:
            self.step(-1)
        elif key == Qt.Key.Key_Home:
            self.go_to(0)
        elif key == Qt.Key.Key_End:
            self.go_to(len(self.replay) - 1)
        elif key in LEAVE_KEYS:
            self.leave()
        else:
            return False
        return True
