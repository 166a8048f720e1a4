"""Greedy and sampling on tiny random-weight models: exact against generate(), reproducible, distributionally right."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.kv_cache import kv_bytes_per_token
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted, TokenStep


def run(lm, **settings):
    events = list(run_strategy(lm, RunSettings(**settings)))
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[1], PrefillDone)
    assert isinstance(events[-1], RunFinished)
    return events, [e for e in events if isinstance(e, TokenStep)], events[-1]


def reference_generate(lm, prompt_ids, **kwargs):
    ids = torch.tensor([prompt_ids])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=lm.tokenizer.pad_token_id,
                            **kwargs)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("prompt", ["Hello", "The capital of France is", "Beam search keeps several"])
@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.4}, {"no_repeat_ngram_size": 2},
                                       {"repetition_penalty": 0.8, "no_repeat_ngram_size": 3}])
def test_greedy_equals_generate(tiny_lm, prompt, penalties):
    events, steps, done = run(tiny_lm, prompt=prompt, max_new_tokens=24, **penalties)
    expected = reference_generate(tiny_lm, list(events[0].prompt_token_ids), do_sample=False, max_new_tokens=24,
                                  **penalties)
    assert list(done.token_ids) == expected
    assert [s.token_id for s in steps] == expected
    assert all(s.raw_rank >= 1 for s in steps)
    if not penalties:  # without processors greedy always takes the raw top token
        assert all(s.raw_rank == 1 and s.prob == pytest.approx(s.raw_prob, abs=1e-6) for s in steps)


def test_greedy_stops_at_eos_like_generate(tiny_lm_eos):
    events, _, done = run(tiny_lm_eos, prompt="Hello", max_new_tokens=40)
    expected = reference_generate(tiny_lm_eos, list(events[0].prompt_token_ids), do_sample=False, max_new_tokens=40)
    eos = tiny_lm_eos.tokenizer.eos_token_id
    assert eos in expected, "the EOS-biased tiny model should end within 40 tokens"
    assert list(done.token_ids) == expected[: expected.index(eos) + 1]
    assert done.stop_reason == "eos"


def test_same_seed_same_text_and_different_seed_differs(tiny_lm):
    opts = {"prompt": "Hello", "strategy": "sample", "max_new_tokens": 30, "temperature": 1.0}
    a = run(tiny_lm, seed=7, **opts)[2]
    b = run(tiny_lm, seed=7, **opts)[2]
    c = run(tiny_lm, seed=8, **opts)[2]
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


def next_token_logits(lm, ids) -> torch.Tensor:
    """The model's logits [vocab] for the token after ``ids``: one plain forward pass, no cache, float64."""
    with torch.no_grad():
        return lm.model(torch.tensor([list(ids)])).logits[0, -1].double()


def test_sampled_frequencies_match_the_reference_distribution(tiny_lm):
    """1,000 one-token draws (seeds 0..999), chi-square against softmax(logits / T) over the top-k, renormalised.

    The reference comes from the model's own logits on the prompt, not from the engine's recorded probabilities, so
    a sampler that ignored the temperature or cut a different top-k set would fail here.
    """
    prompt, temperature, top_k, draws = "The capital of France is", 0.5, 8, 1000
    opts = {"prompt": prompt, "chat": False, "strategy": "sample", "max_new_tokens": 1,
            "temperature": temperature, "top_k": top_k}
    prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
    assert list(run(tiny_lm, seed=0, **opts)[0][0].prompt_token_ids) == prompt_ids
    logits = next_token_logits(tiny_lm, prompt_ids)
    top = torch.topk(logits, top_k + 1)
    assert top.values[top_k - 1] > top.values[top_k], "a tie at the k-th logit would make the top-k set ambiguous"
    probs = torch.softmax(top.values[:top_k] / temperature, dim=-1)
    expected = dict(zip(top.indices[:top_k].tolist(), probs.tolist(), strict=True))
    assert min(draws * p for p in expected.values()) >= 5, "chi-square needs every expected count to be at least 5"
    # Without the temperature the reference would differ clearly (the test has power against ignoring it).
    untempered = torch.softmax(top.values[:top_k], dim=-1)
    assert draws * float(((untempered - probs) ** 2 / probs).sum()) > 100

    counts = dict.fromkeys(expected, 0)
    for seed in range(draws):
        token = run(tiny_lm, seed=seed, **opts)[1][0].token_id
        assert token in counts, f"sampled token {token}, which is outside the top-{top_k}"
        counts[token] += 1
    chi2 = sum((counts[t] - draws * p) ** 2 / (draws * p) for t, p in expected.items())
    assert chi2 < 24.32, f"chi-square {chi2:.1f} exceeds the 0.1% critical value for 7 degrees of freedom"


