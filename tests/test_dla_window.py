"""On-demand attribution in the real window: the view's Attribute button runs a job that adds the step's
attribution to the selected run (one forward pass), the view draws it, and the run's events keep it."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from support.tiny_models import build_tiny_lm
from windows import let_go, open_window

from playground.config import RunSettings
from playground.events import dumps_event, event_from_dict
from playground.events.dla import LogitAttribution
from playground.state import Run


def test_attribute_button_adds_the_step_to_the_run(qtbot, tmp_path):
    lm = build_tiny_lm(seed=3, layers=3)
    w = open_window(qtbot, tmp_path, lm, RunSettings(prompt="The capital of France is", chat=False,
                                                     max_new_tokens=5))
    try:
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.busy, timeout=30000)
        run = w.session.selected
        assert run is not None and run.finished is not None
        view = w.views["dla"]
        assert view.step_choice.count() == 0
        view.ask_step.setValue(2)
        qtbot.mouseClick(view.ask_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.busy, timeout=30000)
        (a,) = [e for e in run.events if isinstance(e, LogitAttribution)]
        assert (a.step, a.token_id) == (2, run.steps[2].token_id)
        assert abs(a.components_sum - a.difference) < 1e-5
        assert view.step_choice.count() == 1 and f"{a.difference:+.3f}" in view.summary.text()
        assert w.session.live is None
        saved = [event_from_dict(json.loads(dumps_event(e))) for e in run.events]  # File > Save run writes these
        assert [e for e in Run.from_events(saved).events if isinstance(e, LogitAttribution)] == [a]
        view.ask_step.setValue(0)
        w.source = None  # no model: the view's request is refused in words
        view.ask_button.click()
        assert "needs the model loaded here" in w.banner.label.text() and not w.busy
    finally:
        let_go(w)
