"""The constraint made visible in the tokens view (``TokenStep.grammar``; figures from ``playground.state.grammar``):

- a strip over the output, one column per step and a row per kind of step: forced (one token allowed), overrode
  (the model's raw top token forbidden) and free; each cell filled with its row's colour at an opacity equal to the
  raw probability the mask removed there (``removed_shade``), outlined so that a step that lost nothing still shows;
  hover a cell for the step's figures and, on a JSON-schema run, the JSON path being written;
- a line under the text: the steps where the constraint overrode the model's top token, the forced steps, and the
  log-probability it cost (``Σ −ln(1 − removed mass)``, the renormalisation), with a button that continues the run
  from the charted step without the constraint (``start_unconstrained``: what the model would have said).

The token text's "constraint" shading and the candidates' strike-through use the same colour and reason words.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from playground.events import TokenStep
from playground.state import Run, chosen_text, visible_token_text
from playground.state.grammar import (
    CONSTRAINT_WORDS,
    ConstraintSummary,
    renormalisation_cost,
    step_kinds,
    unconstrained_settings,
)
from playground.state.json_path import json_places
from playground.ui.style import format_percent
from playground.ui.views.tokens.candidates import LabelBox
from playground.ui.views.tokens.step_strip import StepStrip
from playground.ui.views.tokens.what_if import start_child

REMOVED_COLOR = "#CC3311"  # the raw probability a constraint removed: this red, as opaque as the share removed
# The strip's rows: (key, words, colour); a step forced to a token the model did not rank first sits in both rows.
CONSTRAINT_ROWS = (
    ("forced", "forced", "#762A83"),
    ("overrode", "overrode top", REMOVED_COLOR),
    ("free", "free", "#0077BB"),
)
STRIP_HELP = ("One column per step. Rows: forced = the constraint allowed one token; overrode top = it forbade the "
              "model's raw top token (a step can be both); free = neither. Each cell is as opaque as the share of the "
              "raw probability the constraint removed at that step. Hover a step for its figures, click to chart it.")
UNCONSTRAINED_WORDS = "without the constraint"


def removed_shade(removed_mass: float, color: str = REMOVED_COLOR) -> QColor:
    """``color`` with an opacity equal to the raw mass removed (0: transparent, 1: opaque)."""
    shade = QColor(color)
    shade.setAlpha(round(255 * min(1.0, max(0.0, removed_mass))))
    return shade


def text_on_removed(removed_mass: float) -> QColor:
    """Black or white, whichever reads better on ``removed_shade(removed_mass)`` over white."""
    return QColor("#FFFFFF") if removed_mass > 0.6 else QColor("#000000")


def constraint_name(kind: str | None) -> str:
    return CONSTRAINT_WORDS.get(kind or "", "the constraint")


def json_path_lines(steps: Sequence[TokenStep], kind: str | None) -> list[str]:
    """Each step's JSON path (where the text before its token is) on a JSON-schema run; [] on others."""
    if kind != "json_schema":
        return []
    return [place.describe() for place in json_places([s.text for s in steps])]


def step_figures(step: TokenStep) -> str:
    """A constrained step's figures in words (the strip's hover)."""
    record = step.grammar
    if record is None:
        return f"<b>Step {step.step}</b>: no constraint record"
    kinds = step_kinds(step)
    how = " and ".join({"forced": "forced (1 token allowed)", "overrode": "<b>overrode the model's top token</b>",
                        "free": f"free ({record.allowed:,} tokens allowed)"}[k] for k in kinds)
    cost = renormalisation_cost(record)
    return (f"<b>Step {step.step}</b> · chose <code>{html.escape(visible_token_text(chosen_text(step)))}</code> · "
            f"{how}<br>removed {html.escape(format_percent(record.removed_mass))} of the raw probability · costs "
            f"{cost:.3f} nats (−ln(1 − removed))")