def test_step_records_candidates_cuts_and_effects(tiny_lm):
    _, steps, _ = run(tiny_lm, prompt="Hello", strategy="sample", max_new_tokens=6, top_k=3, temperature=0.9,
                      repetition_penalty=1.5, num_candidates=8, seed=3)
    for step in steps:
        shown = step.candidates[:8]
        assert [c.raw_rank for c in shown] == list(range(1, 9))
        assert all(a.raw_prob >= b.raw_prob for a, b in itertools.pairwise(shown))
        kept = [c for c in shown if c.processed_prob > 0]
        cut = [c for c in shown if c.cut_by]
        assert len(kept) <= 3 and all(c.cut_by == "top_k" for c in cut) and len(cut) >= 5
        assert {e.name for e in step.effects} == {"repetition_penalty", "temperature", "top_k"}
        top_k = next(e for e in step.effects if e.name == "top_k")
        assert set(top_k.removed) == {c.token_id for c in cut}
        assert step.token_id in {c.token_id for c in kept}
        assert 0 < step.shown_raw_mass <= 1 + 1e-6
        assert step.entropy > step.processed_entropy >= 0  # top-3 at T=0.9 concentrates the distribution
        chosen = next(c for c in step.candidates if c.token_id == step.token_id)
        assert chosen.processed_prob == pytest.approx(step.prob)
        assert step.logprob == pytest.approx(math.log(step.raw_prob))


def test_kv_cache_bytes_follow_the_formula(tiny_lm):
    events, steps, _ = run(tiny_lm, prompt="Hello", max_new_tokens=5)
    per_token = kv_bytes_per_token(tiny_lm.model.config, torch.float32)
    prompt_len = len(events[0].prompt_token_ids)
    assert events[1].kv_cache_bytes == per_token * prompt_len
    for step in steps:  # the newest token enters the cache at the next forward pass
        assert step.kv_cache_bytes == per_token * (prompt_len + step.step)


def test_forced_tokens_branch_the_run(tiny_lm):
    base = run(tiny_lm, prompt="Hello", max_new_tokens=8)[2]
    alternative = next(c.token_id for c in run(tiny_lm, prompt="Hello", max_new_tokens=3)[1][2].candidates[1:])
    forced = (*base.token_ids[:2], alternative)
    events, steps, done = run(tiny_lm, prompt="Hello", max_new_tokens=8, forced_token_ids=forced)
    assert done.token_ids[:3] == forced
    assert [s.forced for s in steps[:4]] == [True, True, True, False]
    assert steps[2].raw_rank >= 2  # the alternative was not the model's first choice
    assert events[0].forced_token_ids == forced


@pytest.mark.parametrize(("forced_rank", "penalties"), [
    ((3, 2), {}),
    ((2, 4), {"repetition_penalty": 1.3}),
    ((4, 2), {"no_repeat_ngram_size": 2}),
])
def test_branch_continues_as_generate_does_from_the_forced_prefix(tiny_lm, forced_rank, penalties):
    """Forcing (a, b) then decoding greedily equals generate() given prompt + (a, b) as its input."""
    prompt_ids = tiny_lm.tokenizer("Hello")["input_ids"]
    a = int(torch.topk(next_token_logits(tiny_lm, prompt_ids), forced_rank[0]).indices[-1])
    b = int(torch.topk(next_token_logits(tiny_lm, [*prompt_ids, a]), forced_rank[1]).indices[-1])
    # The forced tokens are not what greedy would have chosen (under the same penalties).
    assert reference_generate(tiny_lm, prompt_ids, do_sample=False, max_new_tokens=1, **penalties) != [a]
    assert reference_generate(tiny_lm, [*prompt_ids, a], do_sample=False, max_new_tokens=1, **penalties) != [b]

    events, steps, done = run(tiny_lm, prompt="Hello", chat=False, max_new_tokens=14, forced_token_ids=(a, b),
                              **penalties)
    assert list(events[0].prompt_token_ids) == prompt_ids
    expected = reference_generate(tiny_lm, [*prompt_ids, a, b], do_sample=False, max_new_tokens=12, **penalties)
    assert len(expected) == 12
    assert list(done.token_ids) == [a, b, *expected]
    assert [s.token_id for s in steps] == [a, b, *expected]
    assert [s.forced for s in steps] == [True, True] + [False] * 12
    assert done.stop_reason == "max_new_tokens"


