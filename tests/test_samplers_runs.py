"""The samplers in real runs on a tiny model: guidance equals transformers' generate(guidance_scale=...), mirostat's
mu follows its rule step by step, XTC's draws are the seed's, a ban holds, and saved runs keep it all."""

from __future__ import annotations

import math

import pytest
import torch

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.traces import read_trace, write_trace


def steps(lm, settings) -> list[TokenStep]:
    return [e for e in run_strategy(lm, settings) if isinstance(e, TokenStep)]


@pytest.mark.parametrize("negative", ["", "Zebra quantum marmalade, 42 ships"])
def test_greedy_with_guidance_equals_transformers_generate(tiny_lm, negative):
    settings = RunSettings(chat=False, prompt="Once upon a time", max_new_tokens=10, guidance_scale=2.5,
                           negative_prompt=negative)
    ours = [s.token_id for s in steps(tiny_lm, settings)]
    prompt = tiny_lm.tokenizer(settings.prompt, return_tensors="pt")
    extra = {}
    if negative:
        extra["negative_prompt_ids"] = tiny_lm.tokenizer(negative, return_tensors="pt").input_ids
    with torch.no_grad():
        out = tiny_lm.model.generate(**prompt, do_sample=False, max_new_tokens=10, min_new_tokens=10,
                                     guidance_scale=2.5, pad_token_id=0, eos_token_id=None, **extra)
    reference = out[0, prompt.input_ids.shape[1]:].tolist()
    assert ours == reference
    plain = [s.token_id for s in steps(tiny_lm, settings.replace(guidance_scale=1.0, negative_prompt=""))]
    assert plain != reference, "precondition: guidance changes the output"


def test_mirostat_mu_starts_at_two_tau_and_follows_each_chosen_tokens_surprise(tiny_lm):
    tau, eta = 3.0, 0.2
    settings = RunSettings(strategy="sample", chat=False, prompt="Hello", max_new_tokens=12, mirostat=2,
                           mirostat_tau=tau, mirostat_eta=eta, seed=5)
    run = steps(tiny_lm, settings)
    mu = 2 * tau
    for step in run:
        assert step.mirostat_mu == pytest.approx(mu, abs=1e-9)
        # Every kept candidate is at most mu bits surprising under the distribution mirostat cut.
        mu -= eta * (-math.log2(step.prob) - tau)
    assert len({round(s.mirostat_mu, 6) for s in run}) > 3
    assert all(s.mirostat_mu is None for s in steps(tiny_lm, settings.replace(strategy="greedy")))


def test_xtc_runs_are_reproducible_by_seed_and_its_cuts_are_shown_by_name(tiny_lm):
    settings = RunSettings(strategy="sample", chat=False, prompt="Hello", max_new_tokens=16, xtc_probability=1.0,
                           xtc_threshold=0.02, seed=11)
    first, again = steps(tiny_lm, settings), steps(tiny_lm, settings)
    assert [s.token_id for s in first] == [s.token_id for s in again]
    cut = [c for s in first for c in s.candidates if c.cut_by == "xtc"]
    assert cut and all(c.processed_prob == 0.0 for c in cut)
    other = steps(tiny_lm, settings.replace(seed=12))
    assert [s.token_id for s in other] != [s.token_id for s in first]


def test_a_banned_word_is_never_chosen_and_its_cut_is_named(tiny_lm):
    settings = RunSettings(chat=False, prompt="Hello", max_new_tokens=12)
    greedy = steps(tiny_lm, settings)
    top = greedy[0].token_id
    banned = steps(tiny_lm, settings.replace(logit_bias=(f"{top}=-inf",)))
    assert top not in [s.token_id for s in banned]
    first = {c.token_id: c for c in banned[0].candidates}
    assert first[top].cut_by == "logit_bias" and first[top].processed_prob == 0.0


def test_a_run_with_every_sampler_on_saves_and_reads_back(tiny_lm, tmp_path):
    settings = RunSettings(strategy="sample", chat=False, prompt="Hello there", max_new_tokens=6, typical_p=0.95,
                           epsilon_cutoff=0.0003, eta_cutoff=0.0003, top_n_sigma=2.0, xtc_probability=0.5,
                           dynatemp_range=0.3, mirostat=2, presence_penalty=0.4, frequency_penalty=0.2,
                           dry_multiplier=0.8, logit_bias=("5=-inf",), guidance_scale=1.5, negative_prompt="no",
                           samplers="guidance;logit_bias;penalties;dry;top_n_sigma;typical_p;epsilon_cutoff;"
                           "eta_cutoff;xtc;temperature;mirostat", seed=3)
    events = list(run_strategy(tiny_lm, settings))
    trace = read_trace(write_trace(events, tmp_path / "run.jsonl"))
    assert trace.events == events and trace.skipped == []
    start = trace.events[0]
    assert isinstance(start, RunStarted)
    assert RunSettings.from_plain_dict(start.settings)[0] == settings
    names = [e.name for e in next(e for e in events if isinstance(e, TokenStep)).effects]
    assert names == ["guidance", "logit_bias", "penalties", "dry", "top_n_sigma", "typical_p", "epsilon_cutoff",
                     "eta_cutoff", "xtc", "dynatemp", "mirostat"]


def test_a_token_saved_before_mirostat_mu_existed_still_loads(tiny_lm, tmp_path):
    import json

    events = list(run_strategy(tiny_lm, RunSettings(chat=False, prompt="Hi", max_new_tokens=3)))
    path = write_trace(events, tmp_path / "run.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line.pop("mirostat_mu", None)
    path.write_text("\n".join(json.dumps(line) for line in lines))
    trace = read_trace(path)
    assert trace.skipped == [] and trace.events == events
