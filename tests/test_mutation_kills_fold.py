"""The folds' base (playground/state/fold.py) where `make mutate` found no test looking (issue 28, point 4): what a
reset clears, what ``apply`` answers, how ``dirty`` accumulates across events until ``take_dirty``, the strategy's
start event, ``end`` and ``status`` — on a tiny model's real greedy run, with a fold of two parts written here."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from playground.config import RunSettings
from playground.events import RunFinished, RunStarted, TokenStep
from playground.state.fold import STATUS, Fold


@dataclass(frozen=True)
class Begun:  # a strategy's own start event (the speculative and beam runs have one)
    note: str


@dataclass(frozen=True)
class Note:  # an event of this fold's that changes its other part
    text: str


class TwoParts(Fold):
    parts = frozenset({"tokens", "summary"})
    start_event = Begun

    def _clear(self) -> None:
        self.tokens: list[int] = []

    def _fold(self, event):
        if isinstance(event, TokenStep):
            self.tokens.append(event.token_id)
            return {"tokens"}
        if isinstance(event, Note):
            return {"summary"}
        return None


class QuietEnd(TwoParts):
    def _finished(self, event):
        return ()


@pytest.fixture(scope="module")
def greedy_events(tiny_lm):
    from playground.engine.strategies import run_strategy

    return list(run_strategy(tiny_lm, RunSettings(prompt="Hello there", chat=False, max_new_tokens=4)))


def test_a_reset_clears_the_run_and_makes_every_part_dirty(greedy_events):
    fold = TwoParts()
    assert TwoParts.all_parts() == frozenset({"tokens", "summary", STATUS})
    assert fold.started is None and fold.tokens_per_s is None and fold.stop_reason is None
    assert fold.figures == {} and fold.dirty == {"tokens", "summary", STATUS}
    start, *_ = greedy_events
    assert isinstance(start, RunStarted)
    assert fold.take_dirty() == {"tokens", "summary", STATUS}
    assert fold.take_dirty() == set() and fold.dirty == set()
    assert fold.apply(start) is True
    assert fold.take_dirty() == {"tokens", "summary", STATUS}


def test_events_add_their_parts_to_dirty_until_a_view_takes_them(greedy_events):
    start, finished = greedy_events[0], greedy_events[-1]
    steps = [e for e in greedy_events if isinstance(e, TokenStep)]
    assert isinstance(finished, RunFinished) and len(steps) == 4
    fold = TwoParts()
    fold.apply(start)
    fold.take_dirty()
    assert fold.apply(object()) is False and fold.dirty == set()  # not one of its events: nothing changes
    assert fold.apply(steps[0]) is True and fold.dirty == {"tokens"}
    assert fold.apply(Note("n")) is True and fold.dirty == {"tokens", "summary"}  # both, until a view takes them
    assert fold.apply(Begun("a round")) is True  # the strategy's start: kept, and everything is drawn again
    assert fold.started == Begun("a round") and fold.dirty == {"tokens", "summary", STATUS}
    fold.take_dirty()
    for step in steps[1:]:
        fold.apply(step)
    assert fold.dirty == {"tokens"}
    assert fold.apply(finished) is True
    assert fold.dirty == {"tokens", "summary", STATUS}  # the steps' part is still there beside the end's
    assert fold.tokens == [s.token_id for s in steps]
    assert fold.tokens_per_s == finished.tokens_per_s and fold.stop_reason == finished.stop_reason
    assert fold.figures == dict(finished.figures) and fold.ended
    assert fold.status() == f"finished ({finished.stop_reason})"
    quiet = QuietEnd()
    quiet.apply(start)
    quiet.take_dirty()
    quiet.apply(steps[0])
    assert quiet.apply(finished) is False  # its end changed none of its parts ...
    assert quiet.dirty == {"tokens", STATUS}  # ... but the header's status did, and the step's part stays


def test_a_run_ended_without_finishing_is_drawn_whole_and_says_how(greedy_events):
    start = greedy_events[0]
    first = next(e for e in greedy_events if isinstance(e, TokenStep))
    fold = TwoParts()
    fold.apply(start)
    assert fold.status() == "running…"
    assert fold.status(under_way=False) == "running…"  # the default word while waiting
    assert fold.status("waiting for the first token…", under_way=False) == "waiting for the first token…"
    assert fold.status("waiting for the first token…") == "running…"
    fold.take_dirty()
    fold.apply(first)
    fold.end("stopped")
    assert fold.ended and fold.status() == "stopped"
    assert fold.take_dirty() == {"tokens", "summary", STATUS}
