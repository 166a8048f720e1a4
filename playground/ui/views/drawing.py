"""What the views share for drawing: a plain plot with its labels, and a redraw that streams at a bounded rate."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, QPointF, QRectF, QSize, QTimer
from PySide6.QtGui import QPicture
from PySide6.QtWidgets import QFrame, QLayout, QScrollArea, QVBoxLayout, QWidget


def static_plot(parent: QWidget | None, title: str, bottom: str, left: str, min_height: int | None = None
                ) -> pg.PlotWidget:
    """A plot with a title and axis labels, no context menu, no auto-range button, no mouse panning."""
    plot = pg.PlotWidget(parent)
    item = plot.getPlotItem()
    item.setMenuEnabled(False)
    item.hideButtons()
    item.setMouseEnabled(x=False, y=False)
    item.setTitle(title, size="10pt")
    item.setLabel("bottom", bottom)
    item.setLabel("left", left)
    if min_height is not None:
        plot.setMinimumHeight(min_height)
    return plot


def set_ticks(axis: pg.AxisItem, ticks: list | None) -> None:
    """``axis.setTicks(ticks)`` unless the axis holds these ticks already: every ``setTicks`` throws the axis's
    picture away, and a streaming draw that sets the same ticks again (the same layers, the same labels) would have
    the axis measure and lay out every label again at its next paint."""
    if ticks is not None and axis._tickLevels == ticks:  # pyqtgraph keeps what setTicks was given there
        return
    axis.setTicks(ticks)


class KeptPicturesAxis(pg.AxisItem):
    """An axis that keeps its last few drawings by everything a drawing depends on, and plays a kept one again
    instead of laying out its ticks and labels anew.

    pyqtgraph throws an axis's drawing away on every range change (even to a range it drew a moment ago) and on
    every ``setTicks``; laying out the labels again is most of a streaming chart's update. A chart whose range
    moves among a few steps (the tokens chart's probability axis), or whose labels come back (the same tokens at
    the same step of a repeating text), draws each once. What a drawing depends on is in ``_picture_key``: the
    range, the ticks, the axis's geometry and the plot's (the grid spans it), the scale to the screen, the
    style and the pens; anything else that drops the drawing (a new font or pen) is in the style or the pens.
    """

    KEEP = 32
    picture: QPicture | None  # pyqtgraph's: the drawing played at each paint (None: to be laid out again)

    def __init__(self, orientation: str, **kwargs) -> None:
        super().__init__(orientation, **kwargs)
        self._kept: OrderedDict[tuple, QPicture] = OrderedDict()

    def _picture_key(self, painter) -> tuple:
        view = self.linkedView()
        plot = () if view is None or self.grid is False else view.mapRectToItem(self, view.boundingRect()).getRect()
        ticks = None if self._tickLevels is None else tuple(tuple(level) for level in self._tickLevels)
        screen = painter.worldTransform()  # its scale: how many pixels the axis is long (a move changes nothing)
        return (tuple(self.range), ticks, self.geometry().getRect(), plot, screen.m11(), screen.m12(), screen.m21(),
                screen.m22(), self.grid, repr(self.style), _pen_key(self.pen()), _pen_key(self.textPen()),
                _pen_key(self.tickPen()))

    def paint(self, p, opt, widget) -> None:
        if self.picture is None:
            key = self._picture_key(p)
            kept = self._kept.get(key)
            if kept is None:
                super().paint(p, opt, widget)  # lays out and draws, sets self.picture
                if self.picture is not None:
                    self._kept[key] = self.picture
                    if len(self._kept) > self.KEEP:
                        self._kept.popitem(last=False)
                return
            self._kept.move_to_end(key)
            self.picture = kept
        self.picture.play(p)


class _MeasuringPainter:
    """Stands in for the painter while an axis lays out its labels (``generateDrawSpecs`` sets its font and
    measures each label, nothing else): each label's measure is kept, by font and text, for the next layout."""

    def __init__(self, painter, kept: dict) -> None:
        self._painter = painter
        self._kept = kept

    def setFont(self, font) -> None:
        self._painter.setFont(font)

    def boundingRect(self, rect, flags, text):
        key = (self._painter.font().key(), rect.getRect(), int(flags), text)
        measured = self._kept.get(key)
        if measured is None:
            if len(self._kept) > 4096:
                self._kept.clear()
            measured = self._kept[key] = self._painter.boundingRect(rect, flags, text)
        return QRectF(measured)  # the caller shrinks it


class LabelsAxis(KeptPicturesAxis):
    """A kept-pictures axis whose labels change as it streams (the tokens chart's token labels): a label's size
    is measured once, and the axis's bounds once per layout (pyqtgraph asks for them again for every label)."""

    def __init__(self, orientation: str, **kwargs) -> None:
        super().__init__(orientation, **kwargs)
        self._measured: dict = {}
        self._bounds: QRectF | None = None  # while laying out

    def generateDrawSpecs(self, p):
        self._bounds = super().boundingRect()
        try:
            return super().generateDrawSpecs(_MeasuringPainter(p, self._measured))
        finally:
            self._bounds = None

    def boundingRect(self) -> QRectF:
        return QRectF(self._bounds) if self._bounds is not None else super().boundingRect()


def _pen_key(pen) -> tuple:
    return pen.color().rgba(), pen.widthF(), pen.style(), pen.isCosmetic(), pen.brush().style()


