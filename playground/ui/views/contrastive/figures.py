"""The contrastive view's header (the amateur, α, the run's status) and its figures: how often the contrast changed
the expert's choice, the plausible set, the costs, and (after the run) the comparison with plain greedy."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QWidget

from playground.state.contrastive import STEPS, ContrastiveState, dola_variant
from playground.state.fold import STATUS
from playground.ui.style import format_percent, rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.contrastive.style import ContrastiveOwner
from playground.ui.views.texts import status_html


def figures_html(s: ContrastiveState) -> str:
    n = len(s.steps)
    if not n:
        return ""
    chosen = n - s.forced
    share = format_percent(s.changed / chosen) if chosen else "—"
    rows = [f"<b>This run</b>: the contrast changed the expert's choice at <b>{s.changed}</b> of {chosen} steps "
            f"({share}) · plausible set: {s.mean_plausible:.1f} tokens on average · per step: amateur "
            f"{s.mean_ms(s.amateur_ms):.2f} ms, contrast maths {s.mean_ms(s.contrast_ms):.2f} ms, whole step "
            f"{s.mean_ms(s.step_ms):.1f} ms"]
    f = s.figures
    if "step_cost" in f:
        divergence = f.get("first_divergence")
        where = "" if divergence is None else (" · identical to greedy" if divergence < 0 else
                                               f" · first differs from greedy at token {int(divergence)}")
        rows.append(f"<b>Against plain greedy</b> (measured after the run, same prompt): a contrastive step costs "
                    f"<b>{f['step_cost']:.2f}×</b> a greedy step ({s.tokens_per_s:.1f} vs "
                    f"{f['greedy_tokens_per_s']:.1f} tokens/s){where}")
    return "<br>".join(rows)


class HeaderAndFigures(Panel):
    shows = frozenset({STATUS, STEPS})

    def __init__(self, view: ContrastiveOwner, parent: QWidget) -> None:
        self.view = view
        self.header = rich_label(parent)
        self.figures = rich_label(parent)

    def draw(self) -> None:
        state = self.view.state
        if state.started is None and not state.steps:
            self.figures.setText("")
            return
        status = status_html(state, "waiting for the first step…", under_way=bool(state.steps))
        started = state.started
        if started is not None:
            temperature = f" at T = {started.amateur_temperature:g}" if started.amateur_temperature != 1 else ""
            mode = "sampled from the normalised scores" if started.do_sample else "greedy on the scores"
            variant = dola_variant(started)
            which = f" · variant <b>{variant}</b>" if variant else ""
            what = (f" · amateur <b>{html.escape(started.amateur)}</b>{which}: {html.escape(started.detail)}"
                    f"{temperature} · "
                    f"α = {started.alpha:g} · {mode}")
        else:
            what = ""
        self.header.setText(f"<b>Contrastive decoding</b>{what} · {len(state.steps)} steps · {status}")
        self.figures.setText(figures_html(state))
