"""What-if (``state/what_if.py``): a finished run re-derived under other settings from its recorded raw candidates.

References: the run's own recorded processed probabilities (its own settings), a fresh run forcing the same tokens
under the other settings (its candidates' processed probabilities and cut_by), and for the exactness flags the
whole processed distribution the engine's chain gives on the model's logits at each step (a teacher-forced forward
pass in the test): a step flagged exact must keep no token outside the recorded ones and match it everywhere.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from playground.config import RunSettings
from playground.engine.processors import build_pipeline, run_pipeline
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep, dumps_event, event_from_dict
from playground.state.what_if import RecordedRun, unpack_raw_candidates
from playground.state.what_if import re_derive as _re_derive

BASE = RunSettings(strategy="sample", prompt="Hello there, tell me", max_new_tokens=20, record_candidates=96, seed=3,
                   temperature=0.9)


@pytest.fixture(scope="module")
def recorded(tiny_lm):
    events = list(run_strategy(tiny_lm, BASE))
    start = next(e for e in events if isinstance(e, RunStarted))
    return start.prompt_token_ids, [e for e in events if isinstance(e, TokenStep)]


def re_derive(steps, prompt_ids, settings, **options):
    return _re_derive(RecordedRun.of(steps, prompt_ids), settings, **options)


def without_whole(steps):
    """The steps as a run saved before the whole-vocabulary numbers were recorded (``RawCandidates.whole``)."""
    return [dataclasses.replace(s, raw_top=dataclasses.replace(s.raw_top, whole=None)) if s.raw_top else s
            for s in steps]


def _processed_reference(tiny_lm, settings, prompt_ids, steps):
    """The engine's processed distribution [vocab] at each step, on logits of a plain forward over the context."""
    context = [*prompt_ids, *(s.token_id for s in steps)]
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([context])).logits[0].float()  # [seq, vocab]
    pipeline = build_pipeline(settings, sampling=settings.strategy == "sample")
    out = []
    for i in range(len(steps)):
        end = len(prompt_ids) + i
        out.append(run_pipeline(pipeline, torch.tensor([context[:end]]), logits[end - 1 : end]).softmax(-1)[0])
    return out


def test_the_recorded_candidates_are_the_raw_top_tokens_and_survive_a_saved_run(tiny_lm, recorded):
    prompt_ids, steps = recorded
    step = event_from_dict(__import__("json").loads(dumps_event(steps[3])))
    assert step.raw_top == steps[3].raw_top
    ids, logits = unpack_raw_candidates(step.raw_top)
    context = [*prompt_ids, *(s.token_id for s in steps[:3])]
    with torch.no_grad():
        raw = tiny_lm.model(torch.tensor([context])).logits[0, -1].double()
    expected = torch.topk(raw, 96)
    assert ids.tolist() == expected.indices.tolist()
    logprobs = raw.log_softmax(-1)
    assert max(abs(a - b) for a, b in zip(logits - step.raw_top.logsumexp, logprobs[expected.indices].tolist(),
                                            strict=True)) <= 0.5 / 1024 + 1e-6
    tail = 1 - float(logprobs[expected.indices].exp().sum())
    assert math.isclose(step.raw_top.tail_mass, tail, abs_tol=1e-6)
    assert step.raw_top.vocab_size == tiny_lm.model.config.vocab_size
    rest = torch.ones(logprobs.shape[0], dtype=torch.bool)
    rest[expected.indices] = False
    for power, moment in zip((0.5, 1.5, 2.0), step.raw_top.tail_log_moments, strict=True):
        assert math.isclose(moment, float(torch.logsumexp(power * logprobs[rest], 0)), abs_tol=1e-4)


def test_an_old_saved_step_without_raw_candidates_loads_and_is_not_exact(recorded):
    prompt_ids, steps = recorded
    plain = __import__("json").loads(dumps_event(steps[0]))
    del plain["raw_top"]
    old = event_from_dict(plain)
    assert old.raw_top is None
    what_if = re_derive([old, *steps[1:]], prompt_ids, BASE.replace(top_k=5))
    assert not what_if.exact[0] and what_if.reasons[0] == "the step recorded no raw candidates"
    assert what_if.exact[1:].all()