def set_title(item: pg.PlotItem, title: str | None, **args) -> None:
    """``item.setTitle(title, **args)`` unless it shows that title already: a new title is new HTML for its label
    and a new layout of the plot."""
    label = item.titleLabel
    if (title is not None and label.isVisible() and label.text == title
            and all(label.opts.get(key) == value for key, value in args.items())):
        return
    item.setTitle(title, **args)


# BarGraphItem options that hold one value per bar (or one for all, as a scalar).
_PER_BAR = ("x", "x0", "x1", "y", "y0", "y1", "width", "height", "brushes", "pens")


def clear_bars(bars: pg.BarGraphItem) -> None:
    """Draw no bars, whatever the item was drawn with last: every per-bar option holding a list or an array
    becomes empty. (pyqtgraph broadcasts the options together, so ``setOpts(x=[], height=[])`` on bars last drawn
    with a ``y0`` of 4 values raises "operands could not be broadcast together with shapes (4,) (0,)".)"""
    bars.setOpts(**{key: [] for key, value in bars.opts.items()
                    if key in _PER_BAR and value is not None and not np.isscalar(value)})


class TallEnough(QWidget):
    """A column of wrapped texts that keeps the height its texts need at its width: a splitter or a scroll area
    around it would otherwise squeeze it to its minimum size hint (which wrapped labels guess at some other width)
    and cut its last lines."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        layout: QLayout | None = self.layout()
        if layout is not None and layout.hasHeightForWidth():
            need = layout.totalHeightForWidth(event.size().width())
            if need != self.minimumHeight():
                self.setMinimumHeight(need)


class LeastHeight(QWidget):
    """A scroll area's content that asks for the least height its layout needs at its width (wrapped texts whole,
    every panel at its minimum height), where Qt's scroll area would take the preferred one: a dock that holds that
    least height shows everything without a vertical scroll bar, the stretching panels sharing what is left; a
    smaller dock scrolls."""

    def hasHeightForWidth(self) -> bool:
        return self.layout() is not None

    def heightForWidth(self, width: int) -> int:
        layout = self.layout()
        return layout.totalMinimumHeightForWidth(width) if layout is not None else super().heightForWidth(width)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(hint.width(), self.heightForWidth(hint.width())) if self.layout() is not None else hint


def fill_with_scroll(view: QWidget, content: QWidget) -> QScrollArea:
    """Fill ``view`` with a frameless scroll area holding ``content``: a dock lower than the panels' least heights
    scrolls instead of squeezing them. Returns the scroll area (a view may set its bar policies)."""
    scroll = QScrollArea(view)
    scroll.setWidget(content)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    outer = QVBoxLayout(view)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(scroll)
    return scroll


class ThrottledDraw(QObject):
    """Calls ``draw`` at once, then at most once per ``interval_ms`` while a run streams (the batches that come in
    between are drawn together when the interval is over)."""

    def __init__(self, parent: QObject, interval_ms: int, draw: Callable[[], None]) -> None:
        super().__init__(parent)
        self._draw = draw
        self._pending = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._fired)

    def request(self, streaming: bool) -> None:
        """Draw now, or — while ``streaming`` and within the interval since the last draw — when it is over."""
        if streaming and self._timer.isActive():
            self._pending = True
            return
        self._draw()
        if streaming:
            self._timer.start()

    def cancel(self) -> None:
        self._timer.stop()
        self._pending = False

    def _fired(self) -> None:
        if self._pending:
            self._pending = False
            self._draw()
            self._timer.start()


class TextsInside(QObject):
    """Keeps text items of a view box whole: each is drawn where it was placed, moved just enough to lie inside
    the box (which clips what runs past it), again whenever the box is resized or its range changes."""

    def __init__(self, box: pg.ViewBox, margin: float = 2.0) -> None:
        super().__init__(box)
        self._box = box
        self._margin = margin
        self._placed: dict[int, tuple[pg.TextItem, float, float]] = {}
        box.sigTransformChanged.connect(self.refit)

    def place(self, item: pg.TextItem, x: float, y: float) -> None:
        """``item.setPos(x, y)`` (view coordinates), kept inside the box."""
        self._placed[id(item)] = (item, x, y)
        self._fit(item, x, y)

    def refit(self, *_args) -> None:
        for item, x, y in self._placed.values():
            self._fit(item, x, y)

    def _fit(self, item: pg.TextItem, x: float, y: float) -> None:
        item.setPos(x, y)
        box = self._box
        if not item.isVisible() or not item.textItem.toPlainText() or box.width() <= 0 or box.height() <= 0:
            return
        item.updateTransform(force=True)
        m = self._margin
        area = box.sceneBoundingRect().adjusted(m, m, -m, -m)
        ink = item.mapRectToScene(item.boundingRect())
        dx = _shift(ink.left(), ink.right(), area.left(), area.right())
        dy = _shift(ink.top(), ink.bottom(), area.top(), area.bottom())
        if dx or dy:
            item.setPos(box.mapSceneToView(box.mapViewToScene(QPointF(x, y)) + QPointF(dx, dy)))


def _shift(low: float, high: float, area_low: float, area_high: float) -> float:
    """How far to move [low, high] to lie within [area_low, area_high] (its start first when it cannot fit)."""
    if low < area_low or high - low > area_high - area_low:
        return area_low - low
    if high > area_high:
        return area_high - high
    return 0.0
