"""What-if in the tokens view: a finished run's steps re-derived under the settings form's sampler values and order
(``playground.state.what_if``, from the raw candidates each step recorded), display only.

With the switch on, every change of the form re-derives all steps at once on the GUI thread (debounced by
DEBOUNCE_MS, so a spin box's keystrokes or a drag cost one re-derivation): the chart and the tooltips show the
re-derived processed probabilities and cuts, the output strikes through the tokens the new settings would have cut,
and the strip under the output marks, step by step, where greedy's pick is not the run's token, where the run's
token would be cut, where the kept set changes, and (grey, hatched) which steps are estimates and why. Switching it
off draws the run's own numbers again. "Continue from here with these settings" branches from the charted step:
the run's tokens before it forced, the form's sampler settings from it on.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QPainter
from PySide6.QtWidgets import QWidget

from playground.config import ConfigError, RunSettings, rows
from playground.config.catalog import get_strategy
from playground.config.samplers import SAMPLER_GROUPS, parse_sampler_order
from playground.events import TokenStep
from playground.state import Run, chosen_text, visible_token_text
from playground.state.what_if import RecordedRun, WhatIf, re_derive
from playground.ui.style import CUT_COLOR, format_percent
from playground.ui.views.tokens.candidates import WHAT_IF_BAR_COLOR as WHAT_IF_COLOR
from playground.ui.views.tokens.step_strip import StepStrip

CUT_MARK_COLOR = "#CC3311"  # a token the what-if settings would have cut: struck through, underlined red
DEBOUNCE_MS = 40
WHAT_IF_LABEL = "what-if: display only"
# The strip's rows: (key, words, colour).
STRIP_ROWS = (
    ("greedy", "greedy ≠ run", "#CC3311"),
    ("cut", "token cut", "#EE7733"),
    ("kept", "kept set ≠", "#0077BB"),
)
EXCLUDED = frozenset({"seed", "forced_token_ids"})  # sampling-section settings a re-derivation does not read


def what_if_fields() -> tuple[str, ...]:
    """The settings a what-if changes: the sampling and penalties sections' (the chain's order too)."""
    return tuple(r.name for r in rows(RunSettings)
                 if r.spec.section in ("sampling", "penalties") and r.name not in EXCLUDED)


def _value_text(name: str, value: Any) -> str:
    if name == "samplers":
        return " → ".join(parse_sampler_order(value)) if value else "transformers' order"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(repr(v) for v in value) or "none"
    return repr(value) if isinstance(value, str) else str(value)


def settings_diff(run: RunSettings, new: RunSettings) -> list[str]:
    """The what-if settings that differ from the run's, in words ("top-k 40 → 5")."""
    labels = {r.name: r.spec.label for r in rows(RunSettings)}
    out = [f"strategy {run.strategy} → {new.strategy}"] if run.strategy != new.strategy else []
    for name in what_if_fields():
        old, value = getattr(run, name), getattr(new, name)
        if old != value:
            out.append(f"{labels.get(name, name)} {_value_text(name, old)} → {_value_text(name, value)}")
    for group in SAMPLER_GROUPS:  # a sampler's own settings (top-a, ...): its group's fields
        group_labels = {r.name: r.spec.label for r in rows(group)}
        before, after = run.group(group), new.group(group)
        for f in dataclasses.fields(group):
            old, value = getattr(before, f.name), getattr(after, f.name)
            if old != value:
                out.append(f"{group_labels.get(f.name, f.name)} {_value_text(f.name, old)} → "
                           f"{_value_text(f.name, value)}")
    return out


def branch_settings(parent: RunSettings, new: RunSettings, forced: tuple[int, ...]) -> RunSettings:
    """The parent run's settings with the what-if's sampler values and order, forcing ``forced``."""
    values = {name: getattr(new, name) for name in what_if_fields()}
    # The form's strategy when it yields the same steps as the run's (greedy <-> sample), else the run's own.
    same_steps = get_strategy(new.strategy).step_events == get_strategy(parent.strategy).step_events
    strategy = new.strategy if same_steps else parent.strategy
    groups = (*(g for g in parent.groups if type(g) not in SAMPLER_GROUPS),  # the samplers' own: the what-if's
              *(new.group(group) for group in SAMPLER_GROUPS))
    return parent.replace(strategy=strategy, forced_token_ids=forced, groups=groups,
                          max_new_tokens=max(parent.max_new_tokens, len(forced) + 1), **values)


