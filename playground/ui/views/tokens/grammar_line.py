"""A constrained step's line in the token's tooltip: how many tokens the constraint allowed, the raw probability it
removed, whether it overrode the model's first choice, and the tokens it fixes from there (``TokenStep.grammar``);
and the mark of a fast-forward token in the text (the constraint fixed it and the run fed it to the model in one
batched pass with the others it fixed): a dashed underline that leaves the shade readable."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCharFormat

from playground.events.grammar import GrammarStep
from playground.ui.style import format_percent

# A fast-forward token's dashed underline: Okabe-Ito green (not the what-if's red), lighter on a dark shade.
FAST_FORWARD_COLOR = "#009E73"
FAST_FORWARD_ON_DARK = "#7FEBC8"


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
    if record.fast_forward:
        line += ("<br><span style='color:" + FAST_FORWARD_COLOR + "'>fast-forward</span>: the constraint fixed this "
                 "token; its probabilities are from one batched pass over the tokens it fixed")
    return line


def mark_fast_forward(fmt: QTextCharFormat, record: GrammarStep | None) -> None:
    """Underline a fast-forward token's text (dashed, in ``FAST_FORWARD_COLOR``, or ``FAST_FORWARD_ON_DARK`` on a
    dark shade); others are left as they are."""
    if record is not None and record.fast_forward:
        brush = fmt.background()
        dark = brush.style() != Qt.BrushStyle.NoBrush and brush.color().lightnessF() < 0.5
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DashUnderline)
        fmt.setUnderlineColor(QColor(FAST_FORWARD_ON_DARK if dark else FAST_FORWARD_COLOR))