@pytest.mark.parametrize("values", [dict(top_k=6), dict(top_k=10, temperature=0.6), dict(min_p=0.3)])
def test_re_deriving_with_the_runs_own_settings_gives_its_recorded_probabilities(tiny_lm, values):
    settings = BASE.replace(**values)
    events = list(run_strategy(tiny_lm, settings))
    prompt_ids = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    steps = [e for e in events if isinstance(e, TokenStep)]
    what_if = re_derive(steps, prompt_ids, settings)
    assert what_if.exact.mean() >= 0.8, what_if.reasons
    for row, step in enumerate(steps):
        if not what_if.exact[row]:
            continue
        column = {int(t): j for j, t in enumerate(what_if.ids[row])}
        for candidate in step.candidates:
            j = column[candidate.token_id]
            assert math.isclose(what_if.probs[row, j], candidate.processed_prob, rel_tol=2e-3, abs_tol=1e-6)
            assert what_if.cut_name(row, j) == candidate.cut_by
        assert not what_if.chosen_cut[row]
        assert math.isclose(what_if.chosen_prob[row], step.prob, rel_tol=2e-3, abs_tol=1e-6)


OTHERS = [
    dict(temperature=0.7, top_k=8), dict(top_p=0.6), dict(min_p=0.15, temperature=1.3), dict(epsilon_cutoff=0.02),
    dict(repetition_penalty=1.6, top_k=12), dict(presence_penalty=0.6, frequency_penalty=0.4, min_p=0.2),
    dict(typical_p=0.7, top_k=10), dict(no_repeat_ngram_size=1, top_k=10), dict(top_n_sigma=1.0),
    dict(dry_multiplier=1.5, dry_allowed_length=1, dry_sequence_breakers=(), top_k=10),
    dict(logit_bias=("5=-4", "7=-inf"), top_k=10), dict(logit_bias=("5=+4",), top_k=10),
    dict(samplers="top_k;temperature", temperature=1.7, top_k=7),
    dict(strategy="greedy"), dict(strategy="greedy", repetition_penalty=1.3), dict(top_p=0.95, temperature=1.0),
]


@pytest.mark.parametrize("values", OTHERS, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o in OTHERS])
def test_other_settings_equal_a_fresh_run_at_the_same_tokens_where_exact(tiny_lm, recorded, values):
    prompt_ids, steps = recorded
    settings = BASE.replace(**values).validate()
    what_if = re_derive(steps, prompt_ids, settings, breaker_ids=frozenset())
    fresh = [e for e in run_strategy(tiny_lm, settings.replace(forced_token_ids=tuple(s.token_id for s in steps)))
             if isinstance(e, TokenStep)]
    reference = _processed_reference(tiny_lm, settings, prompt_ids, steps)
    recorded_ids = [set(unpack_raw_candidates(s.raw_top)[0].tolist()) | {s.token_id} for s in steps]
    for row, (step, probs) in enumerate(zip(fresh, reference, strict=True)):
        outside = sorted(set(range(probs.shape[0])) - recorded_ids[row])
        if not what_if.exact[row]:
            continue
        # Computed here: the share of the unrecorded tokens (0 when the chain cut them all) is the what-if's.
        assert math.isclose(what_if.tail_prob[row], float(probs[outside].sum()), rel_tol=2e-3, abs_tol=1e-6), row
        column = {int(t): j for j, t in enumerate(what_if.ids[row])}
        for candidate in step.candidates:
            j = column[candidate.token_id]
            assert math.isclose(what_if.probs[row, j], candidate.processed_prob, rel_tol=2e-3, abs_tol=1e-6)
            assert what_if.cut_name(row, j) == candidate.cut_by
        for token, j in column.items():
            if token >= 0:
                assert math.isclose(what_if.probs[row, j], float(probs[token]), rel_tol=2e-3, abs_tol=1e-6)
        assert what_if.chosen_cut[row] == (float(probs[step.token_id]) == 0.0)
        assert what_if.greedy[row] == int(probs.argmax())
        assert what_if.greedy_differs[row] == (int(probs.argmax()) != step.token_id)
    if "top_n_sigma" in values:  # it reads the whole distribution's spread, and the tail is in play
        # Without the whole-vocabulary numbers (a run saved before they were recorded) it cannot be exact; with
        # them (after a temperature only: the spread scales with it) its line is known (test_what_if_vs_engine).
        assert not re_derive(without_whole(steps), prompt_ids, settings, breaker_ids=frozenset()).exact.any()
        assert what_if.exact.mean() >= 0.5, what_if.reasons
    elif values == {"strategy": "greedy"}:  # no cut, no temperature: the tail's share is known at every step
        assert what_if.exact.all(), what_if.reasons
    elif ("top_k" in values or "min_p" in values) and values.get("logit_bias") != ("5=+4",):
        assert what_if.exact.mean() >= 0.5, what_if.reasons


