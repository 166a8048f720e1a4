"""What the contrastive view's panels share: their colours, bars, number formats and least heights, and what they
read of the view (``ContrastiveOwner``)."""

from __future__ import annotations

import html
import math
from typing import Protocol

import pyqtgraph as pg

from playground.state.contrastive import AlphaReplay, ContrastiveState
from playground.ui.style import PROCESSED_COLOR, RAW_COLOR, format_percent

CHART_HEIGHT, SHORT_CHART_HEIGHT = 280, 235  # the three candidate panels' least height
STRIP_HEIGHT, SHORT_STRIP_HEIGHT = 110, 90  # the steps strip's
EXPERT_COLOR = RAW_COLOR  # the expert's own distribution: the raw model output, blue as everywhere
AMATEUR_COLOR = "#009988"  # Tol's teal
CONTRAST_COLOR = PROCESSED_COLOR  # the scores the token was chosen from: orange, as "processed" everywhere
CHANGED_COLOR = "#EE3377"  # a step where the contrast overruled the expert (Tol's magenta)
SAME_COLOR = "#BBBBBB"
UNKNOWN_COLOR = "#E6E6E6"
CUT_SHADE = (120, 120, 120, 55)
SLOTS = 10  # candidates shown in the chart
BAR_WIDTH = 0.6
FLOOR = -80.0  # log-probabilities below this are drawn at it (the bar's label says the value)
TICK_CHARS = 7  # a token's label under a bar or a step


def bars(color: str) -> pg.BarGraphItem:
    return pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=color, pen=pg.mkPen(None))


def padded(values: list[float], room_above: float = 0.12) -> tuple[float, float]:
    """A y range holding ``values`` and 0, with a margin (``room_above`` of the span above, for marks)."""
    low, high = min([*values, 0.0]), max([*values, 0.0])
    span = max(high - low, 1.0)
    return low - 0.08 * span, high + room_above * span


def swatch(color: str, text: str) -> str:
    return f"<span style='color:{color};font-size:13pt'>■</span>&nbsp;{text}"


def percent(prob: float) -> str:
    return html.escape(format_percent(prob))  # "<0.01%" is not a tag


def nats(value: float) -> str:
    return "−∞" if value == -math.inf else f"{value:+.2f}".replace("-", "−")


class ContrastiveOwner(Protocol):
    """What a panel of the contrastive view reads of the view: the fold, the shown step, the what-if α and its
    replay, the dock's height, and what a panel asks of it (keep or hover a step, redraw for a new α)."""

    state: ContrastiveState
    short: bool

    @property
    def replay(self) -> AlphaReplay | None: ...

    @property
    def shown_step(self) -> int | None: ...

    def what_if_alpha(self) -> float: ...

    def select_step(self, index: int) -> None: ...

    def hover_step(self, index: int | None) -> None: ...

    def alpha_changed(self) -> None: ...
