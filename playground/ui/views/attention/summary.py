"""The attention view's summary over the run: the sink's share, attention against distance, the heavy hitters."""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QVBoxLayout, QWidget

from playground.state.attention import DISTANCE_EDGES, SINK_POSITIONS, AttentionState
from playground.ui.style import rich_label
from playground.ui.views.drawing import set_ticks, static_plot


def _bucket_label(low: int, high: int) -> str:
    return str(low) if high == low + 1 else (f"{low}+" if high >= 1 << 30 else f"{low}–{high - 1}")


class SummaryPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = static_plot(self, "Attention vs distance (%, run mean)", "query − key distance",
                                "%", min_height=160)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=(230, 140, 60))
        self.plot.getPlotItem().addItem(self.bars)
        self.plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        self.text = rich_label(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot)
        layout.addWidget(self.text)

    def draw(self, s: AttentionState) -> None:
        profile = s.distance_profile()
        used = int(np.nonzero(profile)[0].max()) + 1 if profile.any() else 0
        x = np.arange(used)
        self.bars.setOpts(x=x, height=100 * profile[:used])
        axis = self.plot.getPlotItem().getAxis("bottom")
        set_ticks(axis, [[(float(i), _bucket_label(DISTANCE_EDGES[i], DISTANCE_EDGES[i + 1])) for i in range(used)]])
        if used:
            self.plot.getPlotItem().setXRange(-0.6, used - 0.4, padding=0)
        heavy = ", ".join(f"{p} {html.escape(repr(s.texts[p]) if p < len(s.texts) else '')} ({w:.2f})"
                          for p, w in s.heavy_hitters(6))
        lines = [f"<b>Sink</b>: the first {SINK_POSITIONS} positions receive {s.sink_share():.1%} of all attention "
                 f"(mean over {s.steps} steps, every layer and head).",
                 f"<b>Heavy hitters</b> (attention summed over the run, mean over layers and heads): {heavy or '—'}"]
        if s.evicted:
            lines.append(f"<b>Evicted</b>: {len(s.evicted)} positions no layer holds any more (grey under the map).")
        if s.quality is not None:
            q = s.quality
            first = "never" if q.first_divergence < 0 else f"at token {q.first_divergence}"
            lines.append(f"<b>Against the full cache</b>: mean KL {q.mean_kl:.4f} nats, top-1 agreement "
                         f"{q.agreement:.0%} (teacher-forced); greedy output diverges {first}.")
        self.text.setText("<br>".join(lines))
