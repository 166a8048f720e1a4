"""The bar chart of one step's candidates: raw vs processed probability, the chosen one, what was cut.

Items are built once and updated with ``setOpts``/``setTicks``; the value labels are one item that draws them all.
Bars are horizontal so token labels read left to right on the axis.

While a run streams the chart is redrawn several times a second, and on a 2-core CPU every millisecond the GUI
thread spends is taken from the model: hence the opaque grid, the single value-label item, the header outside the
layout and the stepped axis extent below (benchmarks/bench_window.py measures the window against a plain thread).
"""

from __future__ import annotations

import html
import time

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPen
from PySide6.QtWidgets import QApplication, QLabel, QMenu, QSizePolicy, QVBoxLayout, QWidget

from playground.events import TokenStep
from playground.state import (
    ChartRow,
    chart_candidates,
    chart_rows,
    chosen_text,
    cut_summary,
    rest_shares,
    visible_token_text,
)
from playground.state.grammar import forbidden_ids, forbidden_reason
from playground.ui.style import (
    CHOSEN_COLOR,
    CUT_COLOR,
    MARK_BAND_COLOR,
    PROCESSED_COLOR,
    RAW_COLOR,
    format_percent,
    rich_label,
)
from playground.ui.views.drawing import LabelsAxis, set_ticks
from playground.ui.views.tokens.tooltip import rank_text

FORBIDDEN_MARK = "✗"  # before an axis label the constraint forbade (a tick label has no strike-out of its own)
FORBIDDEN_COLOR = "#CC3311"  # constraint.REMOVED_COLOR: the stroke through a bar the constraint forbade, its words
WHAT_IF_BAR_COLOR = "#009988"  # views/tokens/what_if.py's WHAT_IF_COLOR: the what-if's processed bars

MAX_ROWS = 15  # candidates drawn (plus the rest-of-vocabulary row); the tooltip and trace hold more
LABEL_CHARS = 20
BAR = 0.36  # thickness of one bar; a row holds two (raw above, processed below)
# The probability axis ends at one of these (percent), and holds the widest that a run's steps up to the shown one
# needed: it only widens while a run streams, so bars compare across steps and the axis is not drawn again for
# every step (a third of a chart update here; in an animation, the grid lines moving cost most of the chart's
# share of each frame).
X_EXTENTS = (10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130)


def _pct(prob: float) -> str:
    return html.escape(format_percent(prob))  # for rich text: "<0.01%" would open a tag


class GridAxis(LabelsAxis):
    """An axis whose grid lines are opaque (pre-blended over the background) and drawn behind the bars.

    pyqtgraph draws a grid as translucent lines on top of the plot; Qt's raster engine blends those pixel by
    pixel, which was three quarters of the chart's repaint time (~3.5 of ~4.7 ms here). The same greys, opaque,
    cost a fraction of that; behind the bars they no longer stripe them.
    """

    def __init__(self, orientation: str, background: QColor, **kwargs) -> None:
        super().__init__(orientation, **kwargs)
        self._background = background
        self._pens: dict[int, QPen] = {}

    def _opaque(self, pen: QPen) -> QPen:
        color = pen.color()
        key = color.rgba()
        if color.alpha() == 255:
            return pen
        if key not in self._pens:
            a, bg = color.alphaF(), self._background
            opaque = QPen(pen)
            opaque.setColor(QColor.fromRgbF(color.redF() * a + bg.redF() * (1 - a),
                                            color.greenF() * a + bg.greenF() * (1 - a),
                                            color.blueF() * a + bg.blueF() * (1 - a)))
            self._pens[key] = opaque
        return self._pens[key]

    def generateDrawSpecs(self, p):
        specs = super().generateDrawSpecs(p)
        if specs is None or self.grid is False:
            return specs
        axis_spec, tick_specs, text_specs = specs
        return axis_spec, [(self._opaque(pen), start, stop) for pen, start, stop in tick_specs], text_specs


class ValueLabel:
    """One value label (text, colour, data-space anchor); drawn by ``ValueLabels``. Reads like a text item."""

    __slots__ = ("color", "text", "visible", "x", "y")

    def __init__(self) -> None:
        self.text = ""
        self.color = QColor()
        self.x = self.y = 0.0
        self.visible = False

    def set(self, text: str, color: str, x: float, y: float) -> None:
        self.text, self.color, self.x, self.y, self.visible = text, QColor(color), x, y, True

    def toPlainText(self) -> str:
        return self.text

    def isVisible(self) -> bool:
        return self.visible


