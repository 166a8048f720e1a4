"""The speculative view's tree parts: a tree round drawn as its tree, and the tree what-if as a depth × width heat map.

- ``RoundTree``: the selected round's drafted tree in the round plot: nodes placed by depth (x) and sibling order (y,
  the accepted path on the top row, then the drafter's ranks), edges parent → child, each node a label with its
  token's text: the accepted path in the accepted colour, the children of the path's last node that the target turned
  down in the rejected colour, the nodes never reached faint grey, the target's own token after the path in the
  target's colour. A node's tooltip gives its q and p.
- ``TreeGrid``: the what-if plot for tree runs, a heat map of the estimated speed-up over the cut trees (depth kept ×
  width kept), each cell's mean tokens per round and speed-up written in it, this run's cell outlined.

Both build their items once (a pool of labels, grown to the largest round or grid seen) and update them in place.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFont, QFontMetricsF

from playground.events.speculative import SpeculativeRound
from playground.state import visible_token_text
from playground.state.speculative import ACCEPTED, GRAMMAR, REJECTED, TARGET, TreeWhatIf, rejected_nodes
from playground.ui.style import format_percent
from playground.ui.views.speculative.text import KIND_COLORS, TINTS
from playground.ui.views.texts import short_label

UNREACHED = "unreached"  # a node the verification never reached (below a rejected node, or a sibling of the path)
NODE_COLORS = {**KIND_COLORS, UNREACHED: "#AAAAAA"}
NODE_FILLS = {**TINTS, UNREACHED: "#FFFFFF"}
EDGE_COLOR = "#BBBBBB"
MAX_TREE_SLOTS = 64 + 1  # the node budget's most drafted tokens, and the target's own
MAX_LABEL_PT, MIN_LABEL_PT = 9, 7
DOT_PITCH = 0.4  # a crowded tree: the height of a row that holds only nodes never reached (dots), in rows
# The heat map's colours: light red below plain decoding's speed, white at 1×, light teal above (black text reads on
# all of them).
SLOWER_RGB, EVEN_RGB, FASTER_RGB = (244, 165, 130), (255, 255, 255), (128, 205, 193)


def node_kinds(r: SpeculativeRound) -> list[str]:
    """Each drafted token's kind: on the accepted path, rejected where the path stopped, or never reached."""
    rejected = set(rejected_nodes(r))
    # Sampled: a sibling tried and rejected before the one accepted was judged too.
    judged = {i for i, d in enumerate(r.drafted) if d.draw is not None}
    return [ACCEPTED if i < r.accepted else GRAMMAR if r.drafted[i].grammar_rejected else
            REJECTED if i in rejected or i in judged else UNREACHED for i in range(len(r.drafted))]


def tree_layout(r: SpeculativeRound) -> tuple[list[int], int | None, int]:
    """Rows (0 = top) of each drafted token, of the target's own token (None when it has none), and how many rows.
    Each depth is a column: the accepted path on the top row (and the target's token right after it), then the other
    nodes grouped by their parent's row and ordered by the drafter's rank, none above its parent (a branch runs
    below the line it leaves), as compact as that allows."""
    n = len(r.drafted)
    parents = r.parents or tuple(range(-1, n - 1))
    depths = r.depths()
    rows = [0] * n
    by_depth: dict[int, list[int]] = {}
    for i in range(n):  # parents come before their children
        by_depth.setdefault(depths[i], []).append(i)
    has_target = r.target_kind != "none"
    count = 1
    for depth in sorted(by_depth):
        taken = 1 if has_target and depth == r.accepted else 0  # the target's token holds the top row there
        order = sorted(by_depth[depth], key=lambda i: (i >= r.accepted, rows[parents[i]] if parents[i] >= 0 else 0,
                                                      r.drafted[i].rank))
        for i in order:
            rows[i] = max(taken, rows[parents[i]] if parents[i] >= 0 else 0)
            taken = rows[i] + 1
        count = max(count, taken)
    return rows, (0 if has_target else None), count


def node_tooltip(r: SpeculativeRound, i: int, kind: str, depth: int) -> str:
    d = r.drafted[i]
    rejected = "rejected: its draw was not below min(1, p′/q)" if d.draw is not None else \
        "rejected: the target's choice differed here"
    verdict = {ACCEPTED: "accepted: on the path", REJECTED: rejected,
               GRAMMAR: "rejected by the grammar before verification: the constraint forbids it here",
               UNREACHED: "not reached: its parent was not accepted, or the path went another way"}[kind]
    draw = f" · draw u {d.draw:.3f}" if d.draw is not None else ""
    if d.draw is not None and d.accept_prob is not None:
        draw += f" vs min(1, p′/q) {d.accept_prob:.3f}"
    return (f"<code>{html.escape(visible_token_text(d.text))}</code> · depth {depth} · the drafter's choice "
            f"#{d.rank + 1} here<br>{verdict}<br>drafter's q {html.escape(format_percent(d.draft_prob))} · "
            f"target's p {html.escape(format_percent(d.target_prob))}{draw}")


