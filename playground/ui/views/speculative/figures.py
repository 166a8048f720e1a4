"""The speculative view's header (the drafter, its k, the run's status) and its live figures: acceptance, accepted
drafts per round, target calls saved, and the measured speed-up once the run's end brings it."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QWidget

from playground.state.fold import STATUS
from playground.state.speculative import ACCEPTED, GRAMMAR, REJECTED, ROUNDS, TARGET, SpeculativeState
from playground.ui.style import format_percent, rich_label
from playground.ui.views.columns import Panel
from playground.ui.views.speculative.plots import SpeculativeOwner
from playground.ui.views.speculative.text import DRAFT_Q_COLOR, TARGET_COLOR, swatch
from playground.ui.views.texts import status_html


def figures_html(s: SpeculativeState) -> str:
    rate = f"<b>{format_percent(s.acceptance_rate)}</b>" if s.acceptance_rate is not None else "—"
    alpha = f"{s.alpha:.2f}" if s.alpha is not None else "—"
    mean = f"<b>{s.mean_accepted:.2f}</b>" if s.mean_accepted is not None else "—"
    per_call = s.emitted / s.target_calls if s.target_calls else 0.0
    if s.is_tree:
        acceptance = (f"Acceptance: {rate} of {s.drafted} drafted nodes ({s.accepted} accepted, {s.rejected} off "
                      f"the path) · α = {alpha} per depth the target reached")
    else:
        acceptance = (f"Acceptance: {rate} of {s.drafted} drafts ({s.accepted} accepted, {s.rejected} rejected) · "
                      f"α = {alpha} of the drafts the target judged")
    rows = [
        acceptance,
        f"Mean accepted per round: {mean} drafts · {per_call:.2f} tokens per target call",
        f"Target calls saved: <b>{s.calls_saved}</b> = {s.plain_calls} plain ({s.emitted} tokens) − "
        f"{s.target_calls} speculative (one per round, the first reading the prompt too)",
    ]
    if s.constraint:
        rows.append(constraint_html(s))
    if s.speedup is not None and s.baseline_tokens_per_s:
        rows.append(f"Speed-up, measured: <b>{s.speedup:.2f}×</b> ({s.tokens_per_s:.1f} tokens/s vs "
                    f"{s.baseline_tokens_per_s:.1f} tokens/s decoding plainly on the same prompt)")
    elif s.ended:
        rows.append("Speed-up: not measured (the run skipped the plain baseline, or was stopped)")
    else:
        rows.append("Speed-up against plain decoding: <i>measured at the end</i> (a short plain run follows)")
    return "<br>".join(rows)


def constraint_html(s: SpeculativeState) -> str:
    """The acceptance under the constraint, split by where each token was drafted."""
    def part(name: str, span: str) -> str:
        drafted, accepted, _ = s.span_counts(span)
        rate = f" ({format_percent(accepted / drafted)})" if drafted else ""
        return f"{name} {accepted}/{drafted}{rate}"

    return (f"Under the constraint: <b>{s.grammar_rejected}</b> drafts rejected by the grammar before verification · "
            f"accepted at {part('forced steps', 'forced')}, {part('free steps', 'free')} · "
            f"{part('inside constrained spans', 'inside')}, {part('outside', 'outside')}")


def legend_html(constrained: bool) -> str:
    """The marks' legend; the grammar's mark only for a run with a constraint (a line less for the others)."""
    grammar = (f"{swatch(GRAMMAR, 'rejected by the grammar')} (a constraint's, before verification) &nbsp; "
               if constrained else "")
    return (f"{swatch(ACCEPTED, 'accepted draft')} &nbsp; {swatch(REJECTED, 'rejected draft')} (not in the "
            "output; shown where it was rejected; hatched in the charts) &nbsp; "
            f"{swatch(TARGET, 'target’s own token')} (correction or bonus) &nbsp; {grammar}"
            f"<span style='color:{DRAFT_Q_COLOR}'>■</span> drafter’s q &nbsp; "
            f"<span style='color:{TARGET_COLOR}'>■</span> target’s p &nbsp; "
            "<i>click a token or a round to inspect it</i>")


class HeaderAndFigures(Panel):
    shows = frozenset({STATUS, ROUNDS})

    def __init__(self, view: SpeculativeOwner, parent: QWidget) -> None:
        self.view = view
        self.header = rich_label(parent)
        self.figures = rich_label(parent)
        self.figures.setMinimumWidth(300)
        self.legend = rich_label(parent)
        self.legend.setText(legend_html(False))
        self._constrained = False

    def draw(self) -> None:
        state = self.view.state
        if bool(state.constraint) != self._constrained:
            self._constrained = bool(state.constraint)
            self.legend.setText(legend_html(self._constrained))
        if not state.rounds and not state.emitted:
            status = "waiting for the first round…" if not state.ended else "ended before any round"
            drafter = f" · {html.escape(state.drafter)} drafts {state.draft_k}" if state.drafter else ""
            if state.drafter and state.is_tree:
                drafter += f" deep, {state.tree_shape}"
            self.header.setText(f"<b>Speculative decoding</b>{drafter} · {status}")
            self.figures.setText("")
            return
        mode = "sampled (rejection rule)" if state.do_sample else "greedy"
        shape = f"k = {state.draft_k} deep, {state.tree_shape}" if state.is_tree else f"k = {state.draft_k}"
        self.header.setText(
            f"<b>Speculative decoding</b> · drafter <b>{html.escape(state.drafter)}</b> "
            f"({html.escape(state.detail)}) · {shape} · {mode} verification · "
            f"{len(state.rounds)} rounds · {state.emitted} tokens · {status_html(state)}")
        self.figures.setText(figures_html(state))
