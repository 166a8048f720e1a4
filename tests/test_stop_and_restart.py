"""Stop in the window, for every registered strategy: the run ends "stopped" within a step, keeps every event it
streamed and its final event (saying which end-of-run figures were cut short), and the next run starts; every view
resets from any state; closing the window while a job runs exits cleanly.

The window is driven with the worker in the loop (pytest-qt, offscreen) on tiny random models.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from windows import let_go, open_window

from playground.config import RunSettings
from playground.config.catalog import get_strategy, strategy_names
from playground.config.words import settings_from_pane
from playground.engine.run_context import RunContext
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished, TokenStep
from playground.events.panes import PaneToken
from playground.events.patching import PatchingRow
from playground.events.speculative import SpeculativeRound
from playground.state import Run
from playground.ui.main_window import MainWindow
from playground.ui.views import view_classes
from playground.ui.views.base import View

RUN_TIMEOUT_MS = 30000
PROMPT = "one two three one two three one two three"

# Each registered strategy with the options that make its steps yield several events and give it end-of-run
# work, the end-of-run figures a Stop mid-run leaves out, and how many units one step may still yield after Stop.
STOP_CASES: dict[str, tuple[str, tuple[str, ...], int]] = {
    "greedy": ("greedy", (), 1),
    "sample": ("sample --temperature 0.8", (), 1),
    "beam": ("beam --num-beams 3", (), 1),
    "diverse beam": ("beam --num-beams 4 --num-beam-groups 2 --diversity-penalty 1.5", (), 1),
    "speculative": ("speculative --draft prompt-lookup --draft-k 10 --prompt-lookup-ngram 1 --baseline-tokens 8",
                    ("baseline",), 11),
    # A tree drafted depth by depth by the target's first layer, verified in one pass.
    "speculative tree": ("speculative --draft layers --draft-layers 1 --tree-width 2 --baseline-tokens 8",
                         ("baseline",), 5),
    "early-exit": ("early-exit --compare-full --exit-threshold 0.5", ("full_model",), 1),
    "layer-skip": ("layer-skip --skip-threshold 0.5 --compare-full", ("full_model",), 1),
    "kv-cache": ("kv-cache --paged --samples 2 --compare-no-cache --batch-sweep 1,2", ("no_cache", "batch_sweep"), 1),
    # A cache that keeps less, with the attention view's recording: its quality pass is end-of-run work too.
    "kv compressed": ("kv-cache --kv-keep h2o --kv-budget 12 --kv-window 4 --record-attention",
                      ("no_cache", "full_model"), 1),
    "compare": ("compare --pane greedy --pane 'sample --temperature 0.8' --log-likelihood", ("log_likelihood",), 1),
    "contrastive": ("contrastive --contrast-baseline 8", ("baseline",), 1),
    "contrastive-search": ("contrastive-search --top-k 4 --penalty-alpha 0.6", (), 1),
    "cascade": ("cascade --cheap layers --cheap-layers 1 --cascade-compare", ("full_model",), 1),
    "quant lab": ("greedy --quant rtn-int8 --compare", (), 1),  # reference and quantized copy side by side
}
TINY_VECTOR = Path(__file__).parent / "data" / "steering" / "tiny-happy-sad.safetensors"
STOP_CASES.update({"steering sweep": (f"greedy --steer {TINY_VECTOR}:1 --steer-sweep=-2,2 --steer-compare",
                                      ("sweep_scores",), 1)})  # feeds both steering views
STOP_CASES.update({"watermark": ("sample --watermark kirchenbauer --temperature 0.8", (), 1)})  # the watermark lab


# Strategies that decode no tokens (activation patching: a map's rows) have their Stop checked in their own tests
# (tests/test_patching.py, tests/test_attribution_maps_window.py); here they feed the views' reset check only.
VIEW_ONLY_CASES = {"patching": "patching --corrupted 'one two three one two three one two four'"}  # 3 maps


def case_settings(name: str, max_new_tokens: int) -> RunSettings:
    options = STOP_CASES[name][0] if name in STOP_CASES else VIEW_ONLY_CASES[name]
    return settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=max_new_tokens), options)


def unit_key(event) -> tuple | None:
    """What one step of a run produces: a token, a beam step, or a pane's token (one per pane)."""
    if isinstance(event, (TokenStep, BeamStep)):
        return (type(event).__name__,)
    if isinstance(event, PaneToken):
        return ("pane", event.pane)
    if isinstance(event, PatchingRow):
        return ("row",)
    return None


