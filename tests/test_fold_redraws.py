"""A fold says which of its parts an event changed, and a view redraws only the panels of those parts (nothing when
no part changed), on real runs of a tiny model.

The parts an event must change are written here from what the event is (a round, a token, a step), not read back
from the fold; the redraws are counted by wrapping each panel's ``draw``.
"""

from __future__ import annotations

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, PrefillProgress, RunFinished, RunStarted, TokenStep
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.events.speculative import SpeculativeRound, SpeculativeStarted
from playground.state import Run
from playground.state.contrastive import ContrastiveState
from playground.state.fold import STATUS
from playground.state.speculative import MARKS, ROUNDS, SpeculativeState
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.contrastive import ContrastiveView
from playground.ui.views.speculative import SpeculativeView

PROMPT = "the cat sat on the mat. the cat sat on the mat."


@pytest.fixture(scope="module")
def speculative_events(tiny_lm) -> list:
    settings = RunSettings.from_flat(strategy="speculative", prompt=PROMPT, max_new_tokens=24, baseline_tokens=4,
                                     draft="prompt-lookup")
    return list(run_strategy(tiny_lm, settings))


@pytest.fixture(scope="module")
def contrastive_events(tiny_lm) -> list:
    settings = RunSettings.from_flat(strategy="contrastive", prompt=PROMPT, max_new_tokens=12)
    return list(run_strategy(tiny_lm, settings))


def _counting(view) -> dict[str, int]:
    """Wrap every panel's draw of ``view`` with a counter, by the panel's class name."""
    counts: dict[str, int] = {}
    for section in view.sections:
        name = type(section).__name__
        counts[name] = 0
        draw = section.draw

        def counted(draw=draw, name=name) -> None:
            counts[name] += 1
            draw()

        section.draw = counted
    return counts


def _head(events: list, stop: type) -> tuple[list, int]:
    """The events before the first ``stop`` event, and its index."""
    at = next(i for i, e in enumerate(events) if isinstance(e, stop))
    return events[:at], at


def test_the_speculative_fold_names_the_parts_each_event_changes(speculative_events):
    state = SpeculativeState()
    assert state.take_dirty() == {ROUNDS, MARKS, STATUS}  # a reset fold is drawn whole
    for event in speculative_events:
        changed = state.apply(event)
        dirty = state.take_dirty()
        if isinstance(event, (RunStarted, SpeculativeStarted, RunFinished, SpeculativeRound)):
            assert changed and dirty == {ROUNDS, MARKS, STATUS}
        elif isinstance(event, TokenStep):
            assert changed and dirty == {MARKS, STATUS}
        elif isinstance(event, PrefillDone):
            assert changed and dirty == {STATUS}
        else:
            assert not changed and dirty == set(), type(event).__name__
    assert not state.apply(PrefillProgress(done_tokens=1, total_tokens=2)) and state.take_dirty() == set()
    assert state.stop_reason == speculative_events[-1].stop_reason
    assert state.tokens_per_s == speculative_events[-1].tokens_per_s
    assert state.figures == dict(speculative_events[-1].figures)


def test_the_contrastive_fold_names_the_parts_each_event_changes(contrastive_events):
    state = ContrastiveState()
    steps = 0
    for event in contrastive_events:
        changed = state.apply(event)
        dirty = state.take_dirty()
        if isinstance(event, ContrastStep):
            steps += 1
            assert changed and dirty == {"steps", "texts", STATUS}
        elif isinstance(event, TokenStep):
            assert changed and dirty == {"texts", STATUS}
        elif isinstance(event, (RunStarted, ContrastiveStarted, RunFinished)):
            assert changed and dirty == {"steps", "texts", STATUS}
        else:
            assert not changed and dirty == set(), type(event).__name__
    assert steps == len(state.steps) > 0


def test_a_token_redraws_only_the_speculative_panels_that_show_it(qtbot, speculative_events):
    configure_pyqtgraph()
    view = SpeculativeView()
    qtbot.addWidget(view)
    view.resize(1200, 700)
    view.show()
    run = Run.from_events(speculative_events)
    # Up to (not with) the second round's token events: a round and its tokens, then the second round.
    rounds = [i for i, e in enumerate(speculative_events) if isinstance(e, SpeculativeRound)]
    second = rounds[1]
    view.apply(run, speculative_events[: second + 1])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)  # past the throttle
    counts = _counting(view)
    # The second round's first token alone: only the panels of the marks and the status (the header).
    token = next(e for e in speculative_events[second:] if isinstance(e, TokenStep))
    view.apply(run, [token])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    assert counts == {"RoundsTimeline": 0, "RoundChart": 0, "PositionsPlot": 0, "WhatIfPlot": 0,
                      "HeaderAndFigures": 1}
    # An event no part of the fold keeps: nothing at all is drawn.
    view.apply(run, [PrefillProgress(done_tokens=1, total_tokens=2)])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    assert sum(counts.values()) == 1
    # The next round: every panel that shows the rounds.
    nxt = speculative_events[rounds[2]]
    view.apply(run, [nxt])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    assert counts == {"RoundsTimeline": 1, "RoundChart": 1, "PositionsPlot": 1, "WhatIfPlot": 1,
                      "HeaderAndFigures": 2}


def test_a_token_redraws_only_the_contrastive_panels_that_show_it(qtbot, contrastive_events):
    configure_pyqtgraph()
    view = ContrastiveView()
    qtbot.addWidget(view)
    view.resize(1200, 700)
    view.show()
    run = Run.from_events(contrastive_events)
    steps = [i for i, e in enumerate(contrastive_events) if isinstance(e, ContrastStep)]
    view.apply(run, contrastive_events[: steps[1] + 1])  # the second step, without its token event
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    counts = _counting(view)
    token = next(e for e in contrastive_events[steps[1]:] if isinstance(e, TokenStep))
    view.apply(run, [token])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    # A token's text: the strip's labels, the step panel and the header; not DoLa's plot nor the what-if's replay.
    assert counts == {"DolaPlot": 0, "WhatIfAlpha": 0, "StepsStrip": 1, "StepChart": 1, "HeaderAndFigures": 1}
    view.apply(run, [PrefillProgress(done_tokens=1, total_tokens=2)])
    view.flush()
    qtbot.wait(view.live_draw_ms + 100)
    assert sum(counts.values()) == 3
