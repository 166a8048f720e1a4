"""The cascade view: which model produced each token, where the full model took over, and what that saved.

- The output, each token coloured by the model that produced it (cheap, full, forced); ▲ marks each escalation
  point (where the full model took over). Per response, the cheap model's thrown-away response is struck through
  before the full model's own. Hover a token: both models' figures for it.
- A strip of the cheap model's confidence per token (its probability for its own choice, after the sampler
  pipeline), each bar coloured by who produced the token, with the threshold line and the escalation points; per
  response, the cheap response's confidences and their mean.
- Figures: tokens by each model, escalations, the full model's passes and catch-ups, each model's time; at the
  end, agreement with the full model alone and the time and compute saved.

Events are folded into the Qt-free ``CascadeState``; the text grows by the new marks only (redrawn once when a
per-response verdict restyles the cheap response), the strip's items are built once and updated with ``setOpts``/
``setData``, at most every ``LIVE_DRAW_MS`` while streaming.
"""

from __future__ import annotations

import html
import math
from typing import cast

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QMouseEvent, QPainter, QPixmap, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QLabel, QSplitter, QToolTip, QVBoxLayout, QWidget

from playground.events.cascade import CHEAP, FORCED, FULL, CascadeStarted, CascadeStep
from playground.state import Run, flowing_token_text, visible_token_text
from playground.state.cascade import DISCARDED, CascadeState, Mark
from playground.ui.marked_text import MarkedTextEdit
from playground.ui.style import format_percent, mono_font, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import fill_with_scroll, set_ticks, set_title, static_plot
from playground.ui.views.texts import short_label, status_html

TICK_CHARS = 8  # a token's label under its step
LIVE_DRAW_MS = 200  # while streaming, the strip and figures redraw at most this often
# One colour per meaning (Paul Tol's colour-blind-safe "vibrant" set, as the speculative view: the cheap model's
# kept token is its accepted draft's teal, the full model the target's blue, a thrown-away token the rejected red).
COLORS = {CHEAP: "#009988", FULL: "#0077BB", FORCED: "#777777", DISCARDED: "#CC3311"}
TINTS = {CHEAP: "#D5F0EC", FULL: "#D6E7F4", FORCED: "#EEEEEE", DISCARDED: "#F8DCD5"}
ESCALATION_COLOR = "#EE3377"  # ▲ where the full model took over (in the text and the strip)
THRESHOLD_COLOR = "#333333"
MEAN_COLOR = "#EE7733"
ESCALATION_MARK = "▲"
WORDS = {CHEAP: "cheap model", FULL: "full model", FORCED: "forced", DISCARDED: "thrown away"}


def _swatch(kind: str, text: str) -> str:
    style = f"color:{COLORS[kind]};background:{TINTS[kind]};" + ("font-weight:bold;" if kind == FULL else "")
    body = f"<s>&nbsp;{text}&nbsp;</s>" if kind == DISCARDED else f"&nbsp;{text}&nbsp;"
    return f"<span style='{style}'>{body}</span>"


def _pct(prob: float | None) -> str:
    return "—" if prob is None else html.escape(format_percent(prob))


def mark_tooltip(state: CascadeState, mark: Mark) -> str:
    """A token's figures: who produced it, the cheap model's choice and confidence, the full model's decision."""
    s = mark.step
    token = html.escape(visible_token_text(mark.text))
    where = f"cheap response token {s.step}" if s.draft else f"step {s.step}"
    head = f"<code>{token}</code> · {where} · <b>{WORDS[mark.kind]}</b>"
    if mark.escalation:
        head += f" · <span style='color:{ESCALATION_COLOR}'>{ESCALATION_MARK} escalation point</span>"
    rows = [head]
    if s.cheap_token_id is not None:
        same = "" if s.cheap_token_id == s.token_id else " (not the output's)"
        rule = ""
        if state.threshold is not None and not state.per_response and s.cheap_prob is not None:
            rule = f" {'&lt;' if s.cheap_prob < state.threshold else '≥'} threshold {state.threshold:g}"
        rows.append(f"cheap model chose <code>{html.escape(visible_token_text(s.cheap_text))}</code>{same}: "
                    f"p = {_pct(s.cheap_prob)}{rule} · {s.cheap_ms:.1f} ms")
    if s.full_read:
        prob = f"p = {_pct(s.full_prob)} · " if s.full_prob is not None else ""
        rows.append(f"full model: {prob}read {s.full_read} position{'s' * (s.full_read != 1)} in one pass · "
                    f"{s.full_ms:.1f} ms")
    return "<br>".join(rows)


