"""The what-if held to the engine for every sampler the registry declares (issue 28, point 2).

A run on a tiny model records its raw candidates; each sampler's declared examples (``SamplerSpec.what_if_examples``)
re-derive it in the what-if, and the engine runs the same settings teacher-forced along the run's tokens (a forced
run, for its candidates' processed probabilities and cut_by, and the engine's sampler chain on a teacher-forced
forward pass, for the whole processed distribution, its samplers' state following the same tokens). Wherever the
what-if says a step is exact its numbers are the engine's on every recorded candidate and for the tokens not
recorded together; everywhere else the step carries a reason (the estimate's marker). A sampler declared
estimate-only is asserted never exact. Driven by the registry: a sampler added later is covered by its declaration.

The whole-vocabulary numbers each step records (``RawCandidates.whole``) are checked against the logits here, and a
run saved before them still loads, its samplers that read every token estimates where the tail is in play.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from playground.config import RunSettings
from playground.config.samplers import SPECS, sampler_is_on
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep, dumps_event, event_from_dict
from playground.state.what_if import RecordedRun, re_derive, unpack_raw_candidates
from playground.state.what_if.stages import STAGES

RUN = dict(prompt="Hello there, tell me", max_new_tokens=16, record_candidates=160, seed=5)
REL, ABS = 2e-3, 1e-6  # the recorded log-probabilities' rounding (1/2048 nat) and float32's


@pytest.fixture(scope="module")
def recorded(tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings(strategy="sample", temperature=0.9, **RUN)))
    start = next(e for e in events if isinstance(e, RunStarted))
    return start.prompt_token_ids, [e for e in events if isinstance(e, TokenStep)]


@pytest.fixture(scope="module")
def logits(tiny_lm, recorded):
    """The raw logits [steps, vocab] of a teacher-forced forward pass over the run's context."""
    prompt_ids, steps = recorded
    context = [*prompt_ids, *(s.token_id for s in steps)]
    with torch.no_grad():
        out = tiny_lm.model(torch.tensor([context])).logits[0].float()
    return out[len(prompt_ids) - 1: len(prompt_ids) - 1 + len(steps)]


def _settings(values: dict) -> RunSettings:
    return RunSettings.from_flat(strategy="sample", **RUN, **values).validate()


def _engine(tiny_lm, settings: RunSettings, prompt_ids, steps, logits) -> tuple[list[TokenStep], list[torch.Tensor]]:
    """The engine's run forced along the run's tokens, and its processed distribution [vocab] at each step (the
    chain on the teacher-forced logits, mirostat's mu and Adaptive-P's average following the same tokens)."""
    forced = [e for e in run_strategy(tiny_lm, settings.replace(forced_token_ids=tuple(s.token_id for s in steps)))
              if isinstance(e, TokenStep)]
    context = [*prompt_ids, *(s.token_id for s in steps)]
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    pipeline = build_pipeline(settings, sampling=True, run=run)
    out = []
    for i, step in enumerate(steps):
        probs = run_pipeline(pipeline, torch.tensor([context[:len(prompt_ids) + i]]), logits[i:i + 1]).softmax(-1)[0]
        run.accept(step.token_id, float(probs[step.token_id]))
        out.append(probs)
    return forced, out


def _check(what_if, steps, forced, reference, where: str) -> int:
    """Every step the what-if calls exact equals the engine; every other one says why. Returns the exact count."""
    for row, (step, engine, probs) in enumerate(zip(steps, forced, reference, strict=True)):
        if not what_if.exact[row]:
            assert what_if.reasons[row], f"{where}: step {row} is an estimate without its marker"
            continue
        tol = dict(rel_tol=1e-2 if "adaptive_p" in what_if.stages else REL, abs_tol=1e-5 if "adaptive_p" in
                   what_if.stages else ABS)
        recorded_ids = set(unpack_raw_candidates(step.raw_top)[0].tolist()) | {step.token_id}
        outside = sorted(set(range(probs.shape[0])) - recorded_ids)
        assert math.isclose(what_if.tail_prob[row], float(probs[outside].sum()), **tol), (where, row)
        column = {int(t): j for j, t in enumerate(what_if.ids[row]) if t >= 0}
        for token, j in column.items():
            assert math.isclose(what_if.probs[row, j], float(probs[token]), **tol), (where, row, token)
        for candidate in engine.candidates:
            j = column[candidate.token_id]
            assert math.isclose(what_if.probs[row, j], candidate.processed_prob, **tol), (where, row)
            assert what_if.cut_name(row, j) == candidate.cut_by, (where, row, candidate.token_id)
        assert what_if.chosen_cut[row] == (float(probs[step.token_id]) == 0.0), (where, row)
        assert what_if.greedy[row] == int(probs.argmax()), (where, row)
    return int(what_if.exact.sum())