@pytest.fixture(scope="module")
def long_lm():
    """A tiny model with a long context, so a run is still going when it is stopped."""
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, max_positions=4096)


class _KeepOpen:
    """Stands in for qtbot when opening the module's window: qtbot would close it after the first test."""

    @staticmethod
    def addWidget(_widget) -> None:
        pass


@pytest.fixture(scope="module")
def shared_window(qapp, long_lm, tmp_path_factory):
    """One window for the module's cases (the suite's time: a window costs over a second of CPU to build, more than
    a case's runs). Each case stops a run and then checks that the next run starts and ends in that window, so the
    window a case gets is one a user has used: idle, its last run ended; the first case gets a fresh one."""
    w = open_window(_KeepOpen, tmp_path_factory.mktemp("stop-window"), long_lm, RunSettings(max_new_tokens=8),
                    size=(1400, 900))
    yield w
    let_go(w)
    w.close()
    w.deleteLater()


@pytest.fixture
def window(qtbot, shared_window):
    let_go(shared_window)  # a case that failed mid-run leaves no job to the next one
    assert not shared_window.busy
    yield shared_window
    let_go(shared_window)


# Where Stop must land for the case to mean something: inside a step that still has several events to yield.
STOP_INSIDE_A_STEP = {
    # A round that emits 3 or more tokens: its event comes first, its tokens after it.
    "speculative": lambda event: isinstance(event, SpeculativeRound) and event.emitted >= 3,
}


class Produced(list):
    """Every event the engine yields to the worker, in order (appended on the worker thread); with ``stop_when``,
    Stop is pressed from the worker right after the first event it accepts (``at_stop``: events before Stop)."""

    stop_when = None
    at_stop: int | None = None


@pytest.fixture
def produced(window, monkeypatch) -> Produced:
    seen = Produced()
    start_job = window._start_job

    def recording_start_job(body, kind, **given):
        def recorded(should_stop, progress):
            events = iter(body(should_stop, progress))
            try:
                for event in events:
                    seen.append(event)
                    if seen.stop_when is not None and seen.at_stop is None and seen.stop_when(event) \
                            and sum(unit_key(e) is not None for e in seen) >= 2:
                        seen.at_stop = len(seen)
                        window.job.stop()
                    yield event
            finally:
                getattr(events, "close", lambda: None)()

        start_job(recorded if kind == "run" else body, kind, **given)

    monkeypatch.setattr(window, "_start_job", recording_start_job)
    return seen


def generate(qtbot, w: MainWindow, settings: RunSettings) -> Run:
    w.set_run_settings(settings)
    assert w.current_settings() == settings  # the form holds every option of the case
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    assert w.busy, "Generate started nothing"
    return w.session.runs[-1]


def test_every_registered_strategy_has_a_stop_case():
    assert set(strategy_names()) <= set(STOP_CASES) | set(VIEW_ONLY_CASES)
    assert all(not get_strategy(name).decodes for name in VIEW_ONLY_CASES)