class RoundTree:
    """The items that draw a tree round in a plot (hidden while the plot shows a chain's bars)."""

    def __init__(self, plot: pg.PlotItem) -> None:
        self._plot = plot
        box = plot.getViewBox()
        self.edges = pg.PlotDataItem([], [], connect="pairs", pen=pg.mkPen(EDGE_COLOR, width=1))
        self.path_edges = pg.PlotDataItem([], [], connect="pairs", pen=pg.mkPen(KIND_COLORS[ACCEPTED], width=2.5))
        for item in (self.edges, self.path_edges):
            item.setZValue(-1)
            plot.addItem(item)
        self.context = self._label()
        self.nodes: list[pg.TextItem] = []  # a pool of node labels; the first ``shown`` are this round's
        self.kinds: list[str] = []  # the shown nodes' kinds: the drafted tokens', then TARGET
        self.shown = 0
        self._font_pt = MAX_LABEL_PT
        self.crowded = False  # more rows than labels fit: the nodes never reached are dots (their text: tooltips)
        self._round: SpeculativeRound | None = None
        self._placed: list[tuple[pg.TextItem, float]] = []  # (label, its depth), for the range
        box.sigResized.connect(self._refit)

    def _label(self) -> pg.TextItem:
        label = pg.TextItem("", anchor=(0.5, 0.5))
        label.textItem.document().setDocumentMargin(1)
        label.setVisible(False)
        self._plot.addItem(label)
        return label

    def hide(self) -> None:
        self._round = None
        self.edges.setData([], [])
        self.path_edges.setData([], [])
        self.context.setVisible(False)
        for label in self.nodes[: self.shown]:
            label.setVisible(False)
        self.shown = 0
        self.kinds = []

    def _plan(self, r: SpeculativeRound) -> tuple[int, bool, list[float], float]:
        """The labels' size (pt), whether the tree is crowded, each row's y and the rows' whole height. Rows that
        do not fit the plot's height at the smallest size: the rows holding only nodes never reached shrink to dots'
        height (the accepted path, the turned-down alternatives and the target's token keep their labels)."""
        n = len(r.drafted)
        rows, _target, count = tree_layout(r)
        kinds = node_kinds(r)
        pt, fits = self._fitting_font(count)
        labelled = {0} | {rows[i] for i in range(n) if kinds[i] != UNREACHED}
        pitch = [1.0 if fits or j in labelled else DOT_PITCH for j in range(count)]
        ys = [sum(pitch[:j]) for j in range(count)]
        height = ys[-1] + 1.0  # the last row's y, and room under it for its labels (the range ends 0.4 short)
        if not fits:
            pt = self._fitting_font(height)[0]
        return pt, not fits, ys, height

    def show(self, r: SpeculativeRound) -> tuple[int, float]:
        """Draw round ``r``'s tree; returns the x range's last depth and the rows' height (for the plot range)."""
        self.hide()
        self._round = r
        self._placed = []
        n = len(r.drafted)
        depths = r.depths()
        parents = r.parents or tuple(range(-1, n - 1))
        row_of, target_row, _count = tree_layout(r)
        self._font_pt, self.crowded, ys, height = self._plan(r)
        rows = [ys[j] for j in row_of]
        kinds = node_kinds(r)
        shown = min(n + (target_row is not None), MAX_TREE_SLOTS)
        while len(self.nodes) < shown:
            self.nodes.append(self._label())
        columns = max([*depths, r.accepted if target_row is not None else 0, 0]) + 2  # and the context's
        limit = 9 if columns <= 8 else 5
        edges: list[list[float]] = [[], []]
        path: list[list[float]] = [[], []]
        for i in range(min(n, shown)):
            parent = parents[i]
            x0, y0 = (depths[parent], rows[parent]) if parent >= 0 else (-1, 0)
            into = path if kinds[i] == ACCEPTED else edges
            into[0] += [x0, depths[i]]
            into[1] += [y0, rows[i]]
            self._set(self.nodes[i], visible_token_text(r.drafted[i].text), kinds[i], depths[i], rows[i], limit)
            self.nodes[i].setToolTip(node_tooltip(r, i, kinds[i], depths[i]))
        self.kinds = kinds[:shown]
        if target_row is not None and n < MAX_TREE_SLOTS:
            x0, y0 = (r.accepted - 1, rows[r.accepted - 1]) if r.accepted else (-1, 0)
            path[0] += [x0, r.accepted]
            path[1] += [y0, target_row]
            label = self.nodes[n]
            self._set(label, visible_token_text(r.target_text), TARGET, r.accepted, target_row, limit)
            kind = "correction" if r.target_kind == "correction" else "bonus"
            label.setToolTip(f"<code>{html.escape(visible_token_text(r.target_text))}</code> · the target's own "
                             f"token ({kind}) · p {html.escape(format_percent(r.target_prob))}")
            self.kinds.append(TARGET)
        self.shown = shown
        self.edges.setData(*edges)
        self.path_edges.setData(*path)
        self.context.setHtml(f"<span style='color:#555555; font-size:{self._font_pt}pt'><i>context</i></span>")
        self.context.fill = pg.mkBrush("#FFFFFF")  # over the edges that leave it
        self.context.setVisible(True)
        self.context.setPos(-1, 0)
        self._set_range(columns - 2, height, [label for label, x in self._placed if x == columns - 2])
        return columns - 2, height

    def _set_range(self, last: int, height: float, rightmost: list[pg.TextItem]) -> None:
        """The plot's range: the context's column to the last depth, with room at either side for the half of the
        widest label there (the labels keep their size in pixels however the plot is scaled), and every row."""
        box = self._plot.getViewBox()
        pad = 4.0  # px
        left = self.context.textItem.boundingRect().width() / 2 + pad
        right = max((label.textItem.boundingRect().width() for label in rightmost), default=0.0) / 2 + pad
        span = max(last, 2) + 1  # the context's column (−1) to the last depth's
        width = box.width() if box.width() > 0 else 400.0
        per_depth = (width - left - right) / span
        if per_depth < 20:  # too narrow to make room: a fixed margin
            low, high = -1.6, max(last, 2) + 0.6
        else:
            low, high = -1 - left / per_depth, max(last, 2) + (right / per_depth if last >= 2 else 0.6)
        self._plot.setXRange(low, high, padding=0)
        self._plot.setYRange(-0.6, max(height, 3) - 0.4, padding=0)

    def _set(self, label: pg.TextItem, text: str, kind: str, x: float, row: float, limit: int) -> None:
        words = html.escape(short_label(text, limit)) or "∅"
        if self.crowded and kind == UNREACHED:
            words = "•"
        if kind in (REJECTED, GRAMMAR):
            words = f"<s>{words}</s>"
        if kind == TARGET:
            words = f"<b>{words}</b>"
        label.setHtml(f"<span style='color:{NODE_COLORS[kind]}; font-size:{self._font_pt}pt'>{words}</span>")
        dot = self.crowded and kind == UNREACHED  # a dot alone: no box around it
        label.fill = pg.mkBrush(None if dot else NODE_FILLS[kind])
        label.border = pg.mkPen(None if dot else NODE_COLORS[kind], width=1.5 if kind in (ACCEPTED, TARGET) else 1)
        label.setVisible(True)
        label.update()
        label.setPos(x, row)
        self._placed.append((label, x))

    def label_texts(self) -> list[str]:
        """The shown nodes' texts, as drawn (the drafted tokens', then the target's)."""
        return [label.textItem.toPlainText() for label in self.nodes[: self.shown]]

    def _fitting_font(self, rows: float) -> tuple[int, bool]:
        """The largest label size (pt) whose line fits a row of the plot's current height, and whether one does."""
        box = self._plot.getViewBox()
        height = box.height() if box.height() > 0 else 200.0
        per_row = height / (max(rows, 3) + 0.2)
        for pt in range(MAX_LABEL_PT, MIN_LABEL_PT - 1, -1):
            font = QFont()
            font.setPointSize(pt)
            if QFontMetricsF(font).height() + 4 <= per_row:  # and its box
                return pt, True
        return MIN_LABEL_PT, False

    def _refit(self, *_args) -> None:
        if self._round is not None:  # the labels keep their size in pixels: the margins and rows change
            self.show(self._round)