class ValueLabels(pg.GraphicsObject):
    """All value labels of the chart in one item: each drawn in pixels, left-aligned and centred on its anchor.

    One item drawing ~30 short strings replaces ~30 ``pg.TextItem``s, each a rich-text document whose transform
    is recomputed while the scene paints, which scheduled a second full repaint of the chart after every update.
    """

    PAD_PX = 4.0  # gap between a bar's end and its label

    def __init__(self, font: QFont) -> None:
        super().__init__()
        self.labels: list[ValueLabel] = []
        self._font = font
        metrics = QFontMetricsF(font)
        self._baseline = (metrics.ascent() - metrics.descent()) / 2  # from the anchor's y to the baseline
        self._bounds = QRectF()

    def label(self, index: int) -> ValueLabel:
        while len(self.labels) <= index:
            self.labels.append(ValueLabel())
        return self.labels[index]

    def changed(self, view_rect: QRectF) -> None:
        """Labels were edited: redraw. ``view_rect`` (data space) bounds what can be seen of them."""
        if view_rect != self._bounds:
            self.prepareGeometryChange()
            self._bounds = QRectF(view_rect)
        self.update()

    def dataBounds(self, ax, frac=1.0, orthoRange=None):
        return None, None  # labels never widen the view

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter, *args) -> None:
        to_device = painter.transform()
        painter.resetTransform()  # text in pixels, whatever the data scale
        painter.setFont(self._font)
        for label in self.labels:
            if label.visible:
                anchor = to_device.map(QPointF(label.x, label.y))
                painter.setPen(label.color)
                painter.drawText(QPointF(anchor.x() + self.PAD_PX, anchor.y() + self._baseline), label.text)