def test_exactness_when_the_tail_decides_and_when_it_cannot(recorded):
    """Computed here from each step's own recorded numbers: top-k within the recorded candidates decides unless the
    k-th and the next are within the rounding; top-k past them never decides; top-p (no temperature, so the tail's
    mass is known) is exact exactly when the tail, below every recorded token, holds at most 1 - top_p."""
    prompt_ids, steps = recorded
    rounding = "a candidate lies within the recorded log-probabilities' rounding (1/2048 nat) of the cut"
    what_if = re_derive(steps, prompt_ids, BASE.replace(top_k=20))
    for row, step in enumerate(steps):
        _, logits = unpack_raw_candidates(step.raw_top)
        close = (logits[19] - logits[20]) / 0.9 <= 2.5 * (0.5 / 1024) / 0.9
        assert bool(what_if.exact[row]) == (not close)
        assert what_if.reasons[row] == (rounding if close else "")
    assert not re_derive(steps, prompt_ids, BASE.replace(top_k=200)).exact.any()
    top_p = 0.9
    what_if = re_derive(steps, prompt_ids, BASE.replace(top_p=top_p, temperature=1.0))
    checked = 0
    for row, step in enumerate(steps):
        ids, _ = unpack_raw_candidates(step.raw_top)
        tail = step.raw_top.tail_mass - (math.exp(step.logprob) if step.token_id not in ids.tolist() else 0.0)
        if what_if.reasons[row] == rounding:
            continue
        checked += 1
        assert bool(what_if.exact[row]) == (tail <= 1 - top_p), (row, tail, what_if.reasons[row])
    assert checked >= len(steps) - 2
    assert 0 < what_if.exact.sum() < len(steps), "precondition: some steps each way"


def _synthetic_steps(seed: int, vocab: int = 2000, record: int = 64, steps: int = 40):
    """Steps packed from whole-vocabulary logits of several tail shapes (flat just under the last recorded token,
    spread far below it, heavy), with the logits kept as the reference."""
    from playground.engine.step_analysis import pack_raw_candidates

    generator = torch.Generator().manual_seed(seed)
    out, full = [], []
    for i in range(steps):
        logits = torch.randn(vocab, generator=generator) * (1.0 + i % 4)
        logits[:8] += 6.0 * torch.rand(8, generator=generator)
        order = torch.argsort(logits, descending=True)
        if i % 3 == 0:  # a flat tail: every unrecorded token just under the last recorded one
            logits[order[record:]] = logits[order[record - 1]] - 0.01 - 0.001 * torch.rand(vocab - record,
                                                                                            generator=generator)
        logprobs = logits.log_softmax(-1)
        top = torch.topk(logits, record).indices
        chosen = int(top[0])
        out.append(TokenStep(step=i, token_id=chosen, text="", prob=0.0, raw_prob=float(logprobs[chosen].exp()),
                             logprob=float(logprobs[chosen]), raw_rank=1, entropy=0.0, processed_entropy=0.0,
                             candidates=(), shown_raw_mass=0.0, effects=(), forced=False, step_ms=0.0,
                             kv_cache_bytes=0, raw_top=pack_raw_candidates(top, logprobs, logits)))
        full.append(logits)
    return out, full


SYNTHETIC = [dict(temperature=t, **cut) for t in (0.5, 1.25)
             for cut in (dict(top_p=0.5), dict(epsilon_cutoff=0.002), dict(min_p=0.05), dict(top_p=0.6, top_k=50))]
# Temperatures between and past the recorded tail moments' powers (1/T = 0.8, 1.43, 2.5).
SYNTHETIC += [dict(temperature=t, top_p=0.8) for t in (0.4, 0.7)] + [dict(temperature=0.7, epsilon_cutoff=0.001)]