class CascadeText(MarkedTextEdit):
    """The output with every token coloured by the model that produced it; knows which token is under the mouse."""

    def __init__(self, state: CascadeState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.setReadOnly(True)
        self.setFont(mono_font(12))
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.NoTextInteraction)
        self.restyled = 0  # the state's ``restyled`` when the text was last drawn from scratch
        self._formats = {kind: self._format(kind) for kind in COLORS}
        self._escalation = QTextCharFormat()
        self._escalation.setForeground(QColor(ESCALATION_COLOR))
        self._escalation.setFontWeight(700)

    @staticmethod
    def _format(kind: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(COLORS[kind]))
        fmt.setBackground(QColor(TINTS[kind]))
        fmt.setFontStrikeOut(kind == DISCARDED)
        fmt.setFontItalic(kind == FORCED)
        if kind == FULL:
            fmt.setFontWeight(700)
        return fmt

    def redraw(self) -> None:
        drawn = self.drawn
        self.clear_marks()
        self.append_marks(self.state.marks[:drawn], None)

    def follow(self) -> None:
        """Draw the marks the state has and this text does not (all of them after a restyle)."""
        state = self.state
        if state.restyled != self.restyled:
            self.restyled = state.restyled
            self.clear_marks()
        if self.drawn < len(state.marks):
            self.append_marks(state.marks[self.drawn :], state.marks[self.drawn - 1] if self.drawn else None)

    def append_marks(self, marks: list[Mark], previous: Mark | None) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for mark in marks:
            if mark.escalation:  # not part of the output: the point where the full model took over
                after_discarded = previous is not None and previous.kind == DISCARDED
                cursor.insertText(f"\n\n{ESCALATION_MARK} " if after_discarded else ESCALATION_MARK,
                                  self._escalation)
            text = flowing_token_text(mark.text) if mark.text else "·"
            if mark.kind == DISCARDED:  # not part of the output either: kept on its lines, line breaks as ↵
                text = text.replace("\n", "")
            self.starts.append(cursor.position())
            cursor.insertText(text, self._formats[mark.kind])
            self.ends.append(cursor.position())
            previous = mark
        self.split_paragraph()  # the paragraph being written stays short: an append costs what is new
        bar = self.verticalScrollBar()
        if bar.value() >= bar.maximum() - 40:  # follow the stream unless the user scrolled up
            bar.setValue(bar.maximum())

    def mark_rect(self, index: int):
        cursor = QTextCursor(self.document())
        cursor.setPosition(self.starts[index])
        return self.cursorRect(cursor)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        index = self.mark_at(event.position().toPoint())
        if index is None:
            QToolTip.hideText()
        else:
            QToolTip.showText(event.globalPosition().toPoint(), mark_tooltip(self.state, self.state.marks[index]),
                              self)
        super().mouseMoveEvent(event)


