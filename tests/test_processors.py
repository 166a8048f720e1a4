"""Each logit transform equals transformers' processor with the same parameters, and never modifies its input."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from playground.config import RunSettings
from playground.engine.processors import (
    apply_repetition_penalty,
    apply_temperature,
    ban_repeated_ngrams,
    build_pipeline,
    keep_min_p,
    keep_top_k,
    keep_top_p,
    run_pipeline,
)

VOCAB = 64

CASES = [
    ("repetition_penalty", 1.3, apply_repetition_penalty, RepetitionPenaltyLogitsProcessor(penalty=1.3)),
    ("repetition_penalty", 0.7, apply_repetition_penalty, RepetitionPenaltyLogitsProcessor(penalty=0.7)),
    ("no_repeat_ngram", 2, ban_repeated_ngrams, NoRepeatNGramLogitsProcessor(2)),
    ("no_repeat_ngram", 3, ban_repeated_ngrams, NoRepeatNGramLogitsProcessor(3)),
    ("temperature", 0.6, apply_temperature, TemperatureLogitsWarper(0.6)),
    ("top_k", 5, keep_top_k, TopKLogitsWarper(5)),
    ("top_k", 1, keep_top_k, TopKLogitsWarper(1)),
    ("top_p", 0.8, keep_top_p, TopPLogitsWarper(0.8)),
    ("top_p", 0.3, keep_top_p, TopPLogitsWarper(0.3)),
    ("min_p", 0.1, keep_min_p, MinPLogitsWarper(0.1)),
    ("min_p", 0.5, keep_min_p, MinPLogitsWarper(0.5)),
]


@pytest.mark.parametrize(("name", "value", "ours", "reference"), CASES, ids=[f"{c[0]}={c[1]}" for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transform_equals_transformers_processor(name, value, ours, reference, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, VOCAB, generator=generator) * 3
    # Small vocabulary of ids so repeats (and repeated n-grams) occur.
    ids = torch.randint(0, 8, (4, 20), generator=generator)
    before = logits.clone()
    expected = reference(ids, logits.clone())
    got = ours(ids, logits, value)
    assert torch.equal(logits, before), "the transform modified its input"
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_no_repeat_ngram_bans_exactly_the_completing_tokens():
    ids = torch.tensor([[5, 6, 7, 5, 6, 9, 5]])  # 2-grams starting with 5: (5,6) twice -> 6 banned after 5
    out = ban_repeated_ngrams(ids, torch.zeros(1, 10), 2)
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [6]


def test_pipeline_order_and_greedy_ignores_sampling_warpers():
    settings = RunSettings(strategy="sample", repetition_penalty=1.2, no_repeat_ngram_size=3, temperature=0.7,
                           top_k=10, top_p=0.9, min_p=0.05)
    names = [t.name for t in build_pipeline(settings, sampling=True)]
    assert names == ["repetition_penalty", "no_repeat_ngram", "temperature", "top_k", "top_p", "min_p"]
    assert [t.name for t in build_pipeline(settings, sampling=False)] == ["repetition_penalty", "no_repeat_ngram"]
    assert build_pipeline(RunSettings(), sampling=True) == ()


PIPELINES = [
    {"temperature": 0.7, "top_k": 1},
    {"top_p": 0.6},
    {"min_p": 0.2},
    {"temperature": 1.3, "top_k": 12, "top_p": 0.9, "min_p": 0.05},
    {"no_repeat_ngram_size": 1},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "top_p": 0.8},
]


@pytest.mark.parametrize("options", PIPELINES, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o in PIPELINES])
def test_the_pipeline_a_run_builds_equals_transformers_processors_in_their_order(options):
    """What the built pipeline does to the logits, against transformers' processors chained in generate()'s order
    (penalties, then temperature, top-k, top-p, min-p), for the settings that switch each one on."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(2, VOCAB, generator=generator) * 3
    ids = torch.randint(0, 8, (2, 12), generator=generator)
    reference = []
    if "repetition_penalty" in options:
        reference.append(RepetitionPenaltyLogitsProcessor(penalty=options["repetition_penalty"]))
    if "no_repeat_ngram_size" in options:
        reference.append(NoRepeatNGramLogitsProcessor(options["no_repeat_ngram_size"]))
    if "temperature" in options:
        reference.append(TemperatureLogitsWarper(options["temperature"]))
    if "top_k" in options:
        reference.append(TopKLogitsWarper(options["top_k"]))
    if "top_p" in options:
        reference.append(TopPLogitsWarper(options["top_p"]))
    if "min_p" in options:
        reference.append(MinPLogitsWarper(options["min_p"]))
    expected = logits.clone()
    for processor in reference:
        expected = processor(ids, expected)
    pipeline = build_pipeline(RunSettings(strategy="sample", **options), sampling=True)
    assert len(pipeline) == len(reference)
    got = run_pipeline(pipeline, ids, logits)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.equal(got, logits), "precondition: the pipeline changes the logits"


def test_no_repeat_ngram_bans_the_first_repeat_as_soon_as_the_text_is_one_ngram_long():
    ids = torch.tensor([[5, 5]])  # the 2-gram (5, 5) is in the text, and the text ends with 5: 5 is banned
    out = ban_repeated_ngrams(ids, torch.zeros(1, 10), 2)
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [5]
    expected = NoRepeatNGramLogitsProcessor(2)(ids, torch.zeros(1, 10))
    assert torch.equal(torch.isinf(out), torch.isinf(expected))