def step_under(step: TokenStep, what_if: WhatIf, row: int) -> TokenStep:
    """``step`` as the what-if re-derived it: its candidates' processed probabilities and cuts, the chosen token's
    processed probability and the processed entropy (over the recorded candidates) replaced; raw numbers kept."""
    ids = what_if.ids[row]
    column = {int(t): j for j, t in enumerate(ids.tolist()) if t >= 0}
    candidates = []
    for c in step.candidates:
        j = column.get(c.token_id)
        if j is None:  # shown but not among the recorded raw candidates (more shown than recorded)
            candidates.append(dataclasses.replace(c, processed_prob=0.0, cut_by="not recorded"))
            continue
        cut = what_if.cut_name(row, j)
        candidates.append(dataclasses.replace(c, processed_prob=0.0 if cut else float(what_if.probs[row, j]),
                                              cut_by=cut))
    p = what_if.probs[row]
    p = p[p > 0]
    entropy = float(-(p * np.log2(p)).sum()) if p.size else 0.0
    return dataclasses.replace(step, candidates=tuple(candidates), prob=float(what_if.chosen_prob[row]),
                               processed_entropy=entropy, effects=())


def _token(steps: list[TokenStep] | tuple[TokenStep, ...], row: int, token_id: int, what_if: WhatIf) -> str:
    """A token's text, from the step's candidates (else its id)."""
    step = steps[row]
    if token_id == step.token_id:
        return visible_token_text(chosen_text(step))
    text = next((c.text for c in step.candidates if c.token_id == token_id), None)
    return visible_token_text(text) if text is not None else f"id {token_id}"


class WhatIfState:
    """One run's what-if: its recorded candidates unpacked once, the run's own re-derivation (for the kept set's
    changes) once, then one ``re_derive`` per settings change."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.steps = tuple(run.steps)
        prompt = run.started.prompt_token_ids if run.started is not None else ()
        self.recorded = RecordedRun.of(self.steps, prompt)
        self.own = re_derive(self.recorded, run.settings)
        self.what_if: WhatIf | None = None
        self.settings: RunSettings | None = None
        self.diff: list[str] = []
        self.kept_changed = np.zeros(len(self.steps), dtype=bool)

    def matches(self, run: Run) -> bool:
        return run is self.run and len(run.steps) == len(self.steps)

    def derive(self, settings: RunSettings, encode: Any = None) -> WhatIf:
        self.settings = settings
        self.what_if = re_derive(self.recorded, settings, encode=encode)
        self.diff = settings_diff(self.run.settings, settings)
        self.kept_changed = (self.what_if.kept != self.own.kept).any(axis=1)
        return self.what_if

    def marks(self) -> dict[str, np.ndarray]:
        w = self.what_if
        assert w is not None
        return {"greedy": w.greedy_differs, "cut": w.chosen_cut, "kept": self.kept_changed}

    def step_tip(self, row: int) -> str:
        """The strip's hover for one step, in words."""
        w = self.what_if
        if w is None:
            return ""
        steps = self.steps
        lines = [f"<b>Step {row}</b> · the run chose <code>{_token(steps, row, int(w.chosen[row]), w)}</code>"]
        if w.greedy_differs[row]:
            lines.append(f"greedy would pick <code>{_token(steps, row, int(w.greedy[row]), w)}</code>")
        if w.chosen_cut[row]:
            column = int(np.nonzero(w.ids[row] == w.chosen[row])[0][0])
            lines.append(f"the run's token would be cut by {w.cut_name(row, column)}")
        if self.kept_changed[row]:
            lines.append(f"kept set: {int(w.kept[row].sum())} of the recorded candidates "
                         f"(the run's: {int(self.own.kept[row].sum())})")
        lines.append("exact" if w.exact[row] else f"<i>not exact</i>: {w.reasons[row]}")
        return "<br>".join(lines)


