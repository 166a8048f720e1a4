"""Tests written to kill the survivors of the mutation run over prompt salience and activation patching
(playground/engine/attribution, issue 28, point 4): each names the bug it catches, against references computed
here (quadrature rules from their definitions, occlusion and logit differences by plain forwards)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.config.patching import PatchingSettings
from playground.engine.attribution.salience import (
    SalienceStopped,
    TargetLogprob,
    baseline_token,
    ig_points,
    integrated_gradients,
    occlusion,
    salience_events,
)
from playground.engine.run_context import RunContext
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished
from playground.events.patching import PatchingRow, PatchingStarted
from playground.events.salience import SalienceAgreement, SalienceMap

CLEAN, CORRUPTED = "the cat sat on the mat", "the mat sat on the cat"  # the same number of tokens
TARGET = 5


def _logprob(lm, ids, target):
    """log p(target | ids) at the last position, by a plain forward on the token ids."""
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float()
    return float(torch.log_softmax(logits, -1)[target])


# --- salience.py: the quadrature, the baseline token, stop and progress ------------------------------------------

def test_ig_points_are_the_rules_definitions_from_two_steps_on():
    alphas, weights = ig_points(2, "gausslegendre")  # two points: (1 ± 1/√3) / 2, weights 1/2 each
    assert alphas == pytest.approx([(1 - 1 / math.sqrt(3)) / 2, (1 + 1 / math.sqrt(3)) / 2])
    assert weights == pytest.approx([0.5, 0.5])
    alphas, weights = ig_points(5, "riemann_trapezoid")
    assert alphas == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert weights == pytest.approx([0.1, 0.2, 0.2, 0.2, 0.1])
    with pytest.raises(ConfigError, match=r"^integrated gradients need at least 2 steps, not 1$"):
        ig_points(1, "gausslegendre")
    with pytest.raises(ConfigError, match=r"^integrated gradients' rule must be one of gausslegendre, "
                                          r"riemann_trapezoid, not 'simpson'$"):
        ig_points(4, "simpson")


def test_the_baseline_token_is_pad_then_unknown_then_end_then_zero():
    def lm(pad, unk, eos):
        return SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=pad, unk_token_id=unk, eos_token_id=eos))
    assert baseline_token(lm(3, 7, 9)) == 3
    assert baseline_token(lm(None, 7, 9)) == 7
    assert baseline_token(lm(None, None, 9)) == 9
    assert baseline_token(lm(None, None, None)) == 0
    assert baseline_token(SimpleNamespace(tokenizer=SimpleNamespace())) == 0  # no such attributes at all


def test_occlusion_and_ig_poll_stop_before_each_batch(tiny_lm):
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    f = TargetLogprob(tiny_lm, ids, TARGET)
    polls: list[int] = []

    def stop_at_second():
        polls.append(1)
        return len(polls) >= 2
    with pytest.raises(SalienceStopped):
        occlusion(f, 0, stop_at_second, batch=4)
    assert len(polls) == 2
    polls.clear()
    with pytest.raises(SalienceStopped):
        integrated_gradients(f, 0, 6, should_stop=stop_at_second, batch=4)
    assert len(polls) == 2
    never = occlusion(f, 0, lambda: False, batch=4)  # a stop check that says no: the whole map
    by_hand = [_logprob(tiny_lm, ids, TARGET) - _logprob(tiny_lm, [*ids[:p], 0, *ids[p + 1:]], TARGET)
               for p in range(len(ids))]
    np.testing.assert_allclose(never, by_hand, atol=1e-4)


def test_ig_reports_its_progress_and_the_completeness_gap(tiny_lm):
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    f = TargetLogprob(tiny_lm, ids, TARGET)
    said: list[float] = []
    scores, figures = integrated_gradients(f, 0, 5, "riemann_trapezoid", lambda: False, said.append, batch=2)
    assert said == pytest.approx([2 / 5, 4 / 5, 1.0])  # after each batch, the last capped at 1
    expected = _logprob(tiny_lm, ids, TARGET) - _logprob(tiny_lm, [0] * len(ids), TARGET)
    assert figures["expected_sum"] == pytest.approx(expected, abs=1e-5)
    assert figures["completeness_gap"] == pytest.approx(float(scores.sum()) - expected, abs=1e-5)


# --- salience.py: salience_events, the map fields, texts, progress and refusals -----------------------------------

def test_salience_events_fields_progress_and_details(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = tok(CLEAN)["input_ids"]
    output = [TARGET, 9, 11]
    said: list[tuple[str, float]] = []
    events = list(salience_events(tiny_lm, ids, output, 1, ig_steps=4, ig_rule="riemann_trapezoid",
                                  progress=lambda m, x: said.append((m, x))))
    maps = [e for e in events if isinstance(e, SalienceMap)]
    context = [*ids, TARGET]
    base = tok.pad_token_id
    base_text = tok.convert_ids_to_tokens(base)
    logprob = _logprob(tiny_lm, context, 9)
    for m in maps:
        assert m.step == 1 and m.target_id == 9 and m.target_logprob == pytest.approx(logprob, abs=1e-5)
        assert m.baseline == f"token {base} {base_text!r}"
        assert m.tokens == tuple(tok.decode([i]) for i in context)
        assert m.target_text == tok.decode([9])
        assert 0 <= m.seconds < 60
    occ = maps[0]
    by_hand = [logprob - _logprob(tiny_lm, [*context[:p], base, *context[p + 1:]], 9) for p in range(len(context))]
    np.testing.assert_allclose(occ.scores, by_hand, atol=1e-4)
    assert occ.detail == f"each token replaced by {base_text!r} in turn; Δ log p" and occ.figures == {}
    assert maps[1].detail == "∂ log p / ∂ embedding · embedding, summed over the embedding"
    ig = maps[2]
    expected = logprob - _logprob(tiny_lm, [base] * len(context), 9)
    assert ig.figures["expected_sum"] == pytest.approx(expected, abs=1e-5)
    assert ig.detail == (f"4 points (riemann_trapezoid) from every token {base_text!r} to the context; "
                         f"sum {sum(ig.scores):.3f} vs log p − log p(baseline) {expected:.3f}")
    agreement = events[-1]
    assert isinstance(agreement, SalienceAgreement) and agreement.step == 1
    assert agreement.pairs == (("occlusion", "grad_x_input"), ("occlusion", "integrated_gradients"),
                               ("grad_x_input", "integrated_gradients"))
    assert agreement.top_tokens == tuple(max(range(len(m.scores)), key=m.scores.__getitem__) for m in maps)
    titles = ["occlusion", "gradient × input", "integrated gradients"]
    assert [m for m, _ in said[:2]] == [f"Salience of step 1: {titles[0]}…", f"Salience of step 1: {titles[1]}…"]
    assert [x for _, x in said[:2]] == pytest.approx([0, 1 / 3])
    assert said[2] == (f"Salience of step 1: {titles[2]}…", pytest.approx(2 / 3))
    # integrated gradients' own progress, in its third of the bar: 4 points in one batch of 8
    assert said[3] == (f"Salience of step 1: {titles[2]}…", pytest.approx(1.0))
    assert said[-1] == ("Salience of step 1 done", 1.0) and len(said) == 5


def test_word_occlusion_through_salience_events(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = tok("The capital of France is")["input_ids"]
    texts = [tok.decode([i]) for i in ids]
    # words written here: a new word at a token starting with a space (the first token starts one)
    groups = list(np.cumsum([t.startswith(" ") or i == 0 for i, t in enumerate(texts)]) - 1)
    assert len(set(groups)) < len(groups)
    (made, *_) = salience_events(tiny_lm, ids, [TARGET], 0, ("occlusion",), occlude="word")
    base = tok.pad_token_id
    full = _logprob(tiny_lm, ids, TARGET)
    by_hand = [full - _logprob(tiny_lm, [base if groups[q] == groups[p] else i for q, i in enumerate(ids)], TARGET)
               for p in range(len(ids))]
    np.testing.assert_allclose(made.scores, by_hand, atol=1e-4)
    assert made.detail.startswith("each word (all its tokens) replaced by")


def test_salience_events_refusals(tiny_lm):
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    with pytest.raises(ConfigError, match=r"^salience methods must be among occlusion, grad_x_input, "
                                          r"integrated_gradients, not \['lime'\]$"):
        list(salience_events(tiny_lm, ids, [TARGET], 0, ("occlusion", "lime")))
    with pytest.raises(ConfigError, match=r"not none$"):
        list(salience_events(tiny_lm, ids, [TARGET], 0, ()))
    with pytest.raises(ConfigError, match=r"^occlusion hides a token or a word \(token, word\), not 'line'$"):
        list(salience_events(tiny_lm, ids, [TARGET], 0, occlude="line"))
    with pytest.raises(ConfigError, match=r"^step -1 is not in the run \(it has steps 0 to 1\)$"):
        list(salience_events(tiny_lm, ids, [TARGET, 9], -1))
    with pytest.raises(ConfigError, match="at least 2 steps"):  # checked before any map is made
        list(salience_events(tiny_lm, ids, [TARGET], 0, ig_steps=1))


# --- salience_run.py ------------------------------------------------------------------------------------------------

def test_salience_of_the_first_step_and_of_a_step_past_the_run(tiny_lm):
    settings = RunSettings.from_flat(strategy="greedy", prompt="the cat", chat=False, max_new_tokens=3,
                                     salience="occlusion", salience_step=0)
    events = list(run_strategy(tiny_lm, settings))
    (made,) = [e for e in events if isinstance(e, SalienceMap)]
    finished = events[-1]
    prompt = tiny_lm.tokenizer("the cat")["input_ids"]
    assert made.step == 0 and made.token_ids == tuple(prompt) and made.target_id == finished.token_ids[0]
    past = RunSettings.from_flat(strategy="greedy", prompt="the cat", chat=False, max_new_tokens=3,
                                 salience="occlusion", salience_step=3)
    events = list(run_strategy(tiny_lm, past))
    assert not any(isinstance(e, SalienceMap | SalienceAgreement) for e in events)
    assert isinstance(events[-1], RunFinished) and events[-1].cut_short == ()


# --- patching_run.py ------------------------------------------------------------------------------------------------

def _settings(**patching):
    group = PatchingSettings(corrupted=CORRUPTED, **patching)
    return RunSettings(strategy="patching", prompt=CLEAN, chat=False, groups=(group,))


def _last_logits(lm, text):
    with torch.no_grad():
        return lm.model(torch.tensor([lm.tokenizer(text)["input_ids"]])).logits[0, -1].float()


def test_the_answer_and_foil_named_or_chosen(tiny_lm):
    tok = tiny_lm.tokenizer
    clean, corrupted = _last_logits(tiny_lm, CLEAN), _last_logits(tiny_lm, CORRUPTED)
    events = list(run_strategy(tiny_lm, _settings(patch_maps="residual")))
    started = next(e for e in events if isinstance(e, PatchingStarted))
    answer = int(clean.argmax())
    first, second = corrupted.topk(2).indices.tolist()
    assert started.answer_id == answer and started.foil_id == (second if first == answer else first)
    assert first == answer  # here the corrupted prompt's top token is the answer: the foil is its second
    # the answer named as the corrupted prompt's second token: the foil is then its top one
    assert tok(tok.decode([second]), add_special_tokens=False)["input_ids"] == [second]
    named = list(run_strategy(tiny_lm, _settings(patch_maps="residual", patch_answer=tok.decode([second]))))
    started = next(e for e in named if isinstance(e, PatchingStarted))
    assert (started.answer_id, started.foil_id) == (second, first)
    # both named: each its text's first token
    sat, on = (tok(t, add_special_tokens=False)["input_ids"][0] for t in (" sat", " on"))
    events = list(run_strategy(tiny_lm, _settings(patch_maps="residual", patch_answer=" sat", patch_foil=" on")))
    started = next(e for e in events if isinstance(e, PatchingStarted))
    assert (started.answer_id, started.foil_id) == (sat, on)
    assert started.answer_text == tok.decode([sat]) and started.foil_text == tok.decode([on])
    assert started.clean_diff == pytest.approx(float(clean[sat] - clean[on]), abs=1e-4)
    assert started.corrupted_diff == pytest.approx(float(corrupted[sat] - corrupted[on]), abs=1e-4)
    with pytest.raises(ConfigError, match=r"^--patch-answer and --patch-foil are the same token: the logit "
                                          r"difference is 0$"):
        list(run_strategy(tiny_lm, _settings(patch_answer=" sat", patch_foil=" sat")))


def test_a_named_answer_skips_the_tokenizers_special_tokens():
    from support.tiny_models import build_tiny_lm
    from tokenizers.processors import TemplateProcessing

    lm = build_tiny_lm(seed=0)
    bos = lm.tokenizer.bos_token_id
    lm.tokenizer._tokenizer.post_processor = TemplateProcessing(  # a BOS before every text, as Llama's adds
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    sat = lm.tokenizer(" sat", add_special_tokens=False)["input_ids"][0]
    on = lm.tokenizer(" on", add_special_tokens=False)["input_ids"][0]
    assert bos not in (sat, on)
    events = list(run_strategy(lm, _settings(patch_maps="residual", patch_answer=" sat", patch_foil=" on")))
    started = next(e for e in events if isinstance(e, PatchingStarted))
    assert (started.answer_id, started.foil_id) == (sat, on)


def test_the_patching_runs_events_progress_and_stop(tiny_lm):
    said: list[tuple[str, float]] = []
    context = RunContext(progress=lambda m, x: said.append((m, x)))
    events = list(run_strategy(tiny_lm, _settings(patch_maps="residual,attention"), context))
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    (prefill,) = [e for e in events if isinstance(e, PrefillDone)]
    assert (prefill.prompt_tokens, prefill.kv_cache_bytes, prefill.forward_passes, prefill.deferred_tokens) == (
        len(ids), 0, 2, 0)
    started = next(e for e in events if isinstance(e, PatchingStarted))
    assert started.layers == 2 and started.maps == ("residual", "attention")
    assert started.clean_tokens == tuple(tiny_lm.tokenizer.decode([i]) for i in ids)
    rows = [e for e in events if isinstance(e, PatchingRow)]
    assert [r.step for r in rows] == [0, 1, 2, 3] and all(0 <= r.seconds < 60 for r in rows)
    reports = [(m, x) for m, x in said if m.startswith("Patching")]
    assert reports == [("Patching the residual map: block 1 of 2", 0.25), ("Patching the residual map: block 2 of 2",
                       0.5), ("Patching the attention map: block 1 of 2", 0.75),
                       ("Patching the attention map: block 2 of 2", 1.0)]
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.stop_reason == "max_new_tokens"
    assert finished.stop_note == "every block patched at every position" and finished.token_ids == ()
    assert set(finished.figures) == {"residual_s", "attention_s"}
    assert all(0 <= v < 60 for v in finished.figures.values())
    # Stop during the second map: the figures of the map done, the note names the map cut
    polls: list[int] = []
    stopped = list(run_strategy(tiny_lm, _settings(patch_maps="residual,mlp"),
                                lambda: bool(polls.append(1)) or len(polls) >= 3))
    finished = stopped[-1]
    assert [(r.map, r.layer) for r in stopped if isinstance(r, PatchingRow)] == [
        ("residual", 0), ("residual", 1), ("mlp", 0)]
    assert finished.stop_reason == "stopped" and finished.stop_note == "stopped in the mlp map"
    assert set(finished.figures) == {"residual_s"}


def test_the_patching_refusals_say_what_to_change(tiny_lm):
    clean = len(tiny_lm.tokenizer(CLEAN)["input_ids"])
    dog = len(tiny_lm.tokenizer("a dog")["input_ids"])
    with pytest.raises(ConfigError, match=rf"^the clean and corrupted prompts must be the same number of tokens "
                                          rf"\(clean {clean}, corrupted {dog}\): change words for words of as many "
                                          r"tokens$"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                               groups=(PatchingSettings(corrupted="a dog"),))))
    with pytest.raises(ConfigError, match=r"^activation patching needs a corrupted prompt \(--corrupted\): the "
                                          r"prompt with a few words changed, e\.g\. 'The capital of Italy is' "
                                          r"against 'The capital of France is'$"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                               groups=(PatchingSettings(corrupted="   "),))))
    with pytest.raises(ConfigError, match=r"^the corrupted prompt is the clean one: change a few words in it$"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                               groups=(PatchingSettings(corrupted=CLEAN),))))
