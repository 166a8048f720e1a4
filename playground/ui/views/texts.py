"""What the views write the same way: a label cut to a few characters, a long text cut in its middle, and the run's
status at the end of a view's header."""

from __future__ import annotations

import html

from playground.state.fold import Fold


def short_label(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: cut, with "…" at the end (an axis tick, a node's label)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_middle(text: str, limit: int = 60) -> str:
    """Start and end of a long text (hypotheses often share a long start and differ at the end)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " … " + text[-(limit - head - 3) :]


def status_html(fold: Fold, waiting: str = "running…", under_way: bool = True) -> str:
    """The run's state for a header: "finished (eos)", how it ended without finishing (bold: failed, stopped),
    "running…" once ``under_way``, else ``waiting``."""
    text = html.escape(fold.status(waiting, under_way))
    return f"<b>{text}</b>" if fold.stop_reason is None and fold.ended_status else text
