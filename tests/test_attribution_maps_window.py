"""The salience and patching views in the real window (one window): a greedy run explained on demand by the
salience view's button (a job, its maps folded into the run, drawn, saved with the run and reopened without the
model), Stop ending a salience job, and a patching run's maps drawn from its rows."""

from __future__ import annotations

import numpy as np
from windows import let_go, open_window

from playground.config import RunSettings
from playground.events.patching import PatchingRow
from playground.events.salience import SalienceAgreement, SalienceMap
from playground.ui.job_kinds import JobKind

WAIT_MS = 30000


def _wait(qtbot, w):
    qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)


def test_salience_on_demand_saved_and_stopped_and_the_patching_maps(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm)  # one window for every check
    try:
        _explain_a_step_on_demand_then_reopen_it_saved(w, qtbot, tmp_path)
        _stop_ends_a_salience_job(w, qtbot)
        _the_patching_view_draws_every_row(w, qtbot)
    finally:
        let_go(w)


def _explain_a_step_on_demand_then_reopen_it_saved(w, qtbot, tmp_path):
    w.start_run(RunSettings.from_flat(strategy="greedy", prompt="the cat sat", chat=False, max_new_tokens=3,
                                      ig_steps=4))
    _wait(qtbot, w)
    run = w.session.selected
    view = w.views["salience"]
    assert view.applies_to(run) and "Press <b>Explain step</b>" in view.header.text()
    view.step_box.setValue(1)
    view.explain.click()  # the button: its signal, the window's job
    assert w.job_kind is JobKind.SALIENCE
    _wait(qtbot, w)
    maps = [e for e in run.events if isinstance(e, SalienceMap)]
    assert [m.step for m in maps] == [1, 1, 1] and isinstance(run.events[-1], SalienceAgreement)
    assert maps[0].token_ids == (*run.started.prompt_token_ids, run.generated_ids[0])
    assert "Step 1: why" in view.header.text() and "Rank agreement" in view.agreement.text()
    shown = view.rows["occlusion"][1].text()
    assert shown.count("background-color") == len(maps[0].tokens)
    saved = w.save_run(tmp_path / "explained.jsonl")
    reopened = w.open_run(saved)
    assert reopened is not None and reopened is w.session.selected
    assert [e for e in reopened.events if isinstance(e, SalienceMap)] == maps
    assert view.step_box.value() == 1 and view.rows["occlusion"][1].text() == shown
    assert not view.explain.isEnabled()  # a saved run is explained by what it holds


def _stop_ends_a_salience_job(w, qtbot):
    w.start_run(RunSettings.from_flat(strategy="greedy", prompt="the cat sat on the mat", chat=False,
                                      max_new_tokens=2, ig_steps=512))
    _wait(qtbot, w)
    run = w.session.selected
    w.explain_step(0)
    assert w.stop_button.isEnabled()
    w.stop()
    _wait(qtbot, w)
    assert not any(isinstance(e, SalienceAgreement) for e in run.events)  # ended before its agreement


def _the_patching_view_draws_every_row(w, qtbot):
    w.start_run(RunSettings.from_flat(strategy="patching", prompt="the cat sat on the mat", chat=False,
                                      corrupted="the mat sat on the cat"))
    _wait(qtbot, w)
    run = w.session.selected
    rows = [e for e in run.events if isinstance(e, PatchingRow)]
    view = w.views["patching"]
    assert view.applies_to(run) and w.docks["patching"].isVisible()
    for row in rows:
        np.testing.assert_allclose(view.values[row.map][row.layer], row.recovered)
    assert "30/30" not in view.note.text() and "2/2 blocks" in view.note.text()
    assert all(not view.maps[k].plot.isHidden() for k in ("residual", "attention", "mlp"))
