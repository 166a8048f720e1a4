"""The side-by-side panes: several outputs of the same prompt in aligned columns, compared with the first.

One component for the quantization lab (reference vs quantized copy) and the strategies comparison. Each pane shows
its label, status and figures, and its output token by token: a token that differs from the reference pane's token
at the same step is tinted, the pane's first divergence is marked in red, and tokens after it are greyed (from there
on the two texts follow different prefixes, so position-by-position differences no longer mean much).

Each refresh rewrites a pane's document from the ``PanesState`` (a few hundred spans: well under a millisecond), so a
divergence settled late (a pane that ended early) is drawn right.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QTextEdit, QVBoxLayout, QWidget

from playground.state import flowing_token_text
from playground.state.panes import PaneRecord, PanesState
from playground.ui.style import format_percent, mono_font, rich_label

SAME_COLOR = "#222222"
DIFFERS_BG = "#FCE3C8"  # a token that differs from the reference's at the same step (orange tint)
DIVERGE_BG = "#CC3311"  # the first divergence (Tol's red), white text
AFTER_COLOR = "#8A8A8A"  # after the first divergence: grey
PANE_COLORS = ("#0077BB", "#EE7733", "#009988", "#AA3377")  # pane titles, one colour per pane everywhere

FigureText = Callable[[int, PaneRecord], str]


def legend_html() -> str:
    return (f"<span style='background:{DIFFERS_BG}'>&nbsp;differs from the reference at that step&nbsp;</span> "
            f"<span style='background:{DIVERGE_BG};color:white'>&nbsp;first divergence&nbsp;</span> "
            f"<span style='color:{AFTER_COLOR}'>after it (the prefixes differ)</span>")


def pane_html(state: PanesState, index: int) -> str:
    """A pane's output as rich text, marked against pane 0."""
    pane = state.panes[index]
    diverged = state.divergence[index] if index < len(state.divergence) else None
    parts = []
    if pane.texts:
        pieces = pane.texts
    elif pane.finished is not None:  # no token events (beam search): its final text, unmarked
        pieces = [pane.finished.text]
    else:
        pieces = []
    for step, text in enumerate(pieces):
        shown = html.escape(flowing_token_text(text)).replace("\n", "<br>")
        if not pane.texts:
            parts.append(shown)
        elif diverged is not None and step == diverged:
            parts.append(f"<span style='background:{DIVERGE_BG};color:white'>{shown}</span>")
        elif diverged is not None and step > diverged:
            parts.append(f"<span style='color:{AFTER_COLOR}'>{shown}</span>")
        elif state.differs(index, step):
            parts.append(f"<span style='background:{DIFFERS_BG}'>{shown}</span>")
        else:
            parts.append(shown)
    return "".join(parts)


def pane_status(state: PanesState, index: int) -> str:
    pane = state.panes[index]
    tokens = len(pane.token_ids)
    if pane.finished is not None:
        status = f"{pane.finished.stop_reason} · {tokens} tokens · {pane.finished.tokens_per_s:.1f} tok/s"
    elif state.run_ended:
        status = f"ended · {tokens} tokens"
    else:
        status = f"running · {tokens} tokens"
    if index == 0:
        return status + " · <b>reference</b>"
    diverged = state.divergence[index]
    if diverged is not None:
        return status + f" · <b style='color:{DIVERGE_BG}'>diverges at token {diverged + 1}</b>"
    same = "identical so far" if pane.finished is None else "identical to the reference"
    return status + f" · {same}"


class PaneColumn(QFrame):
    def __init__(self, index: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.title = rich_label(self)
        self.figures = rich_label(self)
        self.text = QTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setFont(mono_font(11))
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.title)
        layout.addWidget(self.text, stretch=1)
        layout.addWidget(self.figures)


class SideBySidePanes(QWidget):
    """Up to four aligned panes over one ``PanesState``; ``refresh()`` redraws them from it."""

    MAX_PANES = 4

    def __init__(self, state: PanesState, figure_text: FigureText | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.figure_text = figure_text  # the figures line under a pane (None: none)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.legend = rich_label(self)
        self.legend.setText(legend_html())
        outer.addWidget(self.legend)
        row = QHBoxLayout()
        outer.addLayout(row, stretch=1)
        self.columns = [PaneColumn(i, self) for i in range(self.MAX_PANES)]
        for column in self.columns:
            row.addWidget(column, stretch=1)
            column.hide()

    def refresh(self) -> None:
        for i, column in enumerate(self.columns):
            if i >= len(self.state.panes):
                column.hide()
                continue
            pane = self.state.panes[i]
            color = PANE_COLORS[i % len(PANE_COLORS)]
            column.title.setText(f"<b style='color:{color}'>{html.escape(pane.label)}</b><br>"
                                 f"<span style='color:#555'>{pane_status(self.state, i)}</span>")
            rendered = pane_html(self.state, i)
            if rendered != getattr(column, "_shown", None):
                column._shown = rendered  # rewriting an unchanged document would reset the reader's scroll
                column.text.setHtml(f"<div style='color:{SAME_COLOR}'>{rendered}</div>")
                bar = column.text.verticalScrollBar()  # streaming: follow the end; finished: read from the top
                bar.setValue(bar.minimum() if pane.finished is not None else bar.maximum())
            figures = self.figure_text(i, pane) if self.figure_text is not None else ""
            column.figures.setText(figures)
            column.figures.setVisible(bool(figures))
            column.show()

    def token_probability(self, index: int, step: int) -> str:
        pane = self.state.panes[index]
        return format_percent(pane.probs[step]) if step < len(pane.probs) else ""
