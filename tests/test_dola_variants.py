"""DoLa's two variants (``--dola-variant``) against their formulas written out here from ``output_hidden_states``,
cache-free, in float64, on tiny random models of three families (Llama: untied head; GPT-2: tied head, LayerNorm;
Gemma 2: (1 + w) norms and the final logit soft-capping):

reference (the authors' code as transformers 4.46 ran it)::

    q_j = softmax(lm_head(h_j))                       no final norm, no soft-capping (q_N: the model's own logits)
    M = argmax_j ½ [KL(m || q_N) + KL(m || q_j)],     m = ½ (q_N + q_j)
    keep = { log q_N ≥ max log q_N + log α }          the relative-top filter
    score = log q_N − log q_M on keep, −∞ elsewhere (the baseline there: −1e-3), then the repetition penalty θ

formula (the paper's text)::

    q_j = softmax(cap(lm_head(final_norm(h_j))))      the logit lens, with the model's soft-capping
    M = argmax_j ½ [KL(q_N || m) + KL(q_j || m)]
    score = log q_N − log q_M on { q_N ≥ α max q_N }, then θ

The variant is in the run's settings, its start event and the settings summary."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.tiny_models import build_tiny_lm

from playground.cli import build_parser, settings_from_args
from playground.config import ContrastiveSettings, RunSettings
from playground.engine.contrastive.dola import candidate_layers, relative_top_filter
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, dumps_event, event_from_dict
from playground.events.contrastive import ContrastiveStarted, ContrastStep

PROMPT = "the cat sat on the mat and the cat"
LAYERS = (0, 1, 2, 3)
ALPHA, THETA = 0.1, 1.2
ATOL = 2e-4


def parts(model):
    """(final norm, LM head, soft-cap or None), read straight off the transformers model."""
    norm = model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm
    cap = getattr(model.config, "final_logit_softcapping", None)
    return norm, model.get_output_embeddings(), cap


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) of two float64 distributions (0 log 0 = 0)."""
    return float(torch.where(p > 0, p * (p.log() - q.log()), torch.zeros_like(p)).sum())


def written_out(model, ids: list[int], variant: str):
    """(chosen layer, divergence per layer in nats, scores [vocab], log q_N, log q_M) after ``ids``."""
    norm, head, cap = parts(model)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        final = out.logits[0, -1].double().log_softmax(-1)
        rows = []
        for j in LAYERS:
            h = out.hidden_states[j][0, -1]
            if variant == "reference":
                logits = head(h).double()
            else:
                logits = head(norm(h)).double()
                if cap:
                    logits = torch.tanh(logits / cap) * cap
            rows.append(logits.log_softmax(-1))
    p = final.exp()
    divergence = []
    for lp in rows:
        q = lp.exp()
        m = 0.5 * (p + q)
        divergence.append(0.5 * (kl(m, p) + kl(m, q)) if variant == "reference" else 0.5 * (kl(p, m) + kl(q, m)))
    row = max(range(len(LAYERS)), key=lambda i: divergence[i])
    premature = rows[row]
    # the reference's relative-top filter on log-probabilities, the formula's cut on probabilities
    keep = final >= final.max() + math.log(ALPHA) if variant == "reference" else p >= ALPHA * p.max()
    scores = torch.where(keep, final - premature, torch.tensor(-math.inf, dtype=torch.float64))
    for t in set(ids):
        s = scores[t]
        scores[t] = s * THETA if s < 0 else s / THETA
    return LAYERS[row], divergence, scores, final, premature


def dola_run(lm, variant: str | None, tokens: int = 10):
    chosen = {"dola_variant": variant} if variant else {}
    flat = {"strategy": "contrastive", "prompt": PROMPT, "amateur": "dola", "max_new_tokens": tokens,
            "dola_layers": ",".join(map(str, LAYERS)), "alpha": ALPHA, "dola_repetition_penalty": THETA, **chosen}
    return list(run_strategy(lm, RunSettings.from_flat(**flat)))


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma2"])
def family_lm(request):
    return build_tiny_lm(seed=3, layers=4, family=request.param)


@pytest.mark.parametrize("variant", ["reference", "formula"])
def test_each_variant_equals_its_formula(family_lm, variant):
    events = dola_run(family_lm, variant)
    started = next(e for e in events if isinstance(e, ContrastiveStarted))
    assert started.dola_variant == variant and started.dola_layers == LAYERS
    done = events[-1]
    assert isinstance(done, RunFinished)
    prompt = list(events[0].prompt_token_ids)
    steps = [e for e in events if isinstance(e, ContrastStep)]
    assert len(steps) == 10
    layers_seen, penalised = set(), 0
    for step in steps:
        ids = prompt + list(done.token_ids[: step.step])
        layer, divergence, scores, final, premature = written_out(family_lm.model, ids, variant)
        assert step.premature_layer == layer
        layers_seen.add(layer)
        assert step.layer_jsd == pytest.approx(divergence, rel=1e-3, abs=1e-5)
        assert step.token_id == int(scores.argmax()) == done.token_ids[step.step]
        for c in step.candidates:
            assert c.expert_logprob == pytest.approx(float(final[c.token_id]), abs=ATOL)
            assert c.amateur_logprob == pytest.approx(float(premature[c.token_id]), abs=ATOL)
            if math.isfinite(float(scores[c.token_id])):
                assert c.plausible and c.score == pytest.approx(float(scores[c.token_id]), abs=2 * ATOL)
                penalised += c.token_id in ids
            else:
                assert c.score == -math.inf and not c.plausible
    assert penalised, "precondition: the repetition penalty met a plausible repeated token"


