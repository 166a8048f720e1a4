"""The beam-search tree, growing live: one column per step, every examined candidate a node.

Surviving beams are drawn bold, pruned candidates faint, finished hypotheses as diamonds with their score; the run's
best sequence is emphasised when it ends. Hover a node for its numbers; wheel/drag to zoom and pan. A length-penalty
slider re-ranks the recorded finished hypotheses without regenerating (and says so), and a label shows what the
beams cost in KV cache.

Plot items are built once and updated with ``setData``; events are folded into a Qt-free ``BeamTree`` at once and
drawn at most once per frame.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QVBoxLayout, QWidget

from playground.beam_tree import FINISHED, PRUNED, ROOT, SURVIVING, BeamTree, RankedHypothesis, TreeNode
from playground.events import Event, RunFinished, RunStarted
from playground.state import visible_token_text
from playground.ui.style import CHOSEN_COLOR, format_percent, shade_for_prob

BEST_COLOR = "#CC3311"  # the run's best sequence (Tol vibrant red)
RERANK_COLOR = "#33BBEE"  # best hypothesis under the slider's what-if penalty (Tol vibrant cyan)
FINISHED_COLOR = "#009988"  # finished hypotheses (Tol vibrant teal)
PRUNED_COLOR = "#BBBBBB"
SURVIVOR_EDGE = "#555555"

STEP_PX = 92  # the view shows as many steps as fit at this width (room for a label of ~10 characters)
MIN_VISIBLE_STEPS = 6
SLIDER_SCALE = 10  # slider units per 1.0 of length penalty
REDRAW_MS = 30
RANKING_ROWS = 5

NODE_SIZE = {ROOT: 12, SURVIVING: 10, PRUNED: 6, FINISHED: 12}
NODE_SYMBOL = {ROOT: "s", SURVIVING: "o", PRUNED: "o", FINISHED: "d"}


def format_mb(n_bytes: float) -> str:
    mb = n_bytes / 1e6
    return f"{mb:.3g} MB" if mb >= 0.01 else f"{mb:.2g} MB"


def sequence_text(text: str) -> str:
    """A whole sequence for one line: spaces stay spaces, line breaks and tabs become visible."""
    return text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


def _short(text: str, limit: int = 60) -> str:
    """Start and end of a long text (hypotheses often share a long start and differ at the end)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " … " + text[-(limit - head - 3) :]


class TokenLabels(pg.GraphicsObject):
    """All node labels in one item, drawn at a fixed pixel size next to their nodes.

    Level of detail: labels are elided to the space before the next column, and when rows get too close only the
    beams' (then only the best path's) labels are drawn.
    """

    def __init__(self) -> None:
        super().__init__()
        self._x = np.empty(0)
        self._y = np.empty(0)
        self._texts: list[str] = []
        self._tiers = np.empty(0, dtype=int)  # 0 = best path, 1 = beams and finished, 2 = pruned
        self._colors: list[QColor] = []
        self._bold = np.empty(0, dtype=bool)
        self._bounds = QRectF()
        self.font = QFont("DejaVu Sans Mono", 9)
        self.bold_font = QFont(self.font)
        self.bold_font.setBold(True)
        self._metrics = QFontMetrics(self.font)

    def setData(self, x: np.ndarray, y: np.ndarray, texts: list[str], tiers: np.ndarray, colors: list[QColor],
                bold: np.ndarray) -> None:
        self.prepareGeometryChange()
        self._x, self._y, self._texts, self._tiers, self._colors, self._bold = x, y, texts, tiers, colors, bold
        if len(x):
            # One column and one row of margin: the labels sit to the right of their nodes.
            self._bounds = QRectF(float(x.min()), float(y.min()) - 1, float(x.max() - x.min()) + 2,
                                  float(y.max() - y.min()) + 2)
        else:
            self._bounds = QRectF()
        self.update()

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter: QPainter, option, widget=None) -> None:
        if not len(self._x):
            return
        transform = painter.transform()
        px_x = abs(transform.m11()) or 1.0  # pixels per step
        px_y = abs(transform.m22()) or 1.0  # pixels per row
        room = px_x - 16  # pixels between a node and the next column
        if room < 14:
            return
        max_tier = 2 if px_y >= 17 else 1 if px_y >= 8 else 0
        view = self.getViewBox()
        visible = view.viewRect() if view is not None else self._bounds
        mask = ((self._tiers <= max_tier) & (self._x >= visible.left() - 1) & (self._x <= visible.right())
                & (self._y >= visible.top() - 1) & (self._y <= visible.bottom() + 1))
        painter.save()
        painter.resetTransform()
        half = self._metrics.ascent() / 2 - 1
        height = self._metrics.height()
        backdrop = QColor(255, 255, 255, 210)  # keeps labels readable over the edges
        for i in np.flatnonzero(mask):
            point = transform.map(QPointF(float(self._x[i]), float(self._y[i])))
            font = self.bold_font if self._bold[i] else self.font
            metrics = QFontMetrics(font)
            text = metrics.elidedText(self._texts[i], Qt.TextElideMode.ElideRight, int(room))
            left = point.x() + 8
            painter.fillRect(QRectF(left - 1, point.y() - height / 2, metrics.horizontalAdvance(text) + 2, height),
                             backdrop)
            painter.setFont(font)
            painter.setPen(QPen(self._colors[i]))
            painter.drawText(QPointF(left, point.y() + half), text)
        painter.restore()


