"""The what-if of the samplers added as new files (top-a, tail-free sampling, Adaptive-P): where it says a step is
exact, its numbers are the engine's (a fresh run forcing the same tokens, and the engine's chain on a
teacher-forced forward pass, Adaptive-P's average following the same tokens); where it cannot be, it says so."""

from __future__ import annotations

import math

import pytest
import torch

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.state.what_if import unpack_raw_candidates
from tests.test_what_if import BASE, re_derive, recorded  # noqa: F401 (the recorded run is a fixture)


def _reference(tiny_lm, settings: RunSettings, prompt_ids, steps) -> list[torch.Tensor]:
    """The engine's processed distribution [vocab] at each step, its samplers' state following the run's tokens."""
    context = [*prompt_ids, *(s.token_id for s in steps)]
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([context])).logits[0].float()
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    pipeline = build_pipeline(settings, sampling=True, run=run)
    out = []
    for i, step in enumerate(steps):
        end = len(prompt_ids) + i
        probs = run_pipeline(pipeline, torch.tensor([context[:end]]), logits[end - 1 : end]).softmax(-1)[0]
        run.accept(step.token_id, float(probs[step.token_id]))
        out.append(probs)
    return out


CASES = [dict(top_a=0.2), dict(top_k=10, top_a=0.4), dict(top_k=12, tfs=0.8), dict(tfs=0.9),
         dict(top_k=10, adaptive_target=0.25, adaptive_decay=0.6), dict(adaptive_target=0.3),
         dict(top_k=8, tfs=0.95, top_a=0.1, adaptive_target=0.2, samplers="adaptive_p;top_k;tfs;top_a")]


@pytest.mark.parametrize("values", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in CASES])
def test_exact_steps_are_the_engines(tiny_lm, recorded, values):  # noqa: F811
    prompt_ids, steps = recorded
    settings = _settings(values)  # BASE's run, with only these samplers on
    what_if = re_derive(steps, prompt_ids, settings, breaker_ids=frozenset())
    fresh = [e for e in run_strategy(tiny_lm, settings.replace(forced_token_ids=tuple(s.token_id for s in steps)))
             if isinstance(e, TokenStep)]
    reference = _reference(tiny_lm, settings, prompt_ids, steps)
    recorded_ids = [set(unpack_raw_candidates(s.raw_top)[0].tolist()) | {s.token_id} for s in steps]
    checked = 0
    # Adaptive-P's transform is steep in p (slope up to 10 / 0.3 · p in log p): the recorded log-probabilities'
    # rounding (1/2048 nat) reaches its probabilities amplified, up to ~1 % where p is large.
    rel = 1e-2 if "adaptive_target" in values else 2e-3
    for row, (step, probs) in enumerate(zip(fresh, reference, strict=True)):
        if not what_if.exact[row]:
            assert what_if.reasons[row]
            continue
        checked += 1
        outside = sorted(set(range(probs.shape[0])) - recorded_ids[row])
        assert math.isclose(what_if.tail_prob[row], float(probs[outside].sum()), rel_tol=rel, abs_tol=1e-5), row
        column = {int(t): j for j, t in enumerate(what_if.ids[row])}
        for candidate in step.candidates:
            j = column[candidate.token_id]
            assert math.isclose(what_if.probs[row, j], candidate.processed_prob, rel_tol=rel, abs_tol=1e-5), row
            assert what_if.cut_name(row, j) == candidate.cut_by
        for token, j in column.items():
            if token >= 0:
                assert math.isclose(what_if.probs[row, j], float(probs[token]), rel_tol=rel, abs_tol=1e-5), row
    if "top_k" in values and "samplers" not in values:  # top-k cuts the unrecorded tokens first: then exact
        assert checked >= 0.8 * len(steps), what_if.reasons
    assert checked >= 5 or values in (dict(tfs=0.9), dict(adaptive_target=0.3)), what_if.reasons
    if "adaptive_target" in values and not what_if.exact.all():  # the average carries an inexact step onwards
        first = int(what_if.exact.argmin())
        assert not what_if.exact[first:].any()
    if values in (dict(tfs=0.9), dict(adaptive_target=0.3)):  # they read every unrecorded token: estimates
        assert checked == 0 and all(what_if.reasons)
    assert what_if.stages[-1] == ("adaptive_p" if "adaptive_target" in values else what_if.stages[-1])


def _settings(values: dict) -> RunSettings:
    return RunSettings.from_flat(strategy="sample", prompt=BASE.prompt, max_new_tokens=BASE.max_new_tokens,
                                 record_candidates=BASE.record_candidates, seed=BASE.seed, **values).validate()


def _one_step(logits: torch.Tensor, record: int, chosen: int) -> TokenStep:
    """A recorded step of these raw logits [1, vocab] (the likeliest ``record`` packed, as a run records them)."""
    from playground.engine.step_analysis import analyse_step

    analysis = analyse_step((), torch.zeros(1, 1, dtype=torch.long), logits, 5, record=record)
    analysis.token_id = chosen
    return analysis.to_event(step=0, text="", forced=False, step_ms=0.0, kv_bytes=0, token_text=str)


@pytest.mark.parametrize("values", [dict(top_a=0.05), dict(top_a=0.3), dict(min_p=0.05, tfs=0.6),
                                    dict(top_k=30, tfs=0.9), dict(top_k=30, adaptive_target=0.1),
                                    dict(top_k=30, top_a=0.1),
                                    dict(temperature=0.6, top_a=0.2), dict(temperature=1.5, top_a=0.5)])
def test_on_synthetic_steps_an_exact_claim_is_the_engines(values):
    """Many random steps (400 tokens, 40 recorded, peaked or flat): wherever the what-if claims exact, the engine's
    chain on the whole vocabulary keeps no unrecorded token and gives the same probabilities."""
    from playground.state.what_if import RecordedRun
    from playground.state.what_if import re_derive as derive

    settings = _settings(values)
    generator = torch.Generator().manual_seed(11)
    exact = 0
    for case in range(60):
        logits = torch.randn(1, 400, generator=generator) * (0.5 + case / 10)
        step = _one_step(logits, 40, int(logits.argmax()))
        what_if = derive(RecordedRun.of([step], [1]), settings)
        if not what_if.exact[0]:
            continue
        exact += 1
        run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
        probs = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long),
                             logits.double()).softmax(-1)[0]
        recorded_ids = set(unpack_raw_candidates(step.raw_top)[0].tolist())
        outside = sorted(set(range(400)) - recorded_ids)
        assert math.isclose(what_if.tail_prob[0], float(probs[outside].sum()), rel_tol=1e-2, abs_tol=1e-6), case
        for j, token in enumerate(what_if.ids[0]):
            if token >= 0:
                assert math.isclose(what_if.probs[0, j], float(probs[token]), rel_tol=1e-2, abs_tol=1e-5), case
    assert exact >= 5, "precondition: some steps are exact"
