"""The speculative decoding view: what was drafted, what the target kept, threw away and added, and what it saved.

- The output text, marked: accepted drafts, rejected drafts (struck through, where they were rejected, just before
  the target's correction) and the target's own tokens, in three colours used for the same meaning everywhere here.
- A timeline of rounds (stacked bars: accepted, the target's own, rejected); click a round, or a token in the text,
  to see that round's drafted tokens as bars of the drafter's q next to the target's p, with the verdict (and, for
  sampled runs, the uniform draw). A tree run's round is drawn as its tree instead (``tree.RoundTree``).
- Live figures, a chart of acceptance by draft position (by depth, for trees), and a what-if curve of the expected
  speed-up against k from the measured acceptance and costs (an estimate, labelled as one; the measured speed-up comes
  with the run's end); for tree runs a heat map of the tree cut to each depth and width (``tree.TreeGrid``).

Events are folded into a Qt-free ``SpeculativeState``; the text grows by the new marks only, and the plots' items are
built once and updated with ``setOpts``/``setData``.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QSplitter, QVBoxLayout, QWidget

from playground.events.speculative import SpeculativeRound
from playground.state import visible_token_text
from playground.state.speculative import ACCEPTED, REJECTED, TARGET, SpeculativeState
from playground.ui.style import MARK_BAND_COLOR, MARK_COLOR, format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import LeastHeight, TextsInside, fill_with_scroll, static_plot
from playground.ui.views.speculative.text import (
    ACCEPTED_COLOR,
    DRAFT_Q_COLOR,
    REJECTED_COLOR,
    TARGET_COLOR,
    MarkedText,
    swatch,
)
from playground.ui.views.speculative.tree import RoundTree, TreeGrid, short_text

LIVE_PLOTS_MS = 200  # while streaming, the plots redraw at most this often (the text follows every batch)
SHORT_DOCK = 600  # px: a view lower than this is a short dock (1280 x 800's is 531)
PLOT_HEIGHT = 110  # px: a plot's least height (its title, axis labels and a readable chart)
MAX_SLOTS = 17  # drafted tokens (k ≤ 16) + the target's own
# A line's label to the left, under the line in the upper half of the plot and above it in the lower half (pyqtgraph
# picks the first anchor in the upper half): inside the plot wherever the line lies.
INSIDE_LEFT = [(1, 0), (1, 1)]
LABEL_FILL = (255, 255, 255, 200)  # behind a line's label that lies over bars or the curve
TIMELINE_AXIS = "round (click one to inspect it)"
CSV_COLUMNS = ("round", "position", "token_id", "token", "kind", "draft_q", "target_p", "draw", "accepted", "parent",
               "depth", "rank")


def _short(text: str, limit: int = 9) -> str:
    return short_text(text, limit)


def _bars(color: str, pattern: bool = False) -> pg.BarGraphItem:
    brush = QBrush(QColor(color), Qt.BrushStyle.BDiagPattern) if pattern else pg.mkBrush(color)
    pen = pg.mkPen(color, width=1) if pattern else pg.mkPen(None)
    return pg.BarGraphItem(x=[], height=[], width=0.8, brush=brush, pen=pen)


def tree_table(r: SpeculativeRound) -> str:
    """A tree round's nodes, one line each: depth, the drafter's rank, the token, q and p (the round plot's
    tooltip)."""
    lines = []
    for d, depth in zip(r.drafted, r.depths(), strict=True):
        verdict = "✓" if d.accepted else "·"
        lines.append(f"{verdict} depth {depth} #{d.rank + 1} <code>{html.escape(visible_token_text(d.text))}</code>: "
                     f"q {format_percent(d.draft_prob)} · p {format_percent(d.target_prob)}"
                     + (f" · u {d.draw:.3f}" if d.draw is not None else ""))
    if r.target_kind != "none":
        lines.append(f"★ the target's own <code>{html.escape(visible_token_text(r.target_text))}</code>: "
                     f"p {format_percent(r.target_prob)}")
    return "<br>".join(lines)


def _dashed(color: str):
    return pg.mkPen(color, style=Qt.PenStyle.DashLine)


@register_view
class SpeculativeView(FoldView):
    name = "speculative"
    title = "Speculative"
    consumes = (SpeculativeRound,)
    data_formats = ("csv",)
    live_draw_ms = LIVE_PLOTS_MS  # the text follows every batch (``_follow``), the plots at most this often
    idle_header = ("<b>Speculative decoding</b> — choose the speculative strategy and generate: every round's "
                   "drafts and verdicts appear here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: SpeculativeState = SpeculativeState()
        self.selected_round: int | None = None
        self.follow_live = True  # the round chart follows the newest round until the user picks one
        self._drawn_rounds = 0

        self.header = rich_label(self)
        self.legend = rich_label(self)
        self.legend.setText(
            f"{swatch(ACCEPTED, 'accepted draft')} &nbsp; {swatch(REJECTED, 'rejected draft')} (not in the "
            "output; shown where it was rejected; hatched in the charts) &nbsp; "
            f"{swatch(TARGET, 'target’s own token')} (correction or bonus) &nbsp; "
            f"<span style='color:{DRAFT_Q_COLOR}'>■</span> drafter’s q &nbsp; "
            f"<span style='color:{TARGET_COLOR}'>■</span> target’s p &nbsp; "
            "<i>click a token or a round to inspect it</i>")
        self.text = MarkedText(self.state, self)
        self.text.mark_clicked.connect(self._mark_clicked)
        self.show_rejected = QCheckBox("show rejected drafts", self)
        self.show_rejected.setChecked(True)
        self.show_rejected.setToolTip("Rejected drafts are not part of the output: hide them to read the output "
                                      "alone")
        self.show_rejected.toggled.connect(self._toggle_rejected)
        self.figures = rich_label(self)
        self.figures.setMinimumWidth(300)
        self.round_note = rich_label(self)
        self.what_if_note = rich_label(self)
        self._build_timeline()
        self._build_round_plot()
        self._build_figure_plots()
        self._build_layout()
        self._start_drawing()

    def _build_timeline(self) -> None:
        """One stacked bar per round: accepted, then the target's own token, then the rejected drafts."""
        self.timeline = static_plot(self, "Rounds", TIMELINE_AXIS, "tokens",
                                    min_height=PLOT_HEIGHT)
        self.timeline.getPlotItem().showGrid(y=True, alpha=0.2)
        self._band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
        self.timeline_bars = {ACCEPTED: _bars(ACCEPTED_COLOR), TARGET: _bars(TARGET_COLOR),
                              REJECTED: _bars(REJECTED_COLOR, pattern=True)}
        self._k_line = pg.InfiniteLine(angle=0, movable=False, pen=_dashed("#555555"))
        for item in (self._band, *self.timeline_bars.values(), self._k_line):
            self.timeline.addItem(item)
        self._rounds_x: list[int] = []
        self._rounds_counts: dict[str, list[int]] = {kind: [] for kind in self.timeline_bars}
        self.timeline.scene().sigMouseClicked.connect(self._timeline_clicked)

    def _build_round_plot(self) -> None:
        """The selected round: q next to p for each drafted token, then the target's own token's p."""
        self.round_plot = static_plot(self, "Round", "", "probability", min_height=PLOT_HEIGHT)
        self._q_bars = pg.BarGraphItem(x=[], height=[], width=0.36, brush=DRAFT_Q_COLOR, pen=pg.mkPen(None))
        self._p_bars = pg.BarGraphItem(x=[], height=[], width=0.36, brush=TARGET_COLOR, pen=pg.mkPen(None))
        self._draws = pg.ScatterPlotItem(symbol="t1", size=13, brush="#000000", pen=pg.mkPen("#FFFFFF", width=1))
        for item in (self._q_bars, self._p_bars, self._draws):
            self.round_plot.addItem(item)
        self._verdicts: list[pg.TextItem] = []
        for _ in range(MAX_SLOTS):
            label = pg.TextItem("", anchor=(0.5, 1.0))
            label.setVisible(False)
            self.round_plot.addItem(label)
            self._verdicts.append(label)
        self._verdict_texts = TextsInside(self.round_plot.getPlotItem().getViewBox())
        self.round_tree = RoundTree(self.round_plot.getPlotItem())
        self._round_as_tree = False

    def _build_figure_plots(self) -> None:
        """Acceptance by draft position, and the what-if curve of the expected speed-up against k."""
        self.positions_plot = static_plot(self, "Acceptance by draft position", "draft position in the round",
                                          "accept rate", min_height=PLOT_HEIGHT)
        self._position_bars = _bars(ACCEPTED_COLOR)
        self._alpha_line = pg.InfiniteLine(angle=0, movable=False, pen=_dashed("#333333"), label="α",
                                           labelOpts={"position": 0.99, "color": "#333333", "anchors": INSIDE_LEFT,
                                                      "fill": LABEL_FILL})
        self.positions_plot.addItem(self._position_bars)
        self.positions_plot.addItem(self._alpha_line)
        self.positions_plot.setYRange(0, 1.05, padding=0)
        self.what_if_plot = static_plot(self, "What-if (estimate): speed-up against k",
                                        "k (tokens drafted per round)", "speed-up ×", min_height=PLOT_HEIGHT)
        self._what_if_curve = pg.PlotDataItem([], [], pen=pg.mkPen(TARGET_COLOR, width=2), symbol="o",
                                              symbolSize=5, symbolBrush=TARGET_COLOR, symbolPen=None)
        self._plain_line = pg.InfiniteLine(pos=1.0, angle=0, movable=False,
                                           pen=pg.mkPen("#777777", style=Qt.PenStyle.DotLine),
                                           label="plain decoding = 1×",
                                           labelOpts={"position": 0.99, "color": "#555555", "anchors": INSIDE_LEFT})
        self._run_k_line = pg.InfiniteLine(angle=90, movable=False, pen=_dashed("#333333"), label="this run",
                                           labelOpts={"position": 0.97, "color": "#333333",
                                                      "anchors": [(0, 0), (0, 0)], "fill": LABEL_FILL})
        self._measured = pg.ScatterPlotItem(symbol="star", size=16, brush=MARK_COLOR, pen=pg.mkPen("#333333"))
        for item in (self._plain_line, self._what_if_curve, self._run_k_line, self._measured):
            self.what_if_plot.addItem(item)
        self.tree_grid = TreeGrid(self.what_if_plot.getPlotItem())
        self._what_if_as_grid = False

    def _build_layout(self) -> None:
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        output_row = QHBoxLayout()
        output_row.addWidget(QLabel("<b>Output</b>, marked by who proposed each token", left), 1)
        output_row.addWidget(self.show_rejected)
        left_layout.addLayout(output_row)
        left_layout.addWidget(self.text, 1)
        left_layout.addWidget(self.figures)
        right = QWidget()
        self._right = right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.timeline, 3)
        right_layout.addWidget(self.round_plot, 4)
        right_layout.addWidget(self.round_note)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(left)
        top.addWidget(right)
        top.setSizes([520, 620])
        self._what_if_box = what_if = QVBoxLayout()
        what_if.addWidget(self.what_if_plot, 1)
        what_if.addWidget(self.what_if_note)
        self._bottom = bottom = QHBoxLayout()
        bottom.addWidget(self.positions_plot, 2)
        bottom.addLayout(what_if, 3)
        self._short = False  # a short dock: the what-if note beside its plot, the round note's first line only
        # All in a scroll area: a dock lower than the panels' least heights scrolls instead of squeezing the plots
        # (or growing the window); 1280 x 800's holds them (LeastHeight).
        content = LeastHeight()
        self._content = layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.legend)
        layout.addWidget(top, 5)
        layout.addLayout(bottom, 3)
        fill_with_scroll(self, content)

    def resizeEvent(self, event) -> None:
        self._arrange(event.size().height() < SHORT_DOCK)
        super().resizeEvent(event)

    def _arrange(self, short: bool) -> None:
        """In a short dock (1280 x 800's) the what-if note stands beside its plot instead of under it, and the round
        note keeps its figures line (how the drafts were judged goes to its tooltip): the plots keep their height."""
        if short == self._short:
            return
        self._short = short
        self._stretch_rounds()
        if short:
            self._what_if_box.removeWidget(self.what_if_note)
            self._bottom.setStretch(0, 6)  # positions, what-if, its note: 6 : 7 : 5
            self._bottom.setStretch(1, 7)
            self._bottom.addWidget(self.what_if_note, 5)
        else:
            self._bottom.removeWidget(self.what_if_note)
            self._bottom.setStretch(0, 2)
            self._bottom.setStretch(1, 3)
            self._what_if_box.addWidget(self.what_if_note)
        self._draw()

    # --- the view interface ---------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.selected_round = None
        self.follow_live = True
        self._drawn_rounds = 0
        self._rounds_x.clear()
        for counts in self._rounds_counts.values():
            counts.clear()
        self.text.clear_marks()
        self.text.setExtraSelections([])

    def _append_text(self) -> None:
        """The marks settled since the last batch (the text grows by them alone)."""
        state = self.state
        if self.text.drawn < state.settled:
            self.text.append_marks(state.marks[self.text.drawn : state.settled])

    def _follow(self) -> None:
        self._append_text()
        if self.follow_live and self.state.rounds:
            self.selected_round = len(self.state.rounds) - 1

    def _ended(self) -> None:
        if self.follow_live:
            self.follow_live = False
            self.selected_round = self.state.most_interesting_round()
        self._append_text()

    # --- selection ------------------------------------------------------------------------------------------
    def select_round(self, index: int) -> None:
        """Show round ``index`` in the round chart and band it in the text and the timeline (stops following)."""
        if not 0 <= index < len(self.state.rounds):
            return
        self.follow_live = False
        self.selected_round = index
        self._draw()

    def _toggle_rejected(self, shown: bool) -> None:
        self.text.show_rejected = shown
        self.text.clear_marks()
        self.text.append_marks(self.state.marks[: self.state.settled])
        self._band_text()

    def _band_text(self) -> None:
        if self.selected_round is None or self.selected_round >= len(self.state.round_marks):
            self.text.mark_range(0, 0)
            return
        first, end = self.state.round_marks[self.selected_round]
        self.text.mark_range(first, min(end, self.text.drawn))

    def _mark_clicked(self, index: int) -> None:
        mark = self.state.marks[index]
        if mark.round is not None:
            self.select_round(mark.round)

    def _timeline_clicked(self, event) -> None:
        view = self.timeline.getPlotItem().getViewBox()
        if event.button() != Qt.MouseButton.LeftButton or not view.sceneBoundingRect().contains(event.scenePos()):
            return
        self.select_round(round(view.mapSceneToView(event.scenePos()).x()))

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_timeline()
        self._draw_round()
        self._draw_positions()
        self._draw_what_if()
        self._draw_texts()

    def _draw_timeline(self) -> None:
        state = self.state
        for index in range(self._drawn_rounds, len(state.rounds)):
            self._rounds_x.append(index)
            for kind, count in zip((ACCEPTED, REJECTED, TARGET), state.round_counts(index), strict=True):
                self._rounds_counts[kind].append(count)
        self._drawn_rounds = len(state.rounds)
        x = np.asarray(self._rounds_x, dtype=float)
        base = np.zeros(len(x))
        for kind in (ACCEPTED, TARGET, REJECTED):  # stacked bottom to top
            height = np.asarray(self._rounds_counts[kind], dtype=float)
            self.timeline_bars[kind].setOpts(x=x, y0=base.copy(), height=height, width=0.8)
            base = base + height
        drafts = state.tree_nodes if state.is_tree else state.draft_k  # the most a round drafts
        k = max(drafts, int(base.max()) if len(base) else 0)
        self._k_line.setValue(drafts)
        self._k_line.setVisible(drafts > 0)
        if state.is_tree:
            title = f"Rounds: tokens, stacked (dashed: ≤ {drafts} nodes)"
        elif drafts:
            title = f"Rounds: tokens, stacked (dashed: k = {drafts} drafted)"
        else:
            title = "Rounds: tokens, stacked"
        self.timeline.getPlotItem().setTitle(title, size="10pt")
        selected = self.selected_round
        if selected is None:
            self._band.setOpts(x=[], height=[])
        else:
            self._band.setOpts(x=[selected], y0=[-0.3], height=[k + 1.6], width=1.0)
        n = len(x)
        item = self.timeline.getPlotItem()
        item.setXRange(-0.7, max(n, 10) - 0.3, padding=0)
        item.setYRange(0, k + 1.3, padding=0)
        self._band_text()

    def _draw_round(self) -> None:
        state, index = self.state, self.selected_round
        item = self.round_plot.getPlotItem()
        for label in self._verdicts:
            label.setVisible(False)
        if index is not None and index < len(state.rounds) and (state.is_tree or state.rounds[index].is_tree):
            self._draw_tree_round(index)
            return
        self._round_mode(tree=False)
        if index is None or index >= len(state.rounds):
            self._q_bars.setOpts(x=[], height=[])
            self._p_bars.setOpts(x=[], height=[])
            self._draws.setData(x=[], y=[])
            item.setTitle("Selected round: draft q next to target p (none yet)", size="10pt")
            item.getAxis("bottom").setTicks([[]])
            self.round_note.setText("")
            return
        r = state.rounds[index]
        n = len(r.drafted)
        xs = np.arange(n, dtype=float)
        self._q_bars.setOpts(x=xs - 0.19, height=[d.draft_prob for d in r.drafted], width=0.36)
        p_heights = [d.target_prob for d in r.drafted]
        p_x = list(xs + 0.19)
        if r.target_kind != "none":
            p_heights.append(r.target_prob)
            p_x.append(n + 0.0)
        self._p_bars.setOpts(x=p_x, height=p_heights, width=0.36)
        draws = [(i - 0.19, d.draw * d.draft_prob) for i, d in enumerate(r.drafted) if d.draw is not None]
        self._draws.setData(x=[x for x, _ in draws], y=[y for _, y in draws])
        ticks = []
        compact = n > 6
        for i, d in enumerate(r.drafted):
            if i < r.accepted:
                symbol, color, word = "✓", ACCEPTED_COLOR, "accepted"
            elif i == r.accepted:
                symbol, color, word = "✗", REJECTED_COLOR, "rejected"
            else:
                symbol, color, word = "✗", REJECTED_COLOR, "discarded"
            text = symbol if compact else f"{symbol} {word}"
            self._show_verdict(i, i, max(d.draft_prob, d.target_prob), text, color)
            ticks.append((float(i), _short(visible_token_text(d.text))))
        if r.target_kind != "none":
            word = "correction" if r.target_kind == "correction" else "bonus" if n else "target's own"
            self._show_verdict(n, n, r.target_prob, "★" if compact else f"★ {word}", TARGET_COLOR)
            ticks.append((float(n), _short(visible_token_text(r.target_text))))
        item.getAxis("bottom").setTicks([ticks])
        slots = n + (r.target_kind != "none")
        item.setXRange(-0.6, max(slots, 3) - 0.4, padding=0)
        item.setYRange(0, 1.2, padding=0)
        if n:  # short: the note under the plot says how the drafts were judged
            item.setTitle(f"Round {index}: {r.accepted} of {n} drafts accepted", size="10pt")
        else:
            item.setTitle(f"Round {index}: nothing drafted, the target's own token", size="10pt")
        parts = self._round_note(r)
        self.round_note.setText(parts[0] if self._short else "<br>".join(parts))
        self.round_note.setToolTip("<br>".join(parts[1:]) if self._short else "")

    def _stretch_rounds(self) -> None:
        """The rounds' timeline and the round chart share the column: as tall as each other in a short dock, the
        chart taller in a tall one, and taller still for a tree (its rows need it)."""
        timeline, chart = (2, 3) if self._round_as_tree else (1, 1) if self._short else (3, 4)
        self._right.setStretch(0, timeline)
        self._right.setStretch(1, chart)
        # A short dock gives a tree the height of the figures' row (whose plots need less than a tree's rows).
        tree_in_short = self._round_as_tree and self._short
        top, bottom = (2, 1) if tree_in_short else (5, 3)
        self._content.setStretch(2, top)
        self._content.setStretch(3, bottom)
        # ... and the timeline's axis title (the plot's title and the legend say it) goes to give the tree its rows.
        self.timeline.getPlotItem().setLabel("bottom", "" if tree_in_short else TIMELINE_AXIS)

    def _round_mode(self, tree: bool) -> None:
        """The round plot shows a tree (nodes by depth and sibling order) or a chain's q and p bars."""
        if tree == self._round_as_tree:
            return
        self._round_as_tree = tree
        self._stretch_rounds()
        item = self.round_plot.getPlotItem()
        if tree:
            for bars in (self._q_bars, self._p_bars):
                bars.setOpts(x=[], height=[])
            self._draws.setData(x=[], y=[])
            item.hideAxis("left")
            item.getViewBox().invertY(True)
        else:
            self.round_tree.hide()
            self.round_plot.setToolTip("")
            item.setLabel("bottom", "")
            item.showAxis("left")
            item.getViewBox().invertY(False)

    def _draw_tree_round(self, index: int) -> None:
        """A tree round: its nodes by depth and sibling order, the accepted path on the top row."""
        self._round_mode(tree=True)
        r = self.state.rounds[index]
        item = self.round_plot.getPlotItem()
        last, _height = self.round_tree.show(r)  # it sets the plot's range
        # A short dock: the axis's title goes (the tree needs the height), its first tick says what it counts.
        item.setLabel("bottom", "" if self._short else "depth in the tree (0: right after the context)")
        ticks = [(float(d), "depth 0" if d == 0 and self._short and last < 8 else str(d)) for d in range(last + 1)]
        item.getAxis("bottom").setTicks([[(-1.0, "ctx"), *ticks]])
        n = len(r.drafted)
        rejected = sum(kind == REJECTED for kind in self.round_tree.kinds)
        if n:
            item.setTitle(f"Round {index}: {r.accepted} of {n} nodes accepted, {rejected} turned down at the stop",
                          size="10pt")
        else:
            item.setTitle(f"Round {index}: nothing drafted, the target's own token", size="10pt")
        parts = self._round_note(r)  # one line: the tree takes the height (how it was judged: the tooltip)
        self.round_note.setText(parts[0].replace("output steps", "steps").replace(" (one target pass)", ""))
        self.round_note.setToolTip("<br>".join(parts[1:]))
        self.round_plot.setToolTip(tree_table(r))

    def _show_verdict(self, slot: int, x: float, top: float, text: str, color: str) -> None:
        label = self._verdicts[slot]
        label.setText(text, color=color)
        label.setVisible(True)
        self._verdict_texts.place(label, x, top + 0.02)

    def _round_note(self, r: SpeculativeRound) -> list[str]:
        state = self.state
        step = f"output steps {r.first_step}–{r.first_step + r.accepted}" if r.target_kind != "none" else \
            f"from output step {r.first_step}"
        parts = [f"{step} · draft {r.draft_ms:.2f} ms · verify {r.verify_ms:.1f} ms (one target pass)"]
        if not r.drafted:
            parts.append("The drafter had no proposal: the target's pass gave its own token")
        if state.is_tree or r.is_tree:
            parts.append("Tree: the target judged every node in one pass (a tree attention mask); the accepted path "
                         "is the top row, the turned-down alternatives where it stopped are red, nodes it never "
                         "reached grey")
        if state.do_sample and (state.is_tree or r.is_tree):
            parts.append("Sampled: at each node the children are tried in rank order by the rejection rule "
                         "(accept with min(1, p/q)); when all are rejected the target draws its own token from the "
                         "residual")
        elif state.do_sample:
            parts.append("Sampled: the rejection rule. ▲ = the uniform draw u, placed at u × q: accepted when ▲ is "
                         "below p (u &lt; p/q); a rejected draft is replaced by a draw from max(0, p − q)")
        elif state.is_tree or r.is_tree:
            parts.append("Greedy: at each node the child equal to the target's top token is accepted (at most one "
                         "is); the path stops where none is")
        else:
            parts.append("Greedy: a draft is accepted iff it is the target's top token; no draw; drafts after the "
                         "first rejection are discarded unjudged")
        return parts

    def _draw_positions(self) -> None:
        state = self.state
        rates = state.position_rates()
        xs = [i + 1 for i, rate in enumerate(rates) if rate is not None]
        self._position_bars.setOpts(x=xs, height=[rate for rate in rates if rate is not None], width=0.7)
        alpha = state.alpha
        self._alpha_line.setVisible(alpha is not None)
        if alpha is not None:
            self._alpha_line.setValue(alpha)
            self._alpha_line.label.setFormat(f"α = {alpha:.2f} (all positions)")
        width = max(len(rates), state.draft_k, 1)
        judged = [*state.reached_at, *[0] * (width - len(state.reached_at))]
        item = self.positions_plot.getPlotItem()
        if state.is_tree:
            item.setTitle("Acceptance by depth in the tree", size="10pt")
            item.setLabel("bottom", "depth in the tree")
        else:
            item.setTitle("Acceptance by draft position", size="10pt")
            item.setLabel("bottom", "draft position in the round")
        self.positions_plot.getPlotItem().setXRange(0.4, width + 0.6, padding=0)
        roomy = width <= 6 and self.positions_plot.width() / width >= 90  # px a tick's "(n judged)" needs
        self.positions_plot.getPlotItem().getAxis("bottom").setTicks(
            [[(i, f"{i} ({judged[i - 1]} judged)" if roomy else str(i)) for i in range(1, width + 1)]])

    def _what_if_mode(self, grid: bool) -> None:
        """The what-if plot shows the tree's depth × width heat map or the chain's curve against k."""
        if grid == self._what_if_as_grid:
            return
        self._what_if_as_grid = grid
        item = self.what_if_plot.getPlotItem()
        self._plain_line.setVisible(not grid)
        self._what_if_curve.setVisible(not grid)
        self._measured.setVisible(not grid)
        if grid:
            self._run_k_line.setVisible(False)
            item.setTitle("What-if (estimate): tree depth × width", size="10pt")
            item.setLabel("bottom", "depth kept (levels)")
            item.setLabel("left", "width")
        else:
            self.tree_grid.hide()
            item.setTitle("What-if (estimate): speed-up against k", size="10pt")
            item.setLabel("bottom", "k (tokens drafted per round)")
            item.setLabel("left", "speed-up ×")
            item.getAxis("bottom").setTicks(None)
            item.getAxis("left").setTicks(None)

    def _draw_tree_what_if(self) -> None:
        state = self.state
        self._what_if_mode(grid=True)
        what_if = state.tree_what_if()
        item = self.what_if_plot.getPlotItem()
        if what_if is None:
            self.tree_grid.hide()
            self.what_if_note.setText("<i>The tree what-if appears after the first round with a draft.</i>")
            return
        depths, widths = len(what_if.depths), len(what_if.widths)
        item.setXRange(0.5, depths + 0.5, padding=0)
        item.setYRange(0.5, widths + 0.5, padding=0)
        self.tree_grid.show(what_if)
        item.getAxis("bottom").setTicks([[(float(d), str(d)) for d in what_if.depths]])
        item.getAxis("left").setTicks([[(float(w), str(w)) for w in what_if.widths]])
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
        self.what_if_note.setText(cells)  # how the cells are estimated: the tooltip (the heat map needs the height)
        self.what_if_note.setToolTip(how)

    def _draw_what_if(self) -> None:
        state = self.state
        if state.is_tree:
            self._draw_tree_what_if()
            return
        self._what_if_mode(grid=False)
        self.what_if_note.setToolTip("")
        what_if = state.what_if()
        item = self.what_if_plot.getPlotItem()
        if what_if is None:
            self._what_if_curve.setData([], [])
            self._measured.setData(x=[], y=[])
            self._run_k_line.setVisible(False)
            self.what_if_note.setText("<i>The what-if curve appears after the first round with a draft.</i>")
            return
        self._what_if_curve.setData(list(what_if.ks), list(what_if.speedups))
        self._run_k_line.setVisible(True)
        self._run_k_line.setValue(state.draft_k)
        self._run_k_line.label.setFormat(f"this run: k = {state.draft_k}")
        top = max(*what_if.speedups, 1.0)
        if state.speedup is not None:
            self._measured.setData(x=[state.draft_k], y=[state.speedup])
            top = max(top, state.speedup)
        else:
            self._measured.setData(x=[], y=[])
        item.setXRange(-0.5, what_if.ks[-1] + 0.5, padding=0)
        item.setYRange(0, max(top * 1.15, 1.3), padding=0)
        plain = (f"the measured plain decoding, {what_if.plain_ms:.1f} ms per token" if what_if.plain_measured else
                 f"c<sub>verify</sub>(0) = {what_if.plain_ms:.1f} ms as one plain step (an estimate until the "
                 "measured plain speed comes at the end)")
        star = (f" · <span style='color:#B8860B'>★</span> measured: {state.speedup:.2f}×" if state.speedup is not None
                else "")
        self.what_if_note.setText(
            f"<i>Estimate, not measured</i>: E(k) = (1 − α<sup>k+1</sup>) / (1 − α) tokens per round "
            f"(Leviathan et al. 2023) with α = {what_if.alpha:.2f}, for k·c<sub>draft</sub> + c<sub>verify</sub>(k) "
            f"ms per round: c<sub>draft</sub> = {what_if.draft_ms:.2f} ms per drafted token, "
            f"c<sub>verify</sub>(k) = {what_if.verify_ms_0:.1f} + {what_if.verify_ms_per_draft:.1f}·k ms "
            f"(fitted to the rounds); against {plain}{star}.")

    def _draw_texts(self) -> None:
        state = self.state
        if not state.rounds and not state.emitted:
            status = "waiting for the first round…" if not state.ended else "ended before any round"
            drafter = f" · {html.escape(state.drafter)} drafts {state.draft_k}" if state.drafter else ""
            if state.drafter and state.is_tree:
                drafter += f" deep, {state.tree_shape}"
            self.header.setText(f"<b>Speculative decoding</b>{drafter} · {status}")
            self.figures.setText("")
            return
        if state.stop_reason:
            status = f"finished ({html.escape(state.stop_reason)})"
        elif state.ended_status:
            status = f"<b>{html.escape(state.ended_status)}</b>"
        else:
            status = "running…"
        mode = "sampled (rejection rule)" if state.do_sample else "greedy"
        shape = f"k = {state.draft_k} deep, {state.tree_shape}" if state.is_tree else f"k = {state.draft_k}"
        self.header.setText(
            f"<b>Speculative decoding</b> · drafter <b>{html.escape(state.drafter)}</b> "
            f"({html.escape(state.detail)}) · {shape} · {mode} verification · "
            f"{len(state.rounds)} rounds · {state.emitted} tokens · {status}")
        self.figures.setText(self._figures_html())

    def _figures_html(self) -> str:
        s = self.state
        rate = f"<b>{format_percent(s.acceptance_rate)}</b>" if s.acceptance_rate is not None else "—"
        alpha = f"{s.alpha:.2f}" if s.alpha is not None else "—"
        mean = f"<b>{s.mean_accepted:.2f}</b>" if s.mean_accepted is not None else "—"
        per_call = s.emitted / s.target_calls if s.target_calls else 0.0
        if s.is_tree:
            acceptance = (f"Acceptance: {rate} of {s.drafted} drafted nodes ({s.accepted} accepted, {s.rejected} off "
                          f"the path) · α = {alpha} per depth the target reached")
        else:
            acceptance = (f"Acceptance: {rate} of {s.drafted} drafts ({s.accepted} accepted, {s.rejected} rejected) · "
                          f"α = {alpha} of the drafts the target judged")
        rows = [
            acceptance,
            f"Mean accepted per round: {mean} drafts · {per_call:.2f} tokens per target call",
            f"Target calls saved: <b>{s.calls_saved}</b> = {s.plain_calls} plain ({s.emitted} tokens) − "
            f"{s.target_calls} speculative (one per round, the first reading the prompt too)",
        ]
        if s.speedup is not None and s.baseline_tokens_per_s:
            rows.append(f"Speed-up, measured: <b>{s.speedup:.2f}×</b> ({s.tokens_per_s:.1f} tokens/s vs "
                        f"{s.baseline_tokens_per_s:.1f} tokens/s decoding plainly on the same prompt)")
        elif s.ended:
            rows.append("Speed-up: not measured (the run skipped the plain baseline, or was stopped)")
        else:
            rows.append("Speed-up against plain decoding: <i>measured at the end</i> (a short plain run follows)")
        return "<br>".join(rows)

    # --- data -----------------------------------------------------------------------------------------------
    def export_data(self, path: Path) -> None:
        """Every drafted token and target token of the shown run, one row each."""
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(CSV_COLUMNS)
            for r in self.state.rounds:
                parents = r.parents or range(-1, len(r.drafted) - 1)
                for i, (d, parent, depth) in enumerate(zip(r.drafted, parents, r.depths(), strict=True)):
                    writer.writerow([r.round, i, d.token_id, d.text, ACCEPTED if d.accepted else REJECTED,
                                     repr(d.draft_prob), repr(d.target_prob),
                                     "" if d.draw is None else repr(d.draw), int(d.accepted), parent, depth, d.rank])
                if r.target_kind != "none":
                    writer.writerow([r.round, len(r.drafted), r.target_token_id, r.target_text,
                                     f"{TARGET} ({r.target_kind})", "", repr(r.target_prob), "", "",
                                     r.accepted - 1, r.accepted, ""])
