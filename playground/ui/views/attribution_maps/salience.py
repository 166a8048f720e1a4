"""The salience view: which context tokens made a step's token likely, by each method, drawn on the text.

One row per method: the context (prompt, then the output before the step) with each token's background coloured
by its score on a diverging scale (red raised the token, blue lowered it; each method's own scale, ±its largest
|score|, written at the row's end), then how each pair of methods agrees (Spearman's ρ of their scores) and, where
two disagree (ρ under 0.5), a sentence saying so. "Explain step" computes the maps of any step of the shown run
on demand (a job with progress and Stop, for a run decoded here); the maps are kept with the run.
"""

from __future__ import annotations

import html
import math

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget

from playground.events import Event
from playground.events.salience import (
    DISAGREE_BELOW,
    METHOD_TITLES,
    SALIENCE_METHODS,
    SalienceAgreement,
    SalienceMap,
)
from playground.state import Run, visible_token_text
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.base import View, is_remote_run
from playground.ui.views.steering.heatmap import NEGATIVE, POSITIVE

PROMPT_EDGE = "#555555"


def mix(colour: str, share: float) -> str:
    """``colour`` blended with white: share 0 = white, 1 = the colour."""
    share = max(0.0, min(1.0, share))
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(255 + (c - 255) * share):02x}" for c in (r, g, b))


def score_colour(score: float, top: float) -> str:
    if top <= 0 or not math.isfinite(score):
        return "#ffffff"
    return mix(POSITIVE if score > 0 else NEGATIVE, abs(score) / top)


def tokens_html(m: SalienceMap) -> str:
    top = max((abs(s) for s in m.scores), default=0.0)
    parts = []
    for i, (text, score) in enumerate(zip(m.tokens, m.scores, strict=True)):
        if i == m.prompt_tokens:
            parts.append(f'<span style="color:{PROMPT_EDGE}">│</span>')
        shown = html.escape(visible_token_text(text)).replace(" ", "&nbsp;")
        parts.append(f'<span style="background-color:{score_colour(score, top)}" title="{score:+.3f}">{shown}</span>')
    return "".join(parts) + f'&nbsp;&nbsp;<span style="color:{PROMPT_EDGE}">(±{top:.3g} nats)</span>'


COMPLETENESS_SHARE = 0.1  # integrated gradients' sum further than this share from its target: a warning


def completeness_warning(m: SalienceMap) -> str:
    """Integrated gradients' scores should add up to log p − log p(baseline); far from it, the path integral has
    not converged at this many points (the scores are not to be trusted)."""
    if "expected_sum" not in m.figures:
        return ""
    gap, expected = m.figures["completeness_gap"], m.figures["expected_sum"]
    if abs(gap) <= COMPLETENESS_SHARE * max(abs(expected), 1e-6):
        return ""
    return (f'<br><span style="color:{NEGATIVE}"><b>Not converged:</b> the scores add up to {m.figures["sum"]:.2f}, '
            f"not {expected:.2f} (off by {gap:+.2f}); the path from the baseline is rough here: raise the IG steps "
            "(--ig-steps) or read occlusion instead.</span>")


def agreement_html(agreement: SalienceAgreement, maps: dict[str, SalienceMap]) -> str:
    lines = []
    for (a, b), rho in zip(agreement.pairs, agreement.rho, strict=True):
        lines.append(f"{METHOD_TITLES[a]} ~ {METHOD_TITLES[b]}: ρ = {rho:+.2f}")
    text = "Rank agreement (Spearman): " + "; ".join(lines) + "."
    disagree = [(a, b, r) for (a, b), r in zip(agreement.pairs, agreement.rho, strict=True)
                if math.isfinite(r) and r < DISAGREE_BELOW]
    for a, b, rho in disagree:
        first = {m: visible_token_text(maps[m].tokens[max(range(len(maps[m].scores)), key=maps[m].scores.__getitem__)])
                 for m in (a, b)}
        text += (f"<br><b>{METHOD_TITLES[a]} and {METHOD_TITLES[b]} disagree</b> (ρ {rho:+.2f} &lt; "
                 f"{DISAGREE_BELOW}): they rank the context differently; most salient "
                 f"{html.escape(repr(first[a]))} vs {html.escape(repr(first[b]))}.")
    if not disagree and lines:
        text += f" The methods agree (every ρ ≥ {DISAGREE_BELOW})."
    return text


