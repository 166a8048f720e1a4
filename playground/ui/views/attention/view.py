"""The attention view: what each new token looked at, recorded during the real decode (``--record-attention``).

A step selector (the generated token) and a head selector (each query head, or the mean over heads) choose the
layers × positions heatmap (``heatmap``); the position axis is the prompt and then the output, whose text is
shown underneath with the selected token highlighted and the clicked position outlined; clicking a position shows
its weight in every layer. The summary (``summary``) covers the whole run: sink share, attention against distance,
heavy hitters, and, for a cache that keeps less, the positions it evicted and its quality against the full cache.
"""

from __future__ import annotations

import html

from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from playground.events.attention import AttentionRow
from playground.state.attention import AttentionState
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.attention.heatmap import HeatmapPanel, LayerProfilePanel
from playground.ui.views.attention.summary import SummaryPanel
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import fill_with_scroll

TEXT_WINDOW = 400  # positions of text shown around the selected token (a 2,000-token prompt stays readable)


@register_view
class AttentionView(FoldView):
    name = "attention"
    title = "Attention"
    consumes = (AttentionRow,)
    live_draw_ms = 300
    idle_header = ("<b>Attention</b> — run the kv-cache strategy with “record attention” on: each new token's "
                   "attention over every earlier position, per layer and head, appears here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: AttentionState = AttentionState()
        self.header = rich_label(self)
        self.step_box = QSpinBox(self)
        self.step_box.setPrefix("token ")
        self.head_box = QComboBox(self)
        # As wide as its longest item ("mean over heads"), which the default width cut to "mean ov".
        self.head_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.heatmap = HeatmapPanel(self)
        self.profile = LayerProfilePanel(self)
        self.summary = SummaryPanel(self)
        self.text = rich_label(self)
        self.selected_step: int | None = None
        self.clicked: int | None = None
        controls = QHBoxLayout()
        for widget in (QLabel("Selected token:"), self.step_box, QLabel("Head:"), self.head_box):
            controls.addWidget(widget)
        controls.addStretch(1)
        grid = QGridLayout()
        grid.addWidget(self.heatmap, 0, 0, 1, 2)
        grid.addWidget(self.profile, 1, 0)
        grid.addWidget(self.summary, 1, 1)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 1)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addLayout(controls)
        layout.addLayout(grid, 1)
        layout.addWidget(self.text)
        fill_with_scroll(self, content)
        self.step_box.valueChanged.connect(self._step_chosen)
        self.head_box.currentIndexChanged.connect(lambda _: self._draw())
        self.heatmap.position_clicked.connect(self._position_clicked)
        self._start_drawing()

    def _forget(self) -> None:
        self.selected_step, self.clicked = None, None
        self._heads_listed = 0

    def _follow(self) -> None:
        heads = self.state.started.heads if self.state.started else 0
        if heads != self._heads_listed:
            self.head_box.blockSignals(True)
            self.head_box.clear()
            self.head_box.addItems(["mean over heads"] + [f"head {h + 1}" for h in range(heads)])
            self.head_box.blockSignals(False)
            self._heads_listed = heads
        self.step_box.blockSignals(True)
        self.step_box.setRange(0, max(0, self.state.steps - 1))
        if self.selected_step is None:  # following the newest token until the user picks one
            self.step_box.setValue(max(0, self.state.steps - 1))
        self.step_box.blockSignals(False)

    def _step_chosen(self, value: int) -> None:
        self.selected_step = value
        self._draw()

    def _position_clicked(self, position: int) -> None:
        self.clicked = position
        self._draw()

    def select(self, step: int, head: int | None = None, position: int | None = None) -> None:
        """Show ``step`` (and ``head``, None: the mean; ``position``: as if clicked): for tests and scripts."""
        self._follow()
        self.step_box.setValue(step)
        self.selected_step = step
        self.head_box.setCurrentIndex(0 if head is None else head + 1)
        self.clicked = position
        self._draw()

    def _head(self) -> int | None:
        index = self.head_box.currentIndex()
        return None if index <= 0 else index - 1

    def _draw(self) -> None:
        s = self.state
        if not s.steps:
            self.heatmap.image.clear()
            self.profile.draw(self.state.accumulated[:0], None, "")
            self.text.setText("")
            return
        step = min(self.step_box.value(), s.steps - 1)
        head = self._head()
        matrix = s.matrix(step, head)
        row = s.rows[step]
        evicted = [p for p, when in s.evicted.items() if when < step and p <= row.query_position]
        self.heatmap.draw(matrix, evicted, self.clicked)
        clicked = self.clicked if self.clicked is not None and self.clicked < matrix.shape[1] else None
        if clicked is None and matrix.size:  # until a click: the position the token attends to most, over layers
            clicked = int(matrix.sum(axis=0).argmax())
        text = s.texts[clicked] if clicked is not None and clicked < len(s.texts) else ""
        self.profile.draw(matrix[:, clicked] if clicked is not None else matrix[:, :0].sum(1), clicked, text)
        self.summary.draw(s)
        who = "mean over heads" if head is None else f"head {head + 1}"
        rest = s.rest(step, head).mean()
        start = s.started
        kept = "every position" if start is None or start.top == 0 else f"the top {start.top} positions per layer " \
                                                                          f"and head (the rest: {rest:.1%})"
        self.header.setText(f"<b>Attention</b> — token {step} (its query at position {row.query_position}), {who}; "
                            f"{len(row.positions)} layers; recorded: {kept}.")
        self.text.setText(self._text_html(row.query_position + 1, clicked))

    def _text_html(self, query_next: int, clicked: int | None) -> str:
        """The prompt and output up to the selected token: that token highlighted, the clicked position outlined,
        evicted positions grey and struck through."""
        s = self.state
        first = max(0, query_next - TEXT_WINDOW)
        parts = ["…" if first else ""]
        for p in range(first, min(query_next + 1, len(s.texts))):
            piece = html.escape(s.texts[p]).replace("\n", "⏎")
            style = ""
            if p == query_next:
                style = "background:#ffe066;color:#000"
            elif p == clicked:
                style = "border:1px solid #50a0ff;background:#d8e8ff;color:#000"
            elif p in s.evicted:
                style = "color:#999;text-decoration:line-through"
            parts.append(f'<span style="{style}">{piece}</span>' if style else piece)
        return "<b>Text</b> (the selected token highlighted): " + "".join(parts)