@pytest.mark.parametrize("name", list(STOP_CASES))
def test_stop_mid_run_keeps_the_run_and_the_next_run_starts(qtbot, window, produced, name):
    w = window
    produced.stop_when = STOP_INSIDE_A_STEP.get(name)
    run = generate(qtbot, w, case_settings(name, max_new_tokens=2000))
    if produced.stop_when is None:
        qtbot.waitUntil(lambda: len(run.unit_steps) >= 2, timeout=RUN_TIMEOUT_MS)
        qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
        at_stop = len(produced)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    if produced.stop_when is not None:
        assert produced.at_stop is not None, "Stop never landed inside a step"
        at_stop = produced.at_stop
        stop_round = produced[at_stop - 1]
        assert sum(isinstance(e, TokenStep) for e in produced[at_stop:]) == stop_round.emitted  # the round's tokens

    assert run.error is None, run.error
    assert run.status == "stopped" and run.finished is run.events[-1]
    assert len(run.events) == len(produced) and all(a is b for a, b in zip(run.events, produced, strict=True))
    assert run.finished.cut_short == STOP_CASES[name][1]
    assert len(run.finished.token_ids) < 2000
    # Within one step: the step in flight at Stop, then the end.
    per_step = STOP_CASES[name][2]
    after: dict[tuple, int] = {}
    for event in produced[at_stop:]:
        key = unit_key(event)
        if key is not None:
            after[key] = after.get(key, 0) + 1
    assert all(count <= per_step for count in after.values()), after
    assert "stopped" in w.runs_list.item(run.index).text()

    # The next Generate, of another strategy, starts and runs to its end.
    names = list(STOP_CASES)
    other = names[(names.index(name) + 1) % len(names)]
    second = generate(qtbot, w, case_settings(other, max_new_tokens=4))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert second.error is None and second.finished is not None and second.finished.stop_reason != "stopped"
    assert second.finished.cut_short == () and second.unit_steps
    assert w.generate_button.isEnabled() and not w.stop_button.isEnabled()


def stop_inside(monkeypatch, w: MainWindow, module_name: str, function: str, call: int = 1, poll: int = 0) -> list:
    """Press Stop (from the worker thread, as a user would at that moment) inside the ``call``-th call of
    ``module.function``: at its ``poll``-th poll of the stop check it was given (its run context's, or a plain
    ``should_stop``), or before it runs (``poll`` 0, or none given: it must then notice Stop by itself). Returns the
    calls seen."""
    module = importlib.import_module(module_name)
    real = getattr(module, function)
    signature = inspect.signature(real)
    calls: list[int] = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) != call:
            return real(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        name = "context" if "context" in signature.parameters else "should_stop"
        given = bound.arguments.get(name)
        if poll == 0 or given is None:
            w.job.stop()
            return real(*args, **kwargs)
        polls: list[int] = []

        def polling() -> bool:
            polls.append(1)
            if len(polls) == poll:
                w.job.stop()
            return given()

        bound.arguments[name] = (dataclasses.replace(given, should_stop=polling) if isinstance(given, RunContext)
                                 else polling)
        return real(*bound.args, **bound.kwargs)

    monkeypatch.setattr(module, function, wrapper)
    return calls


# End-of-run work, stopped while it runs: (strategy options, where Stop lands, what is cut, figures left out).
END_CASES = {
    "speculative baseline": ("speculative --draft prompt-lookup --baseline-tokens 6",
                             ("playground.engine.speculative.decode", "plain_greedy", 1, 2), ("baseline",),
                             ("baseline_tokens_per_s", "speedup")),
    "contrastive baseline": ("contrastive --contrast-baseline 6",
                             ("playground.engine.contrastive.decode", "plain_greedy", 1, 2), ("baseline",),
                             ("greedy_tokens_per_s", "step_cost")),
    "early exit's full model": ("early-exit --compare-full --exit-threshold 0.5",
                                ("playground.engine.layers.decode", "plain_greedy", 1, 2), ("full_model",),
                                ("full_tokens_per_s", "time_saved", "identical_fraction")),
    "cascade's full model alone": ("cascade --cheap layers --cheap-layers 1 --cascade-compare",
                                   ("playground.engine.cascade.decode", "full_model_alone", 1, 2), ("full_model",),
                                   ("full_alone_tokens_per_s", "time_saved", "identical_fraction")),
    "kv lab without a cache": ("kv-cache --compare-no-cache",
                               ("playground.engine.kv.batch", "no_cache_decode", 1, 2), ("no_cache",), ()),
    "kv lab batch sweep": ("kv-cache --batch-sweep 1,2,3",
                           ("playground.engine.kv.batch", "batch_greedy", 2, 0), ("batch_sweep",), ()),
    "kv lab int8 cache's full model": ("kv-cache --kv-dtype int8",
                                       ("playground.engine.kv.decode", "plain_greedy", 1, 2), ("full_model",),
                                       ("first_divergence",)),
}


@pytest.mark.parametrize("name", list(END_CASES))
def test_stop_during_end_of_run_work_cuts_it_short_and_says_so(qtbot, window, produced, monkeypatch, name):
    spec, (module, function, call, poll), cut, left_out = END_CASES[name]
    w = window
    calls = stop_inside(monkeypatch, w, module, function, call, poll)
    settings = settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=6), spec)
    run = generate(qtbot, w, settings)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)

    assert len(calls) >= call, f"{function} was not called: the case does not reach its end-of-run work"
    assert run.error is None, run.error
    assert run.finished is run.events[-1] and len(run.events) == len(produced)
    assert run.finished.stop_reason == "stopped" and run.finished.cut_short == cut
    assert not set(left_out) & set(run.finished.figures), run.finished.figures
    # The tokens decoded before the end-of-run work are all kept.
    assert list(run.finished.token_ids) == [s.token_id for s in run.steps] and run.steps
    if name == "kv lab batch sweep":  # the sizes measured in full before Stop are kept
        sweeps = [e for e in run.events if type(e).__name__ == "KVSweep"]
        assert len(sweeps) == 1 and sweeps[0].batch_sizes == (1,)
    if name == "kv lab without a cache":
        assert not [e for e in run.events if type(e).__name__ == "KVCompare"]
    assert "cut short" in w.status.currentMessage() and cut[0].replace("_", " ") in w.status.currentMessage()


