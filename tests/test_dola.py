"""DoLa's formula variant (``--amateur dola --dola-variant formula``) against the paper's formula written out here
from ``output_hidden_states``, cache-free, on tiny random models of two families (Llama: untied head; GPT-2: tied
head, LayerNorm, learned positions):

    q_j = softmax(lm_head(final_norm(h_j)))   (q_N: the model's own logits)
    M = argmax_j JSD(q_N || q_j),   JSD = ½ KL(q_N || m) + ½ KL(q_j || m),   m = ½ (q_N + q_j)
    score = log q_N − log q_M on { q_N ≥ α max q_N },   then the repetition penalty θ on tokens already in the text.

And the candidate buckets are the paper's (even layers of the lower / upper half; 20 layers each past 40 layers;
a tied model starts at 2)."""

from __future__ import annotations

import math

import pytest
import torch
from support.tiny_models import build_tiny_lm

from playground.config import ConfigError, RunSettings
from playground.engine.contrastive.dola import candidate_layers
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, dumps_event, event_from_dict
from playground.events.contrastive import ContrastiveStarted, ContrastStep

PROMPT = "the cat sat on the mat and the cat"
ATOL = 2e-4


def norm_and_head(model):
    if hasattr(model, "transformer"):  # GPT-2
        return model.transformer.ln_f, model.lm_head
    return model.model.norm, model.lm_head


def reference_step(model, ids: list[int], layers: tuple[int, ...], alpha: float, theta: float):
    """(chosen layer, JSD per layer, scores [vocab] float64, lp_final, lp_premature) after ``ids``."""
    norm, head = norm_and_head(model)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        final = out.logits[0, -1].double().log_softmax(-1)
        lens = [head(norm(out.hidden_states[j][0, -1])).double().log_softmax(-1) for j in layers]
    p = final.exp()
    jsd = []
    for lp in lens:
        q = lp.exp()
        m = 0.5 * (p + q)
        jsd.append(0.5 * float((p * (p / m).log()).nansum()) + 0.5 * float((q * (q / m).log()).nansum()))
    row = max(range(len(layers)), key=lambda i: jsd[i])
    premature = lens[row]
    plausible = p >= alpha * p.max()
    scores = torch.where(plausible, final - premature, torch.tensor(-math.inf, dtype=torch.float64))
    for t in set(ids):
        s = scores[t]
        scores[t] = s * theta if s < 0 else s / theta
    return layers[row], jsd, scores, final, premature


def dola_run(lm, **settings):
    flat = {"strategy": "contrastive", "prompt": PROMPT, "amateur": "dola", "max_new_tokens": 10, **settings}
    return list(run_strategy(lm, RunSettings.from_flat(**flat)))


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family_lm(request):
    return build_tiny_lm(seed=3, layers=4, family=request.param)


def test_dola_steps_equal_the_papers_formula(family_lm):
    layers, alpha, theta = (0, 1, 2, 3), 0.1, 1.2
    events = dola_run(family_lm, dola_layers="0,1,2,3", alpha=alpha, dola_repetition_penalty=theta,
                      dola_variant="formula")  # the paper's formula (the default is the authors' code)
    started = next(e for e in events if isinstance(e, ContrastiveStarted))
    assert started.dola_layers == layers and started.dola_penalty == theta
    steps = [e for e in events if isinstance(e, ContrastStep)]
    done = events[-1]
    assert isinstance(done, RunFinished)
    prompt = list(events[0].prompt_token_ids)
    penalised = 0
    for step in steps:
        ids = prompt + list(done.token_ids[: step.step])
        layer, jsd, scores, final, premature = reference_step(family_lm.model, ids, layers, alpha, theta)
        assert step.premature_layer == layer
        assert step.layer_jsd == pytest.approx(jsd, abs=1e-5)
        assert step.token_id == int(scores.argmax()) == done.token_ids[step.step]
        for c in step.candidates:
            assert c.expert_logprob == pytest.approx(float(final[c.token_id]), abs=ATOL)
            assert c.amateur_logprob == pytest.approx(float(premature[c.token_id]), abs=ATOL)
            if math.isfinite(float(scores[c.token_id])):
                assert c.score == pytest.approx(float(scores[c.token_id]), abs=2 * ATOL)
                penalised += c.token_id in ids
            else:
                assert c.score == -math.inf
    assert penalised, "precondition: the repetition penalty met a plausible repeated token"
    # a saved run keeps the DoLa fields
    back = event_from_dict(__import__("json").loads(dumps_event(steps[0])))
    assert back.premature_layer == steps[0].premature_layer and back.layer_jsd == steps[0].layer_jsd


def test_a_single_candidate_is_always_the_premature_layer(family_lm):
    events = dola_run(family_lm, dola_layers="2", max_new_tokens=4)
    assert {e.premature_layer for e in events if isinstance(e, ContrastStep)} == {2}


@pytest.mark.parametrize(("count", "tied", "spec", "expected"), [
    (30, True, "low", tuple(range(2, 15, 2))),  # SmolLM2: tied, 30 layers
    (30, True, "high", tuple(range(15, 30, 2))),
    (32, False, "low", tuple(range(0, 16, 2))),  # LLaMA-7B: the paper's [0, 16) bucket, even layers
    (32, False, "high", tuple(range(16, 32, 2))),
    (80, False, "low", tuple(range(0, 20, 2))),  # deeper than 40: 20 layers per bucket
    (80, False, "high", tuple(range(60, 80, 2))),
    (4, True, "low", (2,)),
    (12, False, "6,2,2", (2, 6)),
])
def test_candidate_buckets_are_the_papers(count, tied, spec, expected):
    assert candidate_layers(spec, count, tied) == expected


def test_a_layer_past_the_model_is_refused(tiny_lm):
    with pytest.raises(ConfigError, match="between 0"):
        dola_run(tiny_lm, dola_layers="0,2")  # 2 layers: layer 2 is the expert itself
    with pytest.raises(ConfigError, match="dola_layers"):
        RunSettings.from_flat(strategy="contrastive", amateur="dola", dola_layers="low,3").validate()
