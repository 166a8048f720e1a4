"""The n-gram ban, one form (``playground.sampler_maths``: ``NgramBan``, ``NgramBans``) used by the engine's sampler
and the what-if, against transformers' ``NoRepeatNGramLogitsProcessor`` on random sequences: the engine's object
called as each strategy calls it (a growing text with ``accept``, speculative roll-backs, beams that reorder), and
the what-if's re-derivation of a recorded run.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import NoRepeatNGramLogitsProcessor

from playground.config import RunSettings
from playground.engine.processors import build_pipeline
from playground.engine.samplers.no_repeat_ngram import NoRepeatNgram, ban_repeated_ngrams
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.sampler_maths import NgramBan, NgramBans, common_prefix
from playground.state.what_if import RecordedRun, re_derive

VOCAB = 12


def transformers_bans(ids: torch.Tensor, n: int) -> list[set[int]]:
    """Each row's banned tokens, as transformers' processor sets them to -inf."""
    out = NoRepeatNGramLogitsProcessor(n)(ids, torch.zeros(ids.shape[0], VOCAB))
    return [set(torch.isinf(row).nonzero().flatten().tolist()) for row in out]


def banned_of(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.isinf(row).nonzero().flatten().tolist()) for row in logits]


def reference_bans(tokens: list[int], n: int) -> set[int]:
    """Written here from the rule: every window tokens[i:i+n] whose first n-1 equal the text's last n-1."""
    if len(tokens) < n:
        return set()
    tail = tokens[len(tokens) - n + 1:]
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i:i + n - 1] == tail}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_growing_text_with_accept_equals_transformers_at_every_step(n, seed):
    rng = random.Random(seed)
    (sampler,) = build_pipeline(RunSettings(no_repeat_ngram_size=n), sampling=False)
    assert isinstance(sampler, NoRepeatNgram)
    alphabet = 4 if n <= 3 else 2  # small: repeated n-grams are common
    tokens = [rng.randrange(alphabet) for _ in range(3)]
    hits = 0
    for _ in range(80):
        ids = torch.tensor([tokens])
        logits = torch.randn(1, VOCAB)
        before = logits.clone()
        out = sampler.apply(ids, logits)
        assert torch.equal(logits, before), "apply modified its input"
        expected = transformers_bans(ids, n)
        assert banned_of(out) == expected == [reference_bans(tokens, n)]
        finite = ~torch.isinf(out[0])
        assert torch.equal(out[0, finite], logits[0, finite])
        hits += bool(expected[0])
        token = rng.randrange(alphabet) if rng.random() < 0.8 else rng.randrange(VOCAB)
        sampler.accept(token, 0.5)
        tokens.append(token)
        if len(tokens) > n:  # incremental: accept indexed the chosen token, the next step reads nothing new
            assert [b.tokens for b in sampler.bans.held] == [tokens]
    assert hits >= 5, "precondition: the walk meets bans"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_speculative_contexts_and_roll_backs_equal_transformers(n):
    """As speculative decoding calls it: the context plus each draft prefix, then a shorter accepted prefix and
    the target's own token (the drafter and the verification share one chain)."""
    rng = random.Random(n)
    (sampler,) = build_pipeline(RunSettings(no_repeat_ngram_size=n), sampling=False)
    text = [rng.randrange(5) for _ in range(6)]
    for _ in range(40):
        draft = [rng.randrange(5) for _ in range(rng.randrange(1, 6))]
        for j in range(len(draft) + 1):
            ids = torch.tensor([text + draft[:j]])
            assert banned_of(sampler.apply(ids, torch.zeros(1, VOCAB))) == transformers_bans(ids, n)
        kept = rng.randrange(len(draft) + 1)
        text = text + draft[:kept] + [rng.randrange(5)]


@pytest.mark.parametrize("n", [2, 3])
def test_beams_that_reorder_and_share_parents_equal_transformers(n):
    rng = random.Random(10 + n)
    (sampler,) = build_pipeline(RunSettings(no_repeat_ngram_size=n), sampling=False)
    beams = [[rng.randrange(4) for _ in range(5)]]
    for _ in range(30):
        ids = torch.tensor(beams)
        assert banned_of(sampler.apply(ids, torch.zeros(len(beams), VOCAB))) == transformers_bans(ids, n)
        width = rng.randrange(1, 6)  # the beam count changes too (the first step has one row)
        beams = [beams[rng.randrange(len(beams))] + [rng.randrange(4)] for _ in range(width)]
    # Rows that extend none of the last call's but share prefixes among themselves (each made from another).
    base = [rng.randrange(4) for _ in range(20)]
    ids = torch.tensor([[*base, 1, 2], [*base, 1, 3], [*base, 2, 2], [*base, 1, 2]])
    assert banned_of(sampler.apply(ids, torch.zeros(4, VOCAB))) == transformers_bans(ids, n)
    ids = torch.cat([ids, torch.tensor([[1], [2], [3], [0]])], dim=1)  # then each of those continues
    assert banned_of(sampler.apply(ids, torch.zeros(4, VOCAB))) == transformers_bans(ids, n)
    ids = torch.tensor([[*base, 1, 2, 0], [*base, 2, 2, 1], base[:10] + [3] * 13])
    assert banned_of(sampler.apply(ids, torch.zeros(3, VOCAB))) == transformers_bans(ids, n)
    # A batch unrelated to what the sampler saw, and the pure function on it.
    ids = torch.randint(0, 4, (3, 25), generator=torch.Generator().manual_seed(n))
    assert banned_of(sampler.apply(ids, torch.zeros(3, VOCAB))) == transformers_bans(ids, n)
    assert banned_of(ban_repeated_ngrams(ids, torch.zeros(3, VOCAB), n)) == transformers_bans(ids, n)


