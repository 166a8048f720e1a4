"""The chain on a compact candidate set after its first cut (``engine/samplers/chain.py``) equals the chain on the
whole vocabulary: on random logits, for every sampler that can make the first cut, followed by every other sampler
(id-reading ones included) in shuffled orders, the step's recorded numbers (processed probabilities, each stage's
effects and cut_by for the shown candidates, entropies) and the whole processed distribution agree; without a cut,
or with one that keeps most of the vocabulary, the chain stays on the whole vocabulary."""

from __future__ import annotations

import math
import random

import pytest
import torch

from playground.config import RunSettings
from playground.config.samplers import DEFAULT_ORDER
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.step_analysis import analyse_step

VOCAB = 8192  # above top-p's and typical's fast-path thresholds, so those run on the whole-vocabulary side too

# Each sampler that can make the first cut, at settings that cut random logits (scale 3) to a few hundred tokens
# or fewer; the id-reading samplers beside them.
CUTS = {
    "top_k": dict(top_k=300), "top_p": dict(top_p=0.7), "min_p": dict(min_p=0.02), "typical_p": dict(typical_p=0.6),
    "epsilon_cutoff": dict(epsilon_cutoff=0.0005), "eta_cutoff": dict(eta_cutoff=0.002),
    "top_n_sigma": dict(top_n_sigma=1.5), "xtc": dict(xtc_probability=1.0, xtc_threshold=0.01),
    "mirostat": dict(mirostat=2, mirostat_tau=3.0),
}
OTHERS = dict(temperature=0.8, dynatemp_range=0.3, repetition_penalty=1.3, no_repeat_ngram_size=2,
              presence_penalty=0.4, frequency_penalty=0.3, dry_multiplier=0.8, dry_allowed_length=1,
              dry_sequence_breakers=(), logit_bias=("5=+30", "7=-inf", "11=+2.5"), guidance_scale=1.5)


def _both(settings: RunSettings, ids: torch.Tensor, logits: torch.Tensor, negative: torch.Tensor):
    """The step analysed on the compact set and on the whole vocabulary, each with its own run state (XTC's draws
    from generators of the same seed, mirostat's mu from its start)."""
    out = []
    for compact in (True, False):
        run = SamplerRun.of(settings, torch.Generator().manual_seed(4), sampling=True)
        run.negative_logits = negative
        pipeline = build_pipeline(settings, sampling=True, vocab_size=VOCAB, run=run)
        out.append(analyse_step(pipeline, ids, logits, 12, compact=compact))
    return out


def _event(analysis, chosen: int):
    analysis.token_id = chosen
    return analysis.to_event(step=0, text="", forced=False, step_ms=0.0, kv_bytes=0, token_text=str)


def _assert_same_step(compact, full) -> None:
    assert torch.equal(torch.isinf(compact.processed_logits), torch.isinf(full.processed_logits))
    kept = torch.isfinite(full.processed_logits)
    torch.testing.assert_close(compact.processed_logits[kept], full.processed_logits[kept], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(compact.processed_probs, full.processed_probs, rtol=1e-5, atol=1e-7)
    # The recorded step, with a kept token chosen and with one the chain cut (shown beside the top candidates).
    cut = torch.isinf(full.processed_logits[0]).nonzero()
    for chosen in (int(full.processed_probs.argmax()), int(cut[len(cut) // 2]) if len(cut) else 0):
        a, b = _event(compact, chosen), _event(full, chosen)
        assert a.effects == b.effects
        assert [c.cut_by for c in a.candidates] == [c.cut_by for c in b.candidates]
        assert [c.token_id for c in a.candidates] == [c.token_id for c in b.candidates]
        for x, y in zip(a.candidates, b.candidates, strict=True):
            assert math.isclose(x.processed_prob, y.processed_prob, rel_tol=1e-5, abs_tol=1e-9)
        assert math.isclose(a.prob, b.prob, rel_tol=1e-5, abs_tol=1e-9)
        assert math.isclose(a.processed_entropy, b.processed_entropy, rel_tol=1e-5, abs_tol=1e-6)
        assert a.entropy == b.entropy


def _case(seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, VOCAB, generator=generator) * 3
    ids = torch.randint(0, 64, (1, 40), generator=generator)  # repeats, so penalties, DRY and the n-gram ban bite
    ids[0, :8] = torch.topk(logits[0], 8).indices  # some of the likeliest tokens are in the text
    negative = torch.randn(1, VOCAB, generator=generator) * 2
    return ids, logits, negative


@pytest.mark.parametrize("first", list(CUTS))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_compact_chain_equals_the_whole_vocabulary_chain_for_every_first_cut(first, seed):
    ids, logits, negative = _case(seed)
    rng = random.Random(seed * 100 + len(first))
    rest = [name for name in DEFAULT_ORDER if name != first]
    rng.shuffle(rest)
    # The first cut somewhere early, with some id-reading samplers before it and the others after.
    order = [*rest[:3], first, *rest[3:]]
    values = {name: value for cut in CUTS.values() for name, value in cut.items()} | OTHERS
    settings = RunSettings(strategy="sample", samplers=";".join(order), **values).validate()
    compact, full = _both(settings, ids, logits, negative)
    assert full.kept is None
    assert compact.kept is not None, "precondition: the chain went compact"
    assert compact.kept.ids.shape[0] * 4 <= VOCAB
    _assert_same_step(compact, full)


@pytest.mark.parametrize("first", [name for name in CUTS if name != "xtc"])  # XTC removes only the top few
def test_each_first_cut_alone_with_the_id_samplers_after_it(first):
    ids, logits, negative = _case(7)
    order = [first, *(name for name in DEFAULT_ORDER if name not in CUTS and name != first)]
    values = CUTS[first] | OTHERS
    settings = RunSettings(strategy="sample", samplers=";".join(order), **values).validate()
    compact, full = _both(settings, ids, logits, negative)
    assert compact.kept is not None, "precondition: the chain went compact"
    _assert_same_step(compact, full)


@pytest.mark.parametrize("values", [OTHERS, {"top_p": 0.9999}, {"min_p": 1e-9, "temperature": 0.7}],
                         ids=["no cut", "top-p keeps most", "min-p keeps most"])
def test_without_a_small_cut_the_chain_stays_on_the_whole_vocabulary(values):
    ids, logits, negative = _case(3)
    settings = RunSettings(strategy="sample", **values).validate()
    compact, full = _both(settings, ids, logits, negative)
    assert compact.kept is None
    assert torch.equal(compact.processed_logits, full.processed_logits)
    assert torch.equal(compact.processed_probs, full.processed_probs)
