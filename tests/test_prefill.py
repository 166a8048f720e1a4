"""Long prompts are read in chunks: the result equals one pass, progress is reported, and Stop is honoured
between chunks (greedy and beam search)."""

from __future__ import annotations

import pytest
import torch

from playground.config import RunSettings
from playground.engine.forward import PREFILL_CHUNK, prefill, prefill_in_chunks
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, PrefillDone, PrefillProgress, RunFinished, TokenStep
from playground.events.speculative import SpeculativeRound


@pytest.fixture(scope="module")
def long_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, max_positions=4096)


def long_prompt(lm, tokens: int) -> str:
    """A prompt a little longer than ``tokens``."""
    text = ""
    while len(lm.tokenizer(text)["input_ids"]) <= tokens:
        text += "The weather in Shanghai is sunny today. "
    return text


def test_chunked_prefill_equals_one_pass(long_lm):
    ids = torch.tensor([long_lm.tokenizer(long_prompt(long_lm, 3 * PREFILL_CHUNK))["input_ids"]])
    with torch.inference_mode():
        whole = long_lm.model(input_ids=ids).logits[:, -1, :]  # the reference: no cache, one forward pass
        chunks = prefill_in_chunks(long_lm.model, ids, chunk=PREFILL_CHUNK)
        reported = []
        while True:
            try:
                reported.append(next(chunks))
            except StopIteration as end:
                logits, cache = end.value
                break
    total = ids.shape[1]
    assert reported == list(range(PREFILL_CHUNK, total, PREFILL_CHUNK))
    assert cache.get_seq_length() == total
    torch.testing.assert_close(logits, whole, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():
        torch.testing.assert_close(prefill(long_lm.model, ids)[0], whole, rtol=1e-4, atol=1e-4)


def test_greedy_after_a_chunked_prefill_equals_generate(long_lm):
    settings = RunSettings(prompt=long_prompt(long_lm, 2 * PREFILL_CHUNK), chat=False, max_new_tokens=12)
    events = list(run_strategy(long_lm, settings))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    total = len(events[0].prompt_token_ids)
    assert [p.done_tokens for p in progress] == list(range(PREFILL_CHUNK, total, PREFILL_CHUNK))
    assert all(p.total_tokens == total for p in progress)
    ids = torch.tensor([events[0].prompt_token_ids])
    expected = long_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                                      pad_token_id=long_lm.tokenizer.pad_token_id)[0, total:].tolist()
    assert list(events[-1].token_ids) == expected


def test_speculative_reads_the_prompts_last_chunk_with_its_first_draft(long_lm, monkeypatch):
    calls = [0]
    real_forward = long_lm.model.forward

    def forward(*args, **kwargs):
        calls[0] += 1
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(long_lm.model, "forward", forward)
    settings = RunSettings.from_flat(prompt=long_prompt(long_lm, 2 * PREFILL_CHUNK), chat=False, max_new_tokens=12,
                                     strategy="speculative", draft="prompt-lookup", draft_k=4, baseline_tokens=0)
    events = list(run_strategy(long_lm, settings))
    total = len(events[0].prompt_token_ids)
    tail = total - 2 * PREFILL_CHUNK
    assert 0 < tail <= PREFILL_CHUNK  # precondition: two whole chunks, then a part of one
    progress = [e.done_tokens for e in events if isinstance(e, PrefillProgress)]
    assert progress == [PREFILL_CHUNK]  # progress between the chunks read before the first round
    prefill_done = next(e for e in events if isinstance(e, PrefillDone))
    assert (prefill_done.forward_passes, prefill_done.deferred_tokens) == (2, tail)
    rounds = [e for e in events if isinstance(e, SpeculativeRound)]
    assert [r.prompt_read for r in rounds] == [tail] + [0] * (len(rounds) - 1)
    assert events[-1].figures["target_calls"] == calls[0] == 2 + len(rounds)
    ids = torch.tensor([events[0].prompt_token_ids])
    expected = real_forward.__self__.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                              max_new_tokens=12, pad_token_id=long_lm.tokenizer.pad_token_id)
    assert list(events[-1].token_ids) == expected[0, total:].tolist()


@pytest.mark.parametrize("strategy", [{"strategy": "greedy"}, {"strategy": "beam", "num_beams": 3},
                                      {"strategy": "speculative", "draft": "prompt-lookup"}])
def test_stop_between_chunks_ends_the_run_before_any_step(long_lm, strategy):
    settings = RunSettings.from_flat(prompt=long_prompt(long_lm, 4 * PREFILL_CHUNK), chat=False,
                                     max_new_tokens=8, **strategy)
    stop = [False]
    events = []
    for event in run_strategy(long_lm, settings, should_stop=lambda: stop[0]):
        events.append(event)
        if isinstance(event, PrefillProgress):
            stop[0] = True  # the user pressed Stop while the prompt was being read
    kinds = [type(e) for e in events]
    assert kinds.count(PrefillProgress) == 1  # not one more chunk after Stop
    assert PrefillDone not in kinds and TokenStep not in kinds and BeamStep not in kinds
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    assert done.token_ids == () and done.sequences == () and done.tokens_per_s == 0.0
    assert done.prefill_ms > 0


def test_stop_between_the_chunks_of_the_cascades_full_model_catch_up(long_lm):
    """The cascade's full model reads the long prompt only at its first escalation, in chunks: Stop between two of
    those chunks ends the run before that step's token (the full model's read polls the run's Stop)."""
    prompt = long_prompt(long_lm, 3 * PREFILL_CHUNK)
    tokens = len(long_lm.tokenizer(prompt)["input_ids"])
    between_chunks = -(-tokens // PREFILL_CHUNK) - 1  # polls of one chunked read of the prompt
    assert between_chunks >= 2  # precondition: a read with at least two polls between its chunks
    settings = RunSettings.from_flat(strategy="cascade", prompt=prompt, chat=False, max_new_tokens=4,
                                     cascade_threshold=1.0, cheap="layers", cheap_layers=1, cascade_compare=False)
    polls: list[int] = []
    # Polls: the cheap model's prefill's, the one before the first step, then the full model's catch-up's.
    first_catch_up_poll = between_chunks + 2

    def should_stop() -> bool:
        polls.append(1)
        return len(polls) >= first_catch_up_poll

    events = list(run_strategy(long_lm, settings, should_stop))
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    assert done.token_ids == () and TokenStep not in [type(e) for e in events]
    assert len(polls) == first_catch_up_poll  # nothing read or polled after Stop
