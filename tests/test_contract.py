"""The typed contract: ``Event`` names every event class, step events are told by their fields (the session folds
each kind where it belongs), stop reasons are a closed set that still opens an unknown one, and a server's run is
known from its start event, in saved runs from before that field too."""

from __future__ import annotations

import dataclasses
import json
import types
import typing

import pytest

from playground.config import RunSettings
from playground.events import (
    EVENT_TYPES,
    STOP_REASONS,
    Event,
    PrefillDone,
    RunFinished,
    RunStarted,
    TokenStep,
    dumps_event,
    event_from_dict,
    event_to_dict,
    is_step_event,
    is_unit_step,
)
from playground.state import Run
from playground.traces import read_trace, write_trace


def _value(hint):
    """A plain value of a field's type (the first of a Literal, None where it may be None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in args else _value(args[0])
    if origin is typing.Literal:
        return args[0]
    if origin is tuple:
        return ()
    if origin is dict or hint is dict:
        return {}
    if dataclasses.is_dataclass(hint):
        return _build(hint)
    return {int: 1, float: 0.5, str: "x", bool: False}.get(hint)


def _build(cls):
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _value(hints[f.name]) for f in dataclasses.fields(cls) if f.init})


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_event_union_names_every_event_class():
    assert set(typing.get_args(Event)) == set(EVENT_TYPES.values())


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_the_session_folds_every_event_type_where_it_belongs(cls):
    """Told apart by the fields the class declares (a ``step`` field; a class-level ``unit`` name), checked here
    from the dataclass itself."""
    event = _build(cls)
    assert event_from_dict(json.loads(dumps_event(event))) == event  # each kind also reads back as itself
    has_step = "step" in _field_names(cls)
    is_unit = has_step and "unit" not in _field_names(cls) and isinstance(getattr(cls, "unit", None), str)
    assert is_step_event(event) == has_step and is_unit_step(event) == is_unit
    run = Run(index=0, settings=RunSettings())
    run.apply(event)
    assert run.events == [event]
    assert (run.started is event, run.prefill is event, run.finished is event) == \
        (cls is RunStarted, cls is PrefillDone, cls is RunFinished)
    assert run.step_events == ([event] if has_step else []) and run.step_kinds == ({cls} if has_step else set())
    assert run.unit_steps == ([event] if is_unit else [])
    assert run.steps == ([event] if issubclass(cls, TokenStep) else [])
    if is_unit:
        assert run.step_unit == cls.unit and run.kv_cache_bytes == event.kv_cache_bytes


def test_the_latest_unit_step_gives_the_cache_size_else_the_prefill():
    run = Run(index=0, settings=RunSettings())
    assert run.kv_cache_bytes is None
    run.apply(dataclasses.replace(_build(PrefillDone), kv_cache_bytes=100))
    assert run.kv_cache_bytes == 100
    run.apply(dataclasses.replace(_build(TokenStep), kv_cache_bytes=140))
    assert run.kv_cache_bytes == 140


def _start(device: str, **extra) -> dict:
    plain = event_to_dict(dataclasses.replace(_build(RunStarted), device=device))
    del plain["remote"]  # as a saved run from before the field
    return {**plain, **extra}


def _done(stop_reason) -> dict:
    return {**event_to_dict(_build(RunFinished)), "stop_reason": stop_reason}


def _write(path, *objects: dict):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
    return path


@pytest.mark.parametrize(("device", "remote"), [("remote: llama.cpp", True), ("remote: vllm", True),
                                                ("cpu", False), ("cuda:0", False)])
def test_an_old_saved_run_is_known_as_a_server_run_by_its_device(tmp_path, device, remote):
    trace = read_trace(_write(tmp_path / "old.jsonl", _start(device), _done("eos")))
    assert trace.skipped == [] and trace.events[0].remote is remote
    from playground.ui.views.base import is_remote_run  # what the views ask

    assert is_remote_run(Run.from_events(trace.events)) is remote


def test_a_saved_runs_own_field_wins_over_its_device(tmp_path):
    trace = read_trace(_write(tmp_path / "new.jsonl", _start("cpu", remote=True), _done("eos")))
    assert trace.events[0].remote is True
    written = write_trace(trace.events, tmp_path / "again.jsonl")
    assert json.loads(written.read_text(encoding="utf-8").splitlines()[0])["remote"] is True


@pytest.mark.parametrize("reason", STOP_REASONS)
def test_every_stop_reason_reads_back_as_itself(tmp_path, reason):
    trace = read_trace(_write(tmp_path / "t.jsonl", _start("cpu"), _done(reason)))
    assert trace.skipped == [] and trace.events[-1].stop_reason == reason


def test_an_unknown_stop_reason_opens_as_unknown(tmp_path):
    """A reason from a newer version (or a server's own) is no reason to lose the run's end."""
    trace = read_trace(_write(tmp_path / "t.jsonl", _start("cpu"), _done("frobnicated")))
    assert trace.skipped == [] and not trace.truncated
    assert trace.events[-1].stop_reason == "unknown" and Run.from_events(trace.events).status == "unknown"


def test_a_stop_reason_that_is_not_text_is_a_damaged_line(tmp_path):
    trace = read_trace(_write(tmp_path / "t.jsonl", _start("cpu"), _done(3)))
    assert trace.truncated and len(trace.skipped) == 1 and "done.stop_reason" in trace.skipped[0]
