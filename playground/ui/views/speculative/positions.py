"""The speculative view's acceptance by draft position (by depth, for trees), with α over all positions."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.state.speculative import ROUNDS
from playground.ui.views.columns import Panel
from playground.ui.views.drawing import set_ticks, set_title, static_plot
from playground.ui.views.speculative.plots import INSIDE_LEFT, LABEL_FILL, PLOT_HEIGHT, SpeculativeOwner, bars, dashed
from playground.ui.views.speculative.text import ACCEPTED_COLOR


class PositionsPlot(Panel):
    shows = frozenset({ROUNDS})

    def __init__(self, view: SpeculativeOwner, parent: QWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "Acceptance by draft position", "draft position in the round", "accept rate",
                                min_height=PLOT_HEIGHT)
        self.bars = bars(ACCEPTED_COLOR)
        self.alpha_line = pg.InfiniteLine(angle=0, movable=False, pen=dashed("#333333"), label="α",
                                          labelOpts={"position": 0.99, "color": "#333333", "anchors": INSIDE_LEFT,
                                                     "fill": LABEL_FILL})
        self.plot.addItem(self.bars)
        self.plot.addItem(self.alpha_line)
        self.plot.setYRange(0, 1.05, padding=0)

    def draw(self) -> None:
        state = self.view.state
        rates = state.position_rates()
        xs = [i + 1 for i, rate in enumerate(rates) if rate is not None]
        self.bars.setOpts(x=xs, height=[rate for rate in rates if rate is not None], width=0.7)
        alpha = state.alpha
        self.alpha_line.setVisible(alpha is not None)
        if alpha is not None:
            self.alpha_line.setValue(alpha)
            self.alpha_line.label.setFormat(f"α = {alpha:.2f} (all positions)")
        width = max(len(rates), state.draft_k, 1)
        judged = [*state.reached_at, *[0] * (width - len(state.reached_at))]
        item = self.plot.getPlotItem()
        if state.is_tree:
            set_title(item, "Acceptance by depth in the tree", size="10pt")
            item.setLabel("bottom", "depth in the tree")
        else:
            set_title(item, "Acceptance by draft position", size="10pt")
            item.setLabel("bottom", "draft position in the round")
        item.setXRange(0.4, width + 0.6, padding=0)
        roomy = width <= 6 and self.plot.width() / width >= 90  # px a tick's "(n judged)" needs
        set_ticks(item.getAxis("bottom"),
            [[(i, f"{i} ({judged[i - 1]} judged)" if roomy else str(i)) for i in range(1, width + 1)]])