def test_a_fingerprint_collision_falls_back_to_reading_the_rows():
    """Rows are matched to the last call's by a weighted sum, then checked whole: with weights that make two
    different texts collide, the check catches it."""
    sampler = NoRepeatNgram(2)
    first = torch.tensor([[1, 2, 3, 1], [2, 1, 1, 3]])  # the same sum (7): equal fingerprints under unit weights
    sampler.apply(first, torch.zeros(2, VOCAB))
    sampler._fingerprint = torch.ones(64, dtype=torch.long)
    ids = torch.tensor([[2, 1, 1, 3, 2], [2, 1, 1, 3, 1]])  # both extend the second row, named as the first
    assert banned_of(sampler.apply(ids, torch.zeros(2, VOCAB))) == transformers_bans(ids, 2) == [{1}, {1, 3}]


def test_a_clone_and_a_reset_start_their_own_index():
    (sampler,) = build_pipeline(RunSettings(no_repeat_ngram_size=2), sampling=False)
    sampler.apply(torch.tensor([[1, 2, 1]]), torch.zeros(1, VOCAB))
    twin = sampler.clone()
    for s in (sampler, twin):
        ids = torch.tensor([[3, 1, 3, 1]])
        assert banned_of(s.apply(ids, torch.zeros(1, VOCAB))) == transformers_bans(ids, 2) == [{3}]
    sampler.reset()
    ids = torch.tensor([[1, 2, 1]])
    assert banned_of(sampler.apply(ids, torch.zeros(1, VOCAB))) == [{2}]


@pytest.mark.parametrize("alphabet", [3, 40])  # 40: more keys than a ban keeps apart, so its changes are merged
def test_the_index_grows_shrinks_and_forks_as_its_text(alphabet):
    rng = random.Random(7)
    for n in (1, 2, 3, 4):
        ban, text, twins = NgramBan(n), [], []
        for _ in range(600):
            if text and rng.random() < 0.3:
                text = text[: rng.randrange(len(text) + 1)]
                ban.truncate(len(text))
            elif rng.random() < 0.1:
                twin = ban.fork()
                twin.extend([rng.randrange(alphabet)])  # a fork's changes never reach the original
                assert twin.banned() == reference_bans(twin.tokens, n)
                twins.append((twin, list(twin.tokens)))
            else:
                token = rng.randrange(alphabet)
                text.append(token)
                ban.extend([token])
            assert ban.tokens == text and ban.banned() == reference_bans(text, n)
        for twin, tokens in twins:  # nor the original's (merged or not) the forks'
            assert twin.tokens == tokens and twin.banned() == reference_bans(tokens, n)
            for cut in range(len(tokens), max(len(tokens) - 2 * n, 0), -1):
                twin.truncate(cut)
                assert twin.banned() == reference_bans(tokens[:cut], n)
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert NgramBans(2).banned([[5, 5]]) == [{5}]


@pytest.mark.parametrize("n", [2, 3])
def test_the_what_if_bans_the_recorded_candidates_transformers_bans(tiny_lm, n):
    """A recorded run re-derived with the ban: the candidates it removes at each step are those transformers'
    processor bans on the step's context (prompt + tokens so far)."""
    base = RunSettings(strategy="sample", prompt="the cat sat on the mat and the cat sat on the", max_new_tokens=16,
                       record_candidates=96, seed=5, temperature=1.0, chat=False)
    events = list(run_strategy(tiny_lm, base))
    prompt_ids = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    steps = [e for e in events if isinstance(e, TokenStep)]
    what_if = re_derive(RecordedRun.of(steps, prompt_ids), base.replace(no_repeat_ngram_size=n).validate())
    vocab = tiny_lm.model.config.vocab_size
    context = list(prompt_ids)
    hits = 0
    for row, step in enumerate(steps):
        out = NoRepeatNGramLogitsProcessor(n)(torch.tensor([context]), torch.zeros(1, vocab))
        expected = set(torch.isinf(out[0]).nonzero().flatten().tolist())
        recorded = [int(t) for t in what_if.ids[row]]
        cut = {t for j, t in enumerate(recorded) if what_if.cut_name(row, j) == "no_repeat_ngram"}
        assert cut == expected & set(recorded), row
        assert all(what_if.probs[row, j] == 0 for j, t in enumerate(recorded) if t in expected)
        hits += len(cut)
        context.append(step.token_id)
    assert hits > 0, "precondition: the run meets bans"
    assert np.isfinite(what_if.probs).all()
