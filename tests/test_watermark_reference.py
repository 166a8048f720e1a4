"""The watermarks held to transformers' own objects (issue 33, point 5): our watermarked logits equal
``WatermarkLogitsProcessor``'s and ``SynthIDTextWatermarkLogitsProcessor``'s on the same keys, contexts and logits
(every seeding scheme, truncated logits, SynthID's repeated contexts and skipped first calls); our z-scores and
p-values equal ``WatermarkDetector``'s on the same token ids; our SynthID g-values and masks equal the
processor's own ``compute_g_values`` and ``compute_context_repetition_mask``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import (
    PretrainedConfig,
    SynthIDTextWatermarkLogitsProcessor,
    WatermarkDetector,
    WatermarkingConfig,
    WatermarkLogitsProcessor,
)

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline
from playground.watermarking import GreenLists, KirchenbauerKey, SynthID, SynthIDKey
from playground.watermarking.detect import detect_kirchenbauer, detect_synthid

VOCAB = 320
SCHEMES = [("lefthash", 1), ("lefthash", 3), ("selfhash", 1), ("selfhash", 4)]
KEYS = (654, 400, 836, 123, 340, 443, 597, 160, 57)


def _logits(seed: int, rows: int = 2, cut: bool = False) -> torch.Tensor:
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    if cut:  # a truncating sampler ran before: most tokens are out of play
        logits[:, 60:] = float("-inf")
    return logits


@pytest.mark.parametrize(("scheme", "width"), SCHEMES, ids=[f"{s}-{w}" for s, w in SCHEMES])
def test_green_list_logits_are_transformers(scheme, width):
    theirs = WatermarkLogitsProcessor(vocab_size=VOCAB, device="cpu", greenlist_ratio=0.3, bias=1.5,
                                      hashing_key=7919, seeding_scheme=scheme, context_width=width)
    ours = GreenLists(KirchenbauerKey(vocab_size=VOCAB, greenlist_ratio=0.3, bias=1.5, hashing_key=7919,
                                      seeding_scheme=scheme, context_width=width))
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(width))
    for seed, cut in [(0, False), (1, True), (2, False)]:
        logits = _logits(seed, cut=cut)
        expected = theirs(ids[:, : 5 + seed], logits)
        got, _ = ours.apply(ids[:, : 5 + seed], logits)
        assert torch.equal(got, expected), (scheme, width, seed)
        assert not torch.equal(got, logits)  # the watermark did act
    short = ids[:, : width - 1]  # shorter than the context: transformers leaves the scores alone
    assert torch.equal(ours.apply(short, _logits(3))[0], theirs(short, _logits(3)))


def test_the_chain_entry_is_transformers_last_processor():
    """Through the settings and the engine's chain: top-k cuts first, the watermark acts on what is left."""
    settings = RunSettings.from_flat(strategy="sample", top_k=50, watermark="kirchenbauer", greenlist_ratio=0.25,
                                     bias=2.0, seeding_scheme="selfhash", context_width=2).validate()
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    pipeline = build_pipeline(settings, sampling=True, vocab_size=VOCAB, run=run)
    assert [s.name for s in pipeline] == ["top_k", "watermark"]
    ids = torch.tensor([[5, 17, 200, 3]])
    logits = _logits(4, rows=1)
    cut = pipeline[0].apply(ids, logits)
    theirs = WatermarkingConfig(greenlist_ratio=0.25, bias=2.0, seeding_scheme="selfhash",
                                context_width=2).construct_processor(VOCAB, "cpu")
    assert torch.equal(pipeline[1].apply(ids, cut), theirs(ids, cut))


def _detector(scheme: str, width: int, ignore: bool) -> WatermarkDetector:
    config = PretrainedConfig(vocab_size=VOCAB, bos_token_id=1)
    return WatermarkDetector(config, "cpu", WatermarkingConfig(greenlist_ratio=0.25, bias=2.0, hashing_key=15485863,
                                                               seeding_scheme=scheme, context_width=width),
                             ignore_repeated_ngrams=ignore)


