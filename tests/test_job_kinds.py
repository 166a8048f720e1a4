"""Each kind of background job, in the real window: whether Stop may end it, whether the model picker shows its
progress, and what its failure says (a run's, a load's, a fetch's or a connect's in the banner; the server
dialog's test answers in the dialog, so no banner)."""

from __future__ import annotations

import threading

import pytest
from windows import let_go, open_window

from playground.config import ConfigError
from playground.ui.job_kinds import JobKind

TIMEOUT_MS = 10000

# kind -> (whose its items are, Stop allowed while it runs, the picker's progress bar shown, the banner after it
# fails)
EXPECTED = {
    "run": ("runs", True, False, "The run failed: the body said no"),
    "load": ("model", False, True, "Could not load the model: the body said no"),
    "fetch": ("model", True, True, "Could not fetch the default model: the body said no"),
    "connect": ("model", False, False, "Could not connect to the server: the body said no"),
    "test": ("model", False, False, None),
    "tune-lens": ("model", True, True, "Could not train the tuned lens: the body said no"),
    "attribute": ("runs", True, False, "Could not attribute the step: the body said no"),
    "salience": ("runs", True, False, "Could not explain the step: the body said no"),
    "steer-build": ("model", True, True, "Could not build the steering vector: the body said no"),
}


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)
    yield w
    let_go(w, 5000)


def test_every_kind_is_described():
    assert {kind.value for kind in JobKind} == set(EXPECTED)


def test_a_job_of_each_kind_runs_and_fails_as_its_kind_says(qtbot, window, monkeypatch):
    w = window
    taken: list[tuple[str, object]] = []
    monkeypatch.setattr(w, "_take_model_items", lambda batch: taken.extend(("model", i) for i in batch))
    monkeypatch.setattr(w, "_apply_events", lambda batch: taken.extend(("runs", i) for i in batch))
    for name, (whose, stoppable, progress_shown, banner) in EXPECTED.items():
        release = threading.Event()
        taken.clear()

        def body(should_stop, progress, release=release, name=name):
            yield name
            release.wait(TIMEOUT_MS / 1000)
            raise ConfigError("the body said no")

        w.banner.hide()
        w._start_job(body, JobKind(name))
        assert w.busy and w.job_kind == name and w.job.name == name
        assert w.stop_button.isEnabled() == stoppable, name
        assert w.picker.progress.isVisible() == progress_shown, name
        assert not w.generate_button.isEnabled()
        qtbot.waitUntil(lambda: bool(taken), timeout=TIMEOUT_MS)
        assert taken == [(whose, name)]
        release.set()
        qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
        assert w.job_kind is None and not w.stop_button.isEnabled()
        if banner is None:
            assert not w.banner.isVisible(), name
        else:
            assert w.banner.isVisible() and w.banner.kind == "error", name
            assert w.banner.label.text() == f"<b>Error:</b> {banner}"


def test_a_job_that_takes_its_own_items_gets_all_of_them(qtbot, window, monkeypatch):
    """A salience job's maps join a run already decoded (the one it explains), not the live run's events: the job
    names where its items go when it starts (``take``), whatever its kind would route them to."""
    w = window
    elsewhere: list[object] = []
    monkeypatch.setattr(w, "_take_model_items", elsewhere.extend)
    monkeypatch.setattr(w, "_apply_events", elsewhere.extend)
    own: list[object] = []

    def body(should_stop, progress):
        yield "a map"
        yield "its agreement"

    w._start_job(body, JobKind.SALIENCE, take=own.extend)
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert own == ["a map", "its agreement"] and elsewhere == []


def test_a_job_a_dialog_follows_tells_it_its_progress_failure_and_end(qtbot, window):
    """The steering dialog follows its build (``follower``): it hears the progress, the failure and the end, in
    that order, and the window's banner still says the failure."""
    from PySide6.QtCore import QObject

    w = window
    heard: list[tuple] = []

    class Follower(QObject):  # as the dialog, a QObject of the GUI thread: the signals queue to it
        def show_progress(self, message, fraction):
            heard.append(("progress", message, fraction))

        def show_error(self, message):
            heard.append(("error", message))

        def job_ended(self):
            heard.append(("ended",))

    def body(should_stop, progress):
        progress("halfway", 0.5)
        yield from ()
        raise ConfigError("the body said no")

    follower = Follower()  # held here, as the window holds its dialog (Qt keeps no reference to it)
    w._start_job(body, JobKind.STEER_BUILD, follower=follower)
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert heard == [("progress", "halfway", 0.5), ("error", "the body said no"), ("ended",)]
    assert w.banner.label.text() == "<b>Error:</b> Could not build the steering vector: the body said no"
