"""The speculative view's what-if: the expected speed-up against k from the measured acceptance and costs (an
estimate, labelled as one; the measured speed-up comes with the run's end), or for tree runs a heat map of the tree
cut to each depth and width (``tree.TreeGrid``); its note says how it is estimated."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from playground.state.speculative import ROUNDS
from playground.ui.style import MARK_COLOR, rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.drawing import set_ticks, set_title, static_plot
from playground.ui.views.speculative.plots import INSIDE_LEFT, LABEL_FILL, PLOT_HEIGHT, SpeculativeOwner, dashed
from playground.ui.views.speculative.text import TARGET_COLOR
from playground.ui.views.speculative.tree import TreeGrid


class WhatIfPlot(Panel):
    shows = frozenset({ROUNDS})

    def __init__(self, view: SpeculativeOwner, parent: QWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "What-if (estimate): speed-up against k", "k (tokens drafted per round)",
                                "speed-up ×", min_height=PLOT_HEIGHT)
        self.curve = pg.PlotDataItem([], [], pen=pg.mkPen(TARGET_COLOR, width=2), symbol="o", symbolSize=5,
                                     symbolBrush=TARGET_COLOR, symbolPen=None)
        self.plain_line = pg.InfiniteLine(pos=1.0, angle=0, movable=False,
                                          pen=pg.mkPen("#777777", style=Qt.PenStyle.DotLine),
                                          label="plain decoding = 1×",
                                          labelOpts={"position": 0.99, "color": "#555555", "anchors": INSIDE_LEFT})
        self.run_k_line = pg.InfiniteLine(angle=90, movable=False, pen=dashed("#333333"), label="this run",
                                          labelOpts={"position": 0.97, "color": "#333333",
                                                     "anchors": [(0, 0), (0, 0)], "fill": LABEL_FILL})
        self.measured = pg.ScatterPlotItem(symbol="star", size=16, brush=MARK_COLOR, pen=pg.mkPen("#333333"))
        for item in (self.plain_line, self.curve, self.run_k_line, self.measured):
            self.plot.addItem(item)
        self.grid = TreeGrid(self.plot.getPlotItem())
        self.as_grid = False
        self.note = rich_label(parent)

    def draw(self) -> None:
        state = self.view.state
        if state.is_tree:
            self._draw_tree()
            return
        self._mode(grid=False)
        self.note.setToolTip("")
        what_if = state.what_if()
        item = self.plot.getPlotItem()
        if what_if is None:
            self.curve.setData([], [])
            self.measured.setData(x=[], y=[])
            self.run_k_line.setVisible(False)
            self.note.setText("<i>The what-if curve appears after the first round with a draft.</i>")
            return
        self.curve.setData(list(what_if.ks), list(what_if.speedups))
        self.run_k_line.setVisible(True)
        self.run_k_line.setValue(state.draft_k)
        self.run_k_line.label.setFormat(f"this run: k = {state.draft_k}")
        top = max(*what_if.speedups, 1.0)
        if state.speedup is not None:
            self.measured.setData(x=[state.draft_k], y=[state.speedup])
            top = max(top, state.speedup)
        else:
            self.measured.setData(x=[], y=[])
        item.setXRange(-0.5, what_if.ks[-1] + 0.5, padding=0)
        item.setYRange(0, max(top * 1.15, 1.3), padding=0)
        plain = (f"the measured plain decoding, {what_if.plain_ms:.1f} ms per token" if what_if.plain_measured else
                 f"c<sub>verify</sub>(0) = {what_if.plain_ms:.1f} ms as one plain step (an estimate until the "
                 "measured plain speed comes at the end)")
        star = (f" · <span style='color:#B8860B'>★</span> measured: {state.speedup:.2f}×" if state.speedup is not None
                else "")
        self.note.setText(
            f"<i>Estimate, not measured</i>: E(k) = (1 − α<sup>k+1</sup>) / (1 − α) tokens per round "
            f"(Leviathan et al. 2023) with α = {what_if.alpha:.2f}, for k·c<sub>draft</sub> + c<sub>verify</sub>(k) "
            f"ms per round: c<sub>draft</sub> = {what_if.draft_ms:.2f} ms per drafted token, "
            f"c<sub>verify</sub>(k) = {what_if.verify_ms_0:.1f} + {what_if.verify_ms_per_draft:.1f}·k ms "
            f"(fitted to the rounds); against {plain}{star}.")

    def _mode(self, grid: bool) -> None:
        """The what-if plot shows the tree's depth × width heat map or the chain's curve against k."""
        if grid == self.as_grid:
            return
        self.as_grid = grid
        item = self.plot.getPlotItem()
        self.plain_line.setVisible(not grid)
        self.curve.setVisible(not grid)
        self.measured.setVisible(not grid)
        if grid:
            self.run_k_line.setVisible(False)
            set_title(item, "What-if (estimate): tree depth × width", size="10pt")
            item.setLabel("bottom", "depth kept (levels)")
            item.setLabel("left", "width")
        else:
            self.grid.hide()
            set_title(item, "What-if (estimate): speed-up against k", size="10pt")
            item.setLabel("bottom", "k (tokens drafted per round)")
            item.setLabel("left", "speed-up ×")
            set_ticks(item.getAxis("bottom"), None)
            set_ticks(item.getAxis("left"), None)

    def _draw_tree(self) -> None:
        state = self.view.state
        self._mode(grid=True)
        what_if = state.tree_what_if()
        item = self.plot.getPlotItem()
        if what_if is None:
            self.grid.hide()
            self.note.setText("<i>The tree what-if appears after the first round with a draft.</i>")
            return
        depths, widths = len(what_if.depths), len(what_if.widths)
        item.setXRange(0.5, depths + 0.5, padding=0)
        item.setYRange(0.5, widths + 0.5, padding=0)
        self.grid.show(what_if)
        set_ticks(item.getAxis("bottom"), [[(float(d), str(d)) for d in what_if.depths]])
        set_ticks(item.getAxis("left"), [[(float(w), str(w)) for w in what_if.widths]])
        here_tokens, here_speedup = what_if.tokens[-1][-1], what_if.speedups[-1][-1]
        plain = (f"the measured plain decoding, {what_if.plain_ms:.1f} ms per token" if what_if.plain_measured else
                 f"c<sub>verify</sub>(0) = {what_if.plain_ms:.1f} ms as one plain step (an estimate until the "
                 "measured plain speed comes at the end)")
        tokens = ("exact for greedy verification" if what_if.exact else
                  "an estimate for sampled verification, where a cut tree's draws would differ")
        measured = f"; measured {state.speedup:.2f}×" if state.speedup is not None else ""
        exact = "exact" if what_if.exact else "estimated (sampled)"
        cells = ("<i>Estimate, not measured</i>: a cell is the tree cut to its first d levels and each node's first "
                 f"w children (by the drafter's rank): mean <b>tokens per round</b> ({exact}) · <b>speed-up ×</b>. "
                 f"Outlined: this run ({here_tokens:.2f} tokens, {here_speedup:.2f}×{measured}). <i>Hover for how."
                 "</i>")
        how = (f"Tokens per round: the accepted path within the cut + the target's own ({tokens}). Speed-up: "
               f"those tokens for n·c<sub>draft</sub> + c<sub>verify</sub>(n) ms per round, n = the cut tree's "
               f"nodes, c<sub>draft</sub> = {what_if.draft_ms:.2f} ms per node, c<sub>verify</sub>(n) = "
               f"{what_if.verify_ms_0:.1f} + {what_if.verify_ms_per_node:.1f}·n ms (fitted to the rounds), "
               f"against {plain}.")
        self.note.setText(cells)  # how the cells are estimated: the tooltip (the heat map needs the height)
        self.note.setToolTip(how)
