"""Beam search: sequences and scores equal transformers' generate(num_beams=...), and the events are well formed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from playground.config import BeamSettings, ConfigError, RunSettings
from playground.engine.beam import run_beam_search
from playground.engine.kv_cache import kv_bytes_per_token
from playground.engine.prompt import encode_prompt
from playground.events import BeamStep, PrefillDone, RunFinished, RunStarted, event_to_dict

SCORE_TOL = 1e-5  # float32 sums of a few dozen log-probs; the prefill runs at batch 1 here, at batch N there


def beam_settings(**changes) -> RunSettings:
    return RunSettings.from_flat(**{"strategy": "beam", "prompt": "The weather in Paris", **changes})


def reference(lm, settings: RunSettings) -> list[tuple[list[int], float]]:
    """(generated ids, sequences_score) of each returned sequence from transformers' own beam search."""
    ids, _ = encode_prompt(lm, settings)
    prompt = torch.tensor([ids])
    beam = settings.group(BeamSettings)
    early = {"true": True, "false": False, "never": "never"}[beam.early_stopping]
    with torch.inference_mode():
        out = lm.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=settings.max_new_tokens,
            num_beams=beam.num_beams, length_penalty=beam.length_penalty, early_stopping=early,
            no_repeat_ngram_size=settings.no_repeat_ngram_size or None,
            repetition_penalty=settings.repetition_penalty, num_return_sequences=beam.num_return_sequences,
            do_sample=False, output_scores=True, return_dict_in_generate=True,
        )
    result = []
    for row in range(settings.group(BeamSettings).num_return_sequences):
        length = int((out.beam_indices[row] != -1).sum())  # generated tokens of this sequence
        result.append((out.sequences[row, len(ids) : len(ids) + length].tolist(), float(out.sequences_scores[row])))
    return result


def run(lm, settings: RunSettings, should_stop=None) -> list:
    return list(run_beam_search(lm, settings, should_stop))


def assert_matches_generate(lm, settings: RunSettings) -> list:
    events = run(lm, settings)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    expected = reference(lm, settings)
    assert len(finished.sequences) == len(expected) == settings.group(BeamSettings).num_return_sequences
    for ours, (ids, score) in zip(finished.sequences, expected, strict=True):
        assert list(ours.token_ids) == ids
        assert ours.score == pytest.approx(score, abs=SCORE_TOL)
    return events


