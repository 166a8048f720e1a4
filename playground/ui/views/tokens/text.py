"""The tokens view's output: every token shaded by its probability (a legend says which distribution), with its
alternatives on hover, the step under a click charted, and a right-click to branch.

The text is kept short to lay out as it streams, as ``playground.ui.marked_text`` explains: the paragraph being
written is split once it is SPLIT_LINES lines long, and a change of width lays the text out again from the steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from PySide6.QtCore import QPoint, QPointF, QRect, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QColor,
    QContextMenuEvent,
    QKeyEvent,
    QMouseEvent,
    QResizeEvent,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QMenu,
    QTextEdit,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from playground.events import Rollback, TokenStep
from playground.state import Run, character_piece, flowing_token_text, visible_token_text
from playground.ui.marked_text import RELAYOUT_MS, shift_ranges, split_wrapped_paragraph
from playground.ui.style import (
    MARK_COLOR,
    format_percent,
    mono_font,
    shade_for_prob,
    text_color_on,
)
from playground.ui.views.tokens.constraint import ConstraintBar, json_path_lines, removed_shade, text_on_removed
from playground.ui.views.tokens.grammar_line import mark_fast_forward
from playground.ui.views.tokens.legend import RANK_BUCKETS, ShadeLegend, rank_bucket
from playground.ui.views.tokens.rollbacks import RollbackMarks, rollback_summary, rollback_tooltip_html
from playground.ui.views.tokens.tooltip import (
    NO_PROBS_BG,
    NO_PROBS_FG,
    NO_PROBS_TEXT,
    has_probs,
    is_remote_step,
    token_tooltip_html,
)

CUT_MARK_COLOR = "#CC3311"  # a token the what-if's settings would have cut (struck through, red wave underline)
# Which number shades a token; the legend says which one is in use.
SHADE_RAW = "raw"
SHADE_PROCESSED = "processed"
SHADE_RANK = "rank"
SHADE_CONSTRAINT = "constraint"  # a constrained run's: the raw probability its mask removed at each step
SHADE_LABELS = {
    SHADE_RAW: "raw model probability (before processors)",
    SHADE_PROCESSED: "probability after processors (what was sampled from)",
    SHADE_RANK: "rank of the chosen token under the raw model distribution, in buckets (as GLTR colours it)",
    SHADE_CONSTRAINT: "raw probability the constraint removed at the step (red, as opaque as the share removed)",
}
def step_prob(step: TokenStep, mode: str) -> float:
    return step.prob if mode == SHADE_PROCESSED else step.raw_prob


class TokenTextEdit(RollbackMarks, QTextEdit):
    """The document of shaded tokens; knows which step sits under any point."""

    step_clicked = Signal(int)
    branch_requested = Signal(int, int)  # step, token id
    unconstrained_requested = Signal(int)  # step: continue from it without the run's constraint
    step_key = Signal(int)  # -1 / +1 from the arrow keys

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFont(mono_font(12))
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.NoTextInteraction)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        # A scroll bar that appears as the text grows would change the width, and so where lines wrap.
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self.shade_mode = SHADE_RAW
        self.steps: list[TokenStep] = []
        self._starts: list[int] = []  # document position where each step's text starts
        self._ends: list[int] = []
        self._prompt_end = 0
        self._prompt_text = ""
        self._hovered: int | None = None
        self._marked: int | None = None
        self.cut_steps: list[int] = []  # the what-if's: steps whose token its settings would have cut
        # step -> its hover's HTML, while a what-if replaces the run's numbers
        self.tooltip_source: Callable[[int], str] | None = None
        self.constraint: str | None = None  # the run's constraint kind ("json_schema", ...), None without one
        self._split_width: float | None = None  # the text width the line splits were made for (None: no splits)
        self._view_before_relayout: tuple[bool, int | None] = (True, None)  # following the end; top step
        self._relayout_timer = QTimer(self)
        self._relayout_timer.setSingleShot(True)
        self._relayout_timer.setInterval(RELAYOUT_MS)
        self._relayout_timer.timeout.connect(self._relayout)
        self._clear_rollbacks()

    # --- content ---------------------------------------------------------------------------------------
    def clear_tokens(self, prompt_text: str = "") -> None:
        self.clear()
        self.steps.clear()
        self._starts.clear()
        self._ends.clear()
        self._split_width = None
        self._marked = None
        self.cut_steps = []
        self._clear_rollbacks()
        self._prompt_text = prompt_text
        cursor = QTextCursor(self.document())
        if prompt_text:
            fmt = QTextCharFormat()
            fmt.setForeground(QColor("#777777"))
            cursor.insertText(prompt_text, fmt)
        self._prompt_end = cursor.position()

    def append_steps(self, steps: list[TokenStep]) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()  # one layout for the whole batch
        self._log_steps(steps)
        for step in steps:
            self._insert(cursor, step)
        cursor.endEditBlock()
        self._split_wrapped_line()
        self.ensureCursorVisible_at_end()

    def _split_wrapped_line(self) -> None:
        """Keep the paragraph being written short (``split_wrapped_paragraph``), and the token ranges right."""
        split = split_wrapped_paragraph(self.document(), self._prompt_end)
        if split is None:
            return
        shift_ranges(self._starts, self._ends, split)  # the tokens it moved
        self._split_width = self.document().textWidth()

    def resizeEvent(self, event: QResizeEvent) -> None:
        if self._split_width is not None and not self._relayout_timer.isActive():
            bar = self.verticalScrollBar()  # where the reader was, before the new width moves the lines
            self._view_before_relayout = (bar.value() >= bar.maximum() - 40, self.step_at(QPoint(4, 4)))
        super().resizeEvent(event)
        if self._split_width is not None and self.document().textWidth() != self._split_width:
            self._relayout_timer.start()  # lines split for the old width would now end early or wrap twice

    def _relayout(self) -> None:
        """Lay the text out again for the current width, keeping the marked step and what was in view."""
        if self._split_width is None or self.document().textWidth() == self._split_width:
            return
        at_end, top = self._view_before_relayout
        laid_out, marked = list(self.layout_log), self._marked
        self.clear_tokens(self._prompt_text)
        self.replay(laid_out)  # the steps, and the spans rollbacks undid
        self.mark_step(marked)
        bar = self.verticalScrollBar()
        if at_end:
            bar.setValue(bar.maximum())
        elif top is not None and top < len(self._starts):
            cursor = QTextCursor(self.document())
            cursor.setPosition(self._starts[top])
            bar.setValue(bar.value() + self.cursorRect(cursor).top())

    def _shade_format(self, step: TokenStep) -> QTextCharFormat:
        fmt = QTextCharFormat()
        if self.shade_mode == SHADE_CONSTRAINT:
            removed = step.grammar.removed_mass if step.grammar is not None else 0.0
            fmt.setBackground(removed_shade(removed))
            fmt.setForeground(text_on_removed(removed))
        elif has_probs(step) and self.shade_mode == SHADE_RANK:
            background = QColor(RANK_BUCKETS[rank_bucket(step.raw_rank)][1])
            fmt.setBackground(background)
            fmt.setForeground(QColor("#000000"))
        elif has_probs(step):
            background = shade_for_prob(step_prob(step, self.shade_mode))
            fmt.setBackground(background)
            fmt.setForeground(text_color_on(background))
        else:
            fmt.setBackground(QColor(NO_PROBS_BG))
            fmt.setForeground(QColor(NO_PROBS_FG))
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
        return fmt

    def _insert(self, cursor: QTextCursor, step: TokenStep) -> None:
        fmt = self._shade_format(step)
        if step.forced:
            fmt.setFontItalic(True)
        mark_fast_forward(fmt, getattr(step, "grammar", None))
        # Newlines and empty deltas (a byte of a multi-byte character) still get a visible mark.
        text = flowing_token_text(step.text) if step.text else "·"
        self._starts.append(cursor.position())
        cursor.insertText(text, fmt)
        self._ends.append(cursor.position())
        self.steps.append(step)

    def reshade(self) -> None:
        """Recolour every token (the shading mode changed); the text stays."""
        cursor = QTextCursor(self.document())
        for step, start, end in zip(self.steps, self._starts, self._ends, strict=True):
            fmt = self._shade_format(step)
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)

    def ensureCursorVisible_at_end(self) -> None:
        bar = self.verticalScrollBar()
        if bar.value() >= bar.maximum() - 40:  # follow the stream unless the user scrolled up
            bar.setValue(bar.maximum())

    def set_cut_steps(self, steps: list[int]) -> None:
        """Strike through (and underline in red) the tokens of these steps: the what-if's settings would have cut
        them. The document's own formats stay as they are, so an empty list restores the text exactly."""
        self.cut_steps = [i for i in steps if 0 <= i < len(self.steps)]
        self._apply_selections()

    def _cut_selection(self, index: int) -> QTextEdit.ExtraSelection:
        selection = QTextEdit.ExtraSelection()
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._starts[index])
        cursor.setPosition(self._ends[index], QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        fmt = QTextCharFormat()
        fmt.setFontStrikeOut(True)
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        fmt.setUnderlineColor(QColor(CUT_MARK_COLOR))
        fmt.setForeground(QColor(CUT_MARK_COLOR))
        selection.format = fmt
        return selection

    def _apply_selections(self) -> None:
        cut = [self._cut_selection(i) for i in self.cut_steps if i < len(self._starts)]
        marked = self._marked_selection()
        self.setExtraSelections(cut + ([marked] if marked is not None else []))

    def mark_step(self, index: int | None) -> None:
        """Outline the step shown in the chart."""
        self._marked = index if index is not None and 0 <= index < len(self.steps) else None
        self._apply_selections()

    def _marked_selection(self) -> QTextEdit.ExtraSelection | None:
        index = self._marked
        if index is None or not 0 <= index < len(self._starts):
            return None
        selection = QTextEdit.ExtraSelection()
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._starts[index])
        cursor.setPosition(self._ends[index], QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        # The same yellow as the chosen row's band in the chart: "this token is the step shown there".
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(MARK_COLOR))
        fmt.setForeground(QColor("#000000"))
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.SingleUnderline)
        fmt.setFontUnderline(True)
        fmt.setFontWeight(700)
        if index in self.cut_steps:  # still reads as cut while charted
            fmt.setFontStrikeOut(True)
            fmt.setForeground(QColor(CUT_MARK_COLOR))
        selection.format = fmt
        return selection

    def step_rect(self, index: int) -> QRect:
        """Where step ``index``'s first character is drawn, in viewport coordinates (scrolled into view)."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._starts[index])
        self.setTextCursor(cursor)
        self.ensureCursorVisible()
        cursor.setPosition(self._starts[index] + 1)
        return self.cursorRect(cursor)

    # --- finding the step under the mouse ------------------------------------------------------------------
    def step_at(self, point: QPoint) -> int | None:
        doc_point = QPointF(point.x() + self.horizontalScrollBar().value(),
                            point.y() + self.verticalScrollBar().value())
        position = self.document().documentLayout().hitTest(doc_point, Qt.HitTestAccuracy.ExactHit)
        if position < self._prompt_end:
            return None
        index = bisect.bisect_right(self._starts, position) - 1
        if 0 <= index < len(self.steps) and position < self._ends[index]:
            return index
        return None

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        index = self.step_at(event.position().toPoint())
        undone = self.undone_under(event.position().toPoint()) if index is None and self.undone else None
        if undone is not None:
            QToolTip.showText(event.globalPosition().toPoint(), rollback_tooltip_html(undone), self)
        elif index is None:
            QToolTip.hideText()
        elif index != self._hovered or not QToolTip.isVisible():
            QToolTip.showText(event.globalPosition().toPoint(), self.tooltip_html(index), self)
        self._hovered = index
        super().mouseMoveEvent(event)

    def tooltip_html(self, index: int) -> str:
        """The hover of step ``index``: the run's numbers, or the what-if's while it is on."""
        if self.tooltip_source is not None:
            return self.tooltip_source(index)
        return token_tooltip_html(self.steps[index], piece=character_piece(self.steps, index),
                                  **self.constraint_notes(index))

    def constraint_notes(self, index: int) -> dict:
        """The tooltip's constraint arguments for step ``index``: the kind, and the JSON path on a schema run."""
        if self.constraint is None:
            return {}
        paths = json_path_lines(self.steps[: index + 1], self.constraint)
        return {"constraint": self.constraint, "json_path": paths[index] if paths else None}

    def mousePressEvent(self, event: QMouseEvent) -> None:
        index = self.step_at(event.position().toPoint())
        if index is not None and event.button() == Qt.MouseButton.LeftButton:
            self.step_clicked.emit(index)
        super().mousePressEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Left, Qt.Key.Key_Right):
            self.step_key.emit(-1 if event.key() == Qt.Key.Key_Left else 1)
            return
        super().keyPressEvent(event)

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        index = self.step_at(event.pos())
        if index is None:
            return
        menu = self.alternatives_menu(index)
        menu.exec(event.globalPos())

    def alternatives_menu(self, index: int) -> QMenu:
        step = self.steps[index]
        menu = QMenu(self)
        menu.addSection(f"Step {step.step}: continue with…")
        for c in sorted(step.candidates, key=lambda c: c.raw_rank):
            if c.token_id == step.token_id:
                continue
            label = visible_token_text(c.text).replace("&", "&&")  # a lone & would mark a shortcut key
            kind = "server" if is_remote_step(step) else "raw"
            action = QAction(f"{label}    {kind} {format_percent(c.raw_prob)}", menu)
            action.triggered.connect(lambda _=False, tid=c.token_id: self.branch_requested.emit(step.step, tid))
            menu.addAction(action)
        if step.grammar is not None:  # a constrained step: what the model would have said from here on its own
            menu.addSeparator()
            free = QAction("Continue without the constraint from here", menu)
            free.triggered.connect(lambda _=False: self.unconstrained_requested.emit(step.step))
            menu.addAction(free)
        return menu


