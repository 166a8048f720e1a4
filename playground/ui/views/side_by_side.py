"""The side-by-side panes: several outputs of the same prompt in aligned columns, compared with the first.

One component for the quantization lab (reference vs quantized copy) and the strategies comparison. Each pane shows
its label, status and figures, and its output token by token: a token that differs from the reference pane's token
at the same step is tinted, the pane's first divergence is marked in red, and tokens after it are greyed (from there
on the two texts follow different prefixes, so position-by-position differences no longer mean much).

A refresh appends the tokens that came since the last one, and the paragraph being written is kept to a few lines as
the token view keeps its own (rewriting a 2,000-token document in four panes took 33 ms of the GUI thread per
refresh, and appending to one long paragraph still 18 ms). A pane is rewritten only when marks already drawn
change: its divergence was found late (a pane that ended early), or the reference pane got tokens it lacked when
they were drawn (a beam pane's text comes at its end).
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QResizeEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QHBoxLayout, QTextEdit, QVBoxLayout, QWidget

from playground.state import flowing_token_text
from playground.state.panes import PaneRecord, PanesState
from playground.ui.marked_text import split_wrapped_paragraph
from playground.ui.style import mono_font, rich_label

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


PLAIN, DIFFERS, DIVERGES, AFTER = "plain", "differs", "diverges", "after"


def token_mark(state: PanesState, index: int, step: int) -> str:
    """How pane ``index``'s token at ``step`` is marked against pane 0."""
    diverged = state.divergence[index]
    if diverged is not None and step == diverged:
        return DIVERGES
    if diverged is not None and step > diverged:
        return AFTER
    return DIFFERS if state.differs(index, step) else PLAIN


def pane_pieces(state: PanesState, index: int, start: int = 0) -> list[tuple[str, str]]:
    """A pane's output from token ``start`` on, as (text, mark); a pane without token events (beam search) is its
    final text, unmarked."""
    pane = state.panes[index]
    if not pane.texts:
        return [(pane.finished.text, PLAIN)] if pane.finished is not None and start == 0 else []
    return [(text, token_mark(state, index, step)) for step, text in enumerate(pane.texts[start:], start=start)]


def _formats() -> dict[str, QTextCharFormat]:
    formats = {}
    for mark, (foreground, background) in {PLAIN: (SAME_COLOR, None), DIFFERS: (SAME_COLOR, DIFFERS_BG),
                                           DIVERGES: ("#FFFFFF", DIVERGE_BG), AFTER: (AFTER_COLOR, None)}.items():
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(foreground))
        if background is not None:
            fmt.setBackground(QColor(background))
        formats[mark] = fmt
    return formats


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
        self._formats = _formats()
        self.forget()

    def forget(self) -> None:
        """Nothing drawn yet."""
        self.text.clear()
        self._drawn = 0  # tokens (or the final text: 1) in the document
        self._divergence: int | None = None  # the divergence the drawn marks were made with
        self._reference_len = 0  # pane 0's tokens when they were drawn
        self._ended = False
        self._pane: PaneRecord | None = None  # the record drawn (a new run brings new records)
        self._split_width: float | None = None  # the width paragraphs were split for (None: no splits)
        self._state: PanesState | None = None

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        width = self.text.document().textWidth()
        if self._split_width is not None and width != self._split_width and self._state is not None:
            state = self._state  # lines split for the old width would now end early or wrap twice: draw again
            self.forget()
            self.draw(state)

    def draw(self, state: PanesState) -> None:
        """Bring the document up to the pane: append what is new, or rewrite it when drawn marks changed."""
        pane = state.panes[self.index]
        reference_len = len(state.panes[0].token_ids)
        count = len(pane.texts) if pane.texts else int(pane.finished is not None)
        stale = (pane is not self._pane or state.divergence[self.index] != self._divergence or count < self._drawn
                 or (self._drawn > self._reference_len and reference_len != self._reference_len))
        if stale:
            self.forget()
        self._state = state
        bar = self.text.verticalScrollBar()  # streaming: follow the end; once finished: read from the top
        if count != self._drawn or stale:
            cursor = QTextCursor(self.text.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.beginEditBlock()  # one layout for the batch
            for text, mark in pane_pieces(state, self.index, self._drawn):
                cursor.insertText(flowing_token_text(text), self._formats[mark])
            cursor.endEditBlock()
            if split_wrapped_paragraph(self.text.document()) is not None:  # appends lay out only the last line
                self._split_width = self.text.document().textWidth()
            self._drawn, self._divergence, self._reference_len = count, state.divergence[self.index], reference_len
            self._pane = pane
            if pane.finished is None:
                bar.setValue(bar.maximum())
        # Once finished: its first line, also when the end comes after the last token was drawn. The text's own
        # cursor goes there too: the appends left it at the end, and a text edit first shown (a dock opened after
        # the run) scrolls to its cursor, which left the pane at its end with its top line cut.
        if pane.finished is not None and not self._ended:
            self._ended = True
            self.text.moveCursor(QTextCursor.MoveOperation.Start)
            bar.setValue(bar.minimum())


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
            column.draw(self.state)
            figures = self.figure_text(i, pane) if self.figure_text is not None else ""
            column.figures.setText(figures)
            column.figures.setVisible(bool(figures))
            column.show()