class BeamTreePanel(QWidget):
    """``apply(event)`` folds an event in (drawn on the next frame); ``reset()`` empties the view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree = BeamTree()
        self._drawn = 0  # nodes already converted to plot arrays
        self._follow = True  # the view follows the newest steps until the user zooms or pans
        self._rerank_penalty: float | None = None
        self.ranking: list[RankedHypothesis] = []

        self.header = QLabel(self)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setWordWrap(True)
        self.legend = QLabel(self)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        self.legend.setText(
            f"<b style='color:{CHOSEN_COLOR}'>●</b> surviving beam (fill: token probability, pale = likely) "
            f"&nbsp; <span style='color:{PRUNED_COLOR}'>●</span> pruned candidate &nbsp; "
            f"<span style='color:{FINISHED_COLOR}'>◆</span> finished hypothesis, with its score &nbsp; "
            f"<b style='color:{BEST_COLOR}'>━</b> best sequence &nbsp; "
            f"<span style='color:{RERANK_COLOR}'>┅</span> best after re-ranking &nbsp; "
            "<i>hover a node for details · wheel to zoom, drag to pan</i>")

        self.plot = pg.PlotWidget(self)
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.15)
        item.setLabel("bottom", "step (n-th generated token; the prompt is at −1)")
        item.setLabel("left", "candidates, grouped under their parent beam")
        item.getAxis("left").setTicks([[]])
        item.getAxis("left").setStyle(showValues=False)
        self.view = item.getViewBox()
        self.view.sigRangeChangedManually.connect(self._stop_following)

        self._pruned_edges = pg.PlotCurveItem(pen=pg.mkPen(PRUNED_COLOR, width=1), connect="pairs")
        self._beam_edges = pg.PlotCurveItem(pen=pg.mkPen(SURVIVOR_EDGE, width=2), connect="pairs")
        self._rerank_path = pg.PlotCurveItem(pen=pg.mkPen(RERANK_COLOR, width=4, style=Qt.PenStyle.DashLine))
        self._best_path = pg.PlotCurveItem(pen=pg.mkPen(BEST_COLOR, width=4))
        self._nodes = pg.ScatterPlotItem(pxMode=True, hoverable=True, tip=self._tip)
        self._labels = TokenLabels()
        for z, plot_item in enumerate((self._pruned_edges, self._beam_edges, self._rerank_path, self._best_path,
                                       self._nodes, self._labels)):
            plot_item.setZValue(z)
            item.addItem(plot_item)

        self.fit_button = QPushButton("Show whole tree", self)
        self.fit_button.clicked.connect(self.fit_all)
        self.penalty_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.penalty_slider.setRange(-2 * SLIDER_SCALE, 4 * SLIDER_SCALE)
        self.penalty_slider.setSingleStep(1)
        self.penalty_slider.setPageStep(5)
        self.penalty_slider.setToolTip("Re-ranks the finished hypotheses recorded in this run; nothing is regenerated")
        self.penalty_slider.valueChanged.connect(self._slider_moved)
        self.penalty_label = QLabel(self)
        self.penalty_label.setWordWrap(True)
        self.penalty_label.setTextFormat(Qt.TextFormat.RichText)
        self.ranking_label = QLabel(self)
        self.ranking_label.setTextFormat(Qt.TextFormat.RichText)
        self.ranking_label.setWordWrap(True)
        self.kv_label = QLabel(self)
        self.kv_label.setTextFormat(Qt.TextFormat.RichText)

        slider_row = QHBoxLayout()
        slider_row.addWidget(QLabel("Length penalty (re-rank):", self))
        slider_row.addWidget(self.penalty_slider, 1)
        slider_row.addWidget(self.fit_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        layout.addLayout(slider_row)
        layout.addWidget(self.penalty_label)
        layout.addWidget(self.ranking_label)
        layout.addWidget(self.kv_label)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self.flush)
        self.reset()

    # --- events -------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self._timer.stop()
        self.tree.reset()
        self._drawn = 0
        self._follow = True
        self._rerank_penalty = None
        self.ranking = []
        self._x: list[float] = []
        self._y: list[float] = []
        self._spots_brush: list = []
        self._spots_pen: list = []
        self._sizes: list[float] = []
        self._symbols: list[str] = []
        self._texts: list[str] = []
        self._tiers: list[int] = []
        self._colors: list[QColor] = []
        self._beam_edge_xy: list[float] = []
        self._pruned_edge_xy: list[float] = []
        for curve in (self._pruned_edges, self._beam_edges, self._rerank_path, self._best_path):
            curve.setData([], [])
        self._nodes.setData([])
        self._labels.setData(np.empty(0), np.empty(0), [], np.empty(0, dtype=int), [], np.empty(0, dtype=bool))
        self.header.setText("<b>Beam search</b> — choose the beam strategy and generate: the tree grows here, "
                            "one column per step.")
        self.penalty_label.setText("")
        self.ranking_label.setText("")
        self.kv_label.setText("")
        self._set_slider(1.0)
        self.penalty_slider.setEnabled(False)  # re-ranking needs a finished run

    def apply(self, event: Event) -> None:
        """Fold an event into the tree; the drawing follows within a frame (``flush()`` draws now)."""
        if isinstance(event, RunStarted):
            self.reset()
        if not self.tree.apply(event):
            return
        if isinstance(event, RunStarted):
            self._set_slider(self.tree.length_penalty)
        if isinstance(event, RunFinished):
            self._rerank_penalty = self.tree.length_penalty
            self.penalty_slider.setEnabled(True)
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Draw everything folded in so far, now."""
        self._timer.stop()
        self._append_new_nodes()
        self._redraw()

    # --- drawing ------------------------------------------------------------------------------------------
    def _append_new_nodes(self) -> None:
        nodes = self.tree.nodes
        for node in nodes[self._drawn :]:
            self._x.append(node.x)
            self._y.append(node.y)
            self._sizes.append(NODE_SIZE[node.state])
            self._symbols.append(NODE_SYMBOL[node.state])
            self._spots_brush.append(self._brush(node))
            self._spots_pen.append(self._pen(node))
            self._texts.append(self._label_text(node))
            self._tiers.append(2 if node.state == PRUNED else 1)
            self._colors.append(QColor(self._label_color(node)))
            if node.parent is not None:
                parent = nodes[node.parent]
                target = self._pruned_edge_xy if node.state == PRUNED else self._beam_edge_xy
                target.extend((parent.x, parent.y, node.x, node.y))
        self._drawn = len(nodes)

    @staticmethod
    def _brush(node: TreeNode):
        if node.state == SURVIVING:
            return pg.mkBrush(shade_for_prob(node.prob))
        if node.state == FINISHED:
            return pg.mkBrush(FINISHED_COLOR)
        if node.state == ROOT:
            return pg.mkBrush(CHOSEN_COLOR)
        return pg.mkBrush(PRUNED_COLOR)

    @staticmethod
    def _pen(node: TreeNode):
        if node.state in (SURVIVING, ROOT):
            return pg.mkPen(CHOSEN_COLOR, width=1.5)
        return pg.mkPen(None)

    def _label_text(self, node: TreeNode, penalty: float | None = None) -> str:
        if node.state == ROOT:
            return "prompt"
        text = visible_token_text(node.text)
        if node.state == FINISHED:
            score = node.normalised_score(self.tree.length_penalty if penalty is None else penalty)
            return f"{score:.2f} {text}"
        return text

    @staticmethod
    def _label_color(node: TreeNode) -> str:
        return {SURVIVING: CHOSEN_COLOR, FINISHED: FINISHED_COLOR, ROOT: CHOSEN_COLOR}.get(node.state, "#999999")

    def _redraw(self) -> None:
        tree = self.tree
        n = len(self._x)
        if n == 0:
            return
        best = set(tree.best_path)
        sizes = np.array(self._sizes, dtype=float)
        pens = list(self._spots_pen)
        tiers = np.array(self._tiers, dtype=int)
        colors = list(self._colors)
        bold = np.zeros(n, dtype=bool)
        if best:
            best_pen = pg.mkPen(BEST_COLOR, width=2.5)
            best_color = QColor(BEST_COLOR)
            for i in best:
                sizes[i] += 3
                pens[i] = best_pen
                tiers[i] = 0
                colors[i] = best_color
                bold[i] = True
        texts = list(self._texts)
        if self._rerank_penalty is not None:
            for node in tree.finished_nodes():
                texts[node.id] = self._label_text(node, self._rerank_penalty)
        self._nodes.setData(x=np.array(self._x), y=np.array(self._y), size=sizes, symbol=self._symbols,
                            brush=self._spots_brush, pen=pens, data=np.arange(n))
        for curve, xy in ((self._beam_edges, self._beam_edge_xy), (self._pruned_edges, self._pruned_edge_xy)):
            pairs = np.array(xy, dtype=float).reshape(-1, 2)
            curve.setData(pairs[:, 0], pairs[:, 1], connect="pairs")
        self._set_path(self._best_path, tree.best_path)
        self._set_path(self._rerank_path, self._rerank_best_path())
        self._labels.setData(np.array(self._x), np.array(self._y), texts, tiers, colors, bold)
        self._update_texts()
        self._update_view()

    def _set_path(self, curve: pg.PlotCurveItem, path: list[int]) -> None:
        if len(path) < 2:
            curve.setData([], [])
            return
        nodes = self.tree.nodes
        curve.setData([nodes[i].x for i in path], [nodes[i].y for i in path])

    def _rerank_best_path(self) -> list[int]:
        self.ranking = self.tree.rerank(self._rerank_penalty) if self._rerank_penalty is not None else []
        if not self.ranking or self.ranking[0].run_rank == 1:
            return []  # same as the run's best: nothing extra to show
        return self.tree.path(self.ranking[0].node_id)

    def _update_view(self) -> None:
        """While streaming, follow the newest steps; at the end, show the window that holds the best path's end.

        The window is as many steps as fit at a readable width; "Show whole tree" (or the wheel) zooms out.
        """
        if not self._follow:
            return
        tree = self.tree
        visible = max(MIN_VISIBLE_STEPS, int(self.view.width() / STEP_PX)) if self.view.width() > 0 else 14
        last = tree.steps - 1
        if tree.best_path and tree.stop_reason is not None:
            last = max(tree.nodes[tree.best_path[-1]].step, min(last, visible - 2))
        first = max(-1, last - visible + 1)
        ys = [tree.nodes[i].y for column in tree.columns[max(0, first) : last + 1] for i in column]
        self.view.setRange(xRange=(first - 0.3, first + visible - 0.1),
                           yRange=(min(ys, default=0) - 0.8, max(ys, default=0) + 0.8), padding=0)

    def _stop_following(self, *_args) -> None:
        self._follow = False

    def fit_all(self) -> None:
        """Show the whole tree (zoom out to every step)."""
        self._follow = False
        self.view.autoRange(padding=0.02)

    # --- texts --------------------------------------------------------------------------------------------
    def _update_texts(self) -> None:
        tree = self.tree
        finished = tree.count(FINISHED)
        state = f"stopped: {tree.stop_reason}" if tree.stop_reason else "running…"
        head = (f"<b>Beam search</b> · {tree.width} beams · {tree.steps} steps · {finished} finished "
                f"hypotheses · {state}")
        if tree.best_path:
            best = tree.nodes[tree.best_path[-1]]
            text = html.escape(_short(sequence_text(tree.path_text(best.id)), 90))
            score = best.normalised_score(tree.length_penalty)
            head += (f"<br>best sequence (<span style='color:{BEST_COLOR}'>━</span>): <code>{text}</code> "
                     f"· score {score:.3f} = log-prob {best.cum_logprob:.2f} / {best.length}"
                     f"<sup>{tree.length_penalty:g}</sup>")
        self.header.setText(head)
        self._update_kv_label()
        self._update_ranking_texts()

    def _update_kv_label(self) -> None:
        tree = self.tree
        if not tree.steps or not tree.width:
            self.kv_label.setText("")
            return
        per_beam = tree.kv_bytes_per_beam
        self.kv_label.setText(
            f"KV cache of the beams (measured after step {tree.steps - 1}): {tree.width} beams × "
            f"{format_mb(per_beam)} = <b>{format_mb(tree.kv_cache_bytes)}</b> — a single sequence (greedy) would "
            f"hold {format_mb(per_beam)}")

    def _update_ranking_texts(self) -> None:
        tree = self.tree
        if self._rerank_penalty is None:
            self.penalty_label.setText(
                "<i>The slider re-ranks the finished hypotheses once the run has ended (no regeneration).</i>")
            self.ranking_label.setText("")
            return
        n = tree.count(FINISHED)
        penalty = self._rerank_penalty
        same = abs(penalty - tree.length_penalty) < 1e-9
        note = ("the scores the run itself used" if same else
                f"a what-if: the run used {tree.length_penalty:g}; a new run with {penalty:g} could keep other "
                "beams alive")
        self.penalty_label.setText(
            f"Length penalty <b>{penalty:g}</b>: re-ranked the <b>{n}</b> finished hypotheses recorded in this run "
            f"from their log-probs and lengths — <b>nothing was regenerated</b> ({note}). "
            f"Score = sum of log-probs / length<sup>penalty</sup>.")
        rows = []
        for i, hyp in enumerate(self.ranking[:RANKING_ROWS], start=1):
            text = html.escape(_short(sequence_text(self.tree.path_text(hyp.node_id)), 80))
            run = f" · run's #{hyp.run_rank}" if hyp.run_rank else ""
            rows.append(f"#{i} &nbsp;<b>{hyp.score:.3f}</b> · {hyp.length} tokens{run} · <code>{text}</code>")
        self.ranking_label.setText("<br>".join(rows))

    # --- slider -------------------------------------------------------------------------------------------
    def _set_slider(self, penalty: float) -> None:
        self.penalty_slider.blockSignals(True)
        self.penalty_slider.setValue(round(penalty * SLIDER_SCALE))
        self.penalty_slider.blockSignals(False)

    def _slider_moved(self, value: int) -> None:
        if self.tree.stop_reason is None:
            return  # while running, the tree still changes; re-ranking starts at the end
        self.set_rerank_penalty(value / SLIDER_SCALE)

    def set_rerank_penalty(self, penalty: float) -> None:
        """Re-rank the recorded finished hypotheses with ``penalty`` and redraw (no regeneration)."""
        self._rerank_penalty = penalty
        self._set_slider(penalty)
        self.flush()

    # --- hover --------------------------------------------------------------------------------------------
    def _tip(self, x: float, y: float, data) -> str:
        return self.tooltip_for(int(data))

    def tooltip_for(self, node_id: int) -> str:
        tree = self.tree
        node = tree.nodes[node_id]
        if node.state == ROOT:
            return f"the prompt ({tree.prompt_tokens} tokens): every beam starts here"
        penalty = tree.length_penalty
        source = "after the repetition penalties" if tree.processed else "the model's"
        state = {SURVIVING: "surviving beam", PRUNED: "pruned candidate", FINISHED: "finished hypothesis"}[node.state]
        lines = [
            f"token: '{visible_token_text(node.text)}' (id {node.token_id})",
            f"step {node.step} · {state} · rank {node.rank} of {len(tree.columns[node.step])} candidates",
            f"probability: {format_percent(node.prob)} ({source}, given its beam)",
            f"cumulative log-prob: {node.cum_logprob:.3f}",
            f"length-normalised score: {node.normalised_score(penalty):.3f} "
            f"(= {node.cum_logprob:.3f} / {node.length}^{penalty:g})",
        ]
        if node.state == FINISHED and node.finished_score is not None:
            lines.append(f"final score: {node.finished_score:.3f}"
                         + (f" · returned as #{node.returned_rank}" if node.returned_rank else ""))
        if node.id in tree.best_path:
            lines.append("on the best sequence")
        lines.append(f"text: {_short(sequence_text(tree.path_text(node.id)), 80)}")
        return "\n".join(lines)