def _without_whole(steps):
    """The steps as a run saved before the whole-vocabulary numbers: their JSON without the field, read back."""
    out = []
    for step in steps:
        plain = json.loads(dumps_event(step))
        del plain["raw_top"]["whole"]
        out.append(event_from_dict(plain))
    return out


EXAMPLES = [(name, i) for name, spec in SPECS.items() for i in range(max(1, len(spec.what_if_examples)))]


@pytest.mark.parametrize(("name", "example"), EXAMPLES, ids=[f"{n}-{i}" for n, i in EXAMPLES])
def test_every_declared_sampler_is_the_engines_where_the_what_if_says_exact(tiny_lm, recorded, logits, name,
                                                                             example):
    spec = SPECS[name]
    assert name in STAGES, f"{name}: no what-if stage (playground/state/what_if/stages/{name}.py)"
    assert spec.what_if_examples, f"{name}: declare what_if_examples (settings that switch it on) in its SamplerSpec"
    values = spec.what_if_examples[example]
    settings = _settings(values)
    assert sampler_is_on(settings, name), f"{name}: its example {values} does not switch it on"
    prompt_ids, steps = recorded
    what_if = re_derive(RecordedRun.of(steps, prompt_ids), settings, breaker_ids=frozenset())
    assert set(spec.stage_names) & set(what_if.stages), f"{name}: the what-if ran no stage for it"
    if spec.what_if.startswith("estimate:"):  # declared never exact: every step says why
        assert not what_if.exact.any() and all(what_if.reasons), (name, what_if.reasons)
        return
    forced, reference = _engine(tiny_lm, settings, prompt_ids, steps, logits)
    # Non-trivial: the example changes the engine's distribution (against the plain softmax) at some step.
    plain = logits.softmax(-1)
    assert max(float((p - q).abs().max()) for p, q in zip(reference, plain, strict=True)) > 1e-3, name
    exact = _check(what_if, steps, forced, reference, f"{name} {values}")
    assert exact >= 3, f"{name} {values}: the example leaves too few exact steps to check ({what_if.reasons})"
    # The same run as saved before the whole-vocabulary numbers: still the engine's wherever it says exact.
    old = re_derive(RecordedRun.of(_without_whole(steps), prompt_ids), settings, breaker_ids=frozenset())
    assert _check(old, steps, forced, reference, f"{name} {values}, an old saved run") <= exact


# Custom orders where the order matters: (order, the other order, settings). Each pair's engine results differ.
ORDERS = [
    ("temperature;min_p", "min_p;temperature", dict(temperature=1.8, min_p=0.25)),
    ("top_p;temperature", "temperature;top_p", dict(top_p=0.5, temperature=0.5)),
    ("typical_p;top_n_sigma", "top_n_sigma;typical_p", dict(typical_p=0.4, top_n_sigma=1.0)),
    ("eta_cutoff;top_k", "top_k;eta_cutoff", dict(eta_cutoff=0.3, top_k=8)),
    ("tfs;top_k", "top_k;tfs", dict(tfs=0.5, top_k=8)),
    ("xtc;min_p", "min_p;xtc", dict(xtc_probability=1.0, xtc_threshold=0.04, min_p=0.3)),
]


@pytest.mark.parametrize(("order", "other", "values"), ORDERS, ids=[o for o, _, _ in ORDERS])
def test_a_custom_order_that_changes_the_result_is_the_engines(tiny_lm, recorded, logits, order, other, values):
    prompt_ids, steps = recorded
    results = []
    for samplers in (order, other):
        settings = _settings({**values, "samplers": samplers})
        what_if = re_derive(RecordedRun.of(steps, prompt_ids), settings)
        forced, reference = _engine(tiny_lm, settings, prompt_ids, steps, logits)
        exact = _check(what_if, steps, forced, reference, samplers)
        assert exact >= 3, (samplers, what_if.reasons)
        results.append((what_if, reference))
    (first, first_ref), (second, second_ref) = results
    assert any(float((p - q).abs().max()) > 1e-3 for p, q in zip(first_ref, second_ref, strict=True)), \
        "precondition: the two orders give different results"
    both = first.exact & second.exact
    assert both.any() and np.abs(first.probs[both] - second.probs[both]).max() > 1e-3, \
        "the what-if gives the same result for both orders where both are exact"