@pytest.mark.parametrize("values", SYNTHETIC, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o in SYNTHETIC])
def test_a_step_flagged_exact_equals_the_chain_on_the_whole_vocabulary_whatever_the_tail(values):
    """Steps whose tails are shaped to sit on the cuts' edges: wherever the what-if says exact, the engine's chain on
    the whole vocabulary keeps no unrecorded token and gives the same probabilities."""
    steps, full = _synthetic_steps(len(values) + int(values["temperature"] * 10))
    settings = RunSettings(strategy="sample", **values).validate()
    what_if = re_derive(steps, [0], settings)
    pipeline = build_pipeline(settings, sampling=True)
    for row, logits in enumerate(full):
        probs = run_pipeline(pipeline, torch.zeros(1, 1, dtype=torch.long), logits[None].double()).softmax(-1)[0]
        recorded = set(what_if.ids[row][what_if.ids[row] >= 0].tolist())
        outside = sorted(set(range(probs.shape[0])) - recorded)
        if not what_if.exact[row]:
            continue
        assert math.isclose(what_if.tail_prob[row], float(probs[outside].sum()), rel_tol=2e-3, abs_tol=1e-7), row
        for j, token in enumerate(what_if.ids[row]):
            if token >= 0:
                assert math.isclose(what_if.probs[row, j], float(probs[token]), rel_tol=2e-3, abs_tol=1e-7)
    if values["temperature"] < 1 or "top_p" not in values:  # above 1, top-p's bounds on a flattened tail are loose
        assert what_if.exact.any(), "precondition: some steps exact"


@pytest.mark.parametrize("tau", [2.0, 3.0])  # the run's own, and another
def test_mirostat_is_re_derived_step_by_step_from_the_chosen_tokens(tiny_lm, tau):
    """With the run's own mirostat, mu and the probabilities are the recorded ones; with another tau they are a
    fresh run's at the same tokens (its mu per step read from its events)."""
    own = BASE.replace(mirostat=2, mirostat_tau=2.0, mirostat_eta=0.1, temperature=1.0, top_k=8,
                       samplers="top_k;mirostat")  # top-k first: the unrecorded tokens are out before mirostat
    events = list(run_strategy(tiny_lm, own))
    prompt_ids = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    steps = [e for e in events if isinstance(e, TokenStep)]
    settings = own.replace(mirostat_tau=tau)
    what_if = re_derive(steps, prompt_ids, settings)
    fresh = [e for e in run_strategy(tiny_lm, settings.replace(forced_token_ids=tuple(s.token_id for s in steps)))
             if isinstance(e, TokenStep)]
    assert what_if.mirostat_mu is not None
    for row, step in enumerate(fresh):
        if not what_if.exact[row]:
            continue
        assert math.isclose(what_if.mirostat_mu[row], step.mirostat_mu, abs_tol=5e-3), row
        column = {int(t): j for j, t in enumerate(what_if.ids[row])}
        for candidate in step.candidates:
            j = column[candidate.token_id]
            assert math.isclose(what_if.probs[row, j], candidate.processed_prob, rel_tol=2e-3, abs_tol=1e-6)
            assert what_if.cut_name(row, j) == candidate.cut_by
    # One step at a border the rounding cannot decide leaves every later mu uncertain: the first steps are exact.
    assert what_if.exact[0] and what_if.exact.sum() >= 2, what_if.reasons
    if not what_if.exact.all():
        assert not what_if.exact[int(np.argmin(what_if.exact)):].any(), "after a step not exact, none is"


def test_the_tails_moment_bounds_hold_whatever_its_shape():
    """log Σ exp(a·logit) of random tails (flat, spread, heavy-topped), computed here, lies within the bounds the
    recorded moments give, for powers between, at and past them; at a recorded power the bounds meet."""
    from playground.state.what_if import MOMENT_POWERS, _moment_bounds

    generator = torch.Generator().manual_seed(11)
    tails = [torch.randn(3000, generator=generator) * scale - 8 for scale in (0.01, 1.0, 3.0)]
    tails.append(torch.cat([torch.full((5,), -3.0), torch.randn(2000, generator=generator) * 2 - 12]))
    for tail in tails:
        tail = tail.double()
        moments = np.array([[float(torch.logsumexp(a * tail, 0)) for a in MOMENT_POWERS]])
        top = np.array([float(tail.max())])
        for a in (0.3, 0.5, 0.8, 1.2, 1.7, 2.0, 2.5, 3.0):
            lower, upper = _moment_bounds(moments, np.array([a]), top)
            truth = float(torch.logsumexp(a * tail, 0))
            assert lower[0] - 1e-9 <= truth <= upper[0] + 1e-9, (a, lower, truth, upper)
            if a in MOMENT_POWERS:
                assert math.isclose(lower[0], upper[0], abs_tol=1e-9)
        lower, upper = _moment_bounds(moments, np.array([1.2]), top)
        assert upper[0] - lower[0] < 0.5, "the bounds are tighter than the count alone gives"
