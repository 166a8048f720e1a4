"""The speculative view's marked output: every drafted and target token in one QTextEdit document, coloured by
what the target said about it (accepted, rejected and struck through, or the target's own), and the colours the whole
view shares.

Marks are appended once (a widget per token would crawl on long outputs); each mark's character range is recorded
so hover and click find the mark under the mouse. Hidden rejected drafts keep an empty range. The paragraph being
written is kept to a few lines as the token view keeps its own (``MarkedTextEdit``), so an append costs what is new,
not the output's length.
"""

from __future__ import annotations

import html
from typing import cast

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from playground.state import flowing_token_text, visible_token_text
from playground.state.speculative import ACCEPTED, FORCED, GRAMMAR, REJECTED, TARGET, Mark, SpeculativeState
from playground.ui.marked_text import MarkedTextEdit
from playground.ui.style import MARK_BAND_COLOR, MARK_COLOR, format_percent, mono_font

# One colour per meaning, everywhere in this view (Paul Tol's colour-blind-safe "vibrant" set): text, bars, labels.
ACCEPTED_COLOR = "#009988"  # teal: a drafted token the target kept
REJECTED_COLOR = "#CC3311"  # red: a drafted token the target threw away (also struck through / hatched)
TARGET_COLOR = "#0077BB"  # blue: the target's own token (correction or bonus), and the target's p
DRAFT_Q_COLOR = "#999999"  # grey: the drafter's q
FORCED_COLOR = "#777777"
GRAMMAR_COLOR = "#EE3377"  # magenta: a drafted token the constraint forbade (rejected before verification)
TINTS = {ACCEPTED: "#D5F0EC", REJECTED: "#F8DCD5", TARGET: "#D6E7F4", FORCED: "#EEEEEE", GRAMMAR: "#FADCE8"}
KIND_COLORS = {ACCEPTED: ACCEPTED_COLOR, REJECTED: REJECTED_COLOR, TARGET: TARGET_COLOR, FORCED: FORCED_COLOR,
               GRAMMAR: GRAMMAR_COLOR}
STRUCK = (REJECTED, GRAMMAR)  # not in the output: struck through
SPAN_WORDS = {"forced": "a forced step (the grammar allowed one token)",
              "inside": "inside a constrained span", "outside": "outside constrained spans (free text)"}


def _pct(prob: float) -> str:
    return html.escape(format_percent(prob))


def swatch(kind: str, text: str) -> str:
    """A legend entry: ``text`` styled as a mark of ``kind``."""
    style = f"color:{KIND_COLORS[kind]};background:{TINTS[kind]};"
    if kind in STRUCK:
        return f"<span style='{style}'><s>&nbsp;{text}&nbsp;</s></span>"
    return f"<span style='{style}'>&nbsp;{text}&nbsp;</span>"