def test_the_recorded_whole_vocabulary_numbers_are_the_logits(recorded, logits):
    _, steps = recorded
    for step, raw in zip(steps, logits.double(), strict=True):
        whole = step.raw_top.whole
        logp = raw.log_softmax(-1)
        assert math.isclose(whole.entropy, float(-(logp.exp() * logp).sum()), rel_tol=1e-5)
        assert math.isclose(whole.logit_mean, float(raw.mean()), rel_tol=1e-5, abs_tol=1e-6)
        assert math.isclose(whole.logit_std, float(raw.std(unbiased=False)), rel_tol=1e-5)
        assert whole.finite == raw.shape[0]
        assert math.isclose(step.entropy, whole.entropy / math.log(2), rel_tol=1e-6)  # the step's own, in bits


@pytest.mark.parametrize("values", [dict(eta_cutoff=0.02), dict(typical_p=0.5), dict(top_n_sigma=1.0),
                                    dict(temperature=1.2, dynatemp_range=0.6, top_k=20)])
def test_an_old_saved_run_loads_and_the_whole_vocabulary_samplers_stay_estimates(recorded, values):
    """First in the chain, with the tail in play: exact at some steps with the numbers, at none without them."""
    prompt_ids, steps = recorded
    old = _without_whole(steps)
    assert all(s.raw_top.whole is None for s in old)
    settings = _settings(values)
    assert re_derive(RecordedRun.of(steps, prompt_ids), settings).exact.any()
    what_if = re_derive(RecordedRun.of(old, prompt_ids), settings)
    whole = "a sampler that reads the whole distribution (typical, eta, top-nσ, dynamic temperature) ran while " \
            "tokens outside the recorded candidates were still in play, after an earlier sampler changed the " \
            "distribution (or in a run saved without the whole vocabulary's numbers)"
    assert not what_if.exact.any() and set(what_if.reasons) == {whole}


def test_xtc_below_probability_one_is_an_estimate_everywhere(recorded):
    prompt_ids, steps = recorded
    what_if = re_derive(RecordedRun.of(steps, prompt_ids), _settings(dict(xtc_probability=0.5, xtc_threshold=0.05)))
    assert not what_if.exact.any()
    assert set(what_if.reasons) == {"XTC fires at random: shown as if it fired"}


# A whole-vocabulary sampler after a stage that changed the distribution while the unrecorded tokens are in play:
# the recorded numbers no longer describe what it reads (the entropy does not scale with a temperature either).
AFTER_A_CHANGE = [dict(repetition_penalty=1.5, eta_cutoff=0.02), dict(presence_penalty=0.5, typical_p=0.5),
                  dict(temperature=0.7, eta_cutoff=0.02), dict(repetition_penalty=1.5, top_n_sigma=1.0),
                  dict(frequency_penalty=0.5, temperature=1.2, dynatemp_range=0.6, top_k=20)]


@pytest.mark.parametrize("values", AFTER_A_CHANGE, ids=[",".join(v) for v in AFTER_A_CHANGE])
def test_after_a_change_the_whole_vocabulary_samplers_are_estimates(tiny_lm, recorded, logits, values):
    prompt_ids, steps = recorded
    settings = _settings(values)
    what_if = re_derive(RecordedRun.of(steps, prompt_ids), settings)
    forced, reference = _engine(tiny_lm, settings, prompt_ids, steps, logits)
    _check(what_if, steps, forced, reference, str(values))
    assert not what_if.exact.any(), what_if.reasons


def _synthetic(case: int, vocab: int = 600, record: int = 40) -> torch.Tensor:
    """Raw logits [1, vocab] of one of several shapes: peaked and random; flat recorded candidates then a cliff (the
    rest's second differences weigh); a plateau across the recorded edge (unrecorded tokens as typical as recorded
    ones); a heavy flat tail."""
    generator = torch.Generator().manual_seed(case)
    kind = case % 4
    x = torch.randn(vocab, generator=generator) * (0.5 + (case % 6))
    x[:6] += 4 * torch.rand(6, generator=generator)
    order = torch.argsort(x, descending=True)
    if kind == 1:  # nearly linear over the recorded ones, then a drop
        x[order[:record]] = torch.linspace(2.0, 0.0, record) + 0.01 * torch.rand(record, generator=generator)
        x[order[record:]] = -3.0 - torch.rand(vocab - record, generator=generator)
    elif kind == 2:  # a plateau straddling the recorded edge
        x[order[record - 15:record + 60]] = x[order[record - 15]] - 0.002 * torch.arange(75.0)
    elif kind == 3:  # a heavy tail just under the last recorded one
        x[order[record:]] = x[order[record - 1]] - 0.05 - 0.3 * torch.rand(vocab - record, generator=generator)
    return x[None]