@register_view
class SalienceView(View):
    name = "salience"
    title = "Prompt salience"
    consumes = (SalienceMap,)
    explains_steps = True
    salience_requested = Signal(int)  # the step to explain

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = rich_label()
        self.step_box = QSpinBox()
        self.step_box.setPrefix("step ")
        self.explain = QPushButton("Explain step")
        self.explain.setToolTip("Compute occlusion, gradient × input and integrated gradients for this step's "
                                "token (a background job: progress in the status bar, Stop ends it); kept with "
                                "the run")
        self.explain.clicked.connect(lambda: self.salience_requested.emit(self.step_box.value()))
        self.step_box.valueChanged.connect(lambda _v: self._redraw())
        controls = QHBoxLayout()
        controls.addWidget(self.step_box)
        controls.addWidget(self.explain)
        controls.addStretch(1)
        self.rows: dict[str, tuple[QLabel, QLabel]] = {}
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.header)
        for method in SALIENCE_METHODS:
            name, row = rich_label(), rich_label()
            layout.addWidget(name)
            layout.addWidget(row)
            self.rows[method] = (name, row)
        self.agreement = rich_label()
        layout.addWidget(self.agreement)
        self.legend = rich_label()
        self.legend.setText(
            f'<span style="background-color:{POSITIVE}">&nbsp;&nbsp;&nbsp;</span> raised log p(token) · '
            f'<span style="background-color:{NEGATIVE}">&nbsp;&nbsp;&nbsp;</span> lowered it · each row on its own '
            f"scale (±its largest |score|, in nats of log p) · │ ends the prompt · hover a token for its score")
        layout.addWidget(self.legend)
        layout.addStretch(1)
        self.reset()

    def applies_to(self, run: Run) -> bool:
        """A run holding salience maps, or a local run of tokens (whose steps can be explained on demand)."""
        return super().applies_to(run) or (bool(run.steps) and not is_remote_run(run))

    def wants_front(self, run: Run) -> bool:
        return any(isinstance(e, SalienceMap) for e in run.step_events)

    def reset(self) -> None:
        self.maps: dict[int, dict[str, SalienceMap]] = {}
        self.agreements: dict[int, SalienceAgreement] = {}
        self.steps = 0
        self.local = True
        self._redraw()

    def apply(self, run: Run, events: list[Event]) -> None:
        latest = None
        for event in events:
            if isinstance(event, SalienceMap):
                self.maps.setdefault(event.step, {})[event.method] = event
                latest = event.step
            elif isinstance(event, SalienceAgreement):
                self.agreements[event.step] = event
        self.steps = len(run.steps)
        self.local = not is_remote_run(run) and run.source is None
        self.step_box.setRange(0, max(0, self.steps - 1))
        if latest is not None:
            self.step_box.setValue(latest)

    def flush(self) -> None:
        self._redraw()

    def end(self, run: Run) -> None:
        self._redraw()

    def _redraw(self) -> None:
        step = self.step_box.value()
        maps = self.maps.get(step, {})
        self.explain.setEnabled(self.steps > 0 and self.local)
        self.explain.setText(f"Explain step {step}" if step not in self.maps else f"Explain step {step} again")
        if not maps:
            done = ", ".join(str(s) for s in sorted(self.maps)) or "none yet"
            self.header.setText(f"No salience for step {step} (steps explained: {done}). "
                                + ("Press <b>Explain step</b> to compute it." if self.local else
                                   "A saved or server run shows the maps it holds; load a model and decode to "
                                   "explain other steps."))
        else:
            first = next(iter(maps.values()))
            self.header.setText(
                f"Step {step}: why {html.escape(repr(visible_token_text(first.target_text)))} "
                f"(log p {first.target_logprob:.3f} under the raw model). Baseline {html.escape(first.baseline)}.")
        for method, (name, row) in self.rows.items():
            m = maps.get(method)
            name.setVisible(m is not None)
            row.setVisible(m is not None)
            if m is not None:
                name.setText(f"<b>{METHOD_TITLES[method]}</b> — {html.escape(m.detail)} ({m.seconds:.1f} s)")
                row.setText(tokens_html(m) + completeness_warning(m))
        agreement = self.agreements.get(step)
        self.agreement.setText(agreement_html(agreement, maps) if agreement is not None and maps else "")
