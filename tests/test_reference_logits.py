"""The numbers a step displays, checked against transformers' ``generate``.

Raw probability, log-probability, rank and entropy come from ``generate(..., output_logits=True)`` (the model's raw
logits at each step); processed probabilities from ``output_scores=True`` (the logits after generate's own
processors). Everything reference-side is computed here in float64, never read back from the engine's events.
"""

from __future__ import annotations

import math

import pytest
import torch

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep

TOL = 1e-5
# The real model's logits differ by up to ~3e-5 between generate's forward passes and the engine's (float32
# kernels on a 49k vocabulary, different cache paths), so its log-probabilities agree to ~1e-4, not 1e-5.
REAL_MODEL_TOL = 1e-4


def run(lm, **settings):
    events = list(run_strategy(lm, RunSettings(**settings)))
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    return list(events[0].prompt_token_ids), [e for e in events if isinstance(e, TokenStep)], events[-1]


def generate(lm, input_ids, **kwargs):
    ids = torch.tensor([list(input_ids)], device=lm.device)
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=lm.tokenizer.pad_token_id,
                                output_logits=True, output_scores=True, return_dict_in_generate=True, **kwargs)
    return out.sequences[0, ids.shape[1]:].tolist(), list(out.logits), list(out.scores)


def entropy_bits(probs: torch.Tensor) -> float:
    return float(torch.special.entr(probs).sum()) / math.log(2)


def check_step(
    step: TokenStep, raw_logits: torch.Tensor, scores: torch.Tensor, num_candidates: int, tol: float = TOL
) -> None:
    """Compare one TokenStep with the reference raw logits and processed scores ([1, vocab] or [vocab])."""
    raw = raw_logits.reshape(-1).double()
    p = torch.softmax(raw, dim=-1)
    q = torch.softmax(scores.reshape(-1).double(), dim=-1)
    chosen = step.token_id

    def rank(token_id: int) -> int:
        return int((raw > raw[token_id]).sum()) + 1

    assert step.raw_prob == pytest.approx(float(p[chosen]), abs=tol)
    assert step.logprob == pytest.approx(float(torch.log_softmax(raw, dim=-1)[chosen]), abs=tol)
    assert step.raw_rank == rank(chosen)
    # The engine sums -p log p over the whole vocabulary in float32: ~1e-5 relative error on a 49k vocabulary.
    assert step.entropy == pytest.approx(entropy_bits(p), rel=tol, abs=tol)
    assert step.prob == pytest.approx(float(q[chosen]), abs=tol)
    assert step.processed_entropy == pytest.approx(entropy_bits(q), rel=tol, abs=tol)

    top = torch.topk(raw, num_candidates)
    assert [c.token_id for c in step.candidates[:num_candidates]] == top.indices.tolist()
    assert step.shown_raw_mass == pytest.approx(float(p[top.indices].sum()), abs=tol)
    assert chosen in {c.token_id for c in step.candidates}
    for c in step.candidates:
        assert c.raw_prob == pytest.approx(float(p[c.token_id]), abs=tol), c
        assert c.raw_rank == rank(c.token_id), c
        assert c.processed_prob == pytest.approx(float(q[c.token_id]), abs=tol), c
        assert (c.cut_by is not None) == bool(torch.isneginf(scores.reshape(-1)[c.token_id])), c


@pytest.mark.parametrize("prompt", ["Hello", "The capital of France is"])
def test_greedy_raw_numbers_match_generate(tiny_lm, prompt):
    prompt_ids, steps, done = run(tiny_lm, prompt=prompt, max_new_tokens=16, num_candidates=12)
    tokens, logits, scores = generate(tiny_lm, prompt_ids, do_sample=False, max_new_tokens=16)
    assert [s.token_id for s in steps] == tokens == list(done.token_ids)
    assert len(steps) == len(logits) == 16
    for step, raw, processed in zip(steps, logits, scores, strict=True):
        check_step(step, raw, processed, num_candidates=12)
        assert step.raw_rank == 1  # no processors: greedy takes the raw top token


@pytest.mark.parametrize("penalties", [{"repetition_penalty": 1.6},
                                       {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}])
def test_greedy_with_penalties_raw_and_processed_numbers_match_generate(tiny_lm, penalties):
    """With penalties the chosen token is not always the raw top one: its raw rank and the processed probability
    (softmax of generate's ``scores``) must still match."""
    prompt_ids, steps, done = run(tiny_lm, prompt="Hello", max_new_tokens=30, **penalties)
    tokens, logits, scores = generate(tiny_lm, prompt_ids, do_sample=False, max_new_tokens=30, **penalties)
    assert [s.token_id for s in steps] == tokens == list(done.token_ids)
    ranks = [int((raw[0] > raw[0, t]).sum()) + 1 for raw, t in zip(logits, tokens, strict=True)]
    assert max(ranks) > 1, "precondition: the penalties must make greedy pick a token below raw rank 1"
    for step, raw, processed in zip(steps, logits, scores, strict=True):
        check_step(step, raw, processed, num_candidates=10)
    assert [s.raw_rank for s in steps] == ranks


def test_sampling_processed_numbers_match_generate_scores(tiny_lm):
    """Every processor on; the reference for step i is generate's first step on prompt + the run's first i tokens."""
    opts = {"repetition_penalty": 1.2, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05}
    prompt_ids, steps, done = run(tiny_lm, prompt="Hello", strategy="sample", seed=11, max_new_tokens=10,
                                  num_candidates=25, **opts)
    tokens = list(done.token_ids)
    assert len(tokens) == 10
    cut_somewhere = False
    for i, step in enumerate(steps):
        _, logits, scores = generate(tiny_lm, [*prompt_ids, *tokens[:i]], do_sample=True, max_new_tokens=1, **opts)
        check_step(step, logits[0], scores[0], num_candidates=25)
        cut_somewhere |= any(c.cut_by for c in step.candidates)
        assert step.prob > 0  # the drawn token survived every processor
    assert cut_somewhere, "precondition: the filters must cut some of the shown candidates"


@pytest.mark.model
def test_real_model_numbers_match_generate(default_lm):
    prompt_ids, steps, done = run(default_lm, max_new_tokens=12, repetition_penalty=1.3, num_candidates=10)
    tokens, logits, scores = generate(default_lm, prompt_ids, do_sample=False, max_new_tokens=12,
                                      repetition_penalty=1.3)
    assert [s.token_id for s in steps] == tokens == list(done.token_ids)
    for step, raw, processed in zip(steps, logits, scores, strict=True):
        check_step(step, raw, processed, num_candidates=10, tol=REAL_MODEL_TOL)
