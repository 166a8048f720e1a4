"""Saved runs: a real trace reads back as its events; damaged files open as far as they can, or say why not."""

from __future__ import annotations

import dataclasses
import json

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted, TokenStep
from playground.traces import TraceError, read_trace, write_trace

MAX_NEW_TOKENS = 6
TRUNCATED = "the trace ends before the run did (no 'done' event): it shows the run as far as it got"


@pytest.fixture(scope="module")
def greedy_trace(model_folder, tmp_path_factory):
    """A greedy trace written by `playground trace`: its path and its lines."""
    from playground.cli import main

    path = tmp_path_factory.mktemp("trace") / "greedy.jsonl"
    argv = ["trace", "--model", str(model_folder), "--device", "cpu", "--prompt", "Paris is",
            "--max-new-tokens", str(MAX_NEW_TOKENS), "--out", str(path)]
    assert main(argv) == 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == MAX_NEW_TOKENS + 3  # start, prefill, one token each, done
    return path, lines


def _plain(value):
    """An event's fields as JSON would hold them (stdlib only: tuples become lists, no -inf in these traces)."""
    return json.loads(json.dumps(dataclasses.asdict(value), allow_nan=False))


def test_a_real_trace_reads_back_as_its_events(greedy_trace, tiny_lm):
    path, lines = greedy_trace
    trace = read_trace(path)
    assert trace.skipped == [] and not trace.truncated and trace.problems() == ""
    assert len(trace.events) == len(lines)
    for event, line in zip(trace.events, lines, strict=True):
        plain = json.loads(line)
        assert type(event).type == plain.pop("type")
        assert _plain(event) == plain
    # And they are the events of the same run decoded here (greedy is deterministic; timings aside).
    reference = list(run_strategy(tiny_lm, RunSettings(prompt="Paris is", max_new_tokens=MAX_NEW_TOKENS)))
    assert [type(e) for e in trace.events] == [type(e) for e in reference]
    start, ref_start = trace.events[0], reference[0]
    assert isinstance(start, RunStarted)
    assert (start.prompt_text, start.prompt_token_ids, start.settings) == \
        (ref_start.prompt_text, ref_start.prompt_token_ids, ref_start.settings)
    tokens = [e for e in trace.events if isinstance(e, TokenStep)]
    ref_tokens = [e for e in reference if isinstance(e, TokenStep)]
    assert [(t.token_id, t.text) for t in tokens] == [(t.token_id, t.text) for t in ref_tokens]
    assert [t.prob for t in tokens] == pytest.approx([t.prob for t in ref_tokens], rel=1e-5)
    assert trace.events[-1].token_ids == reference[-1].token_ids and trace.events[-1].text == reference[-1].text