def first_completion(tokenizer, ids, stop) -> int:
    """Index of the token with which ``stop`` first appears in the decoded text of ``ids[: index + 1]``."""
    return next(i for i in range(len(ids)) if stop in tokenizer.decode(ids[: i + 1], skip_special_tokens=False))


# (token index m, slice of the decoded text up to and including token m) -> the stop string. With prompt "Hello" the
# tiny model writes "...from the3 tokens... w6$...": "the3" spans two tokens, "toke" ends inside " tokens", "w6$"
# spans three.
@pytest.mark.parametrize(("m", "start", "end"), [(6, -4, None), (7, -6, -2), (12, -3, None)])
def test_stop_string_cuts_the_run_where_it_completes(tiny_lm, m, start, end):
    tokenizer = tiny_lm.tokenizer
    full = run(tiny_lm, prompt="Hello", max_new_tokens=30)[2]
    ids = list(full.token_ids)
    assert full.stop_reason == "max_new_tokens" and len(ids) == 30
    stop = tokenizer.decode(ids[: m + 1], skip_special_tokens=False)[start:end]
    assert len(stop) >= 3 and stop.isascii() and stop.isprintable(), f"pick a plain stop string, not {stop!r}"
    cut = first_completion(tokenizer, ids, stop)
    assert 0 < cut < len(ids) - 1, "the stop string must complete mid-run for the test to mean anything"

    stopped = run(tiny_lm, prompt="Hello", max_new_tokens=30, stop_strings=(stop,))[2]
    assert stopped.stop_reason == "stop_string"
    assert list(stopped.token_ids) == ids[: cut + 1]
    assert stop in stopped.text


@pytest.mark.parametrize("k", [0, 1, 5])
def test_stop_request_ends_the_run_within_one_token(tiny_lm, k):
    """should_stop flips right after the k-th TokenStep (k = 0: after prefill); the run ends at once, as "stopped"."""
    settings = RunSettings(prompt="Hello", max_new_tokens=20)
    full = list(run_strategy(tiny_lm, settings))[-1]
    assert full.stop_reason == "max_new_tokens" and len(full.token_ids) == 20

    flag = {"stop": False}
    events = run_strategy(tiny_lm, settings, should_stop=lambda: flag["stop"])
    received, after_flip = [], 0
    event = None
    for event in events:
        if isinstance(event, TokenStep):
            received.append(event.token_id)
            after_flip += flag["stop"]
        if not flag["stop"] and len(received) == k and isinstance(event, TokenStep | PrefillDone):
            flag["stop"] = True
    assert flag["stop"]
    assert after_flip <= 1
    assert isinstance(event, RunFinished) and event.stop_reason == "stopped"
    assert list(event.token_ids) == received
    assert received == list(full.token_ids[: len(received)])


def test_prompt_longer_than_context_is_refused_and_context_limit_stops(tiny_lm):
    with pytest.raises(ConfigError, match="reads at most 256"):
        run(tiny_lm, prompt="token " * 300, chat=False)
    events, steps, done = run(tiny_lm, prompt="word " * 60, chat=False, max_new_tokens=200)
    assert len(events[0].prompt_token_ids) + len(steps) == 256
    assert done.stop_reason == "context_full"


@pytest.mark.parametrize("bad", [{"temperature": 0}, {"top_p": 0}, {"top_k": -1}, {"max_new_tokens": 0},
                                 {"min_p": 1.0}, {"strategy": "nope"}, {"prompt": "  "}])
def test_impossible_settings_say_what_to_do(tiny_lm, bad):
    with pytest.raises(ConfigError):
        list(run_strategy(tiny_lm, RunSettings(**bad)))


def test_token_texts_join_to_the_decoded_output(tiny_lm):
    text = "Le café coûte 3€ — 上海的天气"
    ids = tiny_lm.tokenizer(text)["input_ids"]
    from playground.engine.token_text import IncrementalDecoder

    decoder = IncrementalDecoder(tiny_lm.tokenizer)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
