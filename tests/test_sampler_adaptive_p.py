"""Adaptive-P (llama.cpp's llama_sampler_adaptive_p, in the llama.cpp that llama-cpp-python 0.3.36 vendors:
src/llama-sampler.cpp): its transformed probabilities and its moving average's trajectory against the formulas of
llama.cpp's code written out here; it goes last whatever the order says, cuts nothing, and its state follows
the chosen tokens (accept), resets, clones and rolls back."""

from __future__ import annotations

import math
import re

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline

# llama.cpp's constants (DISTRIBUTION_WIDTH, PEAK_LOGIT_VALUE, SHARPNESS), written out here on purpose.
WIDTH, PEAK, SHARPNESS = 0.3, 5.0, 10.0


def llama_cpp_step(probs: list[float], target: float, weighted_sum: float, total_weight: float) -> list[float]:
    """One apply: the adapted target from the average, each kept token's new logit, their softmax."""
    adapted = min(max(2.0 * min(max(target, 0.0), 1.0) - weighted_sum / total_weight, 0.0), 1.0)
    logits = []
    for p in probs:
        if p == 0.0:
            logits.append(-math.inf)
            continue
        dist = abs((p - adapted) / WIDTH)
        logits.append(PEAK - SHARPNESS * dist * dist / (1.0 + dist))
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def _chain(settings: RunSettings):
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    return run, build_pipeline(settings, sampling=True, run=run)


def test_transformed_probabilities_and_the_average_follow_llama_cpps_formulas():
    target, decay = 0.3, 0.8
    settings = RunSettings.from_flat(strategy="sample", min_p=0.05, adaptive_target=target, adaptive_decay=decay,
                                     samplers="adaptive_p;min_p").validate()
    run, pipeline = _chain(settings)
    assert [t.name for t in pipeline] == ["min_p", "adaptive_p"]  # forced last, as llama.cpp does
    sampler = pipeline[-1]
    weighted, total = target / (1 - decay), 1 / (1 - decay)  # llama.cpp's start: the average is the target
    generator = torch.Generator().manual_seed(5)
    trajectory, expected = [], []
    for step in range(12):
        logits = torch.randn(1, 40, generator=generator, dtype=torch.float64) * 2
        processed = run_pipeline(pipeline, torch.zeros(1, 1, dtype=torch.long), logits).softmax(-1)[0]
        # What min-p left: its softmax is the "original" probability llama.cpp keeps for the average.
        raw = logits.softmax(-1)[0]
        left = [float(p) if p >= 0.05 * float(raw.max()) else 0.0 for p in raw]
        left = [p / sum(left) for p in left]
        reference = llama_cpp_step(left, target, weighted, total)
        assert max(abs(a - b) for a, b in zip(processed.tolist(), reference, strict=True)) < 1e-5, step
        chosen = [0, 3, 7, 1][step % 4] if left[[0, 3, 7, 1][step % 4]] > 0 else int(processed.argmax())
        run.accept(chosen, float(processed[chosen]))
        weighted, total = left[chosen] + decay * weighted, 1.0 + decay * total
        trajectory.append((sampler.weighted_sum, sampler.total_weight))
        expected.append((weighted, total))
    assert [w for w, _ in trajectory] == pytest.approx([w for w, _ in expected], rel=1e-6)
    assert [t for _, t in trajectory] == pytest.approx([t for _, t in expected], rel=1e-6)
    assert expected[-1][0] / expected[-1][1] != pytest.approx(target, abs=1e-3)  # the average moved


def test_it_cuts_nothing_and_keeps_removed_tokens_removed():
    settings = RunSettings.from_flat(strategy="sample", adaptive_target=0.5, top_k=3, samplers="top_k;adaptive_p")
    _run, pipeline = _chain(settings)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.1, -1.0]])
    out = run_pipeline(pipeline, torch.zeros(1, 1, dtype=torch.long), logits)
    assert torch.isfinite(out[0, :3]).all() and torch.isinf(out[0, 3:]).all()


