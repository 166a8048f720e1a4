"""Phrase bans' rollbacks in the tokens view: the undone span stays in the text where it was, struck through and
greyed (the tokens that replaced it follow it), its tokens and probabilities in its tooltip; a line under the text
counts the rollbacks and the tokens they cost.

``RollbackMarks`` is a mixin of the token document (``TokenTextEdit``): ``undo_steps(rollback)`` turns the document's
last steps from the rollback's position on into an undone span (they leave ``steps``: the document's steps are the
run's surviving ones, as ``Run.steps``); ``replay(items)`` lays steps and rollbacks out in their order (a saved run,
a new width); ``undone_at(position)`` is the innermost undone span at a document position.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit

from playground.events import TokenStep
from playground.events.bans import Rollback
from playground.state import visible_token_text
from playground.ui.style import format_percent

UNDONE_FG = "#8A8A8A"
UNDONE_BG = "#F1ECEC"


def _pct(prob: float) -> str:
    return "?" if prob != prob else html.escape(format_percent(prob))


def rollback_tooltip_html(rollback: Rollback, limit: int = 16) -> str:
    """What a rollback undid: the match, the forbidden token, every undone token with its probabilities."""
    kind = "banned phrase" if rollback.kind == "phrase" else "banned pattern"
    rows = "".join(
        f"<tr><td>{rollback.position + i}</td><td><code>{html.escape(visible_token_text(text))}</code></td>"
        f"<td align='right'>{_pct(p)}</td><td align='right'>{_pct(raw)}</td></tr>"
        for i, (text, p, raw) in enumerate(zip(rollback.texts, rollback.probs, rollback.raw_probs, strict=True))
        if i < limit)
    more = f"<br>… and {len(rollback.texts) - limit} more" if len(rollback.texts) > limit else ""
    forbidden = visible_token_text(rollback.forbidden_text)
    matched = "" if rollback.matched == rollback.banned else f" (matched <code>{html.escape(rollback.matched)}</code>)"
    return (f"<b>Rollback {rollback.number}</b>: the output came to contain the {kind} "
            f"<code>{html.escape(rollback.banned)}</code>{matched}<br>"
            f"undid {len(rollback.token_ids)} token{'s' if len(rollback.token_ids) != 1 else ''} from step "
            f"{rollback.position} and forbade <code>{html.escape(forbidden)}</code> there "
            f"({rollback.forbidden_count} forbidden at that step now)"
            f"<table cellspacing=4><tr><th>step</th><th>token</th><th>after processors</th><th>raw</th></tr>{rows}"
            f"</table>{more}")


def rollback_summary(rollbacks: Sequence[Rollback]) -> str:
    """The count line: "3 rollbacks (phrase bans) undid 5 tokens: struck through in the text" ("" for none)."""
    if not rollbacks:
        return ""
    n, cost = len(rollbacks), sum(len(r.token_ids) for r in rollbacks)
    return (f"<span style='color:{UNDONE_FG}'><s>Struck through</s></span> = undone by a phrase ban: "
            f"<b>{n} rollback{'s' if n != 1 else ''}</b> cost <b>{cost} token{'s' if cost != 1 else ''}</b> "
            "(hover a struck span for what matched and the undone tokens)")


class RollbackMarks:
    """The token document's undone spans (mixed into ``TokenTextEdit``, whose members it uses: ``steps``,
    ``_starts``, ``_ends``, ``document()``, ``append_steps``)."""

    steps: list[TokenStep]
    _starts: list[int]
    _ends: list[int]
    undone: list[tuple[int, int, Rollback]]  # (document start, end, the rollback) in the order they came
    layout_log: list[TokenStep | Rollback]  # what the document shows, in order (to lay it out again)
    append_steps: Callable[[list[TokenStep]], None]  # the document's own

    def _clear_rollbacks(self) -> None:
        self.undone = []
        self.layout_log = []

    @property
    def rollbacks(self) -> list[Rollback]:
        return [r for _, _, r in self.undone]

    def _log_steps(self, steps: Iterable[TokenStep]) -> None:
        self.layout_log.extend(steps)

    def undo_steps(self, rollback: Rollback) -> None:
        """The steps from ``rollback.position`` on were undone: strike them through and drop them from ``steps``."""
        position = rollback.position
        if position >= len(self._starts):
            return
        start, end = self._starts[position], self._ends[-1]
        cursor = QTextCursor(cast(QTextEdit, self).document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setFontStrikeOut(True)
        fmt.setForeground(QColor(UNDONE_FG))
        fmt.setBackground(QColor(UNDONE_BG))
        cursor.mergeCharFormat(fmt)
        del self.steps[position:], self._starts[position:], self._ends[position:]
        self.undone.append((start, end, rollback))
        self.layout_log.append(rollback)

    def replay(self, items: Iterable[Any]) -> None:
        """Lay out steps and rollbacks in their order (consecutive steps in one batch)."""
        batch: list[TokenStep] = []
        for item in items:
            if isinstance(item, Rollback):
                if batch:
                    self.append_steps(batch)
                    batch = []
                self.undo_steps(item)
            elif isinstance(item, TokenStep):
                batch.append(item)
        if batch:
            self.append_steps(batch)

    def undone_under(self, point: QPoint) -> Rollback | None:
        """The innermost undone span under a viewport point."""
        edit = cast(QTextEdit, self)
        doc_point = QPointF(point.x() + edit.horizontalScrollBar().value(),
                            point.y() + edit.verticalScrollBar().value())
        position = edit.document().documentLayout().hitTest(doc_point, Qt.HitTestAccuracy.ExactHit)
        return self.undone_at(position) if position >= 0 else None

    def undone_at(self, position: int) -> Rollback | None:
        """The innermost undone span at a document position (a later rollback may strike an earlier one's)."""
        inside = [(end - start, r) for start, end, r in self.undone if start <= position < end]
        return min(inside, key=lambda pair: pair[0])[1] if inside else None
