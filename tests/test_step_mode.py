"""Step mode ("you are the sampler") in the window: the run waits before each token; keys pick (↓ + Enter another
candidate, Space the sampler's own, Enter on the marked sampler's choice), Run on lets it go on by itself, Esc
stops; Stop while a step waits ends the run "stopped" with its final event. The chosen tokens are checked against
the model's own logits at each prefix (greedy's argmax, the candidates' raw order), the forced flags against what
was picked, and a saved run keeps them. A sampling run's Space takes the same draw a plain run of the seed makes.
"""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from windows import let_go, module_window, open_window

from playground.config import RunSettings
from playground.engine.sampling import run_sampling
from playground.events import RunFinished, TokenStep

WAIT_MS = 30000
PROMPT = "one two three"


def next_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.fixture(scope="module")
def shared_window(qapp, tiny_lm, tmp_path_factory):
    """One window for the checks that step a run and look at it (a window and its teardown cost about 0.7 s of CPU);
    closing one mid-step has its own."""
    yield from module_window(tmp_path_factory.mktemp("step-window"), tiny_lm)


def stepping(w, settings: RunSettings):
    """``w`` set to run ``settings`` in step mode (nothing running, no step bar left from an earlier check)."""
    assert not w.busy and not w.views["tokens"].step_bar.isVisible()
    w.set_run_settings(settings)
    assert w.current_settings() == settings
    w.step_mode.setChecked(True)
    return w


@pytest.fixture
def window(shared_window):
    yield stepping(shared_window, RunSettings(prompt=PROMPT, chat=False, max_new_tokens=6))
    let_go(shared_window)


def wait_for_choice(qtbot, w, step: int):
    view = w.views["tokens"]
    qtbot.waitUntil(lambda: view.step_bar.waiting and view.step_bar.step.step == step, timeout=WAIT_MS)
    return view.step_bar


def test_stepping_with_keys_then_run_on(qtbot, window, tiny_lm, tmp_path):
    w = window
    w.generate()
    prompt_ids = None
    taken: list[int] = []

    bar = wait_for_choice(qtbot, w, 0)
    prompt_ids = list(w.session.selected.started.prompt_token_ids)
    logits = next_logits(tiny_lm, prompt_ids)
    by_rank = logits.argsort(descending=True).tolist()
    assert bar.marked().token_id == by_rank[0]  # the mark starts on greedy's own choice
    assert f"'{tiny_lm.tokenizer.decode([by_rank[0]]).replace(' ', '␣')}'" in bar.label.text()
    QTest.keyClick(bar, Qt.Key.Key_Down)
    assert bar.marked().token_id == by_rank[1]
    QTest.keyClick(bar, Qt.Key.Key_Return)  # step 0: the second candidate
    taken.append(by_rank[1])

    bar = wait_for_choice(qtbot, w, 1)
    greedy = int(next_logits(tiny_lm, prompt_ids + taken).argmax())
    assert bar.step.token_id == greedy
    QTest.keyClick(bar, Qt.Key.Key_Down)  # marks another candidate, but Space takes the sampler's own
    assert bar.marked().token_id != greedy
    QTest.keyClick(bar, Qt.Key.Key_Space)  # step 1: the sampler's own
    taken.append(greedy)

    bar = wait_for_choice(qtbot, w, 2)
    by_rank = next_logits(tiny_lm, prompt_ids + taken).argsort(descending=True).tolist()
    QTest.keyClick(bar, Qt.Key.Key_Down)
    QTest.keyClick(bar, Qt.Key.Key_Down)
    QTest.keyClick(bar, Qt.Key.Key_Up)
    QTest.keyClick(bar, Qt.Key.Key_Enter)  # step 2: the second candidate again
    taken.append(by_rank[1])

    bar = wait_for_choice(qtbot, w, 3)
    bar.run_on_button.click()  # the rest by itself
    assert not w.step_mode.isChecked()
    qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
    run = w.session.selected
    assert run.finished is not None and run.finished.stop_reason == "max_new_tokens"
    ids = prompt_ids + taken
    for _ in range(3, 6):
        ids.append(int(next_logits(tiny_lm, ids).argmax()))
    assert [s.token_id for s in run.steps] == ids[len(prompt_ids):]
    assert [s.forced for s in run.steps] == [True, False, True, False, False, False]
    assert not w.views["tokens"].step_bar.isVisible()

    path = w.save_run(tmp_path / "stepped.jsonl")
    opened = w.open_run(path)
    assert [s.forced for s in opened.steps] == [True, False, True, False, False, False]
    assert [s.token_id for s in opened.steps] == ids[len(prompt_ids):]


