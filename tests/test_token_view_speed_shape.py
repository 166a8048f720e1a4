"""The token view's work per append stays proportional to what is new, whatever the output's length.

Structural checks only (no timings): Qt lays out a whole paragraph again on each insertion, so the view keeps the
paragraph being written to a few lines; the text, the token ranges and the picture must not change for it.
"""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtGui import QTextCursor

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.state import flowing_token_text
from playground.ui.marked_text import SPLIT_LINES
from playground.ui.views.tokens.text import TokenView

PROMPT = "Tell me a story."


@pytest.fixture(scope="module")
def one_paragraph(tiny_lm) -> list[TokenStep]:
    """~600 real steps whose text has no line break: one long paragraph, the worst case for a text layout."""
    settings = RunSettings(prompt=PROMPT, chat=False, strategy="sample", max_new_tokens=200)
    steps = [e for e in run_strategy(tiny_lm, settings) if isinstance(e, TokenStep)]
    flat = [dataclasses.replace(s, text=s.text.replace("\n", " ").replace("\r", " ") or "x") for s in steps]
    return [dataclasses.replace(s, step=i) for i, s in enumerate(flat * 3)]


def _view(qtbot, width: int) -> TokenView:
    view = TokenView()
    qtbot.addWidget(view)
    view.resize(width, 420)
    view.show()
    qtbot.waitExposed(view)
    view.reset(PROMPT)
    return view


def _check_ranges(view: TokenView, steps: list[TokenStep]) -> None:
    """Every token's range holds its text (a layout split may add a paragraph break inside the range)."""
    text = view.text
    doc = text.toPlainText()
    assert text.steps == steps
    assert doc.startswith(PROMPT)
    for step, start, end in zip(steps, text._starts, text._ends, strict=True):
        assert doc[start:end].replace("\n", "") == flowing_token_text(step.text)
    assert doc.replace("\n", "") == PROMPT + "".join(flowing_token_text(s.text) for s in steps)


def _token_places(view: TokenView) -> list[tuple[int, int]]:
    """Where each token starts on screen (document coordinates)."""
    text = view.text
    text.verticalScrollBar().setValue(0)
    cursor = QTextCursor(text.document())
    places = []
    for start in text._starts:
        cursor.setPosition(start)
        rect = text.cursorRect(cursor)
        places.append((rect.x(), rect.y()))
    return places


def test_the_paragraph_being_written_stays_a_few_lines_long(qtbot, one_paragraph):
    view = _view(qtbot, 520)
    for i in range(0, len(one_paragraph), 2):
        view.append_steps(one_paragraph[i : i + 2])
        # What the next append lays out again: a few lines, not the paragraph.
        assert view.text.document().lastBlock().layout().lineCount() < SPLIT_LINES
    document = view.text.document()
    blocks = [document.findBlockByNumber(n) for n in range(document.blockCount())]
    lines = sum(block.layout().lineCount() for block in blocks)
    assert lines > 3 * SPLIT_LINES and len(blocks) >= lines / SPLIT_LINES
    _check_ranges(view, one_paragraph)


def test_splits_keep_every_token_where_it_was_and_follow_width_changes(qtbot, one_paragraph):
    streamed = _view(qtbot, 520)
    for i in range(0, len(one_paragraph), 3):
        streamed.append_steps(one_paragraph[i : i + 3])
    streamed.text.mark_step(len(one_paragraph) - 5)

    # The same text appended at once, at another width, then resized: laid out again from its steps.
    resized = _view(qtbot, 380)
    resized.append_steps(one_paragraph)
    resized.text.mark_step(len(one_paragraph) - 5)
    resized.resize(520, 420)
    qtbot.waitUntil(lambda: resized.text.document().textWidth() == streamed.text.document().textWidth())
    qtbot.waitUntil(lambda: not resized.text._relayout_timer.isActive(), timeout=2000)
    qtbot.wait(50)
    _check_ranges(resized, one_paragraph)
    assert resized.text._marked == len(one_paragraph) - 5

    # Split while streaming (every few lines) or once after the relayout: the lines are those of the unsplit text.
    assert streamed.text.document().blockCount() > resized.text.document().blockCount()
    size = streamed.text.document().documentLayout().documentSize()
    assert resized.text.document().documentLayout().documentSize() == size
    assert _token_places(streamed) == _token_places(resized)