def test_state_resets_clones_and_rolls_back():
    settings = RunSettings.from_flat(strategy="sample", adaptive_target=0.2, adaptive_decay=0.5)
    _run, (sampler,) = _chain(settings)
    start = sampler.snapshot()
    assert start == (0.2 / 0.5, 1 / 0.5)
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    sampler.apply(torch.zeros(1, 1, dtype=torch.long), logits)
    twin = sampler.clone()
    sampler.accept(1, 0.0)
    moved = sampler.snapshot()
    p1 = float(logits.softmax(-1)[0, 1])
    assert moved == pytest.approx((p1 + 0.5 * 0.4, 1 + 0.5 * 2.0))
    assert twin.snapshot() == start  # the clone kept its own state
    sampler.restore(start)
    assert sampler.snapshot() == start
    sampler.restore(moved)
    sampler.reset()
    assert sampler.snapshot() == start


def test_greedy_skips_it_and_a_strategy_without_the_run_refuses_it_by_name(tiny_lm):
    from playground.engine.strategies import run_strategy

    assert build_pipeline(RunSettings.from_flat(adaptive_target=0.3), sampling=False) == ()
    settings = RunSettings.from_flat(strategy="speculative", do_sample=True, prompt="Hello", max_new_tokens=4,
                                     adaptive_target=0.3)
    with pytest.raises(ConfigError, match=r"^adaptive_p is not available with the speculative strategy"):
        list(run_strategy(tiny_lm, settings))


def test_a_sampling_run_applies_it_and_its_trace_round_trips(tiny_lm):
    """A whole run through the engine's decode loop: each step's processed distribution is llama.cpp's transform
    of the raw one at the average that the earlier chosen tokens give (recomputed here from the steps)."""
    from playground.engine.strategies import run_strategy
    from playground.events import RunStarted, TokenStep, dumps_event, event_from_dict

    target, decay = 0.4, 0.7
    settings = RunSettings.from_flat(strategy="sample", prompt="Hello there", max_new_tokens=8, seed=2,
                                     adaptive_target=target, adaptive_decay=decay, num_candidates=5)
    events = list(run_strategy(tiny_lm, settings))
    start = next(e for e in events if isinstance(e, RunStarted))
    steps = [e for e in events if isinstance(e, TokenStep)]
    saved = event_from_dict(__import__("json").loads(dumps_event(start)))
    assert RunSettings.from_plain_dict(saved.settings)[0] == settings
    context = [*start.prompt_token_ids]
    weighted, total = target / (1 - decay), 1 / (1 - decay)
    with torch.no_grad():
        for step in steps:
            logits = tiny_lm.model(torch.tensor([context])).logits[0, -1].double()
            raw = logits.softmax(-1).tolist()
            reference = llama_cpp_step(raw, target, weighted, total)
            for candidate in step.candidates:
                assert candidate.processed_prob == pytest.approx(reference[candidate.token_id], abs=2e-4)
            weighted, total = raw[step.token_id] + decay * weighted, 1.0 + decay * total
            context.append(step.token_id)


def test_server_words_and_refusals():
    from playground.remote.errors import RemoteError
    from tests.test_samplers_settings import _request

    settings = RunSettings.from_flat(strategy="sample", adaptive_target=0.35, adaptive_decay=0.8, min_p=0.05,
                                     samplers="adaptive_p;min_p").validate()
    body = _request(settings).kwargs["extra_body"]
    assert body["samplers"][-1] == "adaptive_p" and body["samplers"].count("adaptive_p") == 1
    assert (body["adaptive_target"], body["adaptive_decay"]) == (0.35, 0.8)
    assert "adaptive_target" not in _request(settings.replace(strategy="greedy")).kwargs["extra_body"]
    with pytest.raises(RemoteError, match=re.escape("Adaptive-P: a llama-server option; this server is vllm")):
        _request(settings.replace(samplers=""), engine="vllm")


def test_settings_in_the_cli():
    from playground.cli import build_parser, settings_from_args

    _, settings = settings_from_args(build_parser().parse_args(
        ["trace", "--strategy", "sample", "--adaptive-target", "0.3", "--adaptive-decay", "0.5"]))
    assert settings == RunSettings.from_flat(strategy="sample", adaptive_target=0.3, adaptive_decay=0.5)
    with pytest.raises(ConfigError, match=re.escape("adaptive_decay must be in [0, 0.99]")):
        RunSettings.from_flat(strategy="sample", adaptive_target=0.3, adaptive_decay=0.995).validate()
