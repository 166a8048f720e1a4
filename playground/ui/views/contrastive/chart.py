"""The contrastive view's chart of the shown step: three panels over its candidates (in the expert's order), each on
its own scale: the expert's log-probability (with the plausibility cut, log α + its top log p, as a dashed line), the
amateur's, and the contrast score log p_expert − log p_amateur; candidates outside the cut shaded in all three, the
chosen token banded and starred, the expert's own top token marked. The step panel beside it lists the numbers."""

from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QWidget

from playground.events.contrastive import ContrastCandidate
from playground.state import visible_token_text
from playground.state.contrastive import DOLA_DIVERGENCE, STEPS, TEXTS, StepRecord, dola_variant, raw_score
from playground.ui.style import MARK_BAND_COLOR, rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.contrastive.style import (
    AMATEUR_COLOR,
    BAR_WIDTH,
    CHANGED_COLOR,
    CHART_HEIGHT,
    CONTRAST_COLOR,
    CUT_SHADE,
    EXPERT_COLOR,
    FLOOR,
    SHORT_CHART_HEIGHT,
    SLOTS,
    TICK_CHARS,
    ContrastiveOwner,
    bars,
    nats,
    padded,
    percent,
)
from playground.ui.views.drawing import TextsInside, clear_bars, set_ticks, set_title
from playground.ui.views.texts import short_label

PANEL_LABELS = ("expert log p", "amateur log p", "score")
SHORT_PANEL_LABELS = ("expert", "amateur", "score")


def shown_candidates(record: StepRecord, must: set[int], limit: int = SLOTS) -> list[ContrastCandidate]:
    """The candidates the chart shows, in the expert's order: the first ``limit``, with the tokens of ``must`` (the
    chosen one, the what-if's) taking the places of the last others when they rank lower."""
    ranked = list(record.contrast.candidates)
    shown = ranked[:limit]
    missing = [c for c in ranked[limit:] if c.token_id in must]
    for extra in missing:
        for i in range(len(shown) - 1, -1, -1):
            if shown[i].token_id not in must:
                shown[i] = extra
                break
    return sorted(shown, key=lambda c: (c.expert_rank, c.token_id))