class WhatIfStrip(StepStrip):
    """A thin plot of the run's steps, left to right: a row of marks per kind of difference (``STRIP_ROWS``), grey
    hatching over the steps whose numbers are estimates, the charted step outlined. Hover a step for its details,
    click one to chart it."""

    ROWS = STRIP_ROWS

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.inexact: list[int] = []  # steps drawn hatched

    def set_marks(self, marks: dict[str, np.ndarray], exact: np.ndarray, tip: Any) -> None:
        self.steps = len(exact)
        self.marked = {key: np.nonzero(marks[key])[0].tolist() for key, _, _ in STRIP_ROWS}
        self.inexact = np.nonzero(~exact)[0].tolist()
        self.tip = tip
        self.update()

    def clear(self) -> None:
        self.set_marks({key: np.zeros(0, bool) for key, _, _ in STRIP_ROWS}, np.zeros(0, bool), None)

    def paint_cells(self, painter: QPainter) -> None:
        hatch = QBrush(QColor(CUT_COLOR), Qt.BrushStyle.BDiagPattern)
        for step in self.inexact:
            column = self._column(step)
            painter.fillRect(column, QColor("#E6E6E6"))
            painter.fillRect(column, hatch)
        for i, (key, _, color) in enumerate(STRIP_ROWS):
            for step in self.marked[key]:
                painter.fillRect(self.cell_rect(i, step), QColor(color))


def start_child(window: Any, run: Run, step: int, make: Callable[[RunSettings, tuple[int, ...]], RunSettings],
                words: str, waiting: str) -> str | None:
    """Continue ``run`` from ``step`` in ``window`` (the runs list gains the child) with the settings ``make``
    builds from the parent's and the run's tokens before ``step`` (forced); ``words``: the child's branch label;
    ``waiting``: the message while a job runs. The reason it cannot, or None. The window's own branch does the
    model checks (same model, a local one)."""
    source = getattr(window, "source", None)
    if source is None:
        return "Load a model to continue: a saved run replays without one, but continuing it needs the model"
    if window.busy:
        return waiting
    try:
        made = source.branch(window.session, run, step, run.steps[step].token_id)
        if made is None or made[2] is not None:
            return "This continues on a model loaded here (a server takes text, not these settings)"
        parent, branch, plan = made
        merged = make(parent, tuple(run.generated_ids[:step]))
        source.check(merged)
    except ConfigError as error:
        return str(error)
    window.start_run(merged, dataclasses.replace(branch, token_id=-1, token_text=words), plan)
    return None


def start_branch(window: Any, run: Run, step: int, settings: RunSettings) -> str | None:
    """Continue ``run`` from ``step`` with the what-if ``settings`` in ``window``; the reason it cannot, or None."""
    diff = settings_diff(run.settings, settings)
    words = "what-if settings" + (f" ({'; '.join(diff)})" if diff else "")
    return start_child(window, run, step, lambda parent, forced: branch_settings(parent, settings, forced), words,
                       "Wait for the current job to finish, then continue from the what-if")


def what_if_header(diff: list[str], exact: bool, reason: str, cut: str | None, prob: float,
                   separator: str = " · ") -> str:
    """The what-if's line for one step (the chart's header and the tooltip): what it is, which settings differ from
    the run's, the run's token under them, whether the numbers are exact."""
    changed = separator.join(html.escape(d) for d in diff) if diff else "the run's own settings"
    how = "exact" if exact else f"<i>estimate</i>: {html.escape(reason)}"
    fate = f"<b>cut by {html.escape(cut)}</b>" if cut else html.escape(format_percent(prob))
    return (f"<span style='color:{WHAT_IF_COLOR}'><b>{WHAT_IF_LABEL}</b></span> — {changed}<br>"
            f"the run's token under these settings: {fate} · {how}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if math.isfinite(seconds) else "?"


__all__ = ["DEBOUNCE_MS", "WHAT_IF_COLOR", "WhatIfState", "WhatIfStrip", "branch_settings", "settings_diff",
           "start_branch", "start_child", "step_under", "what_if_header"]
