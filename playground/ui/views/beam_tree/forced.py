"""The beam tree's forced-words layer (constrained beam search): marks on the nodes, tooltip lines, and a panel
with the constraints, the legend and the banks the search kept at each step.

A node that completes a forced word gets a gold star, one that advances a word a gold ring, and a candidate that
a forced word *proposed* (a token that advances it, added beside the top-K continuations) a gold cross; on a pruned
candidate the mark is small and faded. The panel's
table counts the surviving beams of each bank (progress through the words, best first) at the latest steps: how
the search keeps beams at every stage of the words while it places them. Marks are appended with the nodes (work
proportional to the new ones); the panel is one label set once per redraw.
"""

from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QWidget

from playground.events import Event
from playground.events.beam_forced import BankedCandidate
from playground.state.beam_forced import ForcedProgress
from playground.state.beam_tree import PRUNED, ROOT, TreeNode
from playground.ui.style import rich_label

MARK_COLOR = "#DDAA33"  # Tol vibrant-adjacent gold: forced words (not used by the tree's other states)
Z_MARKS = 5.5  # above the nodes and the best path's nodes, below the labels
TABLE_STEPS = 14  # steps the bank table shows (the latest)


def _mark(node: TreeNode, mine: BankedCandidate, parent: BankedCandidate | None, prompt_met: int) -> str | None:
    """Which mark a node gets: "star" (completes a word), "o" (advances one), "+" (proposed only), or none."""
    before_met = len(parent.met) if parent is not None else prompt_met
    before_matched = parent.matched if parent is not None and parent.current == mine.current else 0
    if len(mine.met) > before_met:
        return "star"
    if mine.current >= 0 and mine.matched > before_matched:
        return "o"
    return "+" if mine.proposed else None


class ForcedMarks:
    """Folds the forced-words events beside the tree and draws their marks into ``plot_item``."""

    def __init__(self, plot_item: pg.PlotItem, parent: QWidget) -> None:
        self.progress = ForcedProgress()
        self.marks = pg.ScatterPlotItem(pxMode=True)
        self.marks.setZValue(Z_MARKS)
        plot_item.addItem(self.marks)
        self._pens = {"star": pg.mkPen("#7a5a00", width=1), "o": pg.mkPen(MARK_COLOR, width=2.5),
                      "+": pg.mkPen(MARK_COLOR, width=2)}
        self._brushes = {"star": pg.mkBrush(MARK_COLOR), "o": pg.mkBrush(None), "+": pg.mkBrush(MARK_COLOR)}
        self._sizes = {"star": 15, "o": 17, "+": 9}
        faded = QColor(MARK_COLOR)
        faded.setAlpha(120)
        # A pruned candidate's mark: smaller and faded (a word proposed it, or it would have placed one, but the
        # search kept better ones).
        self._pruned_pens = {"star": pg.mkPen(None), "o": pg.mkPen(faded, width=1.5), "+": pg.mkPen(faded, width=1.5)}
        self._pruned_brushes = {"star": pg.mkBrush(faded), "o": pg.mkBrush(None), "+": pg.mkBrush(faded)}
        self.label = rich_label(parent)
        self.label.setVisible(False)
        self.counts = {"star": 0, "o": 0, "+": 0}

    def reset(self) -> None:
        self.progress.reset()
        self.marks.setData(x=[], y=[])
        self.counts = {"star": 0, "o": 0, "+": 0}
        self.label.setText("")
        self.label.setVisible(False)

    def apply(self, event: Event) -> bool:
        return self.progress.apply(event)

    def add_nodes(self, new: list[TreeNode], nodes: list[TreeNode]) -> None:
        """Mark the nodes just drawn (their parents were drawn before them)."""
        progress = self.progress
        if not progress.active:
            return
        xs, ys, symbols, pens, brushes, sizes = [], [], [], [], [], []
        for node in new:
            if node.state == ROOT:
                continue
            mine = progress.candidate(node.step, node.rank)
            if mine is None or not mine.sorted:  # only what the search weighed (the top-K's rest is noise)
                continue
            parent_node = nodes[node.parent] if node.parent is not None else None
            parent = None if parent_node is None or parent_node.state == ROOT else \
                progress.candidate(parent_node.step, parent_node.rank)
            mark = _mark(node, mine, parent, len(progress.prompt_met))
            if mark is None:
                continue
            self.counts[mark] += 1
            xs.append(node.x)
            ys.append(node.y)
            symbols.append(mark)
            pruned = node.state == PRUNED
            pens.append((self._pruned_pens if pruned else self._pens)[mark])
            brushes.append((self._pruned_brushes if pruned else self._brushes)[mark])
            sizes.append(round(self._sizes[mark] * (0.6 if pruned else 1.0)))
        if xs:
            self.marks.addPoints(x=xs, y=ys, symbol=symbols, pen=pens, brush=brushes, size=sizes)

    def tooltip_lines(self, node: TreeNode) -> list[str]:
        mine = self.progress.candidate(node.step, node.rank) if node.state != ROOT else None
        return self.progress.describe(mine) if mine is not None else []

    def update_panel(self) -> None:
        """The constraints, the legend, the bank table and what the returned sequences met."""
        progress = self.progress
        if not progress.active:
            self.label.setVisible(False)
            return
        gold = f"style='color:{MARK_COLOR}'"
        words = " &nbsp; ".join(
            f"<b>#{i + 1}</b> <code>{html.escape(repr(w.text))}</code>"
            + (f" (any one of {len(w.alternatives)})" if w.disjunctive else "")
            + (" <i>(in the prompt)</i>" if i in progress.prompt_met else "")
            for i, w in enumerate(progress.constraints))
        legend = (f"<b {gold}>★</b> completes a forced word &nbsp; <b {gold}>◯</b> advances one &nbsp; "
                  f"<b {gold}>✚</b> proposed by a forced word (beside the top-K) &nbsp; (small, faded: pruned) "
                  "&nbsp; "
                  f"<i>bank = progress: {progress.bank_unit} per word met + tokens of the one under way</i>")
        lines = [f"<b>Forced words</b> {words}", legend, self._table()]
        if progress.returned_met:
            met = " · ".join(f"#{k + 1}: {len(m)}/{len(progress.constraints)}"
                             for k, m in enumerate(progress.returned_met))
            note = (" — too few hypotheses met every word, so the run filled in with ones that did not "
                    "(as transformers does)") if progress.filled_in else ""
            lines.append(f"Returned sequences, forced words met: {met}{note}")
        self.label.setText("<br>".join(line for line in lines if line))
        self.label.setVisible(True)

    def _table(self) -> str:
        """Surviving beams per bank (rows, best bank first) at the latest steps (columns)."""
        progress = self.progress
        steps = len(progress.survivor_banks)
        if not steps:
            return ""
        first = max(0, steps - TABLE_STEPS)
        head = "".join(f"<td align='right'>&nbsp;{s}</td>" for s in range(first, steps))
        rows = [f"<tr><td><i>beams per bank, at step</i></td>{head}</tr>"]
        counts = [progress.bank_counts(s) for s in range(first, steps)]
        for b in range(progress.top_bank, -1, -1):
            if not any(b in c for c in counts):
                continue
            name = "all met" if b == progress.top_bank else f"bank {b}"
            cells = "".join(f"<td align='right'>&nbsp;{c.get(b, '·')}</td>" for c in counts)
            rows.append(f"<tr><td>{name}</td>{cells}</tr>")
        return f"<table cellspacing='0' cellpadding='0'>{''.join(rows)}</table>"
