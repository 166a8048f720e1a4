"""Colours and fonts shared by every view, so a colour means the same thing everywhere.

Bars use Paul Tol's colour-blind-safe "vibrant" colours; the token shade is a sequential blue-purple ramp
(ColorBrewer BuPu) whose lightness falls with probability, so it reads in greyscale and for colour-blind readers.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QLabel, QWidget

from playground.state import shade_fraction

RAW_COLOR = "#0077BB"  # raw model distribution (blue)
PROCESSED_COLOR = "#EE7733"  # after the sampler pipeline, the distribution the token was drawn from (orange)
CUT_COLOR = "#9E9E9E"  # removed by a processor (grey, hatched)
CHOSEN_COLOR = "#222222"  # outline of the chosen token
REST_COLOR = "#CCCCCC"
MARK_COLOR = "#FFD84D"  # the step shown in the chart, in the token view and as the chart's chosen-row band
MARK_BAND_COLOR = "#FFF1B8"
ERROR_BG = "#FDECEA"
ERROR_FG = "#8A1C12"
INFO_BG = "#EAF2FB"
INFO_FG = "#123D63"

# BuPu stops from p = 1 (pale) to p <= 0.1 % (dark).
SHADE_STOPS = ("#F7FCFD", "#BFD3E6", "#8C96C6", "#8C6BB1", "#88419D", "#6E016B")
SHADE_TICKS = (1.0, 0.1, 0.01, 0.001)


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    return QColor.fromRgbF(a.redF() + (b.redF() - a.redF()) * t, a.greenF() + (b.greenF() - a.greenF()) * t,
                           a.blueF() + (b.blueF() - a.blueF()) * t)


def shade_at(fraction: float) -> QColor:
    """Colour at a position of the ramp, 0 = pale end, 1 = dark end."""
    fraction = min(1.0, max(0.0, fraction))
    scaled = fraction * (len(SHADE_STOPS) - 1)
    low = min(int(scaled), len(SHADE_STOPS) - 2)
    return _mix(QColor(SHADE_STOPS[low]), QColor(SHADE_STOPS[low + 1]), scaled - low)


def shade_for_prob(prob: float) -> QColor:
    return shade_at(shade_fraction(prob))


def text_color_on(background: QColor) -> QColor:
    """Black or white, whichever reads better on ``background``."""
    luma = 0.2126 * background.redF() + 0.7152 * background.greenF() + 0.0722 * background.blueF()
    return QColor("#000000") if luma > 0.5 else QColor("#FFFFFF")


def mono_font(point_size: int = 11) -> QFont:
    font = QFont("DejaVu Sans Mono")
    font.setStyleHint(QFont.StyleHint.Monospace)
    font.setPointSize(point_size)
    return font


def format_percent(prob: float) -> str:
    """Readable percentages across the whole range: 62.1%, 0.43%, <0.01%."""
    pct = prob * 100
    if pct == 0:
        return "0%"
    if pct < 0.01:
        return "<0.01%"
    if pct < 1:
        return f"{pct:.2f}%"
    return f"{pct:.1f}%"


def configure_pyqtgraph() -> None:
    """Once, before any plot is built: row-major images (or heatmaps come out transposed), light theme."""
    import pyqtgraph as pg

    pg.setConfigOptions(imageAxisOrder="row-major", background="w", foreground="#333333", antialias=True)


def rich_label(parent: QWidget | None = None, *, wrap: bool = True) -> QLabel:
    """A label for the panels' headers, legends and explanations: rich text (token text is escaped by callers)."""
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setWordWrap(wrap)
    return label
