"""The tuned lens on a tiny random Llama, against references written out here:

- training lowers the held-out KL (the evaluation text, never trained on) to the last layer's distribution on every
  layer below the last, each measured by hand: output_hidden_states, h + W h + b with the saved file's tensors, the
  final norm and LM head;
- a run with ``--lens-kind tuned`` shows in the layers view (heatmap entropies, the cell's KL under both lenses) the
  numbers of the translators applied by hand; a saved run keeps which lens it used; without a trained lens the
  tuned kind is refused before the run.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from support.tiny_models import build_tiny_lm

from playground.config import ConfigError, RunSettings
from playground.engine.layers.lens import LayerStack
from playground.engine.layers.tuned import (
    calibration_ids,
    collect_hidden,
    lens_path_of,
    save_tuned_lens,
    train_tuned_lens,
)
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.events.layers import LayersStarted, LayerStep
from playground.state import Run
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.layers import LayersView

LAYERS = 4
PROMPT = "the cat sat on the mat"


def finish(generator):
    while True:
        try:
            next(generator)
        except StopIteration as done:
            return done.value


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model, its translators trained on the calibration text and saved in a user cache of its own."""
    cache = tmp_path_factory.mktemp("cache")
    lm = build_tiny_lm(seed=4, layers=LAYERS)
    stack = LayerStack.of(lm.model)
    hidden, final = collect_hidden(stack, calibration_ids(lm.tokenizer, "calibration", 768))
    lens = finish(train_tuned_lens(stack, hidden, final, steps=40, batch=64, lr=1e-2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        path = save_tuned_lens(lens, lens_path_of(lm.model, LAYERS))
    return lm, cache, load_file(str(path))


def by_hand(model, ids: list[int], tensors: dict | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each layer's lens log-probabilities [N, vocab] over the positions of ``ids`` (translated with ``tensors``'
    weights and biases when given), and the model's own final log-probabilities."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        final = out.logits[0].double().log_softmax(-1)
        rows = []
        for layer in range(1, LAYERS):
            h = out.hidden_states[layer][0]
            if tensors is not None:
                h = h + h @ tensors["weights"][layer - 1].T + tensors["biases"][layer - 1]
            rows.append(model.lm_head(model.model.norm(h)).double().log_softmax(-1))
    return rows, final


def kl(final: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    return (final.exp() * (final - lp)).sum(-1)


def test_training_lowers_the_held_out_kl_on_every_layer(trained):
    lm, _, tensors = trained
    ids = calibration_ids(lm.tokenizer, "evaluation", 256)
    before, final = by_hand(lm.model, ids, None)
    after, _ = by_hand(lm.model, ids, tensors)
    for layer, (b, a) in enumerate(zip(before, after, strict=True), start=1):
        kl_before, kl_after = float(kl(final, b).mean()), float(kl(final, a).mean())
        assert kl_after < 0.9 * kl_before, (layer, kl_before, kl_after)


@pytest.fixture
def view(qtbot) -> LayersView:
    configure_pyqtgraph()
    v = LayersView()
    qtbot.addWidget(v)
    v.resize(1280, 760)
    v.show()
    return v


def test_the_view_shows_the_translators_applied_by_hand(trained, view, monkeypatch, tmp_path):
    lm, cache, tensors = trained
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    settings = RunSettings.from_flat(prompt=PROMPT, lens=True, lens_kind="tuned", lens_precision="model",
                                     max_new_tokens=6)
    events = list(run_strategy(lm, settings))
    done = events[-1]
    assert isinstance(done, RunFinished)
    prompt = list(events[0].prompt_token_ids)
    tokens = len(done.token_ids)
    entropy = np.zeros((LAYERS, tokens))
    kls = {}
    for step in range(tokens):
        ids = prompt + list(done.token_ids[:step])
        tuned, final = by_hand(lm.model, ids, tensors)
        plain, _ = by_hand(lm.model, ids, None)
        last = final[-1]
        for layer in range(1, LAYERS):
            lp = tuned[layer - 1][-1]
            entropy[layer - 1, step] = float(-(lp.exp() * lp).sum()) / math.log(2)
            kls[step, layer] = (float(kl(last, plain[layer - 1][-1])), float(kl(last, lp)))
        entropy[LAYERS - 1, step] = float(-(last.exp() * last).sum()) / math.log(2)
    write_trace(events, tmp_path / "run.jsonl")
    for source in (events, read_trace(tmp_path / "run.jsonl").events):
        view.show_run(Run.from_events(list(source)))
        np.testing.assert_allclose(view.image.image, entropy, atol=2e-3)  # layers × tokens, row 0 = layer 1
        assert "tuned lens (every layer runs)" in view.header.text()
        for (step, layer), (logit_kl, tuned_kl) in kls.items():
            view.select_cell(step, layer)
            shown = re.search(r"KL to the last layer \(nats\): logit lens ([\d.]+) · tuned lens ([\d.]+)",
                              view.cell_panel.text())
            assert shown, view.cell_panel.text()
            assert float(shown[1]) == pytest.approx(logit_kl, abs=0.006)
            assert float(shown[2]) == pytest.approx(tuned_kl, abs=0.006)
        assert "tuned lens" in view.figures.text() and "lower on" in view.figures.text()
    saved = read_trace(tmp_path / "run.jsonl").events
    assert next(e for e in saved if isinstance(e, LayersStarted)).lens_kind == "tuned"
    assert {e.lens_kind for e in saved if isinstance(e, LayerStep)} == {"tuned"}


def test_the_tuned_kind_without_a_trained_lens_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lm = build_tiny_lm(seed=9, layers=LAYERS)
    with pytest.raises(ConfigError, match="no tuned lens"):
        run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, lens=True, lens_kind="tuned", max_new_tokens=2))


def test_early_exit_decides_by_the_tuned_lens(trained, monkeypatch):
    """The first token's exit layer is the first layer (from 1) whose tuned-lens entropy, by hand, is at most the
    threshold; the threshold is put between layers so that the logit lens would exit elsewhere."""
    lm, cache, tensors = trained
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    started = next(iter(run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, max_new_tokens=1))))
    prompt = started.prompt_token_ids
    tuned, final = by_hand(lm.model, list(prompt), tensors)
    plain, _ = by_hand(lm.model, list(prompt), None)

    def bits(lp):
        return float(-(lp.exp() * lp).sum()) / math.log(2)

    tuned_bits = [bits(t[-1]) for t in tuned] + [bits(final[-1])]
    plain_bits = [bits(p[-1]) for p in plain] + [bits(final[-1])]

    def exit_at(values, threshold):
        return next((i + 1 for i, v in enumerate(values[:-1]) if v <= threshold), None)

    thresholds = sorted(set(tuned_bits[:-1]) | set(plain_bits[:-1]))
    choice = next((t for t in thresholds if exit_at(tuned_bits, t) != exit_at(plain_bits, t)), None)
    assert choice is not None, "precondition: the two lenses exit at different layers for some threshold"
    settings = RunSettings.from_flat(prompt=PROMPT, strategy="early-exit", lens_kind="tuned", lens_precision="model",
                                     exit_metric="entropy", exit_threshold=choice + 1e-6, min_exit_layer=1,
                                     max_new_tokens=1, compare_full=False)
    step = next(e for e in run_strategy(lm, settings) if isinstance(e, LayerStep))
    assert (step.exit_layer or LAYERS) == (exit_at(tuned_bits, choice + 1e-6) or LAYERS)


def test_each_layer_keeps_its_best_translator_on_the_held_apart_positions(trained):
    """A rate far too high ruins the translators; each layer then keeps the best it had on the positions held apart
    for checking (the identity at worst): by hand, no layer's KL there is above the logit lens's."""
    lm, _, _ = trained
    stack = LayerStack.of(lm.model)
    hidden, final = collect_hidden(stack, calibration_ids(lm.tokenizer, "calibration", 320))
    lens = finish(train_tuned_lens(stack, hidden, final, steps=10, lr=1.0, check_every=5, validation_share=0.25))
    held = hidden.shape[1] - int(hidden.shape[1] * 0.25)
    with torch.no_grad():
        for layer in range(LAYERS - 1):
            h = hidden[layer, held:]
            target = final[held:].double()
            moved = h + h @ lens.weights[layer].T + lens.biases[layer]
            plain = lm.model.lm_head(lm.model.model.norm(h)).double().log_softmax(-1)
            tuned = lm.model.lm_head(lm.model.model.norm(moved)).double().log_softmax(-1)
            assert float(kl(target, tuned).mean()) <= float(kl(target, plain).mean()) + 1e-6, layer
