"""Prompt salience against Captum (the reference library, a test extra): occlusion equals ``FeatureAblation`` with
each token its own feature, gradient × input ``LayerGradientXActivation`` on the embeddings, integrated
gradients ``LayerIntegratedGradients`` on the embeddings with the same baseline tokens, points and rule; the rank
correlation equals one computed here from its definition with ties."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

captum_attr = pytest.importorskip("captum.attr")

from playground.config.errors import ConfigError  # noqa: E402
from playground.engine.attribution.salience import (  # noqa: E402
    TargetLogprob,
    baseline_token,
    context_texts,
    grad_x_input,
    integrated_gradients,
    occlusion,
    salience_events,
    spearman,
    word_groups,
)
from playground.events.salience import SalienceAgreement, SalienceMap  # noqa: E402

TARGET = 5


# GPT-2: learned positions added after the embedding; Gemma 2: the embedding scaled by √d, soft-capped logits
@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma2"])
def case(request, tiny_lm):
    from support.tiny_models import build_tiny_lm

    if request.param != "llama":
        tiny_lm = build_tiny_lm(family=request.param)
    ids = tiny_lm.tokenizer("the cat sat on the mat")["input_ids"]
    f = TargetLogprob(tiny_lm, ids, TARGET)

    def forward(input_ids):
        return torch.log_softmax(tiny_lm.model(input_ids=input_ids).logits[:, -1].float(), -1)[:, TARGET]

    return SimpleNamespace(lm=tiny_lm, ids=ids, f=f, forward=forward, x=torch.tensor([ids]),
                           base=baseline_token(tiny_lm))


def test_occlusion_equals_feature_ablation(case):
    c = case
    reference = captum_attr.FeatureAblation(c.forward).attribute(c.x, baselines=c.base)[0].double().numpy()
    mine = occlusion(c.f, c.base, batch=5)  # batches that do not divide the length
    assert np.abs(reference).max() > 0.05
    np.testing.assert_allclose(mine, reference, atol=1e-4)


def test_occlusion_by_word_equals_feature_ablation_with_a_mask(case):
    c = case
    texts = context_texts(c.lm, c.ids)
    groups = word_groups(texts)
    assert len(set(groups)) < len(groups)  # some word is several tokens
    mask = torch.tensor([groups])
    reference = captum_attr.FeatureAblation(c.forward).attribute(c.x, baselines=c.base, feature_mask=mask)
    np.testing.assert_allclose(occlusion(c.f, c.base, batch=3, groups=groups), reference[0].double().numpy(),
                               atol=1e-4)


def test_word_groups():
    assert word_groups(["The", " cap", "ital", " of", ",", " Par", "is", "."]) == [0, 1, 1, 2, 3, 4, 4, 5]
    assert word_groups(["(", "a", ")", "b"]) == [0, 1, 2, 3]


def test_grad_x_input_equals_captum(case):
    c = case
    layer = c.lm.model.get_input_embeddings()
    reference = captum_attr.LayerGradientXActivation(c.forward, layer).attribute(c.x).sum(-1)[0].detach().double()
    np.testing.assert_allclose(grad_x_input(c.f), reference.numpy(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("rule,steps", [("gausslegendre", 16), ("riemann_trapezoid", 9)])
def test_integrated_gradients_equal_captum(case, rule, steps):
    c = case
    lig = captum_attr.LayerIntegratedGradients(c.forward, c.lm.model.get_input_embeddings())
    reference = lig.attribute(c.x, baselines=torch.full_like(c.x, c.base), n_steps=steps, method=rule)
    reference = reference.sum(-1)[0].detach().double().numpy()
    mine, figures = integrated_gradients(c.f, c.base, steps, rule, batch=4)
    np.testing.assert_allclose(mine, reference, rtol=1e-3, atol=1e-5)
    with torch.no_grad():  # completeness against two forwards computed here
        expected = float(c.forward(c.x)[0] - c.forward(torch.full_like(c.x, c.base))[0])
    assert figures["expected_sum"] == pytest.approx(expected, abs=1e-5)
    assert figures["sum"] == pytest.approx(float(mine.sum()))


def _spearman_by_hand(a, b):
    def ranks(v):
        return [sum(1 for w in v if w < x) + (sum(1 for w in v if w == x) + 1) / 2 for x in v]
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((p - ma) * (q - mb) for p, q in zip(ra, rb, strict=True))
    return cov / math.sqrt(sum((p - ma) ** 2 for p in ra) * sum((q - mb) ** 2 for q in rb))


def test_spearman_with_ties():
    a, b = [3.0, 1.0, 2.0, 2.0, 5.0], [0.1, 0.4, 0.2, 0.3, 0.9]
    assert spearman(a, b) == pytest.approx(_spearman_by_hand(a, b))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_events_of_a_step(case):
    c = case
    output = [TARGET, 9, 11]
    events = list(salience_events(c.lm, c.ids, output, 1, ig_steps=4))
    maps = [e for e in events if isinstance(e, SalienceMap)]
    assert [m.method for m in maps] == ["occlusion", "grad_x_input", "integrated_gradients"]
    assert maps[0].token_ids == (*c.ids, TARGET) and maps[0].target_id == 9 and maps[0].prompt_tokens == len(c.ids)
    assert len(maps[0].scores) == len(c.ids) + 1 == len(maps[0].tokens)
    agreement = events[-1]
    assert isinstance(agreement, SalienceAgreement)
    assert agreement.rho[0] == pytest.approx(_spearman_by_hand(maps[0].scores, maps[1].scores))
    with pytest.raises(ConfigError, match="step 3 is not in the run"):
        list(salience_events(c.lm, c.ids, output, 3))
    # Stop: occlusion polls before each batch, so no map is made and no agreement follows
    stopped = list(salience_events(c.lm, c.ids, output, 0, ("occlusion", "integrated_gradients"),
                                   should_stop=lambda: True))
    assert stopped == []


def test_salience_at_the_run_end_and_stop_during_it(tiny_lm):
    from playground.config import RunSettings
    from playground.engine.run_context import RunContext
    from playground.engine.strategies import run_strategy
    from playground.events import RunFinished

    settings = RunSettings.from_flat(strategy="greedy", prompt="the cat", chat=False, max_new_tokens=3,
                                     salience="occlusion,ig", salience_step=-1, ig_steps=4)
    events = list(run_strategy(tiny_lm, settings))
    maps = [e for e in events if isinstance(e, SalienceMap)]
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.cut_short == ()
    assert [m.method for m in maps] == ["occlusion", "integrated_gradients"] and maps[0].step == 2
    assert maps[0].target_id == finished.token_ids[2] and isinstance(events[-2], SalienceAgreement)
    said: list[str] = []  # Stop pressed once the maps begin (their first progress message)
    context = RunContext(should_stop=lambda: bool(said), progress=lambda message, _f: said.append(message))
    events = list(run_strategy(tiny_lm, settings, context))
    assert not any(isinstance(e, SalienceMap) for e in events) and events[-1].cut_short == ("salience",)