class ConstraintStrip(StepStrip):
    """The strip over the output (``CONSTRAINT_ROWS``): a cell per step in each row its kind puts it in, shaded by
    the raw mass removed."""

    ROWS = CONSTRAINT_ROWS

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.removed: list[float] = []
        self.help = STRIP_HELP

    def set_steps(self, steps: Sequence[TokenStep], tip: Any) -> None:
        self.steps = len(steps)
        self.removed = [s.grammar.removed_mass if s.grammar is not None else 0.0 for s in steps]
        kinds = [step_kinds(s) for s in steps]
        self.marked = {key: [i for i, k in enumerate(kinds) if key in k] for key, _, _ in CONSTRAINT_ROWS}
        self.tip = tip
        self.update()

    def clear(self) -> None:
        self.set_steps([], None)

    def cell_color(self, key: str, step: int) -> QColor:
        """The fill of ``step``'s cell in row ``key``."""
        color = next(c for k, _, c in CONSTRAINT_ROWS if k == key)
        return removed_shade(self.removed[step], color)

    def paint_cells(self, painter: QPainter) -> None:
        for i, (key, _, color) in enumerate(CONSTRAINT_ROWS):
            outline = QColor(color)
            for step in self.marked[key]:
                cell = self.cell_rect(i, step)
                painter.fillRect(cell, self.cell_color(key, step))
                painter.setPen(outline)
                painter.drawRect(cell.adjusted(0, 0, -1, -1))


def summary_html(summary: ConstraintSummary | None, kind: str | None) -> str:
    """The line under the text ("" without constrained steps)."""
    if summary is None:
        return ""
    n = summary.steps
    cost = f"<b>{summary.cost:.2f} nats</b>"
    if summary.unbounded:
        cost = (f"<b>unbounded</b> ({len(summary.unbounded)} step{'s' if len(summary.unbounded) != 1 else ''} "
                f"left no raw probability; {summary.cost:.2f} nats over the others)")
    p = summary.kept_probability
    chance = f"{p:.1e}" if 0 < p < 1e-4 else "< 1e-300" if p == 0 else format_percent(p)
    kept = "" if summary.unbounded else (
        f"; the raw model keeps to it along this output with probability e<sup>−{summary.cost:.2f}</sup> = "
        f"{html.escape(chance)}")
    return (f"<b>Constraint</b> ({html.escape(constraint_name(kind))}): overrode the model's top token at "
            f"<b>{len(summary.overrode)}</b> of {n} steps · forced (1 token allowed) at <b>{len(summary.forced)}"
            f"</b> · cost {cost} of log-probability = Σ −ln(1 − raw mass removed) over the steps (the "
            f"renormalisation){kept}")


class ConstraintBar(QWidget):
    """The summary line and "Continue without the constraint" (hidden without constrained steps)."""

    unconstrained = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel(self)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        self.label.setMinimumWidth(60)
        self.button = QPushButton("Branch unconstrained", self)
        self.button.setToolTip("Continue without the constraint from the charted step: the same settings minus the "
                               "constraint; the run's "
                               "tokens before it are forced, the model chooses freely from it on (a new run in the "
                               "runs list)")
        self.button.clicked.connect(self.unconstrained)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 2)
        # In a box that stops the layout request of each new text (it changes as a run streams) at itself.
        layout.addWidget(LabelBox(self.label, self), 1)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_summary(self, summary: ConstraintSummary | None, kind: str | None) -> None:
        text = summary_html(summary, kind)
        if text != self.label.text():
            self.label.setText(text)
        self.setVisible(bool(text))


def start_unconstrained(window: Any, run: Run, step: int) -> str | None:
    """Continue ``run`` from ``step`` without its constraint (the runs list gains the child); why not, or None."""
    if not 0 <= step < len(run.steps):
        return f"run #{run.index + 1} has no step {step}"
    return start_child(window, run, step, unconstrained_settings, UNCONSTRAINED_WORDS,
                       "Wait for the current job to finish, then continue without the constraint")


def removed_legend_ticks() -> tuple[tuple[float, str], ...]:
    """The legend's ticks for the "constraint" shading: removed share -> label."""
    return tuple((m, f"{m * 100:g}%") for m in (0.0, 0.25, 0.5, 0.75, 1.0))


__all__ = ["CONSTRAINT_ROWS", "REMOVED_COLOR", "ConstraintBar", "ConstraintStrip", "json_path_lines",
           "removed_shade", "start_unconstrained", "step_figures", "summary_html", "text_on_removed"]
