"""The sequence so far, token by token (the prompt in grey), with the shown step's token boxed and the hovered
candidate's most similar earlier token marked: the token whose last hidden state the candidate's resembles most."""

from __future__ import annotations

import html

from playground.state.contrastive_search import ContrastiveSearchState

SIMILAR_COLOR = "#FFD84D"  # the marked earlier token (the marks' yellow, as the shown step elsewhere)
PROMPT_COLOR = "#777777"


def sequence_html(state: ContrastiveSearchState, upto: int, similar: int | None) -> str:
    """Every position before ``upto`` (the shown step's), then that step's token boxed; ``similar``: the position to
    mark. Text is escaped; newlines break lines."""
    parts = []
    prompt = state.prompt_length
    for position, text in enumerate(state.texts[: upto + 1]):
        shown = html.escape(text).replace("\n", "↵<br>") or "∅"
        style = [] if position >= prompt else [f"color:{PROMPT_COLOR}"]
        if position == similar:
            style += [f"background:{SIMILAR_COLOR}", "color:#000000", "font-weight:bold"]
        if position == upto:
            style += ["border:1px solid #222222", "text-decoration:underline", "font-weight:bold"]
        span = f"<span style='{';'.join(style)}'>{shown}</span>" if style else shown
        parts.append(f"<a name='similar'></a>{span}" if position == similar else span)
    return "<div style='white-space:pre-wrap'>" + "".join(parts) + "</div>"
