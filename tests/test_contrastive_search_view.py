"""The contrastive-search view and form: the shown step's candidates with their numbers and the winner, the text
marking the hovered candidate's most similar earlier token, the overturn strip's count, the same from a saved run;
the form enables --top-k alone for the strategy and carries it into the run's settings."""

from __future__ import annotations

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events.contrastive_search import SearchStarted, SearchStep
from playground.state import Run
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.contrastive_search import ContrastiveSearchView
from playground.ui.views.contrastive_search.text import SIMILAR_COLOR


@pytest.fixture(scope="module")
def events(tiny_lm) -> list:
    settings = RunSettings.from_flat(strategy="contrastive-search", prompt="The capital of France is Paris. The",
                                     chat=False, max_new_tokens=8, top_k=4, penalty_alpha=0.6)
    return list(run_strategy(tiny_lm, settings))


@pytest.fixture
def view(qtbot) -> ContrastiveSearchView:
    configure_pyqtgraph()
    v = ContrastiveSearchView()
    qtbot.addWidget(v)
    v.resize(1100, 700)
    return v


def marked_text(view: ContrastiveSearchView) -> str:
    """The text of the span the text panel marks as the most similar earlier token."""
    html = view.text.toHtml().lower()
    at = html.index(SIMILAR_COLOR.lower())
    start = html.index(">", at) + 1
    return html[start : html.index("<", start)]


def check_shown(view: ContrastiveSearchView, events: list) -> None:
    steps = [e for e in events if isinstance(e, SearchStep)]
    prompt = next(e for e in events if isinstance(e, SearchStarted)).context_tokens
    texts = [*prompt, *(s.text for s in steps)]
    overturned = [i for i, s in enumerate(steps) if s.overturned]
    assert overturned, "the tiny run should have a step the penalty overturned"
    shown = overturned[-1]  # the finished run shows its last overturned step
    assert view.shown_step == shown
    step = steps[shown]
    table = view.table
    assert table.rowCount() == 4
    for row, c in enumerate(step.candidates):
        assert table.item(row, 2).text() == format_percent(c.confidence)
        assert table.item(row, 3).text() == f"{c.penalty:.3f}"
        assert table.item(row, 5).text() == f"{c.score:+.3f}"
        assert ("★" in table.item(row, 0).text()) == (row == step.winner)
    assert "▲" in table.item(0, 0).text() and step.winner != 0
    assert f"at {len(overturned)} of {len(steps)} steps" in view.strip_label.text()
    assert view.strip.steps == [(s.overturned, s.forced) for s in steps]
    winner = step.candidates[step.winner]
    assert marked_text(view) == texts[winner.similar_position].lower().replace("&", "&amp;")
    similar = texts[winner.similar_position]
    other = next(r for r, c in enumerate(step.candidates) if texts[c.similar_position] != similar)
    view.hover_candidate(other)  # what hovering that row does
    assert marked_text(view) == texts[step.candidates[other].similar_position].lower()
    view.hover_candidate(None)
    assert marked_text(view) == texts[winner.similar_position].lower()


def test_the_view_shows_the_candidates_and_marks_the_most_similar_token_live_and_saved(view, events, tmp_path):
    view.show_run(Run.from_events(events))
    check_shown(view, events)
    saved = read_trace(write_trace(events, tmp_path / "run.jsonl"))
    view.reset()
    view.show_run(Run.from_events(saved.events))
    check_shown(view, events)
    assert not view.grab().toImage().isNull()


def test_the_form_enables_top_k_alone_for_contrastive_search(qapp):
    from playground.ui.controls import RunControls

    controls = RunControls()
    controls.set_run_settings(RunSettings.from_flat(strategy="contrastive-search", top_k=6, penalty_alpha=0.3))
    widgets = controls.widgets
    assert widgets["top_k"].isEnabled() and not widgets["temperature"].isEnabled()
    assert not widgets["top_p"].isEnabled() and controls.boxes["contrastive_search"].isEnabled()
    settings = controls.run_settings("x")
    assert settings.top_k == 6 and settings.temperature == 1.0
    assert settings.group(type(settings.groups[0])).penalty_alpha == 0.3
    controls.strategy.setCurrentText("sample")
    assert widgets["temperature"].isEnabled() and widgets["top_p"].isEnabled() and widgets["top_k"].isEnabled()
    controls.strategy.setCurrentText("greedy")
    assert controls.run_settings("x").top_k == 0  # greedy reads no top-k
