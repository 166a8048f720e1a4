"""Observers on the one decode loop and the run's one context (issue 27, points 2 and 3): an observer the caller
attaches sees every strategy's steps through the loop and places its events before each token's own; the run
history is the one the context (or the loaded model) holds, not process-wide; what a runner takes comes from its
catalog entry. References are counts and orders the test reads off the events itself."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from playground.config import RunSettings
from playground.engine.observe import Observer
from playground.engine.run_context import RunContext
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished, RunStarted, TokenStep
from playground.events.speculative import SpeculativeStarted
from playground.models.run_history import RunHistory

ENGINE = Path(__file__).resolve().parents[1] / "playground" / "engine"


class Marker:
    def __init__(self, kind: str, step: int) -> None:
        self.kind, self.step = kind, step


class Counting(Observer):
    """Counts the hooks' calls and puts a marker before each kept unit (a token, a beam step)."""

    def __init__(self) -> None:
        self.calls = {"started": 0, "watch": 0, "after_step": 0, "finished": 0}

    def started(self, loop):
        self.calls["started"] += 1
        return [Marker("start", -1)]

    def watch(self, loop):
        self.calls["watch"] += 1
        return None

    def after_step(self, loop, picked):
        self.calls["after_step"] += 1

    def step_events(self, loop, picked, units):
        return [[Marker("before", picked.first + j)] for j in range(units)]

    def finished(self, loop):
        self.calls["finished"] += 1


@pytest.mark.parametrize("flat", [
    {"strategy": "greedy"},
    {"strategy": "sample", "seed": 3},
    {"strategy": "speculative", "draft": "prompt-lookup", "baseline_tokens": 0},
], ids=["greedy", "sample", "speculative"])
def test_an_attached_observer_sees_each_step_and_comes_before_each_token(tiny_lm, flat):
    observer = Counting()
    settings = RunSettings.from_flat(prompt="one two one two one two", chat=False, max_new_tokens=9, **flat)
    events = list(run_strategy(tiny_lm, settings, RunContext(observers=(observer,))))
    tokens = [e for e in events if isinstance(e, TokenStep)]
    markers = [e for e in events if isinstance(e, Marker) and e.kind == "before"]
    assert len(tokens) == 9 and [m.step for m in markers] == [t.step for t in tokens]
    for i, event in enumerate(events):  # every token right after its marker
        if isinstance(event, TokenStep):
            assert isinstance(events[i - 1], Marker) and events[i - 1].step == event.step
    assert observer.calls["started"] == 1 and observer.calls["finished"] == 1
    start = next(i for i, e in enumerate(events) if isinstance(e, Marker) and e.kind == "start")
    assert isinstance(events[0], RunStarted) and start < events.index(tokens[0])
    # One step per token for greedy and sampling; a speculative round emits several tokens in one step.
    steps = observer.calls["after_step"]
    assert steps == 9 if flat["strategy"] != "speculative" else 1 <= steps < 9
    assert observer.calls["watch"] >= steps - 1  # every step's pass is watched (greedy's first reads none)


def test_beam_search_runs_on_the_loop_one_unit_per_beam_step(tiny_lm):
    observer = Counting()
    polls = iter(range(100))
    settings = RunSettings.from_flat(strategy="beam", num_beams=3, prompt="Beam search keeps", max_new_tokens=12)
    events = list(run_strategy(tiny_lm, settings, RunContext(observers=(observer,),
                                                             should_stop=lambda: next(polls) >= 4)))
    beams = [e for e in events if isinstance(e, BeamStep)]
    markers = [e for e in events if isinstance(e, Marker) and e.kind == "before"]
    # The loop polls Stop before each step: 4 steps ran (the prefill's chunk polls none on this short prompt).
    assert [b.step for b in beams] == [m.step for m in markers] == [0, 1, 2, 3]
    assert observer.calls["after_step"] == 4 and events[-1].stop_reason == "stopped"
    assert all(isinstance(events[events.index(b) - 1], Marker) for b in beams)


def test_the_history_is_the_contexts_not_the_process(tiny_lm):
    tiny_lm.history.forget()
    mine = RunHistory()
    settings = RunSettings.from_flat(prompt="Once upon a time", chat=False, max_new_tokens=6)
    events = list(run_strategy(tiny_lm, settings, RunContext(history=mine)))
    done = events[-1]
    assert isinstance(done, RunFinished)
    assert mine.runs == [list(events[0].prompt_token_ids) + list(done.token_ids)]
    assert tiny_lm.history.runs == []  # the model's own history saw nothing of it
    spec = RunSettings.from_flat(strategy="speculative", draft="suffix", prompt="Once upon a time", chat=False,
                                 max_new_tokens=6, baseline_tokens=0)

    def detail(context):
        events = list(run_strategy(tiny_lm, spec, context))
        return next(e for e in events if isinstance(e, SpeculativeStarted)).detail

    assert "1 earlier run " in detail(RunContext(history=mine))
    assert "0 earlier runs" in detail(RunContext(history=RunHistory()))
    assert "0 earlier runs" in detail(RunContext())  # the model's own, still empty before this run ended
    assert len(tiny_lm.history.runs) == 1
    tiny_lm.history.forget()


def test_a_chooser_reaches_only_a_strategy_whose_entry_takes_it(tiny_lm, monkeypatch):
    from playground.config import catalog
    from playground.engine.strategies import takes_chooser

    asked: list[int] = []

    def chooser(step: TokenStep) -> int:
        asked.append(step.step)
        return step.token_id

    greedy = RunSettings.from_flat(prompt="one two", chat=False, max_new_tokens=3)
    list(run_strategy(tiny_lm, greedy, chooser=chooser))
    assert asked == [0, 1, 2] and takes_chooser("greedy") and not takes_chooser("beam")
    # The entry, not the runner's signature, says so: greedy declared without it gets none.
    monkeypatch.setitem(catalog.STRATEGIES, "greedy",
                        dataclasses.replace(catalog.STRATEGIES["greedy"], takes_chooser=False))
    asked.clear()
    assert isinstance(list(run_strategy(tiny_lm, greedy, chooser=chooser))[-1], RunFinished)
    assert asked == [] and not takes_chooser("greedy")


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return names


@pytest.mark.parametrize("module", ["sampling.py", "beam.py", "speculative/decode.py"])
def test_a_strategy_file_names_no_observer(module):
    names = _names(ENGINE / module)
    banned = {"layers_started", "LayerOutputs", "LensRecorder", "LensSettings", "kv_started", "kv_step",
              "playground.engine.observers", "playground.engine.run_history", "remember"}
    assert not names & banned
