"""The settings form's sampler chain in the window: reordered with its buttons, a run follows the new order (its
processed distribution equals the samplers applied by hand in that order); presets and saved runs round-trip
through the form; the logit-bias editor keeps a leading space and shows what each entry is for the tokenizer.
"""

from __future__ import annotations

import pytest
import torch
from windows import let_go, open_window

from playground.config import RunSettings
from playground.config.samplers import DEFAULT_ORDER
from playground.presets import all_presets
from playground.ui.controls import RunControls

RUN_TIMEOUT_MS = 30000


def move(chain, name: str, to: int) -> None:
    """Move ``name`` to row ``to`` with the form's ↑/↓ buttons, as a user would."""
    names = [n for n, _ in chain.row_states()]
    chain.list.setCurrentRow(names.index(name))
    button = chain.up if names.index(name) > to else chain.down
    for _ in range(abs(names.index(name) - to)):
        button.click()


def top_p_by_hand(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of the likeliest tokens whose probability reaches ``p`` (the rest -inf)."""
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(-1) - probs[order]  # mass of the tokens likelier than each
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order[before < p]] = True
    return logits.masked_fill(~keep, float("-inf"))


@pytest.fixture
def window(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm, RunSettings(prompt="one two three", chat=False, max_new_tokens=1))
    yield w
    let_go(w)


def test_a_reordered_chain_runs_in_the_new_order(qtbot, window, tiny_lm):
    controls = window.controls
    controls.strategy.setCurrentText("sample")
    controls.widgets["temperature"].setValue(3.0)
    controls.widgets["top_p"].setValue(0.3)
    chain = controls.chain
    rows = dict(chain.row_states())
    assert "· on" in rows["temperature"] and "· on" in rows["top_p"] and "· off" in rows["top_k"]
    # transformers' order: temperature, then top-p; the user puts top-p first.
    move(chain, "top_p", 0)
    assert [n for n, _ in chain.row_states()][:1] == ["top_p"]
    order = ("top_p", *[n for n in DEFAULT_ORDER if n != "top_p"])
    assert controls.run_settings("x").samplers == ";".join(order)

    window.generate()
    qtbot.waitUntil(lambda: not window.busy, timeout=RUN_TIMEOUT_MS)
    run = window.session.selected
    assert run.finished is not None and run.steps
    step = run.steps[0]
    assert [e.name for e in step.effects] == ["top_p", "temperature"]

    ids = torch.tensor([run.started.prompt_token_ids])
    with torch.no_grad():
        logits = tiny_lm.model(input_ids=ids).logits[0, -1].float()
    new_order = (top_p_by_hand(logits, 0.3) / 3.0).softmax(-1)  # top-p on the raw logits, then temperature
    old_order = top_p_by_hand(logits / 3.0, 0.3).softmax(-1)
    kept_new = int((new_order > 0).sum())
    assert kept_new < int((old_order > 0).sum())  # the two orders keep different sets here
    for c in step.candidates:
        assert c.processed_prob == pytest.approx(float(new_order[c.token_id]), abs=1e-5)
    assert sum(c.processed_prob > 0 for c in step.candidates) == min(kept_new, len(step.candidates))

    chain.reset.click()
    assert [n for n, _ in chain.row_states()] == list(DEFAULT_ORDER)
    assert controls.run_settings("x").samplers == ""


def test_left_out_sampler_is_left_out_of_the_order_and_shown_refused(qtbot):
    controls = RunControls(RunSettings(strategy="sample", top_k=5))
    qtbot.addWidget(controls)
    chain = controls.chain
    item = chain.list.item([n for n, _ in chain.row_states()].index("top_k"))
    item.setCheckState(item.checkState().__class__.Unchecked)
    settings = controls.run_settings("x")
    assert "top_k" not in settings.samplers.split(";") and settings.samplers
    assert "refuses" in dict(chain.row_states())["top_k"]


def test_presets_and_saved_settings_round_trip_through_the_form(qtbot):
    controls = RunControls()
    qtbot.addWidget(controls)
    cases = [p.settings for p in all_presets()] + [
        RunSettings(strategy="sample", samplers="penalties;dry;top_k;typical_p;xtc;temperature", top_k=7,
                    typical_p=0.9, xtc_probability=0.5, dry_multiplier=0.8, presence_penalty=0.5,
                    logit_bias=(" Paris=-inf", "Paris=+2", "42=+5"), guidance_scale=1.5, negative_prompt=" bad"),
    ]
    for settings in cases:
        controls.set_run_settings(settings)
        assert controls.run_settings(settings.prompt) == settings, settings


def test_logit_bias_keeps_the_leading_space_and_shows_the_tokens(qtbot, window, tiny_lm):
    editor = window.controls.logit_bias
    editor.edit.setPlainText(" Paris=-inf\nParis=+2\n7=+1\nnope")
    assert window.current_settings().logit_bias == (" Paris=-inf", "Paris=+2", "7=+1", "nope")
    lines = editor.resolved.text().split("\n")
    tok = tiny_lm.tokenizer
    spaced, plain = tok.encode(" Paris", add_special_tokens=False), tok.encode("Paris", add_special_tokens=False)
    assert spaced != plain
    assert lines[0].startswith("␣Paris = ") and lines[0].split(" = ")[1].startswith(str(spaced[0]))
    assert all(str(t) in lines[0] for t in spaced) and "→ ban" in lines[0]
    assert lines[1].startswith("Paris = ") and all(str(t) in lines[1] for t in plain)
    assert lines[2].startswith("id 7 ") and repr(tok.decode([7]).replace(" ", "␣")) in lines[2]
    assert lines[3].startswith("✗")
