"""The KV view's first panel: the cache's bytes after each step (log scale, MB), measured and by the formula, against
the model's weights and the process's memory, the prefill marked."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from playground.state.kv import KVState
from playground.ui.views.drawing import static_plot
from playground.ui.views.kv.panel import (
    FORMULA_COLOR,
    MB,
    PREFILL_COLOR,
    PROCESS_COLOR,
    RESERVED_COLOR,
    TOTAL_COLOR,
    WEIGHTS_COLOR,
    Panel,
    line,
    set_log_range,
)


class SizePanel(Panel):
    """Bytes over the steps."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, "KV cache size after each step (log scale)", "decoding step", "MB (log scale)",
                           min_height=200)
        super().__init__(plot, parent)
        item = plot.getPlotItem()
        item.setLogMode(x=False, y=True)
        item.showGrid(y=True, alpha=0.2)
        self.process_curve = line(PROCESS_COLOR, 2, Qt.PenStyle.DotLine)
        self.reserved_curve = line(RESERVED_COLOR, 2, Qt.PenStyle.DotLine)
        self.weights_curve = line(WEIGHTS_COLOR, 2, Qt.PenStyle.DashDotLine)
        self.total_curve = line(TOTAL_COLOR, 4)
        self.formula_curve = line(FORMULA_COLOR, 2, Qt.PenStyle.DashLine)
        self.prefill_line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(PREFILL_COLOR, width=2),
                                            label="prefill", labelOpts={"position": 0.55, "color": PREFILL_COLOR,
                                                                        "anchors": [(0, 1), (0, 1)]})
        for curve in (self.weights_curve, self.process_curve, self.reserved_curve, self.total_curve,
                      self.formula_curve):
            item.addItem(curve)
        item.addItem(self.prefill_line)

    def draw(self, s: KVState) -> None:
        steps = s.steps.astype(float)
        self.total_curve.setData(steps, s.total_bytes / MB)
        self.formula_curve.setData(steps, s.formula_bytes / MB)
        self.process_curve.setData(steps, s.process_bytes / MB)
        reserved = s.reserved_bytes
        shown = bool(reserved.size and reserved.any())
        self.reserved_curve.setData(steps if shown else [], reserved / MB if shown else [])
        self.reserved_curve.setVisible(shown)
        weights = s.started.weights_bytes if s.started is not None else 0
        if steps.size and weights > 0:
            self.weights_curve.setData([steps[0], steps[-1]], [weights / MB, weights / MB])
        else:
            self.weights_curve.setData([], [])
        position = s.prefill_position
        self.prefill_line.setVisible(position is not None and steps.size > 0)
        if position is not None:
            # Between the last step before the prefill ended and the first after it.
            self.prefill_line.setValue(float(steps[position]) - 0.5 if position < steps.size else
                                       (float(steps[-1]) + 0.5 if steps.size else -0.5))
            prompt = s.prefill.prompt_tokens if s.prefill is not None else 0
            self.prefill_line.label.setFormat(f"prefill: {prompt} prompt tokens")
        item = self.plot.getPlotItem()
        if steps.size:
            item.setXRange(float(steps[0]) - 1, float(steps[-1]) + 1, padding=0.02)
            values = np.concatenate([s.total_bytes, s.formula_bytes, s.process_bytes, reserved, [weights]]) / MB
            positive = values[values > 0]
            if positive.size:
                set_log_range(item, "left", float(positive.min()) / 1.6, float(positive.max()) * 1.6)
        entries = [(TOTAL_COLOR, "━━", "KV cache, measured"), (FORMULA_COLOR, "╌╌", "formula"),
                   (WEIGHTS_COLOR, "─·─", "model weights"), (PROCESS_COLOR, "┈┈", "process memory")]
        if shown:
            entries.append((RESERVED_COLOR, "┈┈", "device memory reserved"))
        legend = " &nbsp; ".join(f"<span style='color:{color}'><b>{glyph}</b></span> {name}"
                                 for color, glyph, name in entries)
        self.show_plot(f"{legend}<br>{agreement_text(s)}")


def agreement_text(s: KVState) -> str:
    """Whether the measured bytes are the formula's, and why not where they are not."""
    total, formula = s.total_bytes, s.formula_bytes
    if s.holder == "none":
        return "No cache: nothing is held at any step; the lines left are the weights and the process."
    if not total.size:
        return "Measured and formula lie on each other when the cache holds exactly what the formula counts."
    if np.array_equal(total, formula):
        return "Measured = formula at every step ✓ (the dashed line lies on the solid one)."
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(formula > 0, (total - formula) / np.maximum(formula, 1), np.inf)
    worst = int(np.argmax(np.abs(relative)))
    off = float(relative[worst])
    why = {"paged": "a paged cache allocates whole blocks (more) and stores a shared block once (less)",
           "none": "nothing is kept"}.get(s.holder, "")
    if s.started is not None and s.started.kv_dtype != "model":
        why = "the quantization scales are stored too"
    gap = f"{off:+.1%}" if math.isfinite(off) else "all"
    return (f"Measured differs from the formula (most: {gap} at step {int(s.steps[worst])})"
            + (f": {why}." if why else "."))
