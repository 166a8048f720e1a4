"""The KV view's latency panel: the time per token with and without the cache (``KVCompare``), the ratio at the
end."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.state.kv import KVState
from playground.ui.views.drawing import static_plot
from playground.ui.views.kv.panel import CACHED_COLOR, UNCACHED_COLOR, Panel, legend, line


class LatencyPanel(Panel):
    """Time per token, with and without the cache."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, "Time per token, with and without the cache", "generated token", "ms per token",
                           min_height=200)
        plot.getPlotItem().showGrid(y=True, alpha=0.2)
        key = legend(plot, (8, 4))
        self.cached_curve = line(CACHED_COLOR, 2)
        self.uncached_curve = line(UNCACHED_COLOR, 2)
        self.ratio_label = pg.TextItem("", color=UNCACHED_COLOR, anchor=(1.0, 1.15), fill=(255, 255, 255, 210))
        for curve, name in ((self.uncached_curve, "without cache (recompute all)"),
                            (self.cached_curve, "with cache")):
            plot.addItem(curve)
            key.addItem(curve, name)
        plot.addItem(self.ratio_label)
        super().__init__(plot, parent)

    def draw(self, s: KVState) -> None:
        c = s.compare
        if c is None or not c.cached_ms:
            self.cached_curve.setData([], [])
            self.uncached_curve.setData([], [])
            self.ratio_label.setText("")
            when = ("is measured after the run when “compare without cache” is on" if not s.ended
                    else "was not measured in this run (switch on “compare without cache”)")
            self.show_note(f"<b>With vs without the cache</b><br>The time per token without a cache {when}: the "
                           "same tokens decoded again, recomputing every position at every step.")
            return
        self.cached_curve.setData(np.arange(len(c.cached_ms), dtype=float), np.asarray(c.cached_ms, dtype=float))
        self.uncached_curve.setData(np.arange(len(c.uncached_ms), dtype=float),
                                    np.asarray(c.uncached_ms, dtype=float))
        ratio = s.compare_ratio()
        n = min(len(c.cached_ms), len(c.uncached_ms))
        top = max(max(c.cached_ms, default=0.0), max(c.uncached_ms, default=0.0))
        plot = self.plot.getPlotItem()
        plot.setYRange(0, (top if top > 0 else 1.0) * 1.15, padding=0)  # room for the ratio above the last point
        plot.setXRange(0, max(n - 1, 1), padding=0.03)
        if ratio is not None:
            last, overall = ratio
            self.ratio_label.setText(f"×{last:.1f}")
            self.ratio_label.setPos(float(n - 1), float(c.uncached_ms[n - 1]))
            text = (f"Token {n - 1}: <b>{c.uncached_ms[n - 1]:.1f} ms</b> without the cache vs "
                    f"<b>{c.cached_ms[n - 1]:.1f} ms</b> with it: <b>×{last:.1f}</b> (×{overall:.1f} over all "
                    f"{n} tokens; token 0 reads the whole prompt both ways).")
        else:
            self.ratio_label.setText("")
            text = ""
        same = ("Same tokens with and without the cache ✓" if c.identical
                else "<b>The recomputed run chose other tokens</b> (numerics differ)")
        self.show_plot(f"{text} {same}")
