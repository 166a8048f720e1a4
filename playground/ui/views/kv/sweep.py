"""The KV view's batch sweep: throughput and per-step latency against the batch size (``KVSweep``)."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from playground.state.kv import KVState
from playground.ui.views.drawing import set_ticks, static_plot
from playground.ui.views.kv.panel import STEP_MS_COLOR, THROUGHPUT_COLOR, Panel, format_mb, line


class SweepPanel(Panel):
    """Tokens per second (left axis) and ms per step (right axis) over the batch sizes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, "Batching: throughput, step time", "sequences in the batch (log)",
                           "tokens/s", min_height=200)
        item = plot.getPlotItem()
        item.setLogMode(x=True, y=False)
        item.showGrid(y=True, alpha=0.2)
        left = item.getAxis("left")
        left.setPen(THROUGHPUT_COLOR)
        left.setTextPen(THROUGHPUT_COLOR)
        self.throughput_curve = line(THROUGHPUT_COLOR, 2, symbol="o", symbolSize=7, symbolBrush=THROUGHPUT_COLOR,
                                     symbolPen=None)
        item.addItem(self.throughput_curve)
        self._step_box = pg.ViewBox()  # a second y axis on the right: ms per step
        item.showAxis("right")
        item.scene().addItem(self._step_box)
        right = item.getAxis("right")
        right.linkToView(self._step_box)
        right.setLabel("ms per step", color=STEP_MS_COLOR)
        right.setPen(STEP_MS_COLOR)
        right.setTextPen(STEP_MS_COLOR)
        self._step_box.setXLink(item)
        self._step_box.setMouseEnabled(x=False, y=False)
        self.step_ms_curve = line(STEP_MS_COLOR, 2, Qt.PenStyle.DashLine, symbol="s", symbolSize=7,
                                  symbolBrush=STEP_MS_COLOR, symbolPen=None)
        self.step_ms_curve.setLogMode(True, False)  # its box is not the plot's: give it the plot's x mapping
        self._step_box.addItem(self.step_ms_curve)
        super().__init__(plot, parent)
        item.getViewBox().sigResized.connect(self._align_step_box)

    def _align_step_box(self) -> None:
        self._step_box.setGeometry(self.plot.getPlotItem().getViewBox().sceneBoundingRect())

    def draw(self, s: KVState) -> None:
        sweep = s.sweep
        if sweep is None or not sweep.batch_sizes:
            self.throughput_curve.setData([], [])
            self.step_ms_curve.setData([], [])
            when = ("is measured after the run when “batch sweep” lists batch sizes" if not s.ended
                    else "was not run (set “batch sweep”, e.g. 1,2,4,8,16)")
            self.show_note(f"<b>Batching</b><br>A sweep over batch sizes {when}: N copies of the prompt decoded "
                           "together share each read of the weights.")
            return
        sizes = np.asarray(sweep.batch_sizes, dtype=float)
        self.throughput_curve.setData(sizes, np.asarray(sweep.tokens_per_s, dtype=float))
        self.step_ms_curve.setData(sizes, np.asarray(sweep.ms_per_step, dtype=float))
        item = self.plot.getPlotItem()
        set_ticks(item.getAxis("bottom"), [[(math.log10(n), str(n)) for n in sweep.batch_sizes if n > 0]])
        positive = sizes[sizes > 0]
        if positive.size:
            item.setXRange(math.log10(positive.min()), math.log10(positive.max()), padding=0.08)
        item.setYRange(0, max(sweep.tokens_per_s, default=1.0) * 1.1, padding=0)
        self._step_box.setYRange(0, max(sweep.ms_per_step, default=1.0) * 1.1, padding=0)
        self._align_step_box()
        first, last = 0, len(sweep.batch_sizes) - 1
        speed = sweep.tokens_per_s[last] / sweep.tokens_per_s[first] if sweep.tokens_per_s[first] > 0 else 0.0
        slower = sweep.ms_per_step[last] / sweep.ms_per_step[first] if sweep.ms_per_step[first] > 0 else 0.0
        cache = f"; its cache {format_mb(sweep.kv_bytes[last])}" if len(sweep.kv_bytes) > last else ""
        self.show_plot(
            f"<span style='color:{THROUGHPUT_COLOR}'>━ tokens/s</span> &nbsp; "
            f"<span style='color:{STEP_MS_COLOR}'>╌ ms per step</span><br>Batch {sweep.batch_sizes[last]}: "
            f"<b>{sweep.tokens_per_s[last]:,.0f} tokens/s</b> (×{speed:.1f} batch {sweep.batch_sizes[first]}) at "
            f"{sweep.ms_per_step[last]:.1f} ms per step (×{slower:.1f}){cache}.")