class TokenView(QWidget):
    """Token document + legend + shading choice."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.text = TokenTextEdit(self)
        self.legend = ShadeLegend(self)
        self.mode = QComboBox(self)
        self.mode.addItem("raw model", SHADE_RAW)
        self.mode.addItem("after processors", SHADE_PROCESSED)
        self.mode.addItem("rank (GLTR)", SHADE_RANK)  # "constraint" joins them for a constrained run
        self.mode.setToolTip("Which distribution the token shading shows (a constrained run adds the raw "
                             "probability its constraint removed at each step)")
        self.mode.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.caption = QLabel(self)
        self.caption.setWordWrap(True)
        self.rollback_line = QLabel(self)  # the phrase bans' count (hidden without rollbacks)
        self.rollback_line.setWordWrap(True)
        self.rollback_line.hide()
        self.constraint_bar = ConstraintBar(self)  # a constrained run's summary (hidden without one)
        self.remote_note: str | None = None  # which distribution a server's numbers are (None: a local run)
        self.what_if_on = False  # the caption says what the what-if's marks mean
        self.mode_label = QLabel("Shade =", self)
        legend_row = QHBoxLayout()
        legend_row.addWidget(self.mode_label)
        legend_row.addWidget(self.mode)
        legend_row.addWidget(self.legend, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.rollback_line)
        layout.addWidget(self.constraint_bar)
        layout.addLayout(legend_row)
        layout.addWidget(self.caption)
        self._update_caption()

    def _mode_changed(self) -> None:
        self.text.shade_mode = self.mode.currentData() or SHADE_RAW
        self.legend.show_ranks(self.text.shade_mode == SHADE_RANK)
        self.legend.show_removed(self.text.shade_mode == SHADE_CONSTRAINT)
        self.text.reshade()
        self._update_caption()

    def set_constraint(self, kind: str | None) -> None:
        """The shown run's constraint kind (None: none): the tooltips name it, and the shading offers the mass it
        removed."""
        if kind == self.text.constraint:
            return
        self.text.constraint = kind
        at = self.mode.findData(SHADE_CONSTRAINT)
        if kind is not None and at < 0:
            self.mode.addItem("mass removed", SHADE_CONSTRAINT)
        elif kind is None and at >= 0:
            if self.mode.currentIndex() == at:
                self.mode.setCurrentIndex(0)
            self.mode.removeItem(at)
        self._update_caption()

    def set_remote(self, label: str | None, note: str = "") -> None:
        """A server's run (``label``: which distribution its numbers are) or a local one (None): a server sends one
        number per token, so there is one shading to choose."""
        self.remote_note = f"the server's probability ({label}): {note}" if label is not None else None
        if label is not None and self.mode.currentIndex() != 0:
            self.mode.setCurrentIndex(0)  # the server's one number
        self.mode.setVisible(label is None)  # a server sends one probability per token: nothing to choose
        self.mode_label.setText("Shade =" if label is None else "Shade = the server's probability")
        self._update_caption()

    def _update_caption(self) -> None:
        if self.remote_note is not None:
            self.caption.setText(
                f"Token shade: {self.remote_note}; darker = less likely; grey, dotted = {NO_PROBS_TEXT}. "
                "Italic = forced. Hover a token for the server's candidates; click it to chart that step (←/→ to "
                "step); right-click to branch (the server continues from the text).")
            return
        mode = self.text.shade_mode
        what = (f"{SHADE_LABELS[SHADE_RANK]}: green = the model's top choice" if mode == SHADE_RANK
                else SHADE_LABELS[SHADE_CONSTRAINT] if mode == SHADE_CONSTRAINT
                else f"probability of the chosen token, {SHADE_LABELS[mode]}; darker = less likely")
        cut = (f" <span style='color:{CUT_MARK_COLOR}'><s>Struck through, red</s></span> = the what-if's settings "
               "would have cut the run's token there; the strip marks per step where greedy, the token or the kept "
               "set would differ, grey hatched = an estimate (display only)." if self.what_if_on else "")
        free = " or to continue without the constraint" if self.text.constraint is not None else ""
        self.caption.setText(
            f"Token shade: {what}. Italic = forced.{cut} Hover a token for its alternatives; click it to chart that "
            f"step (←/→ to step); right-click to branch{free}.")

    def set_what_if(self, on: bool) -> None:
        self.what_if_on = on
        self._update_caption()

    def show_run(self, run: Run) -> None:
        self.text.clear_tokens(run.started.prompt_text if run.started else "")
        if run.rollbacks:  # the steps with the spans the rollbacks undid, in their order
            self.text.replay(e for e in run.events if isinstance(e, (TokenStep, Rollback)))
        else:
            self.text.append_steps(run.steps)
        self._show_rollbacks()

    def reset(self, prompt_text: str = "") -> None:
        self.text.clear_tokens(prompt_text)
        self._show_rollbacks()

    def undo_steps(self, rollback: Rollback) -> None:
        """A phrase ban rolled the run back: strike the undone span through and count it."""
        self.text.undo_steps(rollback)
        self._show_rollbacks()

    def _show_rollbacks(self) -> None:
        line = rollback_summary(self.text.rollbacks)
        self.rollback_line.setText(line)
        self.rollback_line.setVisible(bool(line))

    def append_steps(self, steps: list[TokenStep]) -> None:
        self.text.append_steps(steps)

    @property
    def steps(self) -> list[TokenStep]:
        return self.text.steps
