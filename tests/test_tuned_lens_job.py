"""Tools → Train tuned lens in the real window, on a tiny model: the job reports its steps, saves the translators
where ``--lens-kind tuned`` finds them (a tuned run then works), and Stop ends it with nothing saved."""

from __future__ import annotations

import functools

import pytest
from support.tiny_models import build_tiny_lm
from windows import let_go, open_window

from playground.config import RunSettings
from playground.engine.layers import tune_job, tuned
from playground.engine.strategies import run_strategy
from playground.events.layers import LayersStarted

TIMEOUT_MS = 60000


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lm = build_tiny_lm(seed=6, layers=3)
    w = open_window(qtbot, tmp_path, lm=lm)
    yield w, lm
    let_go(w, 5000)


def test_the_job_trains_and_saves_the_lens(qtbot, window):
    w, lm = window
    path = tuned.lens_path_of(lm.model, 3)
    assert not path.exists()
    messages = []
    w.status.messageChanged.connect(messages.append)
    w.tune_lens_action.trigger()
    assert w.busy and w.stop_button.isEnabled()
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert path.is_file()
    assert any("step 40 of 40" in m for m in messages), messages
    events = list(run_strategy(lm, RunSettings.from_flat(prompt="a b", lens=True, lens_kind="tuned",
                                                         max_new_tokens=2)))
    assert next(e for e in events if isinstance(e, LayersStarted)).lens_kind == "tuned"


def test_stop_ends_the_job_and_saves_nothing(qtbot, window, monkeypatch):
    w, lm = window
    monkeypatch.setattr(tune_job, "train_for_model", functools.partial(tune_job.train_for_model, steps=100000))
    w.tune_lens_action.trigger()
    qtbot.waitUntil(lambda: "step" in w.status.currentMessage(), timeout=TIMEOUT_MS)
    w.stop()
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert not tuned.lens_path_of(lm.model, 3).exists()
