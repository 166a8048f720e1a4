"""The speculative view's chart of the selected round: the drafter's q next to the target's p for each drafted token,
with the verdicts (and, for sampled runs, the uniform draws), then the target's own token; a tree run's round is
drawn as its tree instead (``tree.RoundTree``). The note under it says how the drafts were judged."""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.events.speculative import SpeculativeRound
from playground.state import visible_token_text
from playground.state.speculative import REJECTED, ROUNDS
from playground.ui.style import format_percent, rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.drawing import TextsInside, set_ticks, set_title, static_plot
from playground.ui.views.speculative.plots import PLOT_HEIGHT, TICK_CHARS, SpeculativeOwner
from playground.ui.views.speculative.text import (
    ACCEPTED_COLOR,
    DRAFT_Q_COLOR,
    GRAMMAR_COLOR,
    REJECTED_COLOR,
    TARGET_COLOR,
)
from playground.ui.views.speculative.tree import RoundTree
from playground.ui.views.texts import short_label

MAX_SLOTS = 17  # drafted tokens (k ≤ 16) + the target's own


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


def round_note(view: SpeculativeOwner, r: SpeculativeRound) -> list[str]:
    """The round's figures line, then how its drafts were judged."""
    state = view.state
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


class RoundChart(Panel):
    """The selected round, as bars (a chain) or as its tree; the note under it."""

    shows = frozenset({ROUNDS})

    def __init__(self, view: SpeculativeOwner, parent: QWidget) -> None:
        self.view = view
        self.plot = static_plot(parent, "Round", "", "probability", min_height=PLOT_HEIGHT)
        self.q_bars = pg.BarGraphItem(x=[], height=[], width=0.36, brush=DRAFT_Q_COLOR, pen=pg.mkPen(None))
        self.p_bars = pg.BarGraphItem(x=[], height=[], width=0.36, brush=TARGET_COLOR, pen=pg.mkPen(None))
        self.draws = pg.ScatterPlotItem(symbol="t1", size=13, brush="#000000", pen=pg.mkPen("#FFFFFF", width=1))
        for item in (self.q_bars, self.p_bars, self.draws):
            self.plot.addItem(item)
        self.verdicts: list[pg.TextItem] = []
        for _ in range(MAX_SLOTS):
            label = pg.TextItem("", anchor=(0.5, 1.0))
            label.setVisible(False)
            self.plot.addItem(label)
            self.verdicts.append(label)
        self._verdict_texts = TextsInside(self.plot.getPlotItem().getViewBox())
        self.tree = RoundTree(self.plot.getPlotItem())
        self.as_tree = False
        self.note = rich_label(parent)

    def draw(self) -> None:
        state, index = self.view.state, self.view.selected_round
        item = self.plot.getPlotItem()
        for label in self.verdicts:
            label.setVisible(False)
        if index is not None and index < len(state.rounds) and (state.is_tree or state.rounds[index].is_tree):
            self._draw_tree(index)
            return
        self._mode(tree=False)
        if index is None or index >= len(state.rounds):
            self.q_bars.setOpts(x=[], height=[])
            self.p_bars.setOpts(x=[], height=[])
            self.draws.setData(x=[], y=[])
            set_title(item, "Selected round: draft q next to target p (none yet)", size="10pt")
            set_ticks(item.getAxis("bottom"), [[]])
            self.note.setText("")
            return
        r = state.rounds[index]
        n = len(r.drafted)
        xs = np.arange(n, dtype=float)
        self.q_bars.setOpts(x=xs - 0.19, height=[d.draft_prob for d in r.drafted], width=0.36)
        p_heights = [d.target_prob for d in r.drafted]
        p_x = list(xs + 0.19)
        if r.target_kind != "none":
            p_heights.append(r.target_prob)
            p_x.append(n + 0.0)
        self.p_bars.setOpts(x=p_x, height=p_heights, width=0.36)
        draws = [(i - 0.19, d.draw * d.draft_prob) for i, d in enumerate(r.drafted) if d.draw is not None]
        self.draws.setData(x=[x for x, _ in draws], y=[y for _, y in draws])
        ticks = []
        compact = n > 6
        for i, d in enumerate(r.drafted):
            if i < r.accepted:
                symbol, color, word = "✓", ACCEPTED_COLOR, "accepted"
            elif d.grammar_rejected:  # the constraint forbade it: rejected before verification
                symbol, color, word = "✗", GRAMMAR_COLOR, "grammar"
            elif i == r.accepted:
                symbol, color, word = "✗", REJECTED_COLOR, "rejected"
            else:
                symbol, color, word = "✗", REJECTED_COLOR, "discarded"
            text = symbol if compact else f"{symbol} {word}"
            self._show_verdict(i, i, max(d.draft_prob, d.target_prob), text, color)
            ticks.append((float(i), short_label(visible_token_text(d.text), TICK_CHARS)))
        if r.target_kind != "none":
            word = "correction" if r.target_kind == "correction" else "bonus" if n else "target's own"
            self._show_verdict(n, n, r.target_prob, "★" if compact else f"★ {word}", TARGET_COLOR)
            ticks.append((float(n), short_label(visible_token_text(r.target_text), TICK_CHARS)))
        set_ticks(item.getAxis("bottom"), [ticks])
        slots = n + (r.target_kind != "none")
        item.setXRange(-0.6, max(slots, 3) - 0.4, padding=0)
        item.setYRange(0, 1.2, padding=0)
        if n:  # short: the note under the plot says how the drafts were judged
            set_title(item, f"Round {index}: {r.accepted} of {n} drafts accepted", size="10pt")
        else:
            set_title(item, f"Round {index}: nothing drafted, the target's own token", size="10pt")
        parts = round_note(self.view, r)
        short = self.view.short
        self.note.setText(parts[0] if short else "<br>".join(parts))
        self.note.setToolTip("<br>".join(parts[1:]) if short else "")

    def _mode(self, tree: bool) -> None:
        """The round plot shows a tree (nodes by depth and sibling order) or a chain's q and p bars."""
        if tree == self.as_tree:
            return
        self.as_tree = tree
        self.view.stretch_rounds()
        item = self.plot.getPlotItem()
        if tree:
            for bars in (self.q_bars, self.p_bars):
                bars.setOpts(x=[], height=[])
            self.draws.setData(x=[], y=[])
            item.hideAxis("left")
            item.getViewBox().invertY(True)
        else:
            self.tree.hide()
            self.plot.setToolTip("")
            item.setLabel("bottom", "")
            item.showAxis("left")
            item.getViewBox().invertY(False)

    def _draw_tree(self, index: int) -> None:
        """A tree round: its nodes by depth and sibling order, the accepted path on the top row."""
        self._mode(tree=True)
        r = self.view.state.rounds[index]
        item = self.plot.getPlotItem()
        short = self.view.short
        last, _height = self.tree.show(r)  # it sets the plot's range
        # A short dock: the axis's title goes (the tree needs the height), its first tick says what it counts.
        item.setLabel("bottom", "" if short else "depth in the tree (0: right after the context)")
        ticks = [(float(d), "depth 0" if d == 0 and short and last < 8 else str(d)) for d in range(last + 1)]
        set_ticks(item.getAxis("bottom"), [[(-1.0, "ctx"), *ticks]])
        n = len(r.drafted)
        rejected = sum(kind == REJECTED for kind in self.tree.kinds)
        if n:
            set_title(item, f"Round {index}: {r.accepted} of {n} nodes accepted, {rejected} turned down at the stop",
                          size="10pt")
        else:
            set_title(item, f"Round {index}: nothing drafted, the target's own token", size="10pt")
        parts = round_note(self.view, r)  # one line: the tree takes the height (how it was judged: the tooltip)
        self.note.setText(parts[0].replace("output steps", "steps").replace(" (one target pass)", ""))
        self.note.setToolTip("<br>".join(parts[1:]))
        self.plot.setToolTip(tree_table(r))

    def _show_verdict(self, slot: int, x: float, top: float, text: str, color: str) -> None:
        label = self.verdicts[slot]
        label.setText(text, color=color)
        label.setVisible(True)
        self._verdict_texts.place(label, x, top + 0.02)
