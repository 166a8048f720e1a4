"""A constrained step's line in the token's tooltip: how many tokens the constraint allowed, the raw probability it
removed, whether it overrode the model's first choice, and the tokens it fixes from there (``TokenStep.grammar``)."""

from __future__ import annotations

import html

from playground.events.grammar import GrammarStep
from playground.ui.style import format_percent


def grammar_line(record: GrammarStep | None) -> str:
    """The tooltip's line for a step's constraint record ("" without one)."""
    if record is None:
        return ""
    allowed = "1 token (forced)" if record.allowed == 1 else f"{record.allowed:,} tokens"
    line = (f"<br>constraint: allowed {allowed} · removed {html.escape(format_percent(record.removed_mass))} of the "
            "raw probability")
    if record.top_forbidden:
        line += " · <b>overrode the model's top token</b>"
    if record.ff_tokens:
        line += f" · fixes the next {len(record.ff_tokens)} token{'s' if len(record.ff_tokens) > 1 else ''}"
    return line