class StepChart(Panel):
    """The three panels and the step panel, for the view's ``shown_step``."""

    shows = frozenset({STEPS, TEXTS})

    def __init__(self, view: ContrastiveOwner, parent: QWidget) -> None:
        self.view = view
        self.shown: list[ContrastCandidate] = []
        self.step_panel = rich_label(parent)
        self.step_panel.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.step_panel.setMinimumWidth(360)
        self.chart = pg.GraphicsLayoutWidget(parent)
        self.chart.setMinimumHeight(CHART_HEIGHT)
        self.panels: list[pg.PlotItem] = []
        self.shades: list[pg.BarGraphItem] = []
        self.bands: list[pg.BarGraphItem] = []
        self.expert_bars, self.amateur_bars, self.contrast_bars = (bars(c) for c in (EXPERT_COLOR, AMATEUR_COLOR,
                                                                                     CONTRAST_COLOR))
        rows = ((self.expert_bars, PANEL_LABELS[0], EXPERT_COLOR), (self.amateur_bars, PANEL_LABELS[1], AMATEUR_COLOR),
                (self.contrast_bars, PANEL_LABELS[2], CONTRAST_COLOR))
        for row, (row_bars, label, color) in enumerate(rows):
            panel = self.chart.addPlot(row=row, col=0)
            panel.setMenuEnabled(False)
            panel.hideButtons()
            panel.setMouseEnabled(x=False, y=False)
            panel.showGrid(y=True, alpha=0.15)
            panel.setLabel("left", label, color=color)
            panel.getAxis("left").setWidth(62)
            panel.getAxis("left").enableAutoSIPrefix(False)  # "score (x0.001)" reads worse than small numbers
            if row:
                panel.setXLink(self.panels[0])
            if row < 2:
                panel.getAxis("bottom").setStyle(showValues=False)
            shade = pg.BarGraphItem(x=[], height=[], width=1.0, brush=pg.mkBrush(*CUT_SHADE), pen=pg.mkPen(None))
            band = pg.BarGraphItem(x=[], height=[], width=1.0, brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
            zero = pg.InfiniteLine(pos=0.0, angle=0, movable=False, pen=pg.mkPen("#555555", width=1))
            for graphic in (band, shade, zero, row_bars):
                panel.addItem(graphic)
            self.panels.append(panel)
            self.shades.append(shade)
            self.bands.append(band)
        self.panels[2].setLabel("bottom", "candidate (the expert's order)")
        self.cut_shade, self.chosen_band = self.shades[0], self.bands[0]
        self.cut_line = pg.InfiniteLine(angle=0, movable=False,
                                        pen=pg.mkPen("#444444", width=1.5, style=Qt.PenStyle.DashLine),
                                        label="cut", labelOpts={"position": 0.995, "color": "#333333",
                                                                "fill": (255, 255, 255, 220),
                                                                "anchors": [(1, 1), (1, 1)]})
        self.panels[0].addItem(self.cut_line)
        self.marks: list[pg.TextItem] = []
        for _ in range(SLOTS):
            mark = pg.TextItem("", anchor=(0.5, 1.0), color="#222222")
            mark.setFont(QFont("DejaVu Sans", 12))
            mark.setVisible(False)
            self.panels[0].addItem(mark)
            self.marks.append(mark)
        self._mark_texts = TextsInside(self.panels[0].getViewBox())

    def arrange(self, short: bool) -> None:
        """A short dock: the panels' least height, and axes that say "expert" (the legend says log p)."""
        self.chart.setMinimumHeight(SHORT_CHART_HEIGHT if short else CHART_HEIGHT)
        for panel, label, color in zip(self.panels, SHORT_PANEL_LABELS if short else PANEL_LABELS,
                                       (EXPERT_COLOR, AMATEUR_COLOR, CONTRAST_COLOR), strict=True):
            panel.setLabel("left", label, color=color)

    def draw(self) -> None:
        view = self.view
        state, index = view.state, view.shown_step
        top_panel, bottom_panel = self.panels[0], self.panels[2]
        for mark in self.marks:
            mark.setVisible(False)
        if index is None or index >= len(state.steps):
            for item in (self.expert_bars, self.amateur_bars, self.contrast_bars, *self.shades, *self.bands):
                clear_bars(item)
            self.cut_line.setVisible(False)
            set_ticks(bottom_panel.getAxis("bottom"), [[]])
            set_title(top_panel, "Selected step (none yet)", size="10pt")
            self.shown = []
            self.step_panel.setText("<b>Selected step</b><br><i>Steps appear as the run goes.</i>")
            return
        record = state.steps[index]
        s = record.contrast
        alpha = view.what_if_alpha()
        replay = view.replay
        what_if = replay.choices[index] if replay is not None else None
        must = {s.token_id, s.contrast_token_id, s.expert_token_id} | ({what_if} if what_if is not None else set())
        shown = self.shown = shown_candidates(record, must)
        plausible = record.plausible_at(alpha)
        inside = {c.token_id for c, ok in zip(s.candidates, plausible, strict=True) if ok}
        n = len(shown)
        xs = np.arange(n, dtype=float)
        expert = [max(c.expert_logprob, FLOOR) for c in shown]
        amateur = [max(c.amateur_logprob, FLOOR) for c in shown]
        scores = [raw_score(c) if c.token_id in inside else math.nan for c in shown]
        drawn = [(x, v) for x, v in zip(xs, scores, strict=True) if math.isfinite(v)]
        self.expert_bars.setOpts(x=xs, height=expert, width=BAR_WIDTH)
        self.amateur_bars.setOpts(x=xs, height=amateur, width=BAR_WIDTH)
        self.contrast_bars.setOpts(x=[x for x, _ in drawn], height=[v for _, v in drawn], width=BAR_WIDTH)
        cut = record.expert_max + math.log(alpha) if alpha > 0 else -math.inf
        ranges = [padded([*expert, *([cut] if math.isfinite(cut) else [])], room_above=0.35),
                  padded(amateur), padded([v for _, v in drawn])]
        outside = [x for x, c in zip(xs, shown, strict=True) if c.token_id not in inside]
        chosen_x = [x for x, c in zip(xs, shown, strict=True) if c.token_id == s.token_id]
        for panel, shade, band, (bottom, top) in zip(self.panels, self.shades, self.bands, ranges, strict=True):
            shade.setOpts(x=outside, y0=[bottom] * len(outside), height=[top - bottom] * len(outside), width=1.0)
            band.setOpts(x=chosen_x, y0=[bottom] * len(chosen_x), height=[top - bottom] * len(chosen_x), width=1.0)
            panel.setYRange(bottom, top, padding=0)
        self.cut_line.setVisible(math.isfinite(cut))
        if math.isfinite(cut):
            self.cut_line.setValue(cut)
            self.cut_line.label.setFormat(f"cut {cut:.2f}")
        mark_y = 0.05 * (ranges[0][1] - ranges[0][0])
        for slot, (x, c) in enumerate(zip(xs, shown, strict=True)):
            marks = []
            if c.token_id == s.token_id:
                marks.append("★")
            if c.token_id == s.expert_token_id:
                marks.append("▲")
            if what_if is not None and c.token_id == what_if and abs(alpha - record.alpha) > 1e-12:
                marks.append("◆")
            if marks:
                mark = self.marks[slot]
                mark.setText(" ".join(marks))
                mark.setVisible(True)
                self._mark_texts.place(mark, x, mark_y)
        set_ticks(bottom_panel.getAxis("bottom"), [[(float(x), short_label(visible_token_text(c.text), TICK_CHARS))
                                                  for x, c in zip(xs, shown, strict=True)]])
        top_panel.setXRange(-0.6, max(n, 4) - 0.4, padding=0)
        verdict = "changed" if s.changed else "kept"  # short: a narrow chart is at least as wide as its title
        set_title(top_panel, f"Step {index}: {verdict} the choice · {s.plausible_count} plausible at "
                           f"α = {record.alpha:g}", size="10pt")
        self.step_panel.setText(self._step_html(record, index, alpha, inside))

    def _step_html(self, record: StepRecord, index: int, alpha: float, inside: set[int]) -> str:
        s = record.contrast
        started, short = self.view.state.started, self.view.short
        text = html.escape(visible_token_text(record.text if record.text is not None else s.text))
        expert = html.escape(visible_token_text(s.expert_text))
        if s.forced:
            head = f"<b>Step {index}</b>: “{text}” was forced (branching)"
        elif s.changed:
            head = (f"<b>Step {index}</b>: chose “{text}” — the expert alone would have said “{expert}”: "
                    f"<b style='color:{CHANGED_COLOR}'>changed</b>")
        else:
            head = f"<b>Step {index}</b>: chose “{text}”, the expert's own top token too"
        if s.layer_jsd and started is not None:
            pairs = zip(started.dola_layers, s.layer_jsd, strict=False)
            jsd = ", ".join(f"<b>{j}</b>: {d:.3g}" if j == s.premature_layer else f"{j}: {d:.3g}" for j, d in pairs)
            variant = dola_variant(started)
            head += (f"<br>DoLa ({variant} variant): amateur = layer <b>{s.premature_layer}</b>, the largest "
                     f"{DOLA_DIVERGENCE[variant]} from the last layer (nats, by layer: {jsd})")
        cut_p = math.exp(record.expert_max) * alpha
        what = "" if abs(alpha - record.alpha) < 1e-12 else " (what-if)"
        cut = (f"Cut at α = {alpha:g}{what}: p<sub>expert</sub> ≥ {alpha:g} × "
               f"{percent(math.exp(record.expert_max))} = {percent(cut_p)}")
        count = f"{s.plausible_count} plausible at the run's α = {record.alpha:g}"
        rows = []
        for c in self.shown:
            mark = "★" if c.token_id == s.token_id else ("▲" if c.token_id == s.expert_token_id else "")
            ok = c.token_id in inside
            score = nats(raw_score(c)) if ok else "<span style='color:#888'>cut</span>"
            rows.append(
                f"<tr><td>{mark}</td><td style='font-family:DejaVu Sans Mono'>"
                f"{html.escape(visible_token_text(c.text))}</td>"
                f"<td align='right'>{percent(math.exp(c.expert_logprob))}</td>"
                f"<td align='right'>{percent(math.exp(c.amateur_logprob))}</td>"
                f"<td align='right'>{score}</td>"
                f"<td align='right'>{percent(c.prob) if c.plausible else '—'}</td></tr>")
        table = ("<table cellspacing='3'><tr><th></th><th align='left'>token</th>"
                 f"<th style='color:{EXPERT_COLOR}'>p expert</th><th style='color:{AMATEUR_COLOR}'>p amateur</th>"
                 f"<th style='color:{CONTRAST_COLOR}'>score</th><th>chosen from</th></tr>{''.join(rows)}</table>")
        timing = f"amateur {s.amateur_ms:.2f} ms · contrast maths {s.contrast_ms:.2f} ms"
        note = "score in nats; “chosen from”: the softmax of the scores over the plausible set"
        self.step_panel.setToolTip(f"{note}<br>{timing}" if short else "")  # short: footnote, timing on hover
        return (f"{head}<br>{cut} · {count}<br>{table}" if short
                else f"{head}<br>{cut} · {count}<br>{table}<i>{note}</i><br>{timing}")
