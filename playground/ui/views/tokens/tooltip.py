"""A token's numbers in words: the hover tooltip (both distributions, or the one a server sent), the chosen
token's rank, and how a token that came without probabilities reads."""

from __future__ import annotations

import html

from playground.events import TokenStep
from playground.state import chart_rows, chosen_text, visible_token_text
from playground.state.grammar import forbidden_ids, forbidden_reason
from playground.ui.style import format_percent
from playground.ui.views.tokens.grammar_line import grammar_line

# A token the server sent without probabilities (llama-server's accepted draft tokens): neutral grey, apart from the
# probability ramp, so it reads neither as certain (pale) nor as unlikely (dark).
NO_PROBS_BG = "#DADADA"
NO_PROBS_FG = "#333333"
NO_PROBS_TEXT = "no probabilities from the server"


def has_probs(step: TokenStep) -> bool:
    """False for a server's token that came without probabilities (its numbers are placeholders)."""
    return step.has_probs


def is_remote_step(step: TokenStep) -> bool:
    """One number per token (a server's): no raw/processed pair to show."""
    return not step.two_distributions


def rank_text(step: TokenStep) -> str:
    """The chosen token's rank: "3", or "> 20" when the server's list does not say exactly (no engine streams
    ranks; they are inferred from the candidates it sends)."""
    if not has_probs(step):
        return "unknown"
    if not getattr(step, "rank_exact", True):
        return f"> {step.raw_rank - 1}" if step.raw_rank > 1 else "unknown"
    return str(step.raw_rank)


def _pct(prob: float) -> str:
    return html.escape(format_percent(prob))  # "<0.01%" would otherwise open an HTML tag


def token_tooltip_html(step: TokenStep, limit: int = 10, piece: tuple[str, str] | None = None,
                       what_if: str | None = None, constraint: str | None = None, json_path: str | None = None
                       ) -> str:
    """Top alternatives with both distributions, the chosen token's log-prob, coverage and the rest.

    ``piece``: (note, characters) when the token holds part of a character split across byte tokens.
    ``what_if``: the step is a what-if's re-derivation (its processed numbers are display only): this line says
    which settings, and the processed column is named so.
    ``constraint``: the run's constraint kind ("json_schema", ...), which names why a candidate the mask forbade is
    struck through; ``json_path``: where in the JSON document the step writes (a JSON-schema run).
    A server's token shows the one number the server sent (its distribution is in the status bar)."""
    if is_remote_step(step):
        return _remote_tooltip_html(step, limit, piece)
    part = f"<b>{html.escape(piece[0])}</b> (a split character shows once, where it completes)<br>" if piece else ""
    head = (f"<b>Step {step.step}</b> · chose <code>{html.escape(visible_token_text(chosen_text(step)))}</code>"
            f"{' <i>(forced by branching)</i>' if step.forced else ''}<br>{part}"
            f"log-prob (raw model, ln p) <b>{step.logprob:.2f}</b> (p = {_pct(step.raw_prob)}) · "
            f"raw rank {step.raw_rank} · "
            f"raw entropy {step.entropy:.2f} bits{grammar_line(getattr(step, 'grammar', None))}")
    if json_path is not None:
        head += f"<br>JSON path being written: <code>{html.escape(json_path)}</code>"
    forbidden = forbidden_ids(step)
    reason = forbidden_reason(constraint)
    processed_title = "after processors"
    if what_if is not None:
        head += f"<br>{what_if}"
        processed_title = "what-if (display only)"
    rows = ["<tr><th align=left>candidate</th><th align=right>raw model</th>"
            f"<th align=right>{processed_title}</th><th></th></tr>"]
    shown = chart_rows(step, limit)  # the chart's rows: chosen always in, then the rest of the vocabulary
    for r in shown[:-1]:
        mark = "◀ chosen" if r.chosen else ""
        struck = r.token_id in forbidden
        if struck:
            mark = f"{mark} {reason}".strip()
        elif r.cut_by:
            mark = f"{mark} cut by {r.cut_by}".strip()
        token = html.escape(r.label)
        weight = ("<b>", "</b>") if r.chosen else ("<s>", "</s>") if struck else ("", "")
        rows.append(f"<tr><td><code>{weight[0]}{token}{weight[1]}</code></td>"
                    f"<td align=right>{_pct(r.raw_prob)}</td>"
                    f"<td align=right>{_pct(r.processed_prob) if not r.cut_by else '—'}</td>"
                    f"<td>{mark}</td></tr>")
    rest = shown[-1]
    rows.append(f"<tr><td><i>rest of vocabulary</i></td><td align=right>{_pct(rest.raw_prob)}</td>"
                f"<td align=right>{_pct(rest.processed_prob)}</td><td></td></tr>")
    covered = 1.0 - rest.raw_prob
    foot = (f"Shown candidates cover {_pct(covered)} of the raw model's probability.<br>"
            "Double-click a bar in the chart or right-click here to continue from an alternative.")
    return f"{head}<table cellspacing=6 cellpadding=0>{''.join(rows)}</table>{foot}"


def _remote_tooltip_html(step: TokenStep, limit: int, piece: tuple[str, str] | None) -> str:
    """A server's token: one probability column (the server's), ranks inferred from its list."""
    part = f"<b>{html.escape(piece[0])}</b> (a split character shows once, where it completes)<br>" if piece else ""
    merged = getattr(step, "merged_bytes", 0)
    if merged:
        part += (f"the server folded the {merged} byte(s) of earlier tokens of this character into this entry; the "
                 "numbers are those of its last piece<br>")
    head = (f"<b>Step {step.step}</b> · chose <code>{html.escape(visible_token_text(chosen_text(step)))}</code>"
            f"{' <i>(forced by branching)</i>' if step.forced else ''}<br>{part}")
    if not has_probs(step):
        return (f"{head}<b>{NO_PROBS_TEXT}</b>: it sent this token without probabilities or candidates (llama-server "
                "does so for the tokens a draft model proposed and the model accepted), so it is drawn in neutral "
                "grey: neither certain nor unlikely.")
    head += (f"log-prob (the server's, ln p) <b>{step.logprob:.2f}</b> (p = {_pct(step.raw_prob)}) · "
             f"rank {rank_text(step)}<br>entropy ≥ {step.entropy:.2f} bits (over the candidates the server sent)")
    rows = ["<tr><th align=left>candidate</th><th align=right>server</th><th></th></tr>"]
    shown = chart_rows(step, limit)
    for r in shown[:-1]:
        weight = ("<b>", "</b>") if r.chosen else ("", "")
        rows.append(f"<tr><td><code>{weight[0]}{html.escape(r.label)}{weight[1]}</code></td>"
                    f"<td align=right>{_pct(r.raw_prob)}</td><td>{'◀ chosen' if r.chosen else ''}</td></tr>")
    rest = shown[-1]
    rows.append(f"<tr><td><i>rest of vocabulary</i></td><td align=right>{_pct(rest.raw_prob)}</td><td></td></tr>")
    foot = (f"The server's candidates cover {_pct(1.0 - rest.raw_prob)}; the rest is what they leave.<br>"
            "Double-click a bar in the chart or right-click here to continue from an alternative.")
    return f"{head}<table cellspacing=6 cellpadding=0>{''.join(rows)}</table>{foot}"
