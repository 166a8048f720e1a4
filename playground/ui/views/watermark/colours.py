"""The watermark's colours: green, red, SynthID's mean g-value between them, grey where a token is not scored."""

from __future__ import annotations

from PySide6.QtGui import QColor

from playground.events.watermark import WatermarkStep

GREEN = "#44AA66"
RED = "#CC4455"
UNSCORED = "#BBBBBB"


def colour_of(mark: WatermarkStep) -> QColor:
    """A token's background: green, red, or (SynthID) between them by its mean g-value; grey when not scored."""
    if not mark.scored:
        return QColor(UNSCORED)
    red, green = QColor(RED), QColor(GREEN)
    # SynthID's mean g-values gather around ½: stretched ×2.5 about it, so a layer's worth of difference shows.
    t = (mark.colour - 0.5) * 2.5 + 0.5 if mark.g_values else mark.colour
    t = min(max(t, 0.0), 1.0)
    mixed = QColor(round(red.red() + (green.red() - red.red()) * t), round(red.green() + (green.green() - red.green())
                   * t), round(red.blue() + (green.blue() - red.blue()) * t))
    mixed.setAlpha(150)
    return mixed


