"""Stop in the window while a run prepares: a drafter's, amateur's, cheap model's or --quant's quantized copy being
built, the KV lab reading a long prompt, the contrastive amateur reading it. Each run ends "stopped" within the
build's (or the prompt's) next progress point, says what Stop cut, keeps nothing half-built, and the next run
starts cleanly.

The window is driven with the worker in the loop (pytest-qt, offscreen) on a tiny random model, as in
``test_stop_and_restart.py``.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from windows import let_go, module_window

from playground.config import RunSettings
from playground.config.words import settings_from_pane
from playground.engine import variants
from playground.events import PrefillDone, PrefillProgress, RunFinished, RunStarted, TokenStep
from playground.state import Run
from playground.ui.main_window import MainWindow

RUN_TIMEOUT_MS = 30000
SHORT = "one two three one two three"
LONG = " ".join(["one two three four"] * 40)  # ~600 tokens of the tiny tokenizer: three chunks of 256


@pytest.fixture(scope="module")
def long_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, max_positions=4096)


@pytest.fixture(scope="module")
def shared_window(qapp, long_lm, tmp_path_factory):
    """One window for every check, each stopping a run and then running again in it (as a user does; a window and
    its teardown cost about 0.7 s of CPU)."""
    yield from module_window(tmp_path_factory.mktemp("stop-window"), long_lm, RunSettings(max_new_tokens=8),
                             (1400, 900))


@pytest.fixture
def window(shared_window):
    variants.clear()
    assert not shared_window.busy
    yield shared_window
    let_go(shared_window)
    variants.clear()


def record_messages(w: MainWindow, monkeypatch) -> list[str]:
    """The status bar's messages from now on (the window's own showMessage again after the test)."""
    messages: list[str] = []
    real_show = w.status.showMessage

    def show(text, *args):
        messages.append(text)
        return real_show(text, *args)

    monkeypatch.setattr(w.status, "showMessage", show)
    return messages


class Seen(list):
    """What a run's job reported, in order, from the worker thread: ("progress", message) and ("event", event).
    With ``stop_when``, Stop is pressed (from the worker, as a user would at that moment) the first time it holds
    on what was seen; ``at`` is how much had been seen then."""

    stop_when = None
    at: int | None = None

    def add(self, window: MainWindow, item: tuple) -> None:
        self.append(item)
        if self.stop_when is not None and self.at is None and self.stop_when(self):
            self.at = len(self)
            window.job.stop()

    def after(self, kind: str) -> list:
        return [x for k, x in self[self.at :] if k == kind]


@pytest.fixture
def seen(window, monkeypatch) -> Seen:
    record = Seen()
    start_job = window._start_job

    def recording_start_job(body, kind, **given):
        def recorded(should_stop, progress):
            def reporting(message, fraction):
                record.add(window, ("progress", message))
                progress(message, fraction)

            events = iter(body(should_stop, reporting))
            try:
                for event in events:
                    record.add(window, ("event", event))
                    yield event
            finally:
                getattr(events, "close", lambda: None)()

        start_job(recorded if kind == "run" else body, kind, **given)

    monkeypatch.setattr(window, "_start_job", recording_start_job)
    return record


def generate(qtbot, w: MainWindow, spec: str, prompt: str = SHORT, new_tokens: int = 4) -> Run:
    settings = settings_from_pane(RunSettings(prompt=prompt, chat=False, max_new_tokens=new_tokens), spec)
    w.set_run_settings(settings)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    assert w.busy, "Generate started nothing"
    run = w.session.runs[-1]
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    return run


BUILDS = {  # a run whose quantized copy is built before its first event
    "drafter": "speculative --draft quantized --draft-quant rtn-int4 --baseline-tokens 0",
    "amateur": "contrastive --amateur quantized --amateur-quant rtn-int8",
    "cheap model": "cascade --cheap quantized --cheap-quant rtn-int4-head --no-cascade-compare",
    "--quant": "greedy --quant rtn-int8",
    "quantization lab": "greedy --quant rtn-int4 --group-size 32 --compare",
}


@pytest.mark.parametrize("name", list(BUILDS))
def test_stop_while_a_quantized_copy_is_built(qtbot, window, seen, monkeypatch, name):
    w = window
    seen.stop_when = lambda items: items[-1][0] == "progress"  # the build's first report
    messages = record_messages(w, monkeypatch)
    run = generate(qtbot, w, BUILDS[name])

    assert seen.at is not None, "the build reported no progress"
    assert len(seen.after("progress")) <= 1  # it ended at its next progress point
    assert run.error is None, run.error
    assert run.status == "stopped" and [type(e) for e in run.events] == [RunStarted, RunFinished]
    assert run.finished.cut_short == ("quantized_copy",) and run.finished.token_ids == ()
    assert "stopped" in w.runs_list.item(run.index).text()
    assert any("Stop cut short: quantized copy" in m for m in messages), messages
    assert variants.held(kind=variants.QuantizedCopy) == []  # nothing half-built kept

    # The same run again, not stopped: the copy is built from scratch and the run goes to its end.
    seen.stop_when, seen.at = None, None
    seen.clear()
    again = generate(qtbot, w, BUILDS[name])
    assert again.error is None and again.finished is not None and again.finished.stop_reason != "stopped"
    assert again.finished.cut_short == () and again.unit_steps
    assert [k for k, _ in seen].count("progress") > 1 and len(variants.held(kind=variants.QuantizedCopy)) == 1
    assert w.generate_button.isEnabled() and not w.stop_button.isEnabled()


def test_the_kv_lab_shows_prompt_progress_and_stops_between_chunks(qtbot, window, seen, monkeypatch):
    w = window
    messages = record_messages(w, monkeypatch)
    seen.stop_when = lambda items: isinstance(items[-1][1], PrefillProgress)
    run = generate(qtbot, w, "kv-cache --paged --kv-dtype int8 --no-compare-no-cache", prompt=LONG)

    assert seen.at is not None, "the KV lab reported no prompt progress"
    events = [x for _, x in seen if not isinstance(x, str)]
    assert sum(isinstance(e, PrefillProgress) for e in events) == 1  # the next chunk boundary ended it
    assert not any(isinstance(e, (PrefillDone, TokenStep)) for e in events)
    assert run.error is None and run.status == "stopped" and run.finished is run.events[-1]
    assert len(run.events) == len(events)
    assert any(m.startswith("Reading the prompt: 256 of ") for m in messages), messages

    seen.stop_when, seen.at = None, None
    seen.clear()
    again = generate(qtbot, w, "kv-cache --paged --kv-dtype int8 --no-compare-no-cache", prompt=LONG)
    progress = [x for _, x in seen if isinstance(x, PrefillProgress)]
    assert [p.done_tokens for p in progress] == [256, 512] and again.finished.stop_reason == "max_new_tokens"
    assert len(again.steps) == 4


def test_stop_while_the_amateur_reads_the_prompt(qtbot, window, seen):
    w = window

    def after_the_experts_prefill(items):
        events = [x for _, x in items if not isinstance(x, str)]
        return isinstance(events[-1], PrefillProgress) and any(isinstance(e, PrefillDone) for e in events) \
            if events else False

    seen.stop_when = after_the_experts_prefill
    run = generate(qtbot, w, "contrastive --amateur quantized --amateur-quant rtn-int8", prompt=LONG)

    assert seen.at is not None, "the amateur's prompt pass reported no progress"
    assert sum(isinstance(x, PrefillProgress) for x in seen.after("event")) == 0  # none after the one that stopped it
    assert run.error is None and run.status == "stopped" and not run.steps
    assert run.finished.cut_short == ("amateur_prefill",) and "amateur_prefill_ms" not in run.finished.figures
    again = generate(qtbot, w, "greedy", new_tokens=3)
    assert again.error is None and again.finished.stop_reason != "stopped" and len(again.steps) == 3