class LabelBox(QWidget):
    """Holds a word-wrapped label outside any layout, so a new text does not lay the whole window out again.

    A label in a layout asks every layout up to the main window (docks and all) to recompute on each new text,
    and its transparent background has every widget beneath it repaint. Here the request stops at this box,
    which changes its own height only when the text needs more or fewer lines; the label paints its own
    background.
    """

    def __init__(self, label: QLabel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = label
        label.setParent(self)
        label.setAutoFillBackground(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._fit()

    def _fit(self) -> None:
        width = max(1, self.width())
        height = self.label.heightForWidth(width) if self.label.wordWrap() else -1
        if height < 0:
            height = self.label.sizeHint().height()
        if height != self.minimumHeight() or height != self.maximumHeight():
            self.setFixedHeight(height)
        self.label.setGeometry(0, 0, width, height)

    def sizeHint(self) -> QSize:
        return QSize(self.label.sizeHint().width(), self.minimumHeight())

    def minimumSizeHint(self) -> QSize:
        return QSize(50, self.minimumHeight())

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:  # the label's text (or font) changed
            self._fit()
            return True
        return super().event(event)

    def resizeEvent(self, event) -> None:
        self._fit()
        super().resizeEvent(event)


def _x_extent(needed: float) -> float:
    return float(next((x for x in X_EXTENTS if x >= needed), needed))


def _extent_for(bars: list[float]) -> float:
    """The axis that ``bars`` (percent) need: the widest, with room for the value label beside it."""
    return _x_extent(max(8.0, max(bars, default=0.0) * 1.18 + 6))


def _extent_of(rows: list[ChartRow], remote: bool) -> float:
    """The axis a step's rows need."""
    return _extent_for([r.raw_prob * 100 for r in rows]
                       + [0.0 if r.cut_by or remote else r.processed_prob * 100 for r in rows])


def step_extent(step: TokenStep) -> float:
    """The axis ``step`` needs on its own (percent): what the chart widens to, at least, when it shows it."""
    remote = not step.two_distributions
    if remote and not step.has_probs:
        return 0.0
    # The rows' bars without their labels (reading each token's visible text was most of this, once a step).
    candidates = chart_candidates(step, MAX_ROWS)
    raw_rest, processed_rest = rest_shares(candidates)
    bars = [c.raw_prob * 100 for c in candidates] + [raw_rest * 100]
    if not remote:
        bars += [0.0 if c.cut_by else c.processed_prob * 100 for c in candidates] + [processed_rest * 100]
    return _extent_for(bars)



class HeldExtents:
    """The axis the chart holds at each step of a run: the widest that any step up to it needed (a running
    maximum), kept per step so that going back to a step shows the axis it streamed with."""

    def __init__(self) -> None:
        self._steps: list[TokenStep] = []  # the steps measured, to notice a run rolled back and rewritten
        self._held: list[float] = []

    def up_to(self, steps: list[TokenStep], index: int) -> float:
        kept = min(len(self._steps), len(steps))
        while kept and self._steps[kept - 1] is not steps[kept - 1]:  # rolled back: only the tail differs
            kept -= 1
        del self._steps[kept:], self._held[kept:]
        for step in steps[len(self._steps):index + 1]:
            self._held.append(max(step_extent(step), self._held[-1] if self._held else 0.0))
            self._steps.append(step)
        return self._held[index]


def _axis_label(row: ChartRow, character: str | None = None, forbidden: bool = False) -> str:
    """The token's text, shortened; the chosen row is marked, with the character its byte belongs to if known; a
    candidate the constraint forbade is marked ✗ (its bar is struck through)."""
    text = row.label if len(row.label) <= LABEL_CHARS else row.label[: LABEL_CHARS - 1] + "…"
    if forbidden:
        return f"{FORBIDDEN_MARK} {text}"
    if row.chosen and character:
        text = f"{text} ({character})"
    return f"▶ {text}" if row.chosen else text


class CandidatesPanel(QWidget):
    """``show_step(step)`` draws a step; ``reset()`` empties it. Double-click a bar to branch from it; right-click it
    for its menu: why the step's token and not this one (``why_requested``), or continue from it."""

    branch_requested = Signal(int, int)  # step, token id
    why_requested = Signal(int, int)  # step, token id: why the step chose its token and not this candidate

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.step: TokenStep | None = None
        self.rows: list[ChartRow] = []
        self.total_steps = 0
        self._last_click: tuple[int | None, float] = (None, 0.0)
        self._ticked_extent = 0.0  # the axis extent its tick spacing was set for
        self.menu: QMenu | None = None  # the last candidate's right-click menu

        self.header = rich_label(self)
        header_box = LabelBox(self.header, self)  # redrawn several times a second while a run streams
        self.legend = rich_label(self)
        self.remote_label: str | None = None  # a server's run: which distribution its numbers are
        self.what_if_html: str | None = None  # the what-if's line while it is on: the bars are its numbers
        self.constraint: str | None = None  # the shown run's constraint kind: why a forbidden candidate is struck
        self.forbidden_rows: list[int] = []  # rows struck through: candidates the constraint forbade
        self._set_legend()

        background = pg.mkColor(pg.getConfigOption("background"))
        self.plot = pg.PlotWidget(self, axisItems={"bottom": GridAxis("bottom", background),
                                                   "left": LabelsAxis("left")})
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setMouseEnabled(x=False, y=False)
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.25)
        # Grid lines at the labelled ticks only: minor ones (every 2 % at most ranges) add little to a chart whose
        # bars carry their values, and all of them move whenever the axis rescales, which an animation pays for
        # in every frame (about two thirds of a GIF frame of this chart).
        item.getAxis("bottom").setStyle(maxTickLevel=0)
        item.setLabel("bottom", "probability (%)")
        item.getAxis("left").setStyle(tickFont=QFont("DejaVu Sans Mono", 9), autoExpandTextSpace=True)
        item.getAxis("left").setWidth(150)
        item.getAxis("bottom").setZValue(-1)  # the grid behind the plot area and its bars (PlotItem sets 0.5)
        for side in ("left", "bottom"):  # no units to scale; else every range change re-sets the label's HTML
            item.getAxis(side).enableAutoSIPrefix(False)

        self._chosen_pen, self._no_pen = pg.mkPen(CHOSEN_COLOR, width=2), pg.mkPen(None)  # made once, not per bar
        self._band = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=MARK_BAND_COLOR, pen=pg.mkPen(None))
        self._raw = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=RAW_COLOR, pen=pg.mkPen(None))
        self._processed = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=PROCESSED_COLOR,
                                          pen=pg.mkPen(None))
        cut_brush = QBrush(QColor(CUT_COLOR), Qt.BrushStyle.BDiagPattern)
        self._cut = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=cut_brush, pen=pg.mkPen(CUT_COLOR))
        # A stroke through the raw bar of each candidate the constraint forbade.
        self._struck = pg.BarGraphItem(x0=[], y=[], width=[], height=[], brush=FORBIDDEN_COLOR, pen=pg.mkPen(None))
        for bar in (self._band, self._raw, self._processed, self._cut, self._struck):
            item.addItem(bar)
        self._band.setZValue(-10)
        self._value_labels = ValueLabels(QFont("DejaVu Sans", 8))
        item.addItem(self._value_labels)

        self.plot.scene().sigMouseClicked.connect(self._on_click)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(header_box)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        self.reset()

    def set_remote(self, label: str | None, note: str = "") -> None:
        """Chart a server's steps (``label``: which distribution its numbers are) or a local run's (None)."""
        if label == self.remote_label:
            return
        self.remote_label = label
        self._set_legend(note)

    def _set_legend(self, note: str = "") -> None:
        if self.remote_label is not None:
            self.legend.setToolTip(note)
            self.legend.setText(
                f"<span style='color:{RAW_COLOR}'>■</span> the server's probability ({html.escape(self.remote_label)})"
                " &nbsp; ▶ chosen token &nbsp; <i>double-click a bar to continue from that token</i><br>"
                "only the candidates the server sent; the rest row is what they leave")
            return
        self.legend.setToolTip("")
        if self.what_if_html is not None:
            self.legend.setText(
                f"<span style='color:{RAW_COLOR}'>■</span> raw model (recorded) &nbsp; "
                f"<span style='color:{WHAT_IF_BAR_COLOR}'>■</span> <b>what-if: display only</b> (re-derived with the "
                f"form's settings)<br><span style='color:{CUT_COLOR}'>▨</span> the what-if cuts it &nbsp; "
                "▶ chosen token &nbsp; <i>switch what-if off for the run's own numbers</i>")
            return
        self.legend.setText(
            f"<span style='color:{RAW_COLOR}'>■</span> raw model (softmax of the logits) &nbsp; "
            f"<span style='color:{PROCESSED_COLOR}'>■</span> after processors (picked from)<br>"
            f"<span style='color:{CUT_COLOR}'>▨</span> cut by a processor &nbsp; ▶ chosen token &nbsp; "
            + (f"<span style='color:{FORBIDDEN_COLOR}'>{FORBIDDEN_MARK} <s>struck</s> = "
               f"{forbidden_reason(self.constraint)}</span>"
               " &nbsp; " if self.constraint is not None else "")
            + "<i>double-click: continue from it; right-click: why not it?</i>")

    def set_constraint(self, kind: str | None) -> None:
        """The shown run's constraint kind (None: none): the legend says what a struck candidate is."""
        if kind != self.constraint:
            self.constraint = kind
            self._set_legend()

    def set_what_if(self, html_line: str | None) -> None:
        """Chart the what-if's re-derived numbers (``html_line``: what it is, under the step's header) or the run's
        own (None). The next ``show_step`` draws them."""
        if (html_line is None) != (self.what_if_html is None):
            self._processed.setOpts(brush=WHAT_IF_BAR_COLOR if html_line is not None else PROCESSED_COLOR)
            self.what_if_html = html_line
            self._set_legend()
        self.what_if_html = html_line

    # --- drawing ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.step = None
        self.rows = []
        self.header.setText("<b>Candidates</b> — run a generation, then click a token to see its step here.")
        self.forbidden_rows = []
        for bar in (self._band, self._raw, self._processed, self._cut, self._struck):
            bar.setOpts(x0=[], y=[], width=[], height=[])
        for label in self._labels:
            label.visible = False
        set_ticks(self.plot.getPlotItem().getAxis("left"), [[]])
        self.plot.getPlotItem().setXRange(0, 100, padding=0)  # an empty chart still reads in percent
        self._apply_range()

    def _apply_range(self) -> None:
        """Move the plot to its new range now, not while the scene paints: pyqtgraph applies a range change
        in its paint preparation, which moves every item and so schedules a second full repaint."""
        view = self.plot.getPlotItem().getViewBox()
        view.updateMatrix()
        self._value_labels.changed(view.viewRect())

    @property
    def _labels(self) -> list[ValueLabel]:
        return self._value_labels.labels

    def show_step(self, step: TokenStep, total_steps: int | None = None, character: str | None = None,
                  extent: float = 0.0) -> None:
        """Draw ``step``; the probability axis ends at ``extent`` percent, or wider where the step needs it."""
        self.step = step
        if total_steps is not None:
            self.total_steps = total_steps
        remote = not step.two_distributions  # a server's one number per token
        if remote and not step.has_probs:
            self._show_no_probs(step)
            return
        self.rows = rows = chart_rows(step, MAX_ROWS)
        n = len(rows)
        y = list(range(n))
        raw = [r.raw_prob * 100 for r in rows]
        # A server sends one number per token: one bar per row (its distribution is in the legend).
        processed = [0.0 if r.cut_by or remote else r.processed_prob * 100 for r in rows]
        cut_rows = [i for i, r in enumerate(rows) if r.cut_by]
        forbidden = forbidden_ids(step)
        self.forbidden_rows = struck = [i for i, r in enumerate(rows) if r.token_id in forbidden]
        x_max = max(extent, _extent_of(rows, remote))
        pens = [self._chosen_pen if r.chosen else self._no_pen for r in rows]

        chosen = [i for i, r in enumerate(rows) if r.chosen]
        self._band.setOpts(x0=[0] * len(chosen), y=chosen, width=[x_max] * len(chosen), height=[0.96] * len(chosen))
        self._raw.setOpts(x0=[0] * n, y=[i - BAR / 2 for i in y], width=raw, height=[BAR] * n, pens=pens)
        self._processed.setOpts(x0=[0] * n, y=[i + BAR / 2 for i in y], width=processed, height=[BAR] * n,
                                pens=pens)
        self._cut.setOpts(x0=[0] * len(cut_rows), y=[i + BAR / 2 for i in cut_rows],
                          width=[max(raw[i], x_max * 0.01) for i in cut_rows], height=[BAR] * len(cut_rows))
        self._struck.setOpts(x0=[-x_max * 0.01] * len(struck), y=[i - BAR / 2 for i in struck],
                             width=[max(raw[i], x_max * 0.01) + x_max * 0.02 for i in struck],
                             height=[BAR * 0.22] * len(struck))

        labels = self._value_labels
        for i, r in enumerate(rows):
            labels.label(2 * i).set(format_percent(r.raw_prob), RAW_COLOR, raw[i] + x_max * 0.01, i - BAR / 2)
            if remote:
                labels.label(2 * i + 1).visible = False
            elif i in struck:
                labels.label(2 * i + 1).set(forbidden_reason(self.constraint), FORBIDDEN_COLOR,
                                            max(raw[i], x_max * 0.01) + x_max * 0.01, i + BAR / 2)
            elif r.cut_by:
                labels.label(2 * i + 1).set(f"cut by {r.cut_by}", "#555555",
                                            max(raw[i], x_max * 0.01) + x_max * 0.01, i + BAR / 2)
            else:
                labels.label(2 * i + 1).set(format_percent(r.processed_prob),
                                            WHAT_IF_BAR_COLOR if self.what_if_html is not None else PROCESSED_COLOR,
                                            processed[i] + x_max * 0.01, i + BAR / 2)
        for label in labels.labels[2 * n:]:
            label.visible = False

        item = self.plot.getPlotItem()
        set_ticks(item.getAxis("left"), [[(i, _axis_label(r, character, i in struck)) for i, r in enumerate(rows)]])
        if x_max != self._ticked_extent:  # labelled grid lines a readable step apart (only those are drawn)
            self._ticked_extent = x_max
            spacing = 5 if x_max <= 30 else 10 if x_max <= 70 else 20
            item.getAxis("bottom").setTickSpacing(major=spacing, minor=spacing)
        item.setXRange(0, x_max, padding=0)
        item.setYRange(-0.6, n - 0.4, padding=0)
        self._apply_range()
        if remote:
            self.header.setText(self._remote_header_html(step))
        elif self.what_if_html is not None:
            self.header.setText(self._what_if_header_html(step))
        else:
            self.header.setText(self._header_html(step))

    def _show_no_probs(self, step: TokenStep) -> None:
        """A token the server sent without probabilities: no bars (none would be true), and say so."""
        self.rows = []
        self.forbidden_rows = []
        for bar in (self._band, self._raw, self._processed, self._cut, self._struck):
            bar.setOpts(x0=[], y=[], width=[], height=[])
        for label in self._labels:
            label.visible = False
        item = self.plot.getPlotItem()
        set_ticks(item.getAxis("left"), [[]])
        item.setXRange(0, 100, padding=0)
        self._apply_range()
        of = f" · token {step.step + 1} of {self.total_steps}" if self.total_steps else ""
        token = html.escape(visible_token_text(chosen_text(step)))
        self.header.setText(
            f"<b>Step {step.step}</b>{of} · chose <code>{token}</code>: <b>no probabilities from the server</b><br>"
            "it sent this token without numbers or candidates (llama-server does so for a draft model's accepted "
            "tokens): nothing to chart")

    def _remote_header_html(self, step: TokenStep) -> str:
        of = f" · token {step.step + 1} of {self.total_steps}" if self.total_steps else ""
        token = html.escape(visible_token_text(chosen_text(step)))
        forced = " <i>(forced)</i>" if step.forced else ""
        label = html.escape(self.remote_label or "server")
        return (f"<b>Step {step.step}</b>{of} · chose <code>{token}</code>{forced}: {_pct(step.raw_prob)} "
                f"({label}) · rank {rank_text(step)} · entropy ≥ {step.entropy:.2f} bits<br>"
                f"the candidates the server sent cover {_pct(1.0 - self.rows[-1].raw_prob)} of the probability")

    def _what_if_header_html(self, step: TokenStep) -> str:
        of = f" · token {step.step + 1} of {self.total_steps}" if self.total_steps else ""
        token = html.escape(visible_token_text(chosen_text(step)))
        forced = " <i>(forced)</i>" if step.forced else ""
        return (f"<b>Step {step.step}</b>{of} · chose <code>{token}</code>{forced}: raw {_pct(step.raw_prob)} · "
                f"{self.what_if_html}")

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
        if self.step is None:
            return
        row = self.row_at_scene(event.scenePos())
        if event.button() == Qt.MouseButton.RightButton:
            menu = self.candidate_menu(row) if row is not None else None
            if menu is not None:
                event.accept()
                menu.popup(event.screenPos().toPoint())
            return
        if event.button() != Qt.MouseButton.LeftButton:
            return
        now = time.monotonic()
        # A second click on the same row counts as a double-click whether or not the scene flagged it.
        double = event.double() or (row is not None and self._last_click[0] == row
                                    and now - self._last_click[1] < QApplication.doubleClickInterval() / 1000)
        self._last_click = (row, now)
        if double and row is not None:
            self._last_click = (None, 0.0)
            self.request_branch(row)

    def candidate_menu(self, row: int) -> QMenu | None:
        """The right-click menu of a candidate's row (None for the chosen token's and the rest-of-vocabulary row):
        "Why <chosen> and not <it>?" and "Continue from <it>"."""
        target = self.rows[row] if 0 <= row < len(self.rows) else None
        step = self.step
        if step is None or target is None or target.token_id is None or target.chosen:
            return None
        token_id = target.token_id
        label = target.label.replace("&", "&&")  # a menu item's "&" marks its shortcut key
        chosen = visible_token_text(chosen_text(step)).replace("&", "&&")
        menu = QMenu(self)
        why = menu.addAction(f"Why '{chosen}' and not '{label}'?")
        why.setToolTip("The why-this-token view splits this step's logit difference by layer and head")
        why.triggered.connect(lambda: self.why_requested.emit(step.step, token_id))
        menu.addAction(f"Continue from '{label}'").triggered.connect(lambda: self.request_branch(row))
        self.menu = menu
        return menu

    def request_branch(self, row: int) -> None:
        target = self.rows[row]
        if self.step is not None and target.token_id is not None and not target.chosen:
            self.branch_requested.emit(self.step.step, target.token_id)
