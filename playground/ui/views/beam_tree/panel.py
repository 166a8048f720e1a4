"""The beam-search tree, growing live: one column per step, every examined candidate a node.

Surviving beams are drawn bold, pruned candidates faint, finished hypotheses as diamonds with their score; the run's
best sequence is emphasised when it ends. Hover a node for its numbers; wheel/drag to zoom and pan. A length-penalty
slider re-ranks the recorded finished hypotheses without regenerating (and says so), and a label shows what the
beams cost in KV cache. A diverse (group) beam search colours each beam group's edges, beams and labels (with a
legend), says in a node's tooltip what the diversity penalty took off it, and lists each group's hypotheses side by
side (the run itself returns the best across the groups).

Events are folded into a Qt-free ``BeamTree`` at once and drawn at most once per frame. Drawing costs what the new
nodes cost, not what the whole tree costs: nodes and edges live in one set of plot items per ``CHUNK_STEPS`` steps
(only the newest chunk is updated, and Qt skips chunks outside the view), pens and brushes are shared, labels are
appended to growing arrays, and only what changes at the end (the best path) is restyled.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QVBoxLayout, QWidget

from playground.events import Event, RunFinished, RunStarted
from playground.state import visible_token_text
from playground.state.beam_tree import FINISHED, PRUNED, ROOT, SURVIVING, BeamTree, RankedHypothesis, TreeNode
from playground.ui.style import CHOSEN_COLOR, format_percent, rich_label, shade_for_prob
from playground.ui.views.beam_tree.forced import ForcedMarks
from playground.ui.views.beam_tree.items import (
    BEST_COLOR,
    BEST_GROWTH,
    CHUNK_STEPS,
    FINISHED_COLOR,
    NODE_SIZE,
    NODE_SYMBOL,
    PRUNED_COLOR,
    PRUNED_LABEL_COLOR,
    RERANK_COLOR,
    SURVIVOR_EDGE,
    Z_BEST_NODES,
    Z_BEST_PATH,
    Z_LABELS,
    Z_RERANK_PATH,
    HoverTip,
    ProbabilityRamp,
    StepChunk,
    TokenLabels,
    group_color,
)
from playground.ui.views.drawing import set_ticks
from playground.ui.views.texts import short_middle

STEP_PX = 92  # the view shows as many steps as fit at this width (room for a label of ~10 characters)
MIN_VISIBLE_STEPS = 6
SLIDER_SCALE = 10  # slider units per 1.0 of length penalty
PENALTY_RANGE = (-5.0, 5.0)  # the controls' range (widened when a run used a penalty outside it)
REDRAW_MS = 30
RANKING_ROWS = 5
GROUP_ROWS = 4  # hypotheses listed per beam group
GROUP_TEXT_CHARS = 90


def format_mb(n_bytes: float) -> str:
    mb = n_bytes / 1e6
    return f"{mb:.3g} MB" if mb >= 0.01 else f"{mb:.2g} MB"


def sequence_text(text: str) -> str:
    """A whole sequence for one line: spaces stay spaces, line breaks and tabs become visible."""
    return text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "⟨CR⟩")


def chunk_of(step: int) -> int:
    """Which set of plot items holds a node of ``step`` (the prompt, step −1, goes with the first steps)."""
    return max(0, step) // CHUNK_STEPS




class BeamTreePanel(QWidget):
    """``apply(event)`` folds an event in (drawn on the next frame); ``end(status)`` closes a run that had no
    RunFinished; ``reset()`` empties the view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree = BeamTree()
        self._drawn = 0  # nodes already turned into plot items and labels
        self._follow = True  # the view follows the newest steps until the user zooms or pans
        self._rerank_penalty: float | None = None
        self.ranking: list[RankedHypothesis] = []

        self.header = rich_label(self)
        self.legend = rich_label(self)
        self.legend.setText(
            f"<b style='color:{CHOSEN_COLOR}'>●</b> surviving beam (fill: token probability, pale = likely) "
            f"&nbsp; <span style='color:{PRUNED_COLOR}'>●</span> pruned candidate &nbsp; "
            f"<span style='color:{FINISHED_COLOR}'>◆</span> finished hypothesis, with its score &nbsp; "
            f"<b style='color:{BEST_COLOR}'>━</b> best sequence &nbsp; "
            f"<span style='color:{RERANK_COLOR}'>┅</span> best after re-ranking &nbsp; "
            "<i>hover a node for details · wheel to zoom, drag to pan</i>")
        self.ramp = ProbabilityRamp(self)
        self.group_legend = rich_label(self)  # diverse beam search: which colour is which beam group
        self.groups_label = rich_label(self)  # diverse beam search: each group's hypotheses, side by side

        self.plot = pg.PlotWidget(self)
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.15)
        item.setLabel("bottom", "step (n-th generated token; the prompt is at −1)")
        item.setLabel("left", "candidates, by parent beam")
        set_ticks(item.getAxis("left"), [[]])
        item.getAxis("left").setStyle(showValues=False)
        self.view = item.getViewBox()
        self.view.sigRangeChangedManually.connect(self._stop_following)

        # Shared styles: a handful of pens and brushes (the scatter's symbol cache is keyed by these objects).
        self._beam_edge_pen = pg.mkPen(SURVIVOR_EDGE, width=2)
        self._pruned_edge_pen = pg.mkPen(PRUNED_COLOR, width=1)
        self._node_pen = pg.mkPen(CHOSEN_COLOR, width=1.5)
        self._no_pen = pg.mkPen(None)
        self._best_pen = pg.mkPen(BEST_COLOR, width=2.5)
        self._state_brush = {state: pg.mkBrush(color) for state, color in
                             ((FINISHED, FINISHED_COLOR), (ROOT, CHOSEN_COLOR), (PRUNED, PRUNED_COLOR))}
        self._shade_brush: dict[int, QBrush] = {}  # rgba -> brush
        self._label_colors = {SURVIVING: QColor(CHOSEN_COLOR), FINISHED: QColor(FINISHED_COLOR),
                              ROOT: QColor(CHOSEN_COLOR), PRUNED: QColor(PRUNED_LABEL_COLOR)}
        self._best_label_color = QColor(BEST_COLOR)
        self._group_edge_pens: dict[int, QPen] = {}  # shared by the chunks' group edge items
        self._group_node_pens: dict[int, QPen] = {}

        self._chunks: list[StepChunk] = []
        self._hover = HoverTip()
        self._rerank_path = pg.PlotCurveItem(pen=pg.mkPen(RERANK_COLOR, width=4, style=Qt.PenStyle.DashLine))
        self._best_path = pg.PlotCurveItem(pen=pg.mkPen(BEST_COLOR, width=4))
        self._best_nodes = pg.ScatterPlotItem(pxMode=True)  # the best path's nodes, emphasised on top
        self._labels = TokenLabels()
        self.forced = ForcedMarks(item, self)  # constrained beam search's marks and bank panel (forced words)
        for z, plot_item in ((Z_RERANK_PATH, self._rerank_path), (Z_BEST_PATH, self._best_path),
                             (Z_BEST_NODES, self._best_nodes), (Z_LABELS, self._labels)):
            plot_item.setZValue(z)
            item.addItem(plot_item)

        self.fit_button = QPushButton("Show whole tree", self)
        self.fit_button.clicked.connect(self.fit_all)
        self.penalty_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.penalty_slider.setSingleStep(1)
        self.penalty_slider.setPageStep(5)
        self.penalty_slider.setToolTip("Re-ranks the finished hypotheses recorded in this run; nothing is regenerated")
        self.penalty_slider.valueChanged.connect(self._slider_moved)
        self.slider_min_label = QLabel(self)
        self.slider_max_label = QLabel(self)
        self.penalty_label = rich_label(self)
        self.ranking_label = rich_label(self)
        self.kv_label = rich_label(self)  # wrapped: unwrapped, it made the window wider than a 1280 px screen

        legend_row = QHBoxLayout()
        legend_row.addWidget(self.legend, 1)
        legend_row.addWidget(QLabel("beam fill:", self))
        legend_row.addWidget(self.ramp)
        slider_row = QHBoxLayout()
        slider_row.addWidget(QLabel("Length penalty (re-rank):", self))
        slider_row.addWidget(self.slider_min_label)
        slider_row.addWidget(self.penalty_slider, 1)
        slider_row.addWidget(self.slider_max_label)
        slider_row.addWidget(self.fit_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addWidget(self.plot, 1)
        layout.addLayout(legend_row)
        layout.addWidget(self.forced.label)
        layout.addLayout(slider_row)
        layout.addWidget(self.group_legend)
        layout.addWidget(self.penalty_label)
        layout.addWidget(self.ranking_label)
        layout.addWidget(self.groups_label)
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
        self._ranking_key: tuple[float, int] | None = None  # (penalty, pool size) the ranking was made for
        self._label_penalty: float | None = None  # penalty the score labels show (None: not drawn yet)
        self._labelled_running = 0  # returned running beams whose labels show a score
        self._styled_best: list[int] = []
        self._shown_paths: dict[int, list[int]] = {}  # id(curve) -> node ids it shows
        for chunk in self._chunks:
            for plot_item in chunk.items():
                self.view.removeItem(plot_item)
        self._chunks = []
        self._hover.owner = None
        self.view.setToolTip("")
        for curve in (self._rerank_path, self._best_path):
            curve.setData([], [])
        self._best_nodes.setData(x=[], y=[])
        self._labels.clear()
        self.forced.reset()
        self.header.setText("<b>Beam search</b> — choose the beam strategy and generate: the tree grows here, "
                            "one column per step.")
        self.penalty_label.setText("")
        self.ranking_label.setText("")
        self.kv_label.setText("")
        self.group_legend.setText("")
        self.group_legend.hide()
        self.groups_label.setText("")
        self.groups_label.hide()
        self._set_slider(1.0)
        self.penalty_slider.setEnabled(False)  # re-ranking needs a finished run

    def apply(self, event: Event) -> None:
        """Fold an event into the tree; the drawing follows within a frame (``flush()`` draws now)."""
        if isinstance(event, RunStarted):
            self.reset()
        forced = self.forced.apply(event)
        if not self.tree.apply(event) and not forced:
            return
        if isinstance(event, RunStarted):
            self._set_slider(self.tree.length_penalty)
            self._show_group_legend()
        if isinstance(event, RunFinished):
            self._rerank_penalty = self.tree.length_penalty
            self.penalty_slider.setEnabled(True)
        if not self._timer.isActive():
            self._timer.start()

    def end(self, status: str) -> None:
        """The run ended without a RunFinished (``status``: "failed", "stopped", ...): say so in the header and
        allow re-ranking whatever finished hypotheses were recorded. A no-op once RunFinished was applied."""
        tree = self.tree
        if tree.stop_reason is not None:
            return
        tree.end(status)
        if tree.rerank_pool() and self._rerank_penalty is None:
            self._rerank_penalty = tree.length_penalty
            self._set_slider(tree.length_penalty)
            self.penalty_slider.setEnabled(True)
        self.flush()

    def flush(self) -> None:
        """Draw everything folded in so far, now."""
        self._timer.stop()
        tree = self.tree
        if not tree.nodes and not tree.ended:
            return
        self._append_new_nodes()
        self._restyle_best_path()
        self._update_ranking()
        self._update_pool_labels()
        self._set_path(self._best_path, tree.best_path)
        self._set_path(self._rerank_path, self._rerank_best_path())
        self._update_texts()
        self.forced.update_panel()
        self._update_view()

    # --- drawing ------------------------------------------------------------------------------------------
    def _append_new_nodes(self) -> None:
        """Turn the nodes folded in since the last flush into plot items and labels (work ∝ new nodes)."""
        tree = self.tree
        if not tree.columns:
            return  # the prompt's place is known once the first column is laid out
        nodes = tree.nodes
        new = nodes[self._drawn :]
        if not new:
            return
        start = 0
        while start < len(new):
            index = chunk_of(new[start].step)
            stop = start
            while stop < len(new) and chunk_of(new[stop].step) == index:
                stop += 1
            self._draw_in_chunk(self._chunk(index), new[start:stop])
            start = stop
        label_styles = [self._label_style(n) for n in new]
        self._labels.append([n.x for n in new], [n.y for n in new], [self._label_text(n) for n in new],
                            [s[0] for s in label_styles], [s[1] for s in label_styles],
                            [s[2] for s in label_styles])
        self.forced.add_nodes(new, nodes)
        self._drawn = len(nodes)

    def _chunk(self, index: int) -> StepChunk:
        while len(self._chunks) <= index:
            self._chunks.append(StepChunk(self.view, self._tip, self._hover, self._beam_edge_pen,
                                          self._pruned_edge_pen, self._group_edge_pens))
        return self._chunks[index]

    def _draw_in_chunk(self, chunk: StepChunk, new: list[TreeNode]) -> None:
        nodes = self.tree.nodes
        chunk.nodes.addPoints(x=[n.x for n in new], y=[n.y for n in new], size=[NODE_SIZE[n.state] for n in new],
                              symbol=[NODE_SYMBOL[n.state] for n in new], brush=[self._brush(n) for n in new],
                              pen=[self._pen(n) for n in new], data=np.array([n.id for n in new]))
        for node in new:
            if node.parent is not None:
                parent = nodes[node.parent]
                target = (chunk.pruned_xy if node.state == PRUNED else chunk.group_xy(node.group)
                          if self.tree.groups > 1 else chunk.beam_xy)
                target.extend((parent.x, parent.y, node.x, node.y))
        chunk.set_edges()

    def _brush(self, node: TreeNode) -> QBrush:
        if node.state != SURVIVING:
            return self._state_brush[node.state]
        color = shade_for_prob(node.prob)
        brush = self._shade_brush.get(color.rgba())
        if brush is None:
            brush = self._shade_brush[color.rgba()] = pg.mkBrush(color)
        return brush

    def _pen(self, node: TreeNode) -> QPen:
        if self.tree.groups > 1 and node.state in (SURVIVING, FINISHED):  # outlined in its beam group's colour
            pen = self._group_node_pens.get(node.group)
            if pen is None:
                pen = self._group_node_pens[node.group] = pg.mkPen(group_color(node.group), width=2)
            return pen
        return self._node_pen if node.state in (SURVIVING, ROOT) else self._no_pen

    def _label_style(self, node: TreeNode) -> tuple[int, QColor, bool]:
        """(tier, colour, bold) of a node's label off the best path."""
        if self.tree.groups > 1 and node.state == SURVIVING:
            return 1, QColor(group_color(node.group)), False
        return (2 if node.state == PRUNED else 1), self._label_colors[node.state], False

    def _label_text(self, node: TreeNode, penalty: float | None = None) -> str:
        if node.state == ROOT:
            return "prompt"
        text = visible_token_text(node.text)
        if node.state == FINISHED or node.finished_score is not None:  # in the re-ranking pool: show its score
            score = node.normalised_score(self.tree.length_penalty if penalty is None else penalty)
            return f"{score:.2f} {text}"
        return text

    def _restyle_best_path(self) -> None:
        """Emphasise the best path (once, when the run ends): its labels, and its nodes in an item on top."""
        tree = self.tree
        best = tree.best_path
        if best == self._styled_best or any(i >= self._drawn for i in best):
            return
        for i in self._styled_best:
            self._labels.restyle(i, *self._label_style(tree.nodes[i]))
        for i in best:
            self._labels.restyle(i, 0, self._best_label_color, True)
        path = [tree.nodes[i] for i in best]
        self._best_nodes.setData(x=[n.x for n in path], y=[n.y for n in path],
                                 size=[NODE_SIZE[n.state] + BEST_GROWTH for n in path],
                                 symbol=[NODE_SYMBOL[n.state] for n in path], brush=[self._brush(n) for n in path],
                                 pen=self._best_pen)
        self._styled_best = list(best)

    def _pool_size(self) -> int:
        return self.tree.count(FINISHED) + len(self.tree.returned_running)

    def _update_ranking(self) -> None:
        penalty = self._rerank_penalty
        if penalty is None:
            self.ranking, self._ranking_key = [], None
            return
        key = (penalty, self._pool_size())
        if key != self._ranking_key:
            self.ranking, self._ranking_key = self.tree.rerank(penalty), key

    def _update_pool_labels(self) -> None:
        """Score labels of the re-ranking pool at the slider's penalty.

        New finished hypotheses get theirs when appended; all of them change only when the penalty does, and the
        running beams a stopped run returned join the pool at the end.
        """
        tree = self.tree
        penalty = tree.length_penalty if self._rerank_penalty is None else self._rerank_penalty
        if penalty != self._label_penalty:
            changed = tree.rerank_pool()
        elif len(tree.returned_running) != self._labelled_running:
            changed = [tree.nodes[i] for i in tree.returned_running]
        else:
            return
        for node in changed:
            if node.id < self._drawn:
                self._labels.set_text(node.id, self._label_text(node, penalty))
        self._label_penalty, self._labelled_running = penalty, len(tree.returned_running)

    def _set_path(self, curve: pg.PlotCurveItem, path: list[int]) -> None:
        if self._shown_paths.get(id(curve)) == path:
            return
        self._shown_paths[id(curve)] = list(path)
        if len(path) < 2:
            curve.setData([], [])
            return
        nodes = self.tree.nodes
        curve.setData([nodes[i].x for i in path], [nodes[i].y for i in path])

    def _rerank_best_path(self) -> list[int]:
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
        if tree.stop_reason == "stopped":
            state = "stopped early: the best so far is shown"
        elif tree.stop_reason:
            state = f"stopped: {tree.stop_reason}"
        elif tree.ended_status:
            state = f"<b>{html.escape(tree.ended_status)}</b> — ended without returning its sequences"
        else:
            state = "running…"
        if not tree.nodes:
            self.header.setText(f"<b>Beam search</b> · {state} before its first step")
        else:
            beams = (f"{tree.width} beams in {tree.groups} groups (diversity penalty {tree.diversity_penalty:g})"
                     if tree.groups > 1 else f"{tree.width} beams")
            head = (f"<b>Beam search</b> · {beams} · {tree.steps} steps · {tree.count(FINISHED)} "
                    f"finished hypotheses · {state}")
            if tree.best_path:
                best = tree.nodes[tree.best_path[-1]]
                text = html.escape(short_middle(sequence_text(tree.path_text(best.id)), 90))
                score = best.normalised_score(tree.length_penalty)
                head += (f"<br>best sequence (<span style='color:{BEST_COLOR}'>━</span>): <code>{text}</code> "
                         f"· score {score:.3f} = log-prob {best.cum_logprob:.2f} / {best.length}"
                         f"<sup>{tree.length_penalty:g}</sup>")
            self.header.setText(head)
        self._update_kv_label()
        self._update_ranking_texts()
        self._update_group_texts()

    def _show_group_legend(self) -> None:
        tree = self.tree
        if tree.groups <= 1:
            return
        swatches = " &nbsp; ".join(f"<b style='color:{group_color(g)}'>━●</b> group {g + 1}"
                                   for g in range(tree.groups))
        self.group_legend.setText(
            f"<b>Diverse beam search</b>, {tree.groups} groups of {tree.width // tree.groups} beams: {swatches} "
            f"&nbsp; <i>each step decides the groups in order; a group's log-prob of a token loses "
            f"{tree.diversity_penalty:g} for every beam of an earlier group that chose it (hover a node)</i>")
        self.group_legend.show()

    def _update_group_texts(self) -> None:
        """Each beam group's hypotheses, side by side (the run returned the best across the groups)."""
        tree = self.tree
        if tree.groups <= 1 or not tree.rerank_pool():
            self.groups_label.setText("")
            self.groups_label.hide()
            return
        cells = []
        for g, hyps in enumerate(tree.group_hypotheses()):
            rows = [f"<b style='color:{group_color(g)}'>Group {g + 1}</b>"]
            for hyp in hyps[:GROUP_ROWS]:
                text = html.escape(short_middle(sequence_text(hyp.text), GROUP_TEXT_CHARS))
                run = f" · <b>returned #{hyp.run_rank}</b>" if hyp.run_rank else ""
                rows.append(f"<b>{hyp.score:.3f}</b> · {hyp.length} tokens{run}<br><code>{text}</code>")
            if len(hyps) > GROUP_ROWS:
                rows.append(f"<i>… {len(hyps) - GROUP_ROWS} more</i>")
            if not hyps:
                rows.append("<i>no hypothesis finished</i>")
            cells.append(f"<td width='{100 // tree.groups}%' valign='top'>{'<br>'.join(rows)}</td>")
        self.groups_label.setText(
            "Each group's hypotheses at the run's length penalty (the run returns the best across the groups):"
            f"<table width='100%' cellspacing='6'><tr>{''.join(cells)}</tr></table>")
        self.groups_label.show()

    def _update_kv_label(self) -> None:
        tree = self.tree
        if not tree.steps or not tree.width:
            self.kv_label.setText("")
            return
        per_beam = tree.kv_bytes_per_beam
        self.kv_label.setText(
            f"KV cache of the beams (measured after step {tree.steps - 1}): <b>{format_mb(tree.kv_cache_bytes)}</b> "
            f"for {tree.width} beams — a single sequence (greedy) would hold about {format_mb(per_beam)} "
            f"<i>(an estimate: the measured total ÷ {tree.width}, not measured)</i>")

    def _update_ranking_texts(self) -> None:
        tree = self.tree
        if self._rerank_penalty is None:
            if tree.ended:
                self.penalty_label.setText(f"<i>The run {html.escape(tree.ended_status or 'ended')} before any "
                                           "hypothesis finished: there is nothing to re-rank.</i>")
            else:
                self.penalty_label.setText(
                    "<i>The slider re-ranks the finished hypotheses once the run has ended (no regeneration).</i>")
            self.ranking_label.setText("")
            return
        penalty = self._rerank_penalty
        running = len(tree.returned_running)
        pool = f"the <b>{tree.count(FINISHED)}</b> finished hypotheses recorded in this run"
        if running:
            beams = "running beams" if running > 1 else "running beam"
            pool += (f" and the <b>{running}</b> {beams} the stopped run returned (scored as if "
                     f"{'they' if running > 1 else 'it'} ended there)")
        if abs(penalty - tree.length_penalty) >= 1e-9:
            note = (f"a what-if: the run used {tree.length_penalty:g}; a new run with {penalty:g} could keep other "
                    "beams alive")
        elif tree.stop_reason is not None:
            note = "the scores the run itself used"
        else:
            note = (f"the run's own penalty; the run {html.escape(tree.ended_status or 'ended')} before returning its "
                    "sequences, so this ranks what had finished by then")
        self.penalty_label.setText(
            f"Length penalty <b>{penalty:g}</b>: re-ranked {pool} from their log-probs and lengths — "
            f"<b>nothing was regenerated</b> ({note}). Score = sum of log-probs / length<sup>penalty</sup>.")
        rows = []
        for i, hyp in enumerate(self.ranking[:RANKING_ROWS], start=1):
            text = html.escape(short_middle(sequence_text(hyp.text), 80))
            run = f" · run's #{hyp.run_rank}" if hyp.run_rank else ""
            rows.append(f"#{i} &nbsp;<b>{hyp.score:.3f}</b> · {hyp.length} tokens{run} · <code>{text}</code>")
        self.ranking_label.setText("<br>".join(rows))

    # --- slider -------------------------------------------------------------------------------------------
    def _set_slider(self, penalty: float) -> None:
        """Show ``penalty`` on the slider, widening its range if a run used a penalty outside the usual one."""
        value = round(penalty * SLIDER_SCALE)
        low = min(round(PENALTY_RANGE[0] * SLIDER_SCALE), value)
        high = max(round(PENALTY_RANGE[1] * SLIDER_SCALE), value)
        self.penalty_slider.blockSignals(True)
        self.penalty_slider.setRange(low, high)
        self.penalty_slider.setValue(value)
        self.penalty_slider.blockSignals(False)
        self.slider_min_label.setText(f"{low / SLIDER_SCALE:g}".replace("-", "−"))
        self.slider_max_label.setText(f"{high / SLIDER_SCALE:g}")

    def _slider_moved(self, value: int) -> None:
        if self._rerank_penalty is None:
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

    def _group_count(self, node: TreeNode) -> int:
        nodes = self.tree.nodes
        return sum(1 for i in self.tree.columns[node.step] if nodes[i].group == node.group)

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
            f"step {node.step} · {state} · rank {node.rank} of "
            + (f"its group's {self._group_count(node)} candidates" if tree.groups > 1
               else f"{len(tree.columns[node.step])} candidates"),
            f"probability: {format_percent(node.prob)} ({source}, given its beam"
            + (", before the diversity penalty)" if tree.groups > 1 else ")"),
            f"cumulative log-prob: {node.cum_logprob:.3f}",
            f"length-normalised score: {node.normalised_score(penalty):.3f} "
            f"(= {node.cum_logprob:.3f} / {node.length}^{penalty:g})",
        ]
        if tree.groups > 1:
            chose = round(node.diversity_penalty / tree.diversity_penalty) if tree.diversity_penalty else 0
            lines.insert(2, f"beam group {node.group + 1} of {tree.groups} · diversity penalty paid: "
                            f"{node.diversity_penalty:.3f} (= {tree.diversity_penalty:g} × {chose} beams of earlier "
                            "groups that chose this token at this step; in the cumulative log-prob)")
        if node.state == FINISHED and node.finished_score is not None:
            lines.append(f"final score: {node.finished_score:.3f}"
                         + (f" · returned as #{node.returned_rank}" if node.returned_rank else ""))
        elif node.finished_score is not None:
            lines.append(f"the run was stopped: returned as #{node.returned_rank}, scored as if it ended here: "
                         f"{node.finished_score:.3f}")
        lines.extend(self.forced.tooltip_lines(node))
        if node.id in tree.best_path:
            lines.append("on the best sequence")
        lines.append(f"text: {short_middle(sequence_text(tree.path_text(node.id)), 80)}")
        return "\n".join(lines)