def _step_of(logits: torch.Tensor, record: int) -> TokenStep:
    from playground.engine.step_analysis import analyse_step

    analysis = analyse_step((), torch.zeros(1, 1, dtype=torch.long), logits, 5, record=record)
    analysis.token_id = int(logits.argmax())
    return analysis.to_event(step=0, text="", forced=False, step_ms=0.0, kv_bytes=0, token_text=str)


SYNTHETIC = [dict(tfs=0.3), dict(tfs=0.6), dict(tfs=0.9), dict(typical_p=0.3), dict(typical_p=0.6),
             dict(typical_p=0.9), dict(eta_cutoff=0.01), dict(eta_cutoff=0.1), dict(top_n_sigma=0.5),
             dict(top_n_sigma=1.5, temperature=0.7), dict(temperature=1.0, dynatemp_range=0.8, top_k=15)]


@pytest.mark.parametrize("values", SYNTHETIC, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in SYNTHETIC])
def test_on_shaped_tails_an_exact_claim_is_the_engines_on_the_whole_vocabulary(values):
    """Steps whose unrecorded tokens sit where they weigh (a cliff after the recorded ones, a plateau across their
    edge, a heavy tail): every step the what-if calls exact is the engine's chain on the whole vocabulary."""
    settings = _settings(values)
    exact = 0
    for case in range(48):
        logits = _synthetic(case)
        step = _step_of(logits, 40)
        what_if = re_derive(RecordedRun.of([step], [1]), settings)
        if not what_if.exact[0]:
            assert what_if.reasons[0]
            continue
        exact += 1
        run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
        probs = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long),
                             logits).softmax(-1)[0].double()
        recorded_ids = set(unpack_raw_candidates(step.raw_top)[0].tolist())
        outside = sorted(set(range(logits.shape[1])) - recorded_ids)
        assert math.isclose(what_if.tail_prob[0], float(probs[outside].sum()), rel_tol=REL, abs_tol=1e-6), case
        for j, token in enumerate(what_if.ids[0]):
            if token >= 0:
                assert math.isclose(what_if.probs[0, j], float(probs[token]), rel_tol=REL, abs_tol=1e-6), (case, j)
    assert exact >= 4, "precondition: some steps are exact"


@pytest.mark.parametrize("sampler", ["epsilon_cutoff", "eta_cutoff"])
def test_a_candidate_within_the_rounding_of_the_line_is_no_exact_claim(sampler):
    """The line set a hair (±0.03 %, under the recorded log-probabilities' 1/2048 nat) from a recorded token's
    probability: the what-if either says it cannot tell (not exact) or is the engine's."""
    flagged = 0
    for case in range(24):
        logits = torch.randn(1, 400, generator=torch.Generator().manual_seed(100 + case)) * 2.5
        step = _step_of(logits, 40)
        probs = logits.double().softmax(-1)[0]
        entropy = float(-(probs * probs.log()).sum())
        ranked = probs.sort(descending=True).values.tolist()
        # eta: a token whose line √ε·e^−H = p has ε = (p·e^H)² within eta's range
        rank = 4 if sampler == "epsilon_cutoff" else next(r for r in range(4, 38)
                                                          if ranked[r] * math.exp(entropy) < 0.9)
        p = ranked[rank] * math.exp(3e-4 * (-1) ** case)
        value = p if sampler == "epsilon_cutoff" else (p * math.exp(entropy)) ** 2  # eta: √ε·e^−H = p
        settings = _settings({sampler: value})
        what_if = re_derive(RecordedRun.of([step], [1]), settings)
        engine = run_pipeline(build_pipeline(settings, sampling=True), torch.zeros(1, 1, dtype=torch.long),
                              logits).softmax(-1)[0].double()
        if not what_if.exact[0]:
            flagged += 1
            continue
        for j, token in enumerate(what_if.ids[0]):
            if token >= 0:
                assert math.isclose(what_if.probs[0, j], float(engine[token]), rel_tol=REL, abs_tol=1e-6), case
    assert flagged > 0, "precondition: some lines fall within the rounding"
