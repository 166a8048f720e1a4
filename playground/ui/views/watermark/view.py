"""The watermark view: a watermarked run token by token.

- The text, each token on its colour: green / red for green lists, SynthID's mean g-value shaded from red (0) to
  green (1); grey where a token is not scored (a repeated SynthID context, a skipped first call).
- The running z-score against the detector's threshold (and the p-value in the header).
- Each step's model entropy with its colour beside it: the low-entropy steps, where the watermark can hardly move
  the choice, carry little of the signal (the header gives the green share below and above 2 bits).
- The KL from the model's distribution to the watermarked one at each step (what the watermark costs there).
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QTabWidget, QTextEdit, QVBoxLayout, QWidget

from playground.config.samplers.watermark import WatermarkSettings
from playground.events import RunFinished
from playground.events.watermark import WatermarkStep
from playground.state import Run, flowing_token_text
from playground.state.watermark import WatermarkState
from playground.ui.style import mono_font, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import fill_with_scroll, static_plot
from playground.ui.views.watermark.colours import colour_of
from playground.ui.views.watermark.detector import DetectorPanel

Z_COLOR = "#0077BB"
KL_COLOR = "#009988"
LOW_ENTROPY_BITS = 2.0


def header_text(state: WatermarkState) -> str:
    started = state.started
    if started is None:
        return WatermarkView.idle_header
    last = state.last
    scheme = "green lists (Kirchenbauer et al.)" if state.scheme == "kirchenbauer" else "SynthID-Text"
    parts = [f"<b>Watermark</b> — {scheme}: {html.escape(getattr(started, 'summary', ''))}"]
    if last is not None and math.isfinite(last.z_score):
        verdict = "watermarked" if last.z_score > state.threshold else "not (yet) detected"
        parts.append(f"z = <b>{last.z_score:.2f}</b> (threshold {state.threshold:g}), p = {last.p_value:.2e} over "
                     f"{last.count} scored tokens: <b>{verdict}</b>")
    kl = state.mean_kl()
    if kl is not None:
        parts.append(f"mean KL(watermarked ‖ model) = {kl:.3f} nats/token")
    (n_low, low), (n_high, high) = state.split_by_entropy(LOW_ENTROPY_BITS)
    if n_low or n_high:
        def share(n: int, v: float) -> str:
            return f"{v:.0%} of {n}" if n else "none"
        what = "green" if state.scheme == "kirchenbauer" else "mean g"
        parts.append(f"{what}: {share(n_low, low)} below {LOW_ENTROPY_BITS:g} bits of entropy, {share(n_high, high)} "
                     "at or above (low-entropy tokens carry little of the signal)")
    parts.append(state.status())
    return " · ".join(parts)


class MarkedText(QTextEdit):
    """The tokens on their colours, appended as their text comes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFont(mono_font(11))
        self.forget()

    def forget(self) -> None:
        self.clear()
        self._drawn = 0
        self._state: WatermarkState | None = None

    def draw(self, state: WatermarkState) -> None:
        if state is not self._state or len(state.tokens) < self._drawn:
            self.forget()
            self._state = state
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        while self._drawn < len(state.tokens) and state.tokens[self._drawn].text is not None:
            token = state.tokens[self._drawn]
            form = QTextCharFormat()
            form.setBackground(colour_of(token.mark))
            form.setToolTip(_tooltip(token.mark))
            cursor.insertText(flowing_token_text(token.text or ""), form)
            self._drawn += 1


def _tooltip(mark: WatermarkStep) -> str:
    what = ("green" if mark.colour >= 1 else "red") if not mark.g_values else \
        f"g-values {''.join(map(str, mark.g_values))} (mean {mark.colour:.2f})"
    scored = "" if mark.scored else " (not scored: a repeated context or a skipped call)"
    entropy = f", entropy {mark.entropy:.2f} bits" if mark.entropy is not None else ""
    kl = f", KL {mark.kl:.3f} nats" if mark.kl is not None else ""
    return f"step {mark.step}: {what}{scored}{entropy}{kl}; z so far {mark.z_score:.2f}"


@register_view
class WatermarkView(FoldView):
    name = "watermark"
    title = "Watermark"
    consumes = (WatermarkStep,)
    idle_header = ("<b>Watermark</b> — generate with <tt>--watermark kirchenbauer</tt> or <tt>synthid</tt>: each "
                   "token's colour, the running z-score, the entropy beside each colour and the watermark's KL "
                   "appear here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: WatermarkState = WatermarkState()
        self.tabs = QTabWidget(self)
        content = QWidget(self.tabs)
        layout = QVBoxLayout(content)
        self.header = rich_label(content)
        layout.addWidget(self.header)
        self.text = MarkedText(content)
        self.text.setMinimumHeight(120)
        layout.addWidget(self.text, stretch=2)
        plots = QHBoxLayout()
        self.z_plot = static_plot(content, "running z-score", "token", "z", min_height=180)
        self.z_curve = self.z_plot.plot([], [], pen=pg.mkPen(Z_COLOR, width=2))
        self.threshold_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#888888", style=pg.QtCore.Qt.PenStyle.DashLine))
        self.z_plot.addItem(self.threshold_line)
        self.entropy_plot = static_plot(content, "entropy beside the colour", "token", "entropy (bits)",
                                        min_height=180)
        self.entropy_bars = pg.BarGraphItem(x=[], height=[], width=0.8)
        self.entropy_plot.addItem(self.entropy_bars)
        self.kl_plot = static_plot(content, "KL(watermarked ‖ model)", "token", "nats", min_height=180)
        self.kl_curve = self.kl_plot.plot([], [], pen=None, symbol="o", symbolSize=5, symbolBrush=KL_COLOR)
        for plot in (self.z_plot, self.entropy_plot, self.kl_plot):
            plots.addWidget(plot)
        layout.addLayout(plots, stretch=3)
        self.tabs.addTab(content, "Live run")
        self.detector = DetectorPanel(self.tabs)
        self.tabs.addTab(self.detector, "Detector (any text)")
        fill_with_scroll(self, self.tabs)
        self._start_drawing()

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The loaded model's tokenizer (the window hands it to views that read typed text): the detector's."""
        self.detector.set_model(tokenizer, getattr(self.window(), "source", None))  # its model source: SWEET's pass

    def show_run(self, run: Run) -> None:
        super().show_run(run)
        finished = next((e for e in reversed(run.events) if isinstance(e, RunFinished)), None)
        g = run.settings.group(WatermarkSettings)
        if g.active():  # the detector starts from the shown run's key and output
            self.detector.use_settings(g, finished.text if finished is not None else None)

    def _forget(self) -> None:
        self.text.forget()

    def _draw(self) -> None:
        state = self.state
        self.header.setText(header_text(state))
        self.text.draw(state)
        marks = [t.mark for t in state.tokens]
        steps = np.array([m.step for m in marks], dtype=float)
        z = np.array([m.z_score for m in marks], dtype=float)
        self.z_curve.setData(steps[np.isfinite(z)], z[np.isfinite(z)])
        self.threshold_line.setValue(state.threshold)
        entropy = np.array([m.entropy if m.entropy is not None else 0.0 for m in marks], dtype=float)
        brushes = [colour_of(m) for m in marks]
        if marks:
            self.entropy_bars.setOpts(x=steps, height=entropy, width=0.8, brushes=brushes, pen=pg.mkPen(None))
        kl = np.array([m.kl if m.kl is not None else np.nan for m in marks], dtype=float)
        keep = np.isfinite(kl)
        self.kl_curve.setData(steps[keep], kl[keep])
