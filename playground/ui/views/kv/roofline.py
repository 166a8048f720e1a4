"""The KV view's roofline: prefill and decode against the machine's measured compute ceiling and memory bandwidth."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.state.kv import KVState
from playground.ui.views.drawing import TextsInside, static_plot
from playground.ui.views.kv.panel import (
    DECODE_COLOR,
    GIGA,
    PREFILL_COLOR,
    ROOF_COLOR,
    Panel,
    line,
    log10,
    points,
    set_log_range,
    unbroken,
)


class RooflinePanel(Panel):
    """Prefill and decode under the roof."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, "Roofline: prefill and decode here", "FLOP per byte moved (log)",
                           "GFLOP/s (log)", min_height=200)
        item = plot.getPlotItem()
        item.setLogMode(x=True, y=True)
        item.showGrid(x=True, y=True, alpha=0.15)
        self.roof_curve = line(ROOF_COLOR, 2)
        self.compute_label = pg.TextItem("", color=ROOF_COLOR, anchor=(1.0, 1.0))
        # Along the slope (it rotates with the axes' direction (1, 1), whatever the plot's aspect).
        self.bandwidth_label = pg.TextItem("", color=ROOF_COLOR, anchor=(0.0, 1.0), rotateAxis=(1, 1))
        self.prefill_point = points(PREFILL_COLOR, "o")
        self.decode_point = points(DECODE_COLOR, "s")
        # One line each, centred under its point (their figures are in the caption): prefill sits higher and further
        # right than decode, under the roof, so the two do not meet and neither crosses the roof.
        self.prefill_label = pg.TextItem("", color=PREFILL_COLOR, anchor=(0.5, -0.15))
        self.decode_label = pg.TextItem("", color=DECODE_COLOR, anchor=(0.5, -0.15))
        for graphic in (self.roof_curve, self.compute_label, self.bandwidth_label, self.prefill_point,
                        self.decode_point, self.prefill_label, self.decode_label):
            item.addItem(graphic)
        self._texts = TextsInside(item.getViewBox())  # the labels stay whole whatever the plot's size
        super().__init__(plot, parent)

    def draw(self, s: KVState) -> None:
        started, phases = s.started, s.phases
        if not phases:
            for point in (self.prefill_point, self.decode_point, self.roof_curve):
                point.setData([], [])
            for label in (self.prefill_label, self.decode_label, self.compute_label, self.bandwidth_label):
                label.setText("")
            self.show_note("<b>Roofline</b><br>Prefill and decode are placed against this machine's measured "
                           "compute and memory limits once each phase has ended.")
            return
        xs, figures = [], []
        for phase, point, label in (("prefill", self.prefill_point, self.prefill_label),
                                    ("decode", self.decode_point, self.decode_label)):
            event = phases.get(phase)
            if event is None or event.bytes_moved <= 0 or event.achieved_flops <= 0:
                point.setData([], [])
                label.setText("")
                continue
            x, y = event.flops / event.bytes_moved, event.achieved_flops / GIGA
            xs.append(x)
            point.setData([x], [y])
            label.setText(f"{event.phase} ({event.tokens} tokens)")
            self._texts.place(label, log10(x), log10(y))
            speed = f"{y:,.1f}" if y >= 1 else f"{y:.2g}"
            figures.append(f"{event.phase} <b>{unbroken(f'{speed} GFLOP/s')}</b> at {unbroken(f'{x:.2g} FLOP/B')}")
        peak_flops = started.peak_flops if started is not None else 0.0
        peak_bw = started.peak_bytes_per_s if started is not None else 0.0
        measured = peak_flops > 0 and peak_bw > 0
        if measured:
            ridge = peak_flops / peak_bw
            xs.append(ridge)
        low, high = min(xs) / 10, max(xs) * 10
        item = self.plot.getPlotItem()
        point_ys = [y for p in (self.prefill_point, self.decode_point) for y in (p.yData if p.yData is not None
                                                                                else [])]
        if measured:
            roof_x = np.logspace(math.log10(low), math.log10(high), 121)
            roof_x = np.union1d(roof_x, [ridge])
            self.roof_curve.setData(roof_x, np.minimum(peak_flops, peak_bw * roof_x) / GIGA)
            # Short labels on the lines (the caption says which is which): they fit a narrow plot.
            self.compute_label.setText(f"{peak_flops / GIGA:,.0f} GFLOP/s")
            self.bandwidth_label.setText(f"{peak_bw / GIGA:,.1f} GB/s")
            start = low * 1.5
            self._texts.place(self.compute_label, math.log10(high), math.log10(peak_flops / GIGA))
            self._texts.place(self.bandwidth_label, math.log10(start), math.log10(peak_bw * start / GIGA))
            point_ys += [peak_bw * low / GIGA, peak_flops / GIGA]
        else:
            self.roof_curve.setData([], [])
            self.compute_label.setText("")
            self.bandwidth_label.setText("")
        set_log_range(item, "bottom", low, high)
        # A decade above the roof and below the lowest point: room for the labels there.
        set_log_range(item, "left", min(point_ys) / 10, max(point_ys) * 10)
        self._texts.refit()
        caption = (" · ".join(figures) + ". The slope is the memory bandwidth, the flat roof the compute ceiling. "
                   "Decode reads every weight for one token per sequence; prefill reuses them for the whole prompt. "
                   "<i>FLOPs and bytes estimated, times measured.</i>")
        if not measured:
            caption += " <b>The machine's ceilings were not measured.</b>"
        self.show_plot(caption)