@register_view
class CascadeView(FoldView):
    name = "cascade"
    title = "Cascade"
    consumes = (CascadeStep,)
    live_draw_ms = LIVE_DRAW_MS
    idle_header = ("<b>Cascade</b> — choose the cascade strategy and generate: the cheap model answers first, the full "
                   "model takes over where it is unsure.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: CascadeState = CascadeState()
        self.header = rich_label(self)
        self.legend = rich_label(self)
        self.legend.setText(
            f"{_swatch(CHEAP, 'cheap model')} &nbsp; {_swatch(FULL, 'full model')} &nbsp; "
            f"<span style='color:{ESCALATION_COLOR}'><b>{ESCALATION_MARK}</b></span> escalation point (the full "
            f"model takes over) &nbsp; {_swatch(FORCED, 'forced')} &nbsp; {_swatch(DISCARDED, 'thrown away')} "
            "(per response: the cheap response the full model rewrote) &nbsp; <i>hover a token for both models' "
            "figures</i>")
        self.text = CascadeText(self.state, self)
        self.figures = rich_label(self)
        self.figures.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.figures.setMinimumWidth(360)
        self._build_strip()
        self._build_layout()
        self._start_drawing()

    def _build_strip(self) -> None:
        self.strip = static_plot(self, "", "token", "cheap model's p", min_height=190)
        item = self.strip.getPlotItem()
        item.setMouseEnabled(x=True, y=False)  # long runs: drag or wheel along the tokens
        item.showGrid(y=True, alpha=0.15)
        self.bars = {kind: pg.BarGraphItem(x=[], height=[], width=0.8, brush=COLORS[kind], pen=pg.mkPen(None))
                     for kind in COLORS}
        self.threshold_line = pg.InfiniteLine(angle=0, movable=False,
                                              pen=pg.mkPen(THRESHOLD_COLOR, width=2, style=Qt.PenStyle.DashLine),
                                              label="threshold", labelOpts={"position": 0.995, "color": THRESHOLD_COLOR,
                                                                            "anchors": [(1, 1), (1, 1)],
                                                                            "fill": (255, 255, 255, 220)})
        self.mean_line = pg.InfiniteLine(angle=0, movable=False,
                                         pen=pg.mkPen(MEAN_COLOR, width=2, style=Qt.PenStyle.DotLine),
                                         label="mean", labelOpts={"position": 0.005, "color": MEAN_COLOR,
                                                                  "anchors": [(0, 1), (0, 1)],
                                                                  "fill": (255, 255, 255, 220)})
        self.escalation_marks = pg.ScatterPlotItem(symbol="t1", size=11, brush=ESCALATION_COLOR, pen=pg.mkPen(None))
        for graphic in (*self.bars.values(), self.threshold_line, self.mean_line, self.escalation_marks):
            item.addItem(graphic)
        item.setYRange(0, 1.12, padding=0)
        set_ticks(item.getAxis("left"), [[(v, f"{v:g}") for v in (0, 0.25, 0.5, 0.75, 1.0)]])
        item.getViewBox().sigXRangeChanged.connect(self._label_tokens)
        item.getViewBox().sigResized.connect(self._label_tokens)

    def _build_layout(self) -> None:
        top = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(QLabel("<b>Output</b>, coloured by the model that produced each token", left))
        left_layout.addWidget(self.text, 1)
        top.addWidget(left)
        top.addWidget(self.figures)
        top.setStretchFactor(0, 3)
        top.setStretchFactor(1, 2)
        top.setSizes([800, 480])
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.legend)
        layout.addWidget(top, 1)
        layout.addWidget(self.strip, 1)
        fill_with_scroll(self, content)

    # --- the view interface ---------------------------------------------------------------------------------
    def empty_text(self, run: Run | None) -> str:
        return ("Cascade: choose the cascade strategy and generate — each token is coloured here by the model "
                "that produced it, the cheap one or the full one.")

    def _forget(self) -> None:
        self.text.restyled = 0
        self.text.clear_marks()

    def _follow(self) -> None:
        self.text.follow()

    def _ended(self) -> None:
        self.text.follow()

    def paint_overlay(self, pixmap: QPixmap, origin: QWidget) -> None:
        """Screenshots: the tooltip of the last escalation point (tooltips are windows a grab would miss)."""
        marks = self.state.marks
        index = next((i for i in range(min(len(marks), self.text.drawn) - 1, -1, -1) if marks[i].escalation), None)
        if index is None:
            return
        rect = self.text.mark_rect(index)
        if not self.text.viewport().rect().contains(rect.center()):
            return
        tip = QLabel(mark_tooltip(self.state, marks[index]))
        tip.setStyleSheet("QLabel { background: #FFFFE8; color: #000; border: 1px solid #777; padding: 5px; }")
        viewport = self.text.viewport()
        tip.setWordWrap(True)
        tip.setFixedWidth(min(560, max(200, viewport.width() - 16)))
        tip.adjustSize()
        anchor = viewport.mapTo(origin, rect.bottomLeft() + QPoint(12, 6))
        right = viewport.mapTo(origin, viewport.rect().topRight()).x()
        x = max(0, min(anchor.x(), right - tip.width() - 4))
        y = anchor.y() if anchor.y() + tip.height() < pixmap.height() else max(0, anchor.y() - rect.height() - 12
                                                                                - tip.height())
        painter = QPainter(pixmap)
        tip.render(painter, QPoint(x, y))
        painter.end()

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_strip()
        self._draw_texts()

    def _draw_strip(self) -> None:
        state = self.state
        steps = state.confidence_steps()
        escalated = state.response is not None and state.response.escalated
        by_kind: dict[str, tuple[list[float], list[float]]] = {kind: ([], []) for kind in COLORS}
        for s in steps:
            if s.cheap_prob is None:
                continue
            kind = DISCARDED if s.draft and escalated else s.producer
            by_kind[kind][0].append(float(s.step))
            by_kind[kind][1].append(s.cheap_prob)
        for kind, (xs, heights) in by_kind.items():
            self.bars[kind].setOpts(x=np.asarray(xs), height=np.asarray(heights), width=0.8)
        threshold = state.threshold
        self.threshold_line.setVisible(threshold is not None)
        if threshold is not None:
            self.threshold_line.setValue(threshold)
            self.threshold_line.label.setFormat(f"threshold {threshold:g}")
        response = state.response
        self.mean_line.setVisible(response is not None)
        if response is not None:
            self.mean_line.setValue(response.mean_prob)
            self.mean_line.label.setFormat(f"mean {response.mean_prob:.3f}")
        points = [] if state.per_response else state.escalation_steps()
        self.escalation_marks.setData(x=[float(x) for x in points], y=[1.06] * len(points))
        item = self.strip.getPlotItem()
        if state.per_response:
            title = ("The cheap model's response: its p for each token it chose (dotted: their mean, vs the "
                     "dashed threshold)")
        else:
            title = (f"The cheap model's p per token: under the dashed threshold the full model decides "
                     f"({ESCALATION_MARK}: it takes over)")
        set_title(item, title, size="10pt")
        item.setXRange(-0.6, max(len(steps), 10) - 0.4, padding=0)
        self._label_tokens()

    def _label_tokens(self) -> None:
        """Token texts under the bars (every one when they fit, else every k-th)."""
        steps = self.state.confidence_steps()
        box = self.strip.getPlotItem().getViewBox()
        low, high = box.viewRange()[0]
        per_token = box.width() / max(high - low, 1.0)
        stride = max(1, math.ceil(58 / max(per_token, 1e-6)))
        ticks = [(float(s.step), short_label(visible_token_text(s.text), TICK_CHARS))
                 for s in steps if s.step % stride == 0]
        set_ticks(self.strip.getPlotItem().getAxis("bottom"), [ticks])

    def _draw_texts(self) -> None:
        state, started = self.state, self.state.started
        if started is None:
            self.figures.setText("")
            return
        status = status_html(state)
        how = "sampled" if started.do_sample else "greedy"
        rule = (f"the whole response is rewritten by the full model when the cheap model's mean p is below "
                f"<b>{started.threshold:g}</b>" if state.per_response else
                f"a token is decided by the full model when the cheap model's p is below <b>{started.threshold:g}</b>")
        self.header.setText(
            f"<b>Cascade</b> · cheap: {html.escape(started.cheap_detail)} · full: {html.escape(started.full_detail)}"
            f"<br>{rule} · {how} · {len(state.output)} tokens · {status}")
        self.figures.setText(self._figures_html())

    def _figures_html(self) -> str:
        s, started = self.state, cast(CascadeStarted, self.state.started)  # drawn once the run started
        n = len(s.output)
        rows = []
        if s.response is not None:
            r = s.response
            verdict = ("below: <b>thrown away</b>, the full model wrote the response" if r.escalated else
                       "not below: <b>kept</b>")
            rows.append(f"Verdict: the cheap response's mean p <b>{r.mean_prob:.3f}</b> over {r.tokens} tokens "
                        f"(lowest {r.min_prob:.3f}) vs threshold {r.threshold:g}: {verdict} · it took "
                        f"{r.draft_ms:.0f} ms")
        elif s.per_response and s.drafts:
            rows.append(f"The cheap model is writing its response: {len(s.drafts)} tokens so far")
        if n:
            share = s.full_share or 0.0
            forced = f" · forced: {s.counts[FORCED]}" if s.counts[FORCED] else ""
            rows.append(f"Full model: <b>{s.counts[FULL]}</b> of {n} tokens (<b>{format_percent(share)}</b>) in "
                        f"{s.escalations} escalation{'s' * (s.escalations != 1)} · cheap model: "
                        f"<b>{s.counts[CHEAP]}</b>{forced}")
        if s.full_passes:
            rows.append(f"Full model passes: {s.full_passes}, reading {s.full_read} positions (each pass catches up "
                        f"on what it missed; the first reads the prompt) · {s.full_ms / s.full_passes:.1f} ms a pass")
        elif n or s.drafts:
            rows.append("The full model has not run (not even on the prompt)")
        if s.cheap_steps:
            rows.append(f"Cheap model: {s.cheap_ms / s.cheap_steps:.1f} ms a token (its pass and choice)")
        rows += self._final_rows(started.cheap_macs / started.full_macs if started.full_macs else None)
        return "<br>".join(rows)

    def _final_rows(self, mac_ratio: float | None) -> list[str]:
        f = self.state.figures
        if not f:
            if self.state.ended:
                return []
            return ["<i>Agreement with the full model alone and the time saved come at the end of the run</i>"]
        rows = []
        if "identical_fraction" in f:
            first = int(f["first_divergence"])
            where = "none" if first < 0 else f"token {first}"
            same = format_percent(f["identical_fraction"])
            rows.append(f"Against the full model alone (same prompt and settings): <b>{same}</b> of tokens "
                        f"identical · first divergence: <b>{where}</b>")
            saved = f["time_saved"]
            verdict = (f"time saved <b>{format_percent(saved)}</b>" if saved >= 0 else
                       f"<b>slower</b>: {1 - saved:.2f}× the full model's time")
            rows.append(f"Speed, prompt included (measured): {f['tokens_per_s_with_prompt']:.1f} tokens/s vs "
                        f"{f['full_alone_tokens_per_s']:.1f} alone · {verdict}")
        elif self.state.ended:
            rows.append("Not compared with the full model alone (switched off, or the run was stopped)")
        if "compute_saved" in f and mac_ratio is not None:
            spent = 1 - f["compute_saved"]
            note = (" (a quantized copy does as many multiply-adds with cheaper weights: it saves memory traffic, "
                    "seen in the time, not arithmetic)") if math.isclose(mac_ratio, 1.0, rel_tol=1e-3) else ""
            rows.append(f"Weight multiply-adds (counted): <b>{spent:.2f}×</b> the full model alone's · the cheap "
                        f"model does {mac_ratio:.2f}× the full model's per position{note}")
        return rows