def _watermarked_ids(lists: GreenLists, length: int, seed: int) -> list[int]:
    """A text sampled under the watermark from random logits (a strong signal), starting with BOS."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[1, 9, 4]])
    for _ in range(length):
        logits = torch.randn(1, VOCAB, generator=generator)
        probs = lists.apply(ids, logits)[0].softmax(-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return ids[0].tolist()


@pytest.mark.parametrize(("scheme", "width"), SCHEMES, ids=[f"{s}-{w}" for s, w in SCHEMES])
def test_z_scores_and_p_values_are_transformers_detectors(scheme, width):
    lists = GreenLists(KirchenbauerKey(vocab_size=VOCAB, seeding_scheme=scheme, context_width=width))
    marked = _watermarked_ids(lists, 60, seed=width)
    plain = torch.randint(2, VOCAB, (30,), generator=torch.Generator().manual_seed(9)).tolist()
    repeats = [1, *([7, 8, 9] * 8)]  # repeated n-grams: ignore_repeated_ngrams counts them once
    for ids in (marked, plain, repeats):
        for ignore in (False, True):
            theirs = _detector(scheme, width, ignore)(torch.tensor([ids]), z_threshold=4.0, return_dict=True)
            ours = detect_kirchenbauer(lists, ids, threshold=4.0, bos_id=1, ignore_repeated_ngrams=ignore)
            assert ours.scored == theirs.num_tokens_scored[0] and ours.green == theirs.num_green_tokens[0]
            assert math.isclose(ours.z_score, float(theirs.z_score[0]), rel_tol=1e-12, abs_tol=1e-12)
            assert math.isclose(ours.p_value, float(theirs.p_value[0]), rel_tol=1e-6, abs_tol=1e-15)
            assert ours.prediction == bool(theirs.prediction[0])
    assert detect_kirchenbauer(lists, marked, bos_id=1).z_score > 3.0  # precondition: the text is marked


def _synthid_pair(skip: bool, ngram_len: int = 3, history: int = 1024):
    theirs = SynthIDTextWatermarkLogitsProcessor(ngram_len=ngram_len, keys=list(KEYS), sampling_table_size=2**16,
                                                 sampling_table_seed=0, context_history_size=history, device="cpu",
                                                 skip_first_ngram_calls=skip)
    ours = SynthID(SynthIDKey(keys=KEYS, ngram_len=ngram_len, context_history_size=history,
                              skip_first_ngram_calls=skip))
    return theirs, ours


@pytest.mark.parametrize("skip", [False, True], ids=["every-call", "skip-first"])
def test_synthid_logits_are_the_processors_step_by_step(skip):
    theirs, ours = _synthid_pair(skip)
    generator = torch.Generator().manual_seed(3)
    prompt = [11, 12, 13, 14]
    ids = torch.tensor([prompt])
    # A text whose contexts repeat (2-token contexts): the processor leaves those steps alone.
    forced = [20, 21, 22, 20, 21, 22, 20, 21, 5, 6]
    acted = []
    for step, token in enumerate(forced):
        logits = torch.randn(1, VOCAB, generator=generator) * 2
        if step % 3 == 1:
            logits[:, 100:] = float("-inf")  # truncated first
        expected = theirs(ids, logits)
        got, did = ours.apply(ids, logits, start=len(prompt))
        finite = torch.isfinite(got)
        assert torch.equal(finite, expected > torch.finfo(torch.float32).min), step  # removed: -inf / finfo.min
        torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=1e-6)
        acted.append(did)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert any(acted) and not all(acted)  # precondition: some steps repeated a context (or were skipped)
    # The engine's entry: the same logits from the chain, and a greedy run is refused by name.
    settings = RunSettings.from_flat(strategy="sample", watermark="synthid", ngram_len=3,
                                     keys=",".join(map(str, KEYS)), skip_first_ngram_calls=skip).validate()
    (entry,) = build_pipeline(settings, sampling=True, vocab_size=VOCAB,
                              run=SamplerRun.of(settings, torch.Generator(), sampling=True))
    fresh_theirs, _ = _synthid_pair(skip)
    probe = torch.tensor([prompt])
    for _ in range(4):
        logits = torch.randn(1, VOCAB, generator=generator)
        out = entry.apply(probe, logits)
        torch.testing.assert_close(out, fresh_theirs(probe, logits), rtol=1e-5, atol=1e-6)
        probe = torch.cat([probe, out.argmax(-1, keepdim=True)], dim=1)


def test_synthid_probability_rounded_below_zero_is_removed_as_transformers_removes_it():
    """A peaked distribution after a truncating sampler (40 tokens in play, as top-k 40 leaves): in float32 a
    layer's ``1 + g − Σ p g`` rounds below zero for some g = 0 tokens, whose log is NaN; transformers writes
    finfo.min there (probability 0), and the run's draw must not meet a NaN (issue 33's benchmark hit it)."""
    theirs, ours = _synthid_pair(skip=False)
    ids = torch.tensor([[11, 12, 13, 14]])
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, :40] = torch.randn(40, generator=torch.Generator().manual_seed(10)) * 12
    expected = theirs(ids, logits.clone())
    removed = expected[0, :40] == torch.finfo(torch.float32).min
    assert removed.any()  # precondition: the tournament rounded some of the 40 tokens in play to probability 0
    got, acted = ours.apply(ids, logits.clone(), start=4)
    assert acted and not torch.isnan(got).any()
    finite = torch.isfinite(got)
    assert torch.equal(finite, expected > torch.finfo(torch.float32).min)
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=1e-6)
    probs = got.softmax(-1)
    assert torch.isfinite(probs).all() and probs[0, :40][removed].eq(0).all()


def test_synthid_g_values_and_masks_are_the_processors_own():
    theirs, ours = _synthid_pair(False, ngram_len=4, history=6)
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6, 200, 201, 17, 18, 19, 20, 21]])
    assert torch.equal(ours.g_values(ids), theirs.compute_g_values(ids))
    assert torch.equal(ours.repetition_mask(ids), theirs.compute_context_repetition_mask(ids))
    # The detector's score is the masked mean g-value, read against fair coins.
    detection = detect_synthid(ours, ids[0].tolist(), VOCAB)
    mask = theirs.compute_context_repetition_mask(ids)[0].bool()
    g = theirs.compute_g_values(ids)[0].double()
    mean = float(g[mask].mean())
    assert detection.scored == int(mask.sum())
    assert math.isclose(detection.green / detection.scored, mean, rel_tol=1e-12)
    assert math.isclose(detection.z_score, (mean - 0.5) / math.sqrt(1 / (4 * int(mask.sum()) * len(KEYS))),
                        rel_tol=1e-12)


def test_z_score_is_calibrated_on_random_ids():
    """Under the null (random token ids) the green-list z-scores are standard normal: mean ≈ 0, sd ≈ 1, and the
    share above 1.645 is ≈ 5% (a false-positive rate at z = 4 cannot be measured over a few seeds)."""
    lists = GreenLists(KirchenbauerKey(vocab_size=VOCAB))
    generator = np.random.default_rng(0)
    zs = np.array([detect_kirchenbauer(lists, generator.integers(0, VOCAB, 200).tolist()).z_score
                   for _ in range(200)])
    assert abs(zs.mean()) < 0.15 and abs(zs.std() - 1) < 0.12
    assert 0.02 < (zs > 1.645).mean() < 0.09
