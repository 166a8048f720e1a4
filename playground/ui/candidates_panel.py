"""The bar chart of one step's candidates: raw vs processed probability, the chosen one, what was cut.

Items are built once and updated with ``setOpts``/``setTicks``; text labels come from a pool that only grows.
Bars are horizontal so token labels read left to right on the axis.
"""

from __future__ import annotations

import html
import time

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget

from playground.events import TokenStep
from playground.state import ChartRow, chart_rows, chosen_text, cut_summary, visible_token_text
from playground.ui.style import (
    CHOSEN_COLOR,
    CUT_COLOR,
    MARK_BAND_COLOR,
    PROCESSED_COLOR,
    RAW_COLOR,
    format_percent,
    rich_label,
)

MAX_ROWS = 15  # candidates drawn (plus the rest-of-vocabulary row); the tooltip and trace hold more
LABEL_CHARS = 20
BAR = 0.36  # thickness of one bar; a row holds two (raw above, processed below)


def _pct(prob: float) -> str:
    return html.escape(format_percent(prob))  # for rich text: "<0.01%" would open a tag


def _axis_label(row: ChartRow) -> str:
    text = row.label if len(row.label) <= LABEL_CHARS else row.label[: LABEL_CHARS - 1] + "…"
    return f"▶ {text}" if row.chosen else text