class MarkedText(MarkedTextEdit):
    """The output with every drafted and target token marked; knows which mark is under the mouse."""

    mark_clicked = Signal(int)  # index into the state's marks

    def __init__(self, state: SpeculativeState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.setReadOnly(True)
        self.setFont(mono_font(12))
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.NoTextInteraction)
        self.show_rejected = True
        self._band: tuple[int, int] = (0, 0)  # the marks ``mark_range`` banded
        self._formats = {kind: self._format(kind) for kind in KIND_COLORS}

    @staticmethod
    def _format(kind: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(KIND_COLORS[kind]))
        fmt.setBackground(QColor(TINTS[kind]))
        fmt.setFontStrikeOut(kind in STRUCK)
        fmt.setFontItalic(kind == FORCED)
        if kind == TARGET:
            fmt.setFontWeight(700)
        return fmt

    def redraw(self) -> None:
        drawn, band = self.drawn, self._band
        self.clear_marks()
        self.append_marks(self.state.marks[:drawn])
        self.mark_range(*band)

    def append_marks(self, marks: list[Mark]) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for mark in marks:
            if mark.kind in STRUCK:  # not part of the output: kept on one line, line breaks shown as ↵
                text = flowing_token_text(mark.text).replace("\n", "") if mark.text else "∅"
            else:
                text = flowing_token_text(mark.text) if mark.text else "·"
            self.starts.append(cursor.position())
            if mark.kind not in STRUCK or self.show_rejected:
                cursor.insertText(text, self._formats[mark.kind])
            self.ends.append(cursor.position())
        self.split_paragraph()
        bar = self.verticalScrollBar()
        if bar.value() >= bar.maximum() - 40:  # follow the stream unless the user scrolled up
            bar.setValue(bar.maximum())

    def mark_range(self, first: int, end: int) -> None:
        """Band the marks ``first`` to ``end`` (a round) with the view's "selected" colour."""
        self._band = (first, end)
        if not 0 <= first < end <= self.drawn or self.starts[first] == self.ends[end - 1]:
            self.setExtraSelections([])
            return
        selection = QTextEdit.ExtraSelection()
        cursor = QTextCursor(self.document())
        cursor.setPosition(self.starts[first])
        cursor.setPosition(self.ends[end - 1], QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(MARK_BAND_COLOR))
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.SingleUnderline)
        fmt.setUnderlineColor(QColor(MARK_COLOR).darker(150))
        selection.format = fmt
        self.setExtraSelections([selection])
        probe = QTextCursor(self.document())
        probe.setPosition(self.starts[first])
        if not self.viewport().rect().contains(self.cursorRect(probe)):
            self.setTextCursor(probe)
            self.ensureCursorVisible()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        index = self.mark_at(event.position().toPoint())
        if index is not None and event.button() == Qt.MouseButton.LeftButton:
            self.mark_clicked.emit(index)
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        index = self.mark_at(event.position().toPoint())
        if index is None:
            QToolTip.hideText()
        else:
            QToolTip.showText(event.globalPosition().toPoint(), mark_tooltip(self.state, index), self)
        super().mouseMoveEvent(event)


def mark_tooltip(state: SpeculativeState, index: int) -> str:
    mark = state.marks[index]
    token = html.escape(visible_token_text(mark.text))
    if mark.round is None:
        what = "forced by branching" if mark.kind == FORCED else "the target's own token after the forced ones"
        return f"<code>{token}</code> · step {mark.step} · {what}"
    r = state.rounds[mark.round]
    head = f"<code>{token}</code> · round {mark.round}"
    if mark.kind == TARGET:
        kind = "correction after a rejection" if r.target_kind == "correction" else "bonus after the draft"
        return f"{head} · the target's own token ({kind}) · p {_pct(r.target_prob)} · step {mark.step}"
    position = cast(int, mark.position)  # a drafted token's
    d = r.drafted[position]
    verdict = "accepted" if mark.kind == ACCEPTED else "rejected: not in the output"
    constraint = f"<br>constraint: {d.allowed:,} tokens allowed here, {SPAN_WORDS.get(d.span, d.span)}" \
        if d.span else ""
    # What the draw was compared with: min(1, p'/q), p' the target's distribution left after earlier siblings'
    # rejections (a saved run from before it was recorded: min(1, p/q), right for chains and first children).
    threshold = d.accept_prob if d.accept_prob is not None else \
        (min(1.0, d.target_prob / d.draft_prob) if d.draft_prob > 0 else None)
    draw = f" · draw u {d.draw:.3f} vs min(1, p′/q) {threshold:.3f}" if d.draw is not None and threshold is not None \
        else ""
    where = (f"depth {r.depths()[position]} · the drafter's choice #{d.rank + 1}" if r.is_tree else
             f"draft position {position + 1}")
    if mark.kind == GRAMMAR:
        return (f"{head} · {where} · <b>rejected by the grammar</b> before verification: the constraint forbids it "
                f"here (the target's pass did not read it){constraint}<br>drafter's q {_pct(d.draft_prob)}<br>"
                "<i>click: show the round</i>")
    if r.is_tree and mark.kind == REJECTED:
        verdict = "rejected: an alternative the target turned down where the accepted path stopped"
    return (f"{head} · {where} · {verdict}<br>drafter's q {_pct(d.draft_prob)} · "
            f"target's p {_pct(d.target_prob)}{draw}{constraint}<br><i>click: show the round</i>")