def speedup_rgb(value: float, low: float, high: float) -> tuple[int, int, int]:
    """The heat map's colour of a speed-up: white at 1×, towards light red at ``low``, light teal at ``high``."""
    if value >= 1.0:
        t, far = (min((value - 1.0) / (high - 1.0), 1.0) if high > 1.0 else 0.0), FASTER_RGB
    else:
        t, far = (min((1.0 - value) / (1.0 - low), 1.0) if low < 1.0 else 0.0), SLOWER_RGB
    return tuple(round(e + (f - e) * t) for e, f in zip(EVEN_RGB, far, strict=True))  # type: ignore[return-value]


class TreeGrid:
    """The tree what-if's heat map in a plot (hidden while the plot shows a chain run's curve)."""

    def __init__(self, plot: pg.PlotItem) -> None:
        self._plot = plot
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setZValue(-2)
        plot.addItem(self.image)
        self.outline = pg.PlotDataItem([], [], pen=pg.mkPen("#222222", width=2.5))
        plot.addItem(self.outline)
        self.cells: dict[tuple[int, int], pg.TextItem] = {}  # (depth, width) -> its label, a pool kept
        self.shown: set[tuple[int, int]] = set()
        self._what_if: TreeWhatIf | None = None
        self._fit = (MAX_LABEL_PT, "line")  # the cells' font (pt) and form (``cell_text``)
        plot.getViewBox().sigResized.connect(self._refit)

    def hide(self) -> None:
        self._what_if = None
        self.image.clear()
        self.image.setVisible(False)
        self.outline.setData([], [])
        for key in self.shown:
            self.cells[key].setVisible(False)
        self.shown = set()

    def show(self, what_if: TreeWhatIf) -> None:
        self._what_if = what_if
        depths, widths = len(what_if.depths), len(what_if.widths)
        flat = [s for row in what_if.speedups for s in row]
        low, high = min(flat), max(flat)
        rgb = np.zeros((widths, depths, 3), dtype=np.uint8)  # row-major: [width − 1, depth − 1]
        for d in range(depths):
            for w in range(widths):
                rgb[w, d] = speedup_rgb(what_if.speedups[d][w], low, high)
        self.image.setImage(rgb, autoLevels=False, levels=(0, 255))
        self.image.setRect(QRectF(0.5, 0.5, depths, widths))
        self.image.setVisible(True)
        self._fit = pt, form = self._fitting_font(depths, widths)
        shown = set()
        for d in what_if.depths:
            for w in what_if.widths:
                label = self.cells.get((d, w))
                if label is None:
                    label = self.cells[(d, w)] = pg.TextItem("", anchor=(0.5, 0.5))
                    label.textItem.document().setDocumentMargin(1)
                    self._plot.addItem(label)
                words = cell_text(what_if, d, w, form).replace("\n", "<br>")
                label.setHtml(f"<div style='text-align:center; color:#222222; font-size:{pt}pt'>{words}</div>")
                label.setVisible(True)
                label.setPos(d, w)
                shown.add((d, w))
        for key in self.shown - shown:
            self.cells[key].setVisible(False)
        self.shown = shown
        x, y = depths + 0.5, widths + 0.5  # this run: the tree as drafted, the grid's last cell
        self.outline.setData([x - 1, x, x, x - 1, x - 1], [y - 1, y - 1, y, y, y - 1])

    def cell_texts(self) -> dict[tuple[int, int], str]:
        """(depth, width) -> the text drawn in that cell."""
        return {key: self.cells[key].textItem.toPlainText() for key in sorted(self.shown)}

    def _fitting_font(self, depths: int, widths: int) -> tuple[int, str]:
        """The cells' font (pt) and form: both numbers on one line with their unit where that fits at 8 pt or more,
        else on two lines, else on one line bare, at the largest size that fits (the smallest, two lines, if none
        does)."""
        box = self._plot.getViewBox()
        cell_w = (box.width() if box.width() > 0 else 300.0) / (depths + 0.2) - 4
        cell_h = (box.height() if box.height() > 0 else 120.0) / (widths + 0.2) - 2
        sizes = range(MAX_LABEL_PT, MIN_LABEL_PT - 1, -1)

        def fits(pt: int, sample: str, lines: int) -> bool:
            font = QFont()
            font.setPointSize(pt)
            metrics = QFontMetricsF(font)
            return metrics.horizontalAdvance(sample) <= cell_w and lines * metrics.height() <= cell_h

        for pt, form in [*((pt, "line") for pt in sizes if pt >= 8), *((pt, "lines") for pt in sizes),
                         *((pt, "bare") for pt in sizes)]:
            sample = {"line": "00.00 tokens · 00.00×", "lines": "00.00×", "bare": "00.00 · 00.00×"}[form]
            if fits(pt, sample, 2 if form == "lines" else 1):
                return pt, form
        return MIN_LABEL_PT, "lines"

    def _refit(self, *_args) -> None:
        what_if = self._what_if
        if what_if is not None and self._fitting_font(len(what_if.depths), len(what_if.widths)) != self._fit:
            self.show(what_if)


def cell_text(what_if: TreeWhatIf, depth: int, width: int, form: str = "lines") -> str:
    """A cell's two numbers, mean tokens per round and the estimated speed-up: on one line with the unit ("line"),
    on two lines ("lines") or on one line bare ("bare")."""
    tokens, speedup = what_if.tokens[depth - 1][width - 1], what_if.speedups[depth - 1][width - 1]
    return {"line": f"{tokens:.2f} tokens · {speedup:.2f}×", "lines": f"{tokens:.2f}\n{speedup:.2f}×",
            "bare": f"{tokens:.2f} · {speedup:.2f}×"}[form]