class CandidatesPanel(QWidget):
    """``show_step(step)`` draws a step; ``reset()`` empties it. Double-click a bar to branch from it."""

    branch_requested = Signal(int, int)  # step, token id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.step: TokenStep | None = None
        self.rows: list[ChartRow] = []
        self.total_steps = 0
        self._last_click: tuple[int | None, float] = (None, 0.0)

        self.header = rich_label(self)
        self.legend = rich_label(self)
        self.legend.setText(
            f"<span style='color:{RAW_COLOR}'>■</span> raw model (softmax of the logits) &nbsp; "
            f"<span style='color:{PROCESSED_COLOR}'>■</span> after processors (picked from)<br>"
            f"<span style='color:{CUT_COLOR}'>▨</span> cut by a processor &nbsp; ▶ chosen token &nbsp; "
            "<i>double-click a bar to continue from that token</i>")

        self.plot = pg.PlotWidget(self)
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setMouseEnabled(x=False, y=False)
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.25)
        item.setLabel("bottom", "probability (%)")
        item.getAxis("left").setStyle(tickFont=QFont("DejaVu Sans Mono", 9), autoExpandTextSpace=True)
        item.getAxis("left").setWidth(150)

        self._band = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
        self._raw = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=RAW_COLOR, pen=pg.mkPen(None))
        self._processed = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=PROCESSED_COLOR,
                                          pen=pg.mkPen(None))
        cut_brush = QBrush(QColor(CUT_COLOR), Qt.BrushStyle.BDiagPattern)
        self._cut = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=cut_brush, pen=pg.mkPen(CUT_COLOR))
        for bar in (self._band, self._raw, self._processed, self._cut):
            item.addItem(bar)
        self._band.setZValue(-10)
        self._labels: list[pg.TextItem] = []

        self.plot.scene().sigMouseClicked.connect(self._on_click)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        self.reset()

    # --- drawing ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.step = None
        self.rows = []
        self.header.setText("<b>Candidates</b> — run a generation, then click a token to see its step here.")
        for bar in (self._band, self._raw, self._processed, self._cut):
            bar.setOpts(x0=[], y=[], width=[], height=[])
        for label in self._labels:
            label.setVisible(False)
        self.plot.getPlotItem().getAxis("left").setTicks([[]])
        self.plot.getPlotItem().setXRange(0, 100, padding=0)  # an empty chart still reads in percent

    def _label(self, index: int) -> pg.TextItem:
        while len(self._labels) <= index:
            label = pg.TextItem(anchor=(0, 0.5))
            label.setFont(QFont("DejaVu Sans", 8))
            self.plot.getPlotItem().addItem(label)
            self._labels.append(label)
        return self._labels[index]

    def show_step(self, step: TokenStep, total_steps: int | None = None) -> None:
        self.step = step
        if total_steps is not None:
            self.total_steps = total_steps
        self.rows = rows = chart_rows(step, MAX_ROWS)
        n = len(rows)
        y = list(range(n))
        raw = [r.raw_prob * 100 for r in rows]
        processed = [0.0 if r.cut_by else r.processed_prob * 100 for r in rows]
        cut_rows = [i for i, r in enumerate(rows) if r.cut_by]
        x_max = max(8.0, max(raw + processed) * 1.18 + 6)  # room for the value labels
        chosen_pen = pg.mkPen(CHOSEN_COLOR, width=2)
        pens = [chosen_pen if r.chosen else pg.mkPen(None) for r in rows]

        chosen = [i for i, r in enumerate(rows) if r.chosen]
        self._band.setOpts(x0=[0] * len(chosen), y=chosen, width=[x_max] * len(chosen), height=[0.96] * len(chosen))
        self._raw.setOpts(x0=[0] * n, y=[i - BAR / 2 for i in y], width=raw, height=[BAR] * n, pens=pens)
        self._processed.setOpts(x0=[0] * n, y=[i + BAR / 2 for i in y], width=processed, height=[BAR] * n,
                                pens=pens)
        self._cut.setOpts(x0=[0] * len(cut_rows), y=[i + BAR / 2 for i in cut_rows],
                          width=[max(raw[i], x_max * 0.01) for i in cut_rows], height=[BAR] * len(cut_rows))

        used = 0
        for i, r in enumerate(rows):
            raw_label = self._label(used)
            used += 1
            raw_label.setText(format_percent(r.raw_prob), color=RAW_COLOR)
            raw_label.setPos(raw[i] + x_max * 0.01, i - BAR / 2)
            raw_label.setVisible(True)
            proc_label = self._label(used)
            used += 1
            if r.cut_by:
                proc_label.setText(f"cut by {r.cut_by}", color="#555555")
                proc_label.setPos(max(raw[i], x_max * 0.01) + x_max * 0.01, i + BAR / 2)
            else:
                proc_label.setText(format_percent(r.processed_prob), color=PROCESSED_COLOR)
                proc_label.setPos(processed[i] + x_max * 0.01, i + BAR / 2)
            proc_label.setVisible(True)
        for label in self._labels[used:]:
            label.setVisible(False)

        item = self.plot.getPlotItem()
        item.getAxis("left").setTicks([[(i, _axis_label(r)) for i, r in enumerate(rows)]])
        item.setXRange(0, x_max, padding=0)
        item.setYRange(-0.6, n - 0.4, padding=0)
        self.header.setText(self._header_html(step))

    def _header_html(self, step: TokenStep) -> str:
        # Steps count from 0 everywhere (events, tooltips, the beam axis); say which token that is.
        of = f" · token {step.step + 1} of {self.total_steps}" if self.total_steps else ""
        cuts = cut_summary(self.rows)
        cut_text = ", ".join(f"{name} cut {count}" for name, count in cuts.items())
        effects = ", ".join(e.name for e in step.effects) or "none"
        token = html.escape(visible_token_text(chosen_text(step)))
        forced = " <i>(forced)</i>" if step.forced else ""
        return (f"<b>Step {step.step}</b>{of} · chose <code>{token}</code>{forced}: "
                f"raw {_pct(step.raw_prob)}, after processors {_pct(step.prob)} · "
                f"entropy {step.entropy:.2f} → {step.processed_entropy:.2f} bits<br>"
                f"processors: {effects}{' · ' + cut_text + ' of the shown' if cut_text else ''} · "
                f"shown candidates cover {_pct(1.0 - self.rows[-1].raw_prob)} of the raw probability")

    # --- branching ----------------------------------------------------------------------------------------
    def row_at_scene(self, scene_pos) -> int | None:
        view = self.plot.getPlotItem().getViewBox()
        if not view.sceneBoundingRect().contains(scene_pos):
            return None
        point = view.mapSceneToView(scene_pos)
        row = round(point.y())
        return row if 0 <= row < len(self.rows) else None

    def _on_click(self, event) -> None:
        if self.step is None or event.button() != Qt.MouseButton.LeftButton:
            return
        row = self.row_at_scene(event.scenePos())
        now = time.monotonic()
        # A second click on the same row counts as a double-click whether or not the scene flagged it.
        double = event.double() or (row is not None and self._last_click[0] == row
                                    and now - self._last_click[1] < QApplication.doubleClickInterval() / 1000)
        self._last_click = (row, now)
        if double and row is not None:
            self._last_click = (None, 0.0)
            self.request_branch(row)

    def request_branch(self, row: int) -> None:
        target = self.rows[row]
        if self.step is not None and target.token_id is not None and not target.chosen:
            self.branch_requested.emit(self.step.step, target.token_id)
