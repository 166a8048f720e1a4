"""Qt-free state: folds engine events into what the views show (one module per view) and the session of runs."""

from playground.state.session import Branch, Run, Session, settings_summary
from playground.state.text import flowing_token_text, visible_token_text
from playground.state.tokens import (
    LOGPROB_FLOOR,
    REST_OF_VOCAB,
    ChartRow,
    character_piece,
    chart_candidates,
    chart_rows,
    chosen_text,
    cut_summary,
    most_interesting_step,
    rest_shares,
    shade_fraction,
    split_characters,
    token_bytes,
)

__all__ = [
    "LOGPROB_FLOOR",
    "REST_OF_VOCAB",
    "Branch",
    "ChartRow",
    "Run",
    "Session",
    "character_piece",
    "chart_candidates",
    "chart_rows",
    "chosen_text",
    "cut_summary",
    "flowing_token_text",
    "most_interesting_step",
    "rest_shares",
    "settings_summary",
    "shade_fraction",
    "split_characters",
    "token_bytes",
    "visible_token_text",
]