def test_mouse_pick_and_escape_stops(qtbot, window, tiny_lm):
    w = window
    w.generate()
    bar = wait_for_choice(qtbot, w, 0)
    prompt_ids = list(w.session.selected.started.prompt_token_ids)
    third = next_logits(tiny_lm, prompt_ids).argsort(descending=True).tolist()[2]
    w.views["tokens"].chart.branch_requested.emit(0, third)  # what a double-click on its bar sends
    bar = wait_for_choice(qtbot, w, 1)
    QTest.keyClick(bar, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
    run = w.session.selected
    assert run.finished is not None and run.finished.stop_reason == "stopped"
    assert [(s.token_id, s.forced) for s in run.steps] == [(third, True)]
    assert run.finished.token_ids == (third,)


def test_stop_while_a_step_waits_ends_the_run_stopped(qtbot, window):
    w = window
    w.generate()
    wait_for_choice(qtbot, w, 0)
    w.stop_button.click()
    qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
    run = w.session.selected
    assert run.finished is not None and run.finished.stop_reason == "stopped" and not run.steps
    assert not w.views["tokens"].step_bar.isVisible()
    w.step_mode.setChecked(False)  # the next run starts and goes on by itself
    w.generate()
    qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
    assert w.session.selected.finished.stop_reason == "max_new_tokens"


def test_closing_the_window_while_a_step_waits(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm, RunSettings(prompt=PROMPT, chat=False, max_new_tokens=6))
    w.step_mode.setChecked(True)
    w.generate()
    wait_for_choice(qtbot, w, 0)
    job = w.job
    run = w.session.selected
    w.close()
    assert job.wait(5000)  # the waiting step saw the stop: the thread ended
    assert not job.is_running()
    assert run.finished is not None and run.finished.stop_reason == "stopped"


def test_sampling_space_takes_the_seeded_draw(qtbot, tiny_lm, shared_window):
    settings = RunSettings(prompt=PROMPT, chat=False, strategy="sample", temperature=1.5, seed=11, max_new_tokens=3)
    plain = [e.token_id for e in run_sampling(tiny_lm, settings) if isinstance(e, TokenStep)]
    w = stepping(shared_window, settings)
    try:
        w.generate()
        for i in range(3):
            bar = wait_for_choice(qtbot, w, i)
            assert bar.step.token_id == plain[i]
            QTest.keyClick(bar, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        assert [s.token_id for s in run.steps] == plain and not any(s.forced for s in run.steps)
    finally:
        let_go(w)


def test_the_engine_chooser_forces_and_stops():
    """The engine's hook without the window: a chooser that picks another token, the own one, then stops."""
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(seed=0)
    settings = RunSettings(prompt=PROMPT, chat=False, max_new_tokens=5)
    answers = iter([lambda s: sorted(s.candidates, key=lambda c: c.raw_rank)[3].token_id,
                    lambda s: s.token_id, lambda s: None])
    asked: list[TokenStep] = []

    def chooser(step: TokenStep):
        asked.append(step)
        return next(answers)(step)

    events = list(run_sampling(lm, settings, chooser=chooser))
    steps = [e for e in events if isinstance(e, TokenStep)]
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    ids = list(events[0].prompt_token_ids)
    fourth = next_logits(lm, ids).argsort(descending=True).tolist()[3]
    second = int(next_logits(lm, [*ids, fourth]).argmax())
    assert [(s.token_id, s.forced) for s in steps] == [(fourth, True), (second, False)]
    assert [a.step for a in asked] == [0, 1, 2]
