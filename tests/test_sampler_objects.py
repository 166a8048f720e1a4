"""Every declared sampler is one engine object: built from the settings, ``apply`` leaves its input alone, and the
stateful ones (mirostat's mu, XTC's draws, Adaptive-P's average) follow the chosen token, reset, clone and roll
back to a snapshot."""

from __future__ import annotations

import torch

from playground.config import RunSettings
from playground.config.samplers import SPECS
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.samplers import ENGINE_SAMPLERS

EVERY = dict(guidance_scale=1.5, logit_bias=("3=+2",), repetition_penalty=1.2, no_repeat_ngram_size=2,
             presence_penalty=0.3, dry_multiplier=0.8, dry_sequence_breakers=(), temperature=0.9, top_k=20, top_p=0.95,
             min_p=0.01, typical_p=0.95, epsilon_cutoff=0.001, eta_cutoff=0.001, top_n_sigma=3.0, xtc_probability=0.5,
             mirostat=2, top_a=0.01, tfs=0.99, adaptive_target=0.3, choices=("ab", "cd"), ban=("the",),
             watermark="kirchenbauer")


def test_every_declared_sampler_has_an_engine_object_and_applies_purely():
    assert set(ENGINE_SAMPLERS) == set(SPECS)
    from support.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()  # the constraint's matcher needs a real tokenizer, as wide as the logits
    vocab = len(tokenizer)
    settings = RunSettings.from_flat(strategy="sample", **EVERY).validate()
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    run.negative_logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1))
    pipeline = build_pipeline(settings, sampling=True, vocab_size=vocab, tokenizer=tokenizer, run=run)
    assert [s.declares for s in pipeline] == [n for n in SPECS if n != "adaptive_p"] + ["adaptive_p"]
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(2))
    for sampler in pipeline:
        before = logits.clone()
        out = sampler.apply(ids, logits)
        assert torch.equal(logits, before), sampler.name
        logits = out


def test_stateful_samplers_accept_reset_clone_and_roll_back():
    settings = RunSettings.from_flat(strategy="sample", mirostat=2, mirostat_tau=3.0, xtc_probability=0.5)
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    xtc, mirostat = build_pipeline(settings, sampling=True, run=run)
    assert run.mirostat is mirostat.state and mirostat.snapshot() == 6.0
    start = mirostat.snapshot()
    twin = mirostat.clone()
    run.accept(4, 0.25)  # surprise 2 bits: mu moves by 0.1 · (2 − 3)
    assert mirostat.snapshot() == 6.0 + 0.1 and twin.snapshot() == start
    mirostat.restore(start)
    assert mirostat.snapshot() == start
    run.accept(4, 0.25)
    mirostat.reset()
    assert mirostat.snapshot() == start
    logits = torch.log(torch.tensor([[0.4, 0.35, 0.15, 0.1]]))
    ids = torch.zeros(1, 1, dtype=torch.long)
    saved = xtc.snapshot()
    first = [xtc.apply(ids, logits) for _ in range(6)]
    xtc.restore(saved)  # the same draws again
    assert all(torch.equal(a, xtc.apply(ids, logits)) for a in first)


def test_every_declared_sampler_is_one_module_of_its_name_in_each_of_the_three_folders():
    """A sampler's declaration, engine object and what-if stage each live in a module named as the sampler (a
    declared sampler with no what-if stage would only fail when a run re-derives with it on)."""
    import importlib.util

    from playground.state.what_if.stages import STAGES

    assert set(STAGES) == set(SPECS)
    for name, spec in SPECS.items():
        for package in ("playground.config.samplers", "playground.engine.samplers", "playground.state.what_if.stages"):
            assert importlib.util.find_spec(f"{package}.{name}") is not None, (package, name)
        assert spec.is_on.__module__ == f"playground.config.samplers.{name}", name
        assert STAGES[name].fn.__module__ == f"playground.state.what_if.stages.{name}", name
