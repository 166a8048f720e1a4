"""The tokens view of a run with phrase bans: the undone spans stay in the text, struck through, where they were;
the document's steps are the surviving ones; hovering a struck span gives its rollback (the undone tokens with their
probabilities); the count line says the rollbacks and the tokens they cost; live streaming, a saved run and a new
width lay out the same text."""

from __future__ import annotations

from test_bans import _events

from playground.events import TokenStep
from playground.events.bans import Rollback
from playground.state.session import Run
from playground.state.text import flowing_token_text
from playground.ui.views.tokens.rollbacks import rollback_tooltip_html


def _shown(text: str) -> str:
    return flowing_token_text(text) if text else "·"


def _expected_document(events) -> tuple[str, list[tuple[str, bool]]]:
    """The output as the view should show it, rebuilt here: (the generated part of the text, its pieces with
    whether each is struck through)."""
    pieces: list[list] = []  # [text, struck, step or None]
    for event in events:
        if isinstance(event, TokenStep):
            pieces.append([_shown(event.text), False, event.step])
        elif isinstance(event, Rollback):
            first = next(i for i, p in enumerate(pieces) if not p[1] and p[2] == event.position)
            for piece in pieces[first:]:
                piece[1] = True
    return "".join(p[0] for p in pieces), [(p[0], p[1]) for p in pieces]


def _run_with_bans(tiny_lm):
    events = _events(tiny_lm, max_new_tokens=32, ban_regex=(r"\w\w",))  # four, two of two tokens
    run = Run.from_events(events)
    assert len(run.rollbacks) >= 2
    return events, run


def _check(view, events, run):
    edit = view.token_view.text
    text, pieces = _expected_document(events)
    document = edit.document().toPlainText()
    assert document.endswith(text), "the undone spans stay where they were"
    assert [s.token_id for s in edit.steps] == [s.token_id for s in run.steps]
    at = len(document) - len(text)
    for piece, struck in pieces:
        from PySide6.QtGui import QTextCursor

        cursor = QTextCursor(edit.document())
        cursor.setPosition(at + 1)  # the format of the character after the position
        assert cursor.charFormat().fontStrikeOut() == struck, (piece, struck)
        at += len(piece)
    # Every undone span gives its own rollback under the mouse (the innermost where one holds another).
    spans = {id(r): (start, end) for start, end, r in edit.undone}
    assert sorted(spans) == sorted(id(r) for r in run.rollbacks)
    for rollback in run.rollbacks:
        start, end = spans[id(rollback)]
        inner = edit.undone_at(start)
        assert inner is not None and start <= spans[id(inner)][0] and spans[id(inner)][1] <= end
        assert end - start == sum(len(_shown(t)) for t in rollback.texts) or rollback is not run.rollbacks[0]
    last = run.rollbacks[-1]
    start, _, _ = next(u for u in edit.undone if u[2] is last)
    assert edit.undone_at(start) is last
    cost = sum(len(r.token_ids) for r in run.rollbacks)
    line = view.token_view.rollback_line
    assert not line.isHidden() and f"{len(run.rollbacks)} rollbacks" in line.text() and f"{cost} token" in line.text()


def test_live_and_saved_runs_strike_the_undone_spans_through(qtbot, tiny_lm):
    from playground.ui.views.tokens import TokensView

    events, run = _run_with_bans(tiny_lm)
    view = TokensView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    live = Run.from_events(events[:1])
    view.apply(live, events[:1])
    for event in events[1:]:  # live: the events in small batches, flushed as the window does
        live.apply(event)
        view.apply(live, [event])
        if isinstance(event, TokenStep) and event.step % 3 == 0:
            view.flush()
    view.end(live)
    _check(view, events, live)
    view.show_run(run)  # a saved run, laid out at once
    _check(view, events, run)
    edit = view.token_view.text
    edit._split_width = -1.0  # as after a change of width: the text is laid out again from its log
    edit._relayout()
    _check(view, events, run)
    view.show_run(Run.from_events(_events(tiny_lm)))  # a run without bans: no count line
    assert view.token_view.rollback_line.isHidden() and not view.token_view.text.undone


def test_the_rollback_tooltip_lists_the_undone_tokens_with_both_probabilities(tiny_lm):
    _, run = _run_with_bans(tiny_lm)
    rollback = run.rollbacks[0]
    tip = rollback_tooltip_html(rollback)
    assert f"Rollback {rollback.number}" in tip and f"undid {len(rollback.token_ids)} token" in tip
    assert tip.count("<tr>") == len(rollback.token_ids) + 1
    from playground.ui.style import format_percent

    for p, raw in zip(rollback.probs, rollback.raw_probs, strict=True):
        assert format_percent(p).replace("<", "&lt;") in tip and format_percent(raw).replace("<", "&lt;") in tip
