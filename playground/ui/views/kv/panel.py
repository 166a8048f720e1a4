"""What the KV view's panels share: a plot or a note in its place with a caption, the view's colours and units,
and the helpers of their plots (lines, markers, legends, log axes with plain-number ticks)."""

from __future__ import annotations

import html
import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QStackedWidget, QVBoxLayout, QWidget

from playground.ui.style import rich_label
from playground.ui.views.drawing import set_ticks

MB = 1e6  # axes and figures in decimal megabytes (538 MB of fp32 weights for SmolLM2's 134.5 M parameters)
GIGA = 1e9
# Paul Tol's colour-blind-safe "bright" colours, one meaning each in this view.
TOTAL_COLOR = "#4477AA"  # the measured cache (and, in the block map, a sequence's own blocks)
FORMULA_COLOR = "#EE6677"  # the formula (dashed, over the measured line)
WEIGHTS_COLOR = "#555555"
PROCESS_COLOR = "#AA3377"
RESERVED_COLOR = "#CCBB44"
PREFILL_COLOR = "#228833"
DECODE_COLOR = "#4477AA"
CACHED_COLOR = "#4477AA"  # with the cache
UNCACHED_COLOR = "#EE6677"  # recomputing everything
SHARED_COLOR = "#EE7733"  # a block more than one sequence references
FREE_COLOR = "#DDDDDD"  # slots of an allocated block that hold nothing yet
EVICTED_COLOR = "#BBBBBB"  # positions a cache that keeps less has dropped
QUANTIZED_COLOR = "#66CCEE"  # positions KIVI holds quantized
ROOF_COLOR = "#333333"
THROUGHPUT_COLOR = "#4477AA"
STEP_MS_COLOR = "#EE7733"


def format_mb(n: float) -> str:
    """Bytes as MB (decimal), with the digits that matter: 538 MB, 46.1 MB, 7.70 MB, 0.046 MB."""
    mb = n / MB
    if abs(mb) >= 100:
        return f"{mb:,.0f} MB"
    if abs(mb) >= 10:
        return f"{mb:.1f} MB"
    if abs(mb) >= 0.1 or mb == 0:
        return f"{mb:.2f} MB"
    return f"{mb:.3g} MB"


def line(color: str, width: float = 2, style: Qt.PenStyle = Qt.PenStyle.SolidLine, **symbol) -> pg.PlotDataItem:
    return pg.PlotDataItem([], [], pen=pg.mkPen(color, width=width, style=style), **symbol)


def points(color: str, symbol: str) -> pg.PlotDataItem:
    """Markers only, as a PlotDataItem (it follows the plot's log mode; a bare scatter item would not)."""
    return pg.PlotDataItem([], [], pen=None, symbol=symbol, symbolSize=13, symbolBrush=color,
                           symbolPen=pg.mkPen("#000000"))


def legend(plot: pg.PlotWidget, offset: tuple[int, int]) -> pg.LegendItem:
    item = plot.getPlotItem().addLegend(offset=offset, labelTextSize="8pt", verSpacing=-6)
    item.setBrush(pg.mkBrush(255, 255, 255, 215))
    return item


def unbroken(text: str) -> str:
    """A figure and its unit kept on one line in a wrapped label (Qt's line breaking ignores <nobr> there and breaks
    after a slash): non-breaking spaces, and a word joiner after each slash."""
    return html.escape(text).replace(" ", "&nbsp;").replace("/", "/\u2060")


def log10(value: float) -> float:
    return math.log10(value) if value > 0 else 0.0


def _plain_number(value: float) -> str:
    """1000 → "1,000", 0.1 → "0.1", 20 → "20": tick labels a newcomer reads without exponents."""
    return f"{value:,.0f}" if value >= 1 else f"{value:.4g}"


def log_ticks(low: float, high: float) -> list[list[tuple[float, str]]]:
    """Ticks of a log axis whose view runs from ``low`` to ``high`` (log10 units): every decade labelled with the
    plain number, 2× and 5× as minor ticks (labelled too when the range spans at most two decades)."""
    major, minor = [], []
    label_minor = high - low <= 2.0
    for k in range(math.floor(low), math.ceil(high) + 1):
        if low <= k <= high:
            major.append((float(k), _plain_number(10.0 ** k)))
        for m in (2, 5):
            v = k + math.log10(m)
            if low <= v <= high:
                minor.append((v, _plain_number(m * 10.0 ** k) if label_minor else ""))
    return [major, minor]


def set_log_range(item: pg.PlotItem, axis: str, low: float, high: float) -> None:
    """Show ``low`` … ``high`` (data units, both > 0) on a log axis, with plain-number ticks."""
    a, b = math.log10(low), math.log10(high)
    if axis == "left":
        item.setYRange(a, b, padding=0)
    else:
        item.setXRange(a, b, padding=0)
    set_ticks(item.getAxis(axis), log_ticks(a, b))


class Panel(QWidget):
    """A plot, or a note in its place (never an empty plot), with a caption under it."""

    def __init__(self, plot: pg.PlotWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = plot
        self.note = rich_label(self)
        self.note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.note.setMargin(16)
        self.note.setFrameShape(QFrame.Shape.StyledPanel)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(plot)
        self.stack.addWidget(self.note)
        self.caption = rich_label(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.stack, 1)
        layout.addWidget(self.caption)

    def draw(self, s: Any) -> None:
        """Draw the panel from the KV fold (each panel its own part of it)."""
        raise NotImplementedError

    def show_plot(self, caption: str) -> None:
        self.stack.setCurrentWidget(self.plot)
        self.caption.setText(caption)

    def show_note(self, note: str, caption: str = "") -> None:
        self.note.setText(note)
        self.stack.setCurrentWidget(self.note)
        self.caption.setText(caption)

    @property
    def showing_note(self) -> bool:
        return self.stack.currentWidget() is self.note