CASES = {
    "default": dict(num_beams=4, max_new_tokens=24),
    "early_true_returns_3": dict(num_beams=4, max_new_tokens=24, early_stopping="true", num_return_sequences=3),
    "never_lp2": dict(num_beams=5, max_new_tokens=20, early_stopping="never", length_penalty=2.0,
                      num_return_sequences=5),
    "false_lp_negative": dict(num_beams=3, max_new_tokens=20, length_penalty=-0.5, num_return_sequences=2),
    "never_lp_half": dict(num_beams=4, max_new_tokens=16, early_stopping="never", length_penalty=0.5),
    "width16_penalties": dict(num_beams=16, max_new_tokens=12, num_return_sequences=4, repetition_penalty=1.3,
                              no_repeat_ngram_size=2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_generate_with_eos(tiny_lm_eos, case):
    events = assert_matches_generate(tiny_lm_eos, beam_settings(**CASES[case]))
    finished = [c for e in events if isinstance(e, BeamStep) for c in e.candidates if c.finished]
    assert finished, "the EOS-biased model should finish hypotheses at EOS"


@pytest.mark.parametrize("changes", [
    dict(num_beams=4, max_new_tokens=24),
    dict(num_beams=6, max_new_tokens=30, repetition_penalty=1.5, no_repeat_ngram_size=3, length_penalty=0.5),
    dict(num_beams=16, max_new_tokens=10, early_stopping="true", num_return_sequences=16),
], ids=["default", "penalties", "width16"])
def test_matches_generate_to_max_length(tiny_lm, changes):
    events = assert_matches_generate(tiny_lm, beam_settings(**changes))
    assert events[-1].stop_reason in ("max_new_tokens", "eos")


def test_some_runs_end_at_eos_and_stop_early(tiny_lm_eos):
    events = run(tiny_lm_eos, beam_settings(num_beams=4, max_new_tokens=24))
    done = events[-1]
    assert done.stop_reason == "eos"
    assert done.token_ids[-1] in tiny_lm_eos.eos_token_ids
    assert sum(isinstance(e, BeamStep) for e in events) < 24


@pytest.mark.parametrize("lm_name", ["tiny_lm", "tiny_lm_eos"])
def test_width_one_equals_greedy(request, lm_name):
    """generate(num_beams=1) is greedy search; beam search of width 1 picks the same tokens (length penalty 1)."""
    lm = request.getfixturevalue(lm_name)
    settings = beam_settings(num_beams=1, max_new_tokens=20)
    ids, _ = encode_prompt(lm, settings)
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                                output_logits=True, return_dict_in_generate=True)
    greedy = out.sequences[0, len(ids) :].tolist()
    logprobs = [torch.log_softmax(step.float(), dim=-1)[0, t].item()
                for step, t in zip(out.logits, greedy, strict=True)]
    done = run(lm, settings)[-1]
    assert list(done.token_ids) == greedy
    assert done.sequences[0].sum_logprobs == pytest.approx(sum(logprobs), abs=SCORE_TOL)
    assert done.sequences[0].score == pytest.approx(sum(logprobs) / len(greedy), abs=SCORE_TOL)


def test_event_structure(tiny_lm_eos):
    width = 4
    settings = beam_settings(num_beams=width, max_new_tokens=24, early_stopping="never", num_return_sequences=3)
    events = run(tiny_lm_eos, settings)
    assert isinstance(events[0], RunStarted) and events[0].strategy == "beam"
    assert isinstance(events[1], PrefillDone)
    steps = events[2:-1]
    assert steps and all(isinstance(e, BeamStep) for e in steps)
    assert [e.step for e in steps] == list(range(len(steps)))
    n_eos = len(tiny_lm_eos.eos_token_ids)
    penalty = settings.group(BeamSettings).length_penalty
    previous_beams = 1  # the prompt
    for event in steps:
        survivors = len(event.parents)
        last = event is steps[-1]
        assert survivors == width or (last and survivors == 0)
        assert len(event.token_ids) == len(event.scores) == survivors
        assert all(0 <= p < previous_beams for p in event.parents)
        assert len(event.candidates) == max(2, 1 + n_eos) * width
        scores = [c.score for c in event.candidates]
        assert scores == sorted(scores, reverse=True)
        survived = [(c.beam, c.token_id, c.score) for c in event.candidates if c.survived]
        assert sorted(survived) == sorted(zip(event.parents, event.token_ids, event.scores, strict=True))
        assert list(event.scores) == sorted(event.scores, reverse=True)
        for c in event.candidates:
            assert not (c.survived and c.finished)
            assert (c.finished_score is not None) == c.finished
            if c.finished:
                assert c.finished_score == pytest.approx(c.score / (event.step + 1) ** penalty)
            assert c.token_logprob <= 0.0
        previous_beams = max(survivors, 1)
    done = events[-1]
    assert done.token_ids == done.sequences[0].token_ids and done.text == done.sequences[0].text
    assert [s.score for s in done.sequences] == sorted((s.score for s in done.sequences), reverse=True)
    for seq in done.sequences:
        assert seq.score == pytest.approx(seq.sum_logprobs / len(seq.token_ids) ** penalty)
    assert done.decode_ms > 0 and done.tokens_per_s > 0


def test_events_are_plain_json(tiny_lm_eos):
    events = run(tiny_lm_eos, beam_settings(num_beams=3, max_new_tokens=10, num_return_sequences=2))
    for event in events:
        json.dumps(event_to_dict(event), allow_nan=False)


def test_cumulative_scores_follow_parents(tiny_lm):
    """Each survivor's score is its parent's score plus its token's log-prob."""
    events = run(tiny_lm, beam_settings(num_beams=3, max_new_tokens=8))
    previous = (0.0,)
    for event in (e for e in events if isinstance(e, BeamStep)):
        for c in event.candidates:
            assert c.score == pytest.approx(previous[c.beam] + c.token_logprob, abs=1e-5)
        previous = event.scores or previous


def test_kv_cache_bytes_follow_the_formula(tiny_lm):
    width = 5
    events = run(tiny_lm, beam_settings(num_beams=width, max_new_tokens=12))
    per_token = kv_bytes_per_token(tiny_lm.model.config, tiny_lm.dtype)
    prompt_len = events[1].prompt_tokens
    assert events[1].kv_cache_bytes == prompt_len * per_token  # one row before the beams split
    for event in (e for e in events if isinstance(e, BeamStep) and e.parents):
        assert event.kv_cache_bytes == width * per_token * (prompt_len + event.step)


def test_should_stop_reports_best_so_far(tiny_lm):
    polls = iter(range(100))
    settings = beam_settings(num_beams=4, max_new_tokens=30, num_return_sequences=2)
    events = run(tiny_lm, settings, should_stop=lambda: next(polls) >= 5)
    done = events[-1]
    assert done.stop_reason == "stopped"
    assert sum(isinstance(e, BeamStep) for e in events) == 5
    assert len(done.sequences) == 2
    assert len(done.token_ids) == 5
    assert done.sequences[0].score >= done.sequences[1].score
    assert done.sequences[0].score == pytest.approx(done.sequences[0].sum_logprobs / 5)


def test_prompt_longer_than_context_is_a_config_error(tiny_lm):
    with pytest.raises(ConfigError, match="shorten the prompt"):
        run_beam_search(tiny_lm, beam_settings(chat=False, prompt="Paris " * 400))


def test_steps_are_capped_at_the_context_length(tiny_lm):
    reps = next(n for n in range(1, 200)
                if len(encode_prompt(tiny_lm, beam_settings(chat=False, prompt="coffee tea " * n))[0])
                > tiny_lm.context_length - 40)
    settings = beam_settings(chat=False, prompt="coffee tea " * reps, num_beams=2, max_new_tokens=64)
    room = tiny_lm.context_length - len(encode_prompt(tiny_lm, settings)[0])
    assert 0 < room < 64
    events = run(tiny_lm, settings)
    assert sum(isinstance(e, BeamStep) for e in events) <= room
    done = events[-1]
    assert all(len(s.token_ids) <= room for s in done.sequences)
    if done.token_ids[-1] not in tiny_lm.eos_token_ids:
        assert done.stop_reason == "context_full"


def test_forced_tokens_are_a_prefix_of_every_sequence(tiny_lm):
    forced = tuple(tiny_lm.tokenizer(" Paris")["input_ids"])
    settings = beam_settings(num_beams=3, max_new_tokens=10, num_return_sequences=3, forced_token_ids=forced)
    events = run(tiny_lm, settings)
    assert events[0].forced_token_ids == forced
    done = events[-1]
    assert all(s.token_ids[: len(forced)] == forced for s in done.sequences)
    assert all(len(s.token_ids) <= 10 for s in done.sequences)


def test_finished_scores_are_length_normalised(tiny_lm_eos):
    settings = beam_settings(num_beams=4, max_new_tokens=24, length_penalty=1.7, early_stopping="never")
    done = run(tiny_lm_eos, settings)[-1]
    for seq in done.sequences:
        assert math.isclose(seq.score, seq.sum_logprobs / len(seq.token_ids) ** 1.7, rel_tol=1e-5)


@pytest.mark.model
def test_default_model_matches_generate(default_lm):
    settings = RunSettings.from_flat(strategy="beam", num_beams=4, max_new_tokens=24, num_return_sequences=2,
                           length_penalty=1.0, early_stopping="false")
    events = assert_matches_generate(default_lm, settings)
    done = events[-1]
    assert "Paris" in done.text
    per_token = kv_bytes_per_token(default_lm.model.config, default_lm.dtype)
    prompt_len = events[1].prompt_tokens
    for event in (e for e in events if isinstance(e, BeamStep) and e.parents):
        assert event.kv_cache_bytes == 4 * per_token * (prompt_len + event.step)


def test_a_beam_branch_continues_as_generate_does_from_the_forced_prefix(tiny_lm):
    """Branching in beam search: every beam starts from the forced tokens, and the search after them is
    transformers' beam search on prompt + forced tokens."""
    settings = beam_settings(num_beams=3, max_new_tokens=12, num_return_sequences=3, early_stopping="never")
    prompt_ids, _ = encode_prompt(tiny_lm, settings)
    with torch.inference_mode():
        logits = tiny_lm.model(input_ids=torch.tensor([prompt_ids])).logits[0, -1]
    forced = (int(torch.topk(logits, 3).indices[2]),)  # the third most likely first token
    greedy_first = int(logits.argmax())
    assert forced[0] != greedy_first
    done = run(tiny_lm, settings.replace(forced_token_ids=forced))[-1]

    ids = torch.tensor([prompt_ids + list(forced)])
    with torch.inference_mode():
        out = tiny_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=3,
                                     num_return_sequences=3, early_stopping="never",
                                     max_new_tokens=12 - len(forced), output_scores=True,
                                     return_dict_in_generate=True, pad_token_id=tiny_lm.tokenizer.pad_token_id)
    pad = tiny_lm.tokenizer.pad_token_id
    expected = [[t for t in row[ids.shape[1]:].tolist() if t != pad] for row in out.sequences]
    assert [list(s.token_ids) for s in done.sequences] == [list(forced) + e for e in expected]
    for seq, score in zip(done.sequences, out.sequences_scores.tolist(), strict=True):
        assert math.isclose(seq.score, score, rel_tol=1e-5, abs_tol=1e-6)
