"""The form shows a sampler's own settings group (top-a, tail-free, Adaptive-P) in the sampling section, beside the
chain: enabled when the strategy samples, its values in the run's settings, round-tripping a saved run; the chain
list lists and marks the new samplers."""

from __future__ import annotations

from playground.config import RunSettings
from playground.ui.controls import RunControls


def test_sampler_groups_sit_in_the_sampling_section_and_follow_the_strategy(qtbot):
    controls = RunControls(RunSettings(strategy="sample"))
    qtbot.addWidget(controls)
    layout = controls.layout()
    boxes = [layout.itemAt(i).widget() for i in range(layout.count()) if layout.itemAt(i).widget() is not None]
    at = {box.title(): i for i, box in enumerate(boxes)}
    sampling, penalties = at["Sampling (sample only)"], at["Penalties"]
    for name in ("top_a", "tfs", "adaptive_p"):
        box = controls.boxes[name]
        assert sampling < boxes.index(box) < penalties, box.title()
        assert "sample only" in box.title() and box.isEnabled()
    controls.widgets["top_a"].setValue(0.3)
    controls.widgets["adaptive_target"].setValue(0.25)
    settings = controls.run_settings("x")
    assert settings == RunSettings.from_flat(prompt="x", strategy="sample", top_a=0.3, adaptive_target=0.25)
    rows = dict(controls.chain.row_states())
    assert "· on" in rows["top_a"] and "· on" in rows["adaptive_p"] and "· off" in rows["tfs"]
    controls.strategy.setCurrentText("greedy")
    assert not controls.boxes["top_a"].isEnabled()
    assert controls.run_settings("x").groups == ()  # greyed out: left at their defaults, as the section's are
    assert "skipped" in dict(controls.chain.row_states())["top_a"]


def test_a_saved_run_with_the_new_samplers_round_trips_through_the_form(qtbot):
    controls = RunControls()
    qtbot.addWidget(controls)
    settings = RunSettings.from_flat(strategy="sample", top_a=0.2, tfs=0.85, adaptive_target=0.3,
                                     adaptive_decay=0.7, samplers="tfs;top_a;temperature;adaptive_p", temperature=0.8)
    saved = RunSettings.from_plain_dict(settings.as_plain_dict())[0]
    controls.set_run_settings(saved)
    assert controls.run_settings(settings.prompt) == settings


def test_the_what_if_panel_names_and_carries_a_samplers_own_settings():
    from playground.ui.views.tokens.what_if import branch_settings, settings_diff

    run = RunSettings.from_flat(strategy="sample", top_a=0.2, max_new_tokens=4)
    new = RunSettings.from_flat(strategy="sample", tfs=0.8, adaptive_target=0.3)
    assert sorted(settings_diff(run, new)) == sorted(["top-a 0.2 → 0", "tail-free z 1 → 0.8",
                                                      "adaptive-P target -1 → 0.3"])
    branch = branch_settings(run, new, (5, 6))
    assert branch == RunSettings.from_flat(strategy="sample", tfs=0.8, adaptive_target=0.3, max_new_tokens=4,
                                           forced_token_ids=(5, 6))