def _damaged(tmp_path, lines: list[str], name: str = "damaged.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_line_that_is_not_json_is_skipped(greedy_trace, tmp_path):
    _, lines = greedy_trace
    damaged = list(lines)
    damaged[3] = "garbage{"  # line 4: a token
    trace = read_trace(_damaged(tmp_path, damaged))
    assert trace.skipped == ["line 4: not JSON (Expecting value)"]
    assert len(trace.events) == len(lines) - 1 and not trace.truncated
    assert trace.problems() == "skipped 1 line (line 4: not JSON (Expecting value))"


def test_an_unknown_event_type_is_skipped(greedy_trace, tmp_path):
    _, lines = greedy_trace
    damaged = [*lines[:3], json.dumps({"type": "speculative_step", "step": 0}), *lines[3:]]
    trace = read_trace(_damaged(tmp_path, damaged))
    assert trace.skipped == ["line 4: unknown event type 'speculative_step'"]
    assert len(trace.events) == len(lines) and not trace.truncated


def test_a_token_missing_a_field_is_skipped(greedy_trace, tmp_path):
    _, lines = greedy_trace
    token = json.loads(lines[2])
    assert token["type"] == "token"
    del token["raw_prob"]
    damaged = [*lines[:2], json.dumps(token), *lines[3:]]
    trace = read_trace(_damaged(tmp_path, damaged))
    assert trace.skipped == ["line 3: token: missing 'raw_prob'"]
    assert [e.step for e in trace.events if isinstance(e, TokenStep)] == list(range(1, MAX_NEW_TOKENS))


def test_a_field_of_the_wrong_type_is_skipped(greedy_trace, tmp_path):
    _, lines = greedy_trace
    token = json.loads(lines[2])
    token["candidates"][0]["raw_rank"] = "first"
    trace = read_trace(_damaged(tmp_path, [*lines[:2], json.dumps(token), *lines[3:]]))
    assert trace.skipped == ["line 3: token.candidates[0].raw_rank: expected int, got 'first'"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_line_with_nan_is_skipped(greedy_trace, tmp_path, constant):
    _, lines = greedy_trace
    token = json.loads(lines[4])  # line 5
    token["prob"] = "@@"
    damaged = list(lines)
    damaged[4] = json.dumps(token).replace('"@@"', constant)
    trace = read_trace(_damaged(tmp_path, damaged))
    assert trace.skipped == [f"line 5: {constant} is not valid JSON"]
    assert len(trace.events) == len(lines) - 1


def test_a_file_cut_half_way_is_truncated(greedy_trace, tmp_path):
    _, lines = greedy_trace
    half = lines[: len(lines) // 2]
    trace = read_trace(_damaged(tmp_path, half))
    assert trace.truncated and trace.skipped == []
    assert trace.problems() == TRUNCATED
    assert len(trace.events) == len(half)
    assert isinstance(trace.events[0], RunStarted) and isinstance(trace.events[1], PrefillDone)


def test_a_file_cut_mid_line_is_truncated_and_says_so(greedy_trace, tmp_path):
    _, lines = greedy_trace
    path = tmp_path / "cut.jsonl"
    text = "".join(line + "\n" for line in lines)
    path.write_text(text[: len(text) - len(lines[-1]) // 2 - 1], encoding="utf-8")  # half of the 'done' line
    trace = read_trace(path)
    assert trace.truncated
    assert len(trace.skipped) == 1 and trace.skipped[0].startswith(f"line {len(lines)}: not JSON (")
    assert trace.problems() == f"skipped 1 line ({trace.skipped[0]}). {TRUNCATED}"


def test_many_problems_are_summed_up(greedy_trace, tmp_path):
    _, lines = greedy_trace
    damaged = [lines[0], lines[1], *["oops"] * 5, *lines[2:]]
    trace = read_trace(_damaged(tmp_path, damaged))
    assert trace.problems() == ("skipped 5 lines (line 3: not JSON (Expecting value); line 4: not JSON (Expecting "
                                "value); line 5: not JSON (Expecting value); and 2 more)")


def test_a_first_line_that_is_not_a_start_is_refused(greedy_trace, tmp_path):
    _, lines = greedy_trace
    path = _damaged(tmp_path, lines[1:])
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert str(error.value) == f"{path} is not a saved run: its first readable line is a 'prefill' event, not a " \
                               f"'start' event"


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    with pytest.raises(TraceError) as error:
        read_trace(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not a saved run")
    assert message.endswith("it holds no readable event")


def test_a_file_of_garbage_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\nnothing else\n", encoding="utf-8")
    with pytest.raises(TraceError, match="is not a saved run"):
        read_trace(path)


def test_a_missing_file_is_refused(tmp_path):
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert str(error.value) == f"cannot read {path}: No such file or directory"


def test_a_second_run_in_one_file_is_not_merged(greedy_trace, tmp_path):
    _, lines = greedy_trace
    trace = read_trace(_damaged(tmp_path, [*lines, *lines]))
    assert len(trace.events) == len(lines) and not trace.truncated
    assert trace.skipped == [f"line {len(lines) + 1}: a second run's start (a saved run holds one run)"]


@pytest.mark.parametrize("settings", [
    RunSettings(prompt="Hello", max_new_tokens=5, stop_strings=("\n",)),
    RunSettings(strategy="sample", prompt="Hello", max_new_tokens=5, top_k=4, seed=2, forced_token_ids=(60, 61)),
    RunSettings.from_flat(strategy="beam", prompt="Hello", max_new_tokens=4, num_beams=3, num_return_sequences=2),
], ids=["greedy", "sample", "beam"])
def test_write_trace_then_read_trace(tiny_lm, tmp_path, settings):
    events = list(run_strategy(tiny_lm, settings))
    path = write_trace(events, tmp_path / "run.jsonl")
    assert path == tmp_path / "run.jsonl" and not (tmp_path / "run.jsonl.part").exists()
    trace = read_trace(path)
    assert trace.events == events and trace.skipped == [] and not trace.truncated


def _failing_save(tiny_lm, path):
    """Save a run, then try to save over it a run holding NaN (which strict JSON cannot write)."""
    events = list(run_strategy(tiny_lm, RunSettings(prompt="Hello", max_new_tokens=3)))
    token = next(e for e in events if isinstance(e, TokenStep))
    write_trace(events, path)
    before = path.read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="only -inf may be non-finite"):
        write_trace([*events[:3], dataclasses.replace(token, prob=float("nan")), *events[3:]], path)
    return before


def test_write_trace_that_fails_keeps_the_earlier_file(tiny_lm, tmp_path):
    before = _failing_save(tiny_lm, tmp_path / "run.jsonl")
    assert (tmp_path / "run.jsonl").read_text(encoding="utf-8") == before


def test_write_trace_that_fails_leaves_no_half_file(tiny_lm, tmp_path):
    _failing_save(tiny_lm, tmp_path / "run.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]


def test_a_truncated_saved_run_is_shown_as_failed(greedy_trace, tmp_path):
    from playground.state import Session

    _, lines = greedy_trace
    trace = read_trace(_damaged(tmp_path, lines[:-1]))  # everything but 'done'
    assert trace.truncated
    session = Session()
    run = session.add_saved_run(trace.events, "cut.jsonl")
    assert run.status == "failed"
    assert run.error is not None and "the saved trace ends" in run.error
    assert len(run.steps) == MAX_NEW_TOKENS and run.finished is None
    assert session.selected is run and session.live is None
    # The whole trace opens as a finished run.
    whole = session.add_saved_run(read_trace(greedy_trace[0]).events, "greedy.jsonl")
    assert whole.error is None and whole.status == whole.finished.stop_reason == "max_new_tokens"
    assert whole.settings == RunSettings(prompt="Paris is", max_new_tokens=MAX_NEW_TOKENS)
    assert isinstance(whole.finished, RunFinished)
