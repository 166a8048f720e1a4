"""The contrastive view's DoLa plot, read back from its items against the paper's formula computed in the test from
``output_hidden_states`` (a tiny Llama): the image holds each candidate layer's JSD per step, the dots sit on the
chosen layer's row, the axis names the layers; a run from a saved trace draws the same; other amateurs draw none."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.tiny_models import build_tiny_lm
from test_dola import PROMPT, reference_step

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.state import Run
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.contrastive import ContrastiveView

LAYERS = (0, 1, 2, 3)


@pytest.fixture
def view(qtbot) -> ContrastiveView:
    configure_pyqtgraph()
    v = ContrastiveView()
    qtbot.addWidget(v)
    v.resize(1280, 760)
    v.show()
    return v


def test_the_dola_plot_draws_the_formulas_layers_and_divergences(view, tmp_path):
    lm = build_tiny_lm(seed=3, layers=4)
    events = list(run_strategy(lm, RunSettings.from_flat(strategy="contrastive", prompt=PROMPT, amateur="dola",
                                                         dola_layers="0,1,2,3", max_new_tokens=8,
                                                         dola_variant="formula")))
    done = events[-1]
    assert isinstance(done, RunFinished)
    prompt = list(events[0].prompt_token_ids)
    expected_rows, expected_jsd = [], []
    for step in range(len(done.token_ids)):
        layer, jsd, *_ = reference_step(lm.model, prompt + list(done.token_ids[:step]), LAYERS, 0.1, 1.2)
        expected_rows.append(LAYERS.index(layer))
        expected_jsd.append(jsd)
    write_trace(events, tmp_path / "run.jsonl")
    for source in (events, read_trace(tmp_path / "run.jsonl").events):
        view.show_run(Run.from_events(list(source)))
        assert view.dola_plot.isVisible()
        image = view._dola_image.image  # [layers, steps]
        assert image.shape == (4, 8)
        np.testing.assert_allclose(image.T, np.array(expected_jsd), atol=1e-5)
        xs, ys = view._dola_dots.getData()
        assert list(xs) == list(range(8)) and list(ys) == expected_rows
        ticks = [label for _, label in view.dola_plot.getPlotItem().getAxis("left")._tickLevels[0]]
        assert ticks == ["0", "1", "2", "3"]
        view.select_step(3)
        assert f"amateur = layer <b>{LAYERS[expected_rows[3]]}</b>" in view.step_panel.text()
    shot = view.grab()
    assert not shot.isNull()


def test_other_amateurs_draw_no_dola_plot(view, tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", prompt=PROMPT,
                                                              max_new_tokens=3)))
    assert all(e.premature_layer == -1 for e in events if isinstance(e, ContrastStep))
    view.show_run(Run.from_events(events))
    assert not view.dola_plot.isVisible()


@pytest.mark.parametrize("variant", ["reference", "formula", None])
def test_the_view_says_which_variant_ran(view, variant):
    """The header, the DoLa plot's title and the step panel name the variant; a run saved before the variants
    existed (no ``dola_variant`` in its start event) ran the formula and says so."""
    lm = build_tiny_lm(seed=3, layers=4)
    settings = RunSettings.from_flat(strategy="contrastive", prompt=PROMPT, amateur="dola", dola_layers="0,1,2,3",
                                     max_new_tokens=3, dola_variant=variant or "formula")
    events = list(run_strategy(lm, settings))
    if variant is None:  # as an older trace reads back
        events = [dataclasses.replace(e, dola_variant="") if isinstance(e, ContrastiveStarted) else e
                  for e in events]
    shown = variant or "formula"
    view.show_run(Run.from_events(events))
    view.select_step(1)
    assert f"variant <b>{shown}</b>" in view.header.text()
    assert f"DoLa ({shown} variant)" in view.step_panel.text()
    divergence = "½[KL(M‖P) + KL(M‖Q)]" if shown == "reference" else "JSD ½[KL(P‖M) + KL(Q‖M)]"
    assert divergence in view.step_panel.text()
    title = view.dola_plot.getPlotItem().titleLabel.text
    assert f"DoLa, {shown} variant" in title or f"DoLa {shown}:" in title