def test_the_variants_part_on_every_family(family_lm):
    """Precondition of the test above: the two formulas pick other layers (or other tokens), so a variant ignored
    is seen; the default is the reference."""
    default, formula = dola_run(family_lm, None), dola_run(family_lm, "formula")
    assert next(e for e in default if isinstance(e, ContrastiveStarted)).dola_variant == "reference"
    layers = [[e.premature_layer for e in run if isinstance(e, ContrastStep)] for run in (default, formula)]
    assert layers[0] != layers[1] or default[-1].token_ids != formula[-1].token_ids


def test_the_relative_top_filter_is_4_46s():
    """Written out: the expert's log-softmax below max + log 0.1 becomes −∞, the baseline's −1e-3 (4.46's
    ``base_filter_value``); kept rows are the two log-softmaxes; at least one token is kept."""
    torch.manual_seed(0)
    scores, baseline = torch.randn(2, 50) * 3, torch.randn(2, 50) * 3
    final, base, threshold = relative_top_filter(scores.clone(), baseline.clone(), 0.1)
    lf, lb = scores.double().log_softmax(-1), baseline.double().log_softmax(-1)
    keep = lf >= lf.max(-1, keepdim=True).values + math.log(0.1)
    assert 1 <= int(keep[0].sum()) < 50
    assert torch.equal(final == -math.inf, ~keep)
    torch.testing.assert_close(final[keep].double(), lf[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(base[keep].double(), lb[keep], atol=1e-5, rtol=0)
    assert torch.all(base[~keep] == torch.tensor(-1e-3))
    torch.testing.assert_close(threshold[:, 0].double(), lf.max(-1).values + math.log(0.1), atol=1e-5, rtol=0)
    # a flat expert keeps every token; relative_top 1 keeps only the top one
    final, base, _ = relative_top_filter(torch.zeros(1, 8), torch.randn(1, 8), 0.1)
    assert torch.isfinite(final).all()
    final, _, _ = relative_top_filter(scores.clone(), baseline.clone(), 1.0)
    assert [int(torch.isfinite(r).sum()) for r in final] == [1, 1]


def test_the_variant_reaches_settings_cli_summary_and_saved_runs(tiny_lm, tmp_path):
    args = build_parser().parse_args(["trace", "--strategy", "contrastive", "--amateur", "dola",
                                      "--dola-variant", "formula"])
    _, run = settings_from_args(args)
    assert run.group(ContrastiveSettings).dola_variant == "formula"
    assert RunSettings().group(ContrastiveSettings).dola_variant == "reference"
    assert "formula" in run.group(ContrastiveSettings).summary()
    with pytest.raises(Exception, match="dola_variant"):
        RunSettings.from_flat(strategy="contrastive", amateur="dola", dola_variant="paper").validate()
    events = list(run_strategy(tiny_lm, run.replace(prompt=PROMPT, max_new_tokens=2)))
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.settings["contrastive"]["dola_variant"] == "formula"
    contrast = next(e for e in events if isinstance(e, ContrastiveStarted))
    back = event_from_dict(json.loads(dumps_event(contrast)))
    assert back.dola_variant == "formula" and "formula variant" in back.detail


def transformers_4_46_candidates(spec: str, count: int, tied: bool) -> list[int]:
    """``_dola_decoding``'s candidate premature layers, as transformers 4.46 writes them."""
    start = 0 if not tied else 2 if count > 2 else 1 if count == 2 else 0
    if spec == "low":
        if start == count // 2:
            return [start]
        return list(range(start, count // 2, 2)) if count <= 40 else list(range(start, 20, 2))
    return list(range(count // 2, count, 2)) if count <= 40 else list(range(count - 20, count, 2))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("spec", ["low", "high"])
def test_candidate_layers_are_transformers_4_46s(spec, tied):
    """Every depth from 1 to 96 layers, tied or not; where 4.46 finds no candidate (a tied 3-layer model's low
    bucket: it would then fail on an empty stack) ours takes the start layer."""
    for count in range(1, 97):
        theirs = transformers_4_46_candidates(spec, count, tied)
        assert list(candidate_layers(spec, count, tied)) == (theirs or [2]), (count, tied, spec)
        if not theirs:
            assert (spec, count, tied) == ("low", 3, True)