def test_side_by_side_scoring_is_skipped_after_stop(long_lm):
    """Stop once every pane has ended: the log-likelihood pass over each output is left out, and said so."""
    settings = settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=4),
                                  "compare --pane greedy --pane greedy --log-likelihood")
    stopped = []
    events = []
    for event in run_strategy(long_lm, settings, lambda: bool(stopped)):
        events.append(event)
        if sum(isinstance(e, PaneToken) for e in events) == 8:  # 4 tokens of each pane: they end without a poll
            stopped.append(True)
    final = events[-1]
    assert isinstance(final, RunFinished) and final.stop_reason == "stopped" and final.cut_short == ("log_likelihood",)
    panes = [e for e in events if type(e).__name__ == "PaneFinished"]
    assert len(panes) == 2 and all("log_likelihood" not in p.figures for p in panes)
    assert all(len(p.token_ids) == 4 for p in panes)


# --- every view resets from every state --------------------------------------------------------------------------

def _runs_for_views(lm) -> list[tuple[str, list, list, list]]:
    """Per case: (name, a whole run's events, a stopped run's events, a run's first events, cut mid-way)."""
    out = []
    for name in [*STOP_CASES, *VIEW_ONLY_CASES]:
        settings = case_settings(name, max_new_tokens=6)
        whole = list(run_strategy(lm, settings))
        stopped: list = []
        for event in run_strategy(lm, settings, lambda seen=stopped: sum(unit_key(e) is not None for e in seen) >= 3):
            stopped.append(event)
        first_steps = [i for i, e in enumerate(whole) if unit_key(e) is not None]
        out.append((name, whole, stopped, whole[: first_steps[len(first_steps) // 2] + 1]))
    return out


@pytest.fixture(scope="module")
def view_runs(long_lm):
    return _runs_for_views(long_lm)


def _stream(view: View, run: Run, events: list, batch: int = 3) -> None:
    """As the window feeds a live run: fold a batch into the run, apply it, flush."""
    for start in range(0, len(events), batch):
        chunk = events[start : start + batch]
        for event in chunk:
            run.apply(event)
        view.apply(run, chunk)
        view.flush()
        if run.finished is not None:
            view.end(run)


def test_every_view_resets_from_every_state(qtbot, view_runs):
    views = []
    for cls in view_classes():
        view = cls()
        qtbot.addWidget(view)
        view.resize(900, 640)
        view.show()
        views.append(view)
    for view in views:
        view.reset()  # empty
        view.reset()
    drawn: dict[str, int] = {}
    for name, whole, stopped, first in view_runs:
        settings = case_settings(name, max_new_tokens=6)
        for view in views:
            if not view.applies_to(Run.from_events(whole)):
                continue
            drawn[view.name] = drawn.get(view.name, 0) + 1
            # mid-run: streamed, still running
            live = Run(index=0, settings=settings)
            view.reset()
            _stream(view, live, first)
            assert live.running
            view.reset()
            # stopped: streamed to its final event, then selected again (show_run), then reset
            done = Run(index=1, settings=settings)
            _stream(view, done, stopped)
            assert done.status == "stopped"
            view.reset()
            view.show_run(done)
            view.reset()
            # failed: the run broke off mid-way
            failed = Run.from_events(first, index=2)
            failed.error = "RuntimeError: the test broke it"
            view.show_run(failed)
            view.end(failed)
            view.reset()
            # and a whole run again, after all that
            view.show_run(Run.from_events(whole, index=3))
            view.reset()
    assert set(drawn) == {cls.name for cls in view_classes()}, "a view no case feeds goes untested"


def test_a_view_that_raises_does_not_leave_the_window_stuck(qtbot, window, capfd):
    from playground.ui.views import register_view, unregister_view

    class Broken(View):
        name, title, consumes = "broken", "Broken view", (TokenStep,)

        def reset(self):
            raise ValueError("operands could not be broadcast together with shapes (4,) (0,)")

    register_view(Broken)
    try:
        w = open_window(qtbot, lm=window.lm, run_settings=RunSettings(max_new_tokens=4), size=None, store=window.store)
        for _ in range(2):
            qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
            qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
        first, second = w.session.runs
        assert first.finished is not None and second.finished is not None and second.error is None
        assert w.views["tokens"].token_view.steps == second.steps  # the other views went on
        assert "Broken view failed" in w.docks["broken"].empty.text() or \
            "broken view failed" in w.docks["broken"].empty.text()
        assert w.docks["broken"].pages.currentWidget() is w.docks["broken"].empty
        err = capfd.readouterr().err
        assert "the broken view raised in" in err and "ValueError: operands could not be broadcast" in err
    finally:
        unregister_view("broken")


# --- closing while a job runs --------------------------------------------------------------------------------

CLOSE_SCRIPT = textwrap.dedent('''
    import os, sys, time
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv[:1])
    from playground.config import ModelSettings, RunSettings
    from playground.ui.main_window import MainWindow

    w = MainWindow(run_settings=RunSettings(max_new_tokens=4, chat=False),
                   store=QSettings(sys.argv[2], QSettings.Format.IniFormat))
    w.show()
    if sys.argv[1] == "load":
        import playground.models.loading as loading
        from playground.models.loading import ModelLoadError

        def slow_load(spec, progress=None):  # a load cannot be interrupted: this one takes 2 s of the CPU
            end = time.monotonic() + 2
            while time.monotonic() < end:
                sum(range(1000))
            raise ModelLoadError("the test's model load only takes time")

        loading.load_model = slow_load
        w.load_model(ModelSettings(path="/nowhere"))
    else:  # a long prompt read: one prefill chunk takes 2 s and Stop is seen only between chunks
        import playground.engine.strategies as strategies
        from support.tiny_models import build_tiny_lm

        def slow_prompt(lm, settings, should_stop=None, progress=None):
            end = time.monotonic() + 2
            while time.monotonic() < end:
                sum(range(1000))
            yield from ()

        strategies.run_strategy = slow_prompt
        w.set_model(build_tiny_lm(seed=0))
        w.generate()
    assert w.busy
    QTimer.singleShot(300, w.close)
    app.exec()
    print("window closed", flush=True)
''')


@pytest.mark.parametrize("job", ["load", "prompt"])
def test_closing_the_window_mid_job_exits_cleanly(tmp_path, job):
    """Closing while a job cannot stop at once (a model load, a long prompt chunk) ends the process with status 0,
    not Qt's abort for a running thread destroyed at exit ("QThread: Destroyed while thread is still running")."""
    script = tmp_path / "close_mid_job.py"
    script.write_text(CLOSE_SCRIPT)
    root = Path(__file__).resolve().parents[1]
    paths = [str(root / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run([sys.executable, str(script), job, str(tmp_path / "settings.ini")], capture_output=True,
                          text=True, timeout=120, cwd=root, env=env)  # tests/ on the path: tests/support importable
    assert done.returncode == 0, done.stderr[-2000:]
    assert "window closed" in done.stdout and "Destroyed while thread" not in done.stderr
