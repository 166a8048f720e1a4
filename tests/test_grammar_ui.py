"""The constraint in the window: its fields in the settings form (from its declaration, as every sampler's), a bad
one refused with the library's message, and a constrained step's tooltip saying what the mask did."""

from __future__ import annotations

import pytest
from test_grammar import smol_tokenizer  # noqa: F401  (the fixture: the default model's tokenizer)

from playground.config import ConfigError, RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.events import TokenStep
from playground.events.grammar import GrammarStep
from playground.ui.controls import RunControls
from playground.ui.views.tokens.tooltip import token_tooltip_html


def test_the_form_carries_a_constraint_and_its_errors(qtbot):
    controls = RunControls(RunSettings(strategy="greedy"))
    qtbot.addWidget(controls)
    assert controls.boxes["grammar"].isEnabled()  # greedy takes a constraint (it sits beside the penalties)
    controls.widgets["regex"].setText("(yes|no)")
    settings = controls.run_settings("x")
    assert settings.group(GrammarSettings).regex == "(yes|no)" and settings.validate()
    controls.set_run_settings(RunSettings.from_plain_dict(settings.as_plain_dict())[0])
    assert controls.widgets["regex"].text() == "(yes|no)"  # a saved run's constraint comes back into the form
    controls.widgets["regex"].setText("[a-z")
    with pytest.raises(ConfigError, match="unclosed character class"):
        controls.run_settings("x").validate()


def test_a_constrained_steps_tooltip_says_what_the_mask_did():
    step = TokenStep(step=3, token_id=5, text="a", prob=1.0, raw_prob=0.01, logprob=-4.6, raw_rank=9, entropy=2.0,
                     processed_entropy=0.0, candidates=(), shown_raw_mass=0.0, effects=(), forced=False, step_ms=1.0,
                     kv_cache_bytes=0, grammar=GrammarStep(allowed=1, removed_mass=0.25, top_forbidden=True,
                                                           ff_tokens=(5, 6)))
    html = token_tooltip_html(step)
    assert "allowed 1 token (forced)" in html and "removed 25" in html and "overrode the model's top token" in html
    assert "fixes the next 2 tokens" in html
    from dataclasses import replace

    assert "constraint" not in token_tooltip_html(replace(step, grammar=None))


def test_the_status_bar_says_why_a_constrained_run_ended(qtbot, tmp_path, smol_tokenizer):  # noqa: F811
    """A budget that ends before the regex is complete: the window's status line gives the engine's note."""
    from PySide6.QtCore import Qt
    from test_grammar import _tiny_on
    from windows import let_go, open_window

    settings = RunSettings.from_flat(prompt="Answer:", chat=False, strategy="greedy", max_new_tokens=3
                                     ).with_group(GrammarSettings(regex="[a-z]{60}")).validate()
    w = open_window(qtbot, tmp_path, _tiny_on(smol_tokenizer), settings)
    try:
        w.set_run_settings(settings)
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.busy and w.session.runs and w.session.runs[-1].finished is not None,
                        timeout=60_000)
        finished = w.session.runs[-1].finished
        assert finished.stop_reason == "grammar_incomplete" and finished.stop_note
        message = w.status.currentMessage()
        assert "grammar_incomplete" in message and finished.stop_note in message, message
    finally:
        let_go(w)
