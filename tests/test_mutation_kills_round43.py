"""Tests written to kill the survivors of round 43's mutation run over prompt salience and activation patching
(playground/engine/attribution, issue 28, point 4): 116 of 1,146 mutants survived the earlier tests. Each test names
the bug it catches; references are computed here (ranks by hand, logits by plain forwards, gradients summed in
float64)."""

from __future__ import annotations

import copy
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.config.patching import PatchingSettings
from playground.engine.attribution import patching_run
from playground.engine.attribution.patching import Patcher, _first, _hidden_of, patch_map_rows
from playground.engine.attribution.salience import (
    TargetLogprob,
    _gradient,
    ig_points,
    integrated_gradients,
    occlusion,
    ranks,
    salience_events,
    spearman,
)
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted
from playground.events.patching import PatchingRow, PatchingStarted
from playground.events.salience import SalienceMap
from playground.models.loaded import LoadedModel

CLEAN, CORRUPTED = "the cat sat on the mat", "the mat sat on the cat"  # the same number of tokens


# --- salience.py: ranks and Spearman's rho -----------------------------------------------------------------------

def test_ranks_give_ties_their_mean_rank():
    """Ranks by hand: ties share the mean of the places they take (kills x_ranks 28, 29, 32: the rank shifted or
    scaled, which Spearman's rho of untied values cannot see)."""
    np.testing.assert_array_equal(ranks(np.array([3.0, 1.0, 1.0, 2.0])), [4.0, 1.5, 1.5, 3.0])
    np.testing.assert_array_equal(ranks(np.array([5.0, 5.0, 5.0])), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(ranks(np.array([0.5, 2.0, 2.0])), [1.0, 2.5, 2.5])


def test_spearman_of_two_values_and_of_ties():
    """Two values: the centred ranks' norm is 1/2, below 1 (kills x_spearman 27: ``denominator > 1``); ties by the
    formula (Pearson's r of the mean ranks, computed here)."""
    assert spearman([1.0, 2.0], [2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0], [3.0, 7.0]) == pytest.approx(1.0)
    a, b = [1.0, 1.0, 2.0, 3.0], [4.0, 3.0, 2.0, 2.0]
    ra, rb = np.array([1.5, 1.5, 3.0, 4.0]), np.array([4.0, 3.0, 1.5, 1.5])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    assert spearman(a, b) == pytest.approx(float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum())))
    assert np.isnan(spearman([1.0, 1.0], [1.0, 2.0]))


# --- salience.py: occlusion's batches, Stop in integrated gradients, a bfloat16 model -----------------------------

def _batch_sizes(lm, call):
    """The batch size of every forward ``call`` makes."""
    sizes: list[int] = []
    handle = lm.model.register_forward_pre_hook(
        lambda _m, args, kwargs: sizes.append(int(kwargs["inputs_embeds"].shape[0])), with_kwargs=True)
    try:
        result = call()
    finally:
        handle.remove()
    return sizes, result


@pytest.mark.parametrize("batch", [4, 16])
def test_occlusion_occludes_each_group_once(tiny_lm, batch):
    """One pass for the context, then the groups in batches of ``batch``, each group once (kills x_occlusion 19, an
    extra empty group, and 32, batches that start one group apart and overlap: same scores, up to 16× the
    passes)."""
    ids = tiny_lm.tokenizer("the cat sat on the mat and the dog sat on the log")["input_ids"]
    f = TargetLogprob(tiny_lm, ids, 5)
    n = len(ids)
    sizes, scores = _batch_sizes(tiny_lm, lambda: occlusion(f, 0, batch=batch))
    assert sizes == [1, *(min(batch, n - s) for s in range(0, n, batch))]
    assert len(scores) == n


def test_stop_before_integrated_gradients_makes_no_map(tiny_lm):
    """salience_events hands its stop check to integrated gradients (kills x_salience_events 117: None passed, so a
    Stop during IG's 32 points went unheard until the map was done)."""
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    events = list(salience_events(tiny_lm, ids, [5], 0, ("integrated_gradients",), should_stop=lambda: True))
    assert events == []


@pytest.fixture(scope="module")
def tiny_bf16(tiny_lm):
    model = copy.deepcopy(tiny_lm.model).to(torch.bfloat16)
    return LoadedModel(model=model, tokenizer=tiny_lm.tokenizer, name="tiny-llama-bf16", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.bfloat16)


def test_integrated_gradients_on_a_bfloat16_model_sums_in_float32(tiny_bf16):
    """On a bfloat16 model the path's points are made in the model's dtype and the weighted gradients summed in
    float32 (kills x_integrated_gradients 20, 22: the sum kept in bfloat16, 8 bits of mantissa; 34, 37: the
    alphas in float32, which makes float32 embeddings that the bfloat16 blocks refuse). The reference sums the
    same points' gradients in float64 here."""
    ids = tiny_bf16.tokenizer(CLEAN)["input_ids"]
    f = TargetLogprob(tiny_bf16, ids, 5)
    steps = 24
    scores, _ = integrated_gradients(f, 0, steps, "riemann_trapezoid", batch=8)
    alphas, weights = ig_points(steps, "riemann_trapezoid")
    e = f.embed(f.ids).detach()
    b = f.embed(torch.full_like(f.ids, 0)).detach()
    total = torch.zeros(e.shape, dtype=torch.float64)
    with torch.inference_mode(False), torch.enable_grad():
        for start in range(0, steps, 8):
            a = torch.tensor(alphas[start:start + 8], dtype=torch.bfloat16)[:, None, None]
            grads = _gradient(f, b + a * (e - b)).double()
            total += (grads * torch.tensor(weights[start:start + 8], dtype=torch.float64)[:, None, None]).sum(0)
    expected = ((e - b).double() * total).sum(-1)[0].numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6)


# --- patching.py: the hooks' helpers, a one-block model ------------------------------------------------------------

def test_the_hooks_read_hidden_states_given_by_name_and_tuple_outputs():
    """A block called with ``hidden_states=`` by keyword, and a module whose output is a tuple (kills x__hidden_of 2,
    4, 5 and x__first 5, 7): the families tested here pass the hidden states by position and return tensors."""
    h, other = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    assert _hidden_of((), {"hidden_states": h}) is h
    assert _hidden_of((h,), {"hidden_states": other}) is h
    assert _first((h, other)) is h
    assert _first(h) is h


def _logit_diff_by_hand(lm, ids, answer, foil):
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    return float(logits[answer] - logits[foil])


def test_patching_a_one_block_model():
    """The rows' length is the prompt's, read from block 0 (kills x_patch_map_rows 22: block 1's, which a one-block
    model has not); each changed position's share against a forward with that position's embedding made clean."""
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(seed=3, layers=1)
    clean_ids = lm.tokenizer(CLEAN)["input_ids"]
    corrupted_ids = lm.tokenizer(CORRUPTED)["input_ids"]
    patcher = Patcher(lm)
    clean, corrupted = patcher.record(clean_ids), patcher.record(corrupted_ids)
    change = clean.logits - corrupted.logits  # the pair whose difference the corruption moves most
    answer, foil = int(change.argmax()), int(change.argmin())
    clean_diff = _logit_diff_by_hand(lm, clean_ids, answer, foil)
    corrupted_diff = _logit_diff_by_hand(lm, corrupted_ids, answer, foil)
    ((layer, share, _),) = list(patch_map_rows(patcher, "residual", clean, corrupted, answer, foil))
    assert layer == 0 and len(share) == len(clean_ids)
    differ = [p for p in range(len(clean_ids)) if clean_ids[p] != corrupted_ids[p]]
    embed = lm.model.get_input_embeddings()
    for p in differ:  # by hand: the corrupted prompt with position p's embedding made the clean one
        with torch.no_grad():
            embeds = embed(torch.tensor([corrupted_ids]))
            embeds[0, p] = embed(torch.tensor([clean_ids[p]]))[0]
            logits = lm.model(inputs_embeds=embeds).logits[0, -1].float()
        by_hand = (float(logits[answer] - logits[foil]) - corrupted_diff) / (clean_diff - corrupted_diff)
        assert share[p] == pytest.approx(by_hand, rel=1e-3, abs=1e-4)
    same = [p for p in range(len(clean_ids)) if clean_ids[p] == corrupted_ids[p]]
    assert same and all(share[p] == 0.0 for p in same)


# --- patching_run.py: the answer's and foil's refusals, the refusal of equal differences, the run's events -------

def _no_tokens_lm():
    return SimpleNamespace(tokenizer=lambda text, add_special_tokens: {"input_ids": []})


def test_an_answer_or_foil_that_encodes_to_no_token_is_refused_by_its_flag():
    """(kills x__token 10 and x_answer_and_foil 6, 10, 11, 16, 20, 21: the message, or the flag it names)"""
    logits = torch.tensor([0.0, 2.0, 1.0])
    with pytest.raises(ConfigError, match=r"^--patch-answer 'zz' encodes to no token$"):
        patching_run.answer_and_foil(_no_tokens_lm(), PatchingSettings(corrupted="x", patch_answer="zz"),
                                     logits, logits)
    with pytest.raises(ConfigError, match=r"^--patch-foil ' zz' encodes to no token$"):
        patching_run.answer_and_foil(_no_tokens_lm(), PatchingSettings(corrupted="x", patch_foil=" zz"),
                                     logits, logits)


def test_two_prompts_with_the_same_logit_difference_are_refused():
    """A tiny GPT-2 made so that the answer's logit is 2 and the foil's 1 after any prompt: its final LayerNorm
    writes exactly 1 in one coordinate (gain 0, bias 1) and the two head rows are 2 and 1 there and 0 elsewhere.
    Both prompts' difference is exactly 1, so there is nothing to recover (kills x_run_patching 82: the sum of the
    differences compared, 2; and 85–89: the refusal's text)."""
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(seed=0, family="gpt2")
    tok = lm.tokenizer
    answer, foil = (tok(t, add_special_tokens=False)["input_ids"][0] for t in ("z", "q"))
    ids = {*tok(CLEAN)["input_ids"], *tok(CORRUPTED)["input_ids"]}
    assert answer != foil and not {answer, foil} & ids, "precondition: neither token is in the prompts"
    final_norm = lm.model.transformer.ln_f
    head = lm.model.get_output_embeddings()
    with torch.no_grad():
        final_norm.weight[0], final_norm.bias[0] = 0.0, 1.0
        head.weight[answer] = 0.0
        head.weight[foil] = 0.0
        head.weight[answer, 0], head.weight[foil, 0] = 2.0, 1.0
    for text in (CLEAN, CORRUPTED):
        assert _logit_diff_by_hand(lm, tok(text)["input_ids"], answer, foil) == 1.0, "precondition"
    settings = RunSettings(strategy="patching", prompt=CLEAN, chat=False, groups=(
        PatchingSettings(corrupted=CORRUPTED, patch_answer="z", patch_foil="q"),))
    with pytest.raises(ConfigError, match=r"^the two prompts give the same logit difference: nothing to recover "
                                          r"\(choose another --patch-answer / --patch-foil\)$"):
        list(run_strategy(lm, settings))


def _patching(**patching):
    return RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                       groups=(PatchingSettings(corrupted=CORRUPTED, **patching),))


def _one_forward_ms(lm, ids):
    times = []
    for _ in range(5):
        start = time.perf_counter()
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([ids]), use_cache=False)
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


@pytest.mark.parametrize("stop_after", [None, 1])
def test_the_patching_runs_start_prefill_and_end_events(tiny_lm, stop_after):
    """The start event carries the clean prompt's text, PatchingStarted the corrupted prompt's tokens, the read's
    time is in milliseconds in both PrefillDone and the final event, and the end has no text and no speed (kills
    x_run_patching 52–54, 96, 105 and x__rows 11, 27, 64, 66, 119, 126, 129, 140, 147, 150)."""
    polls: list[int] = []
    stop = None if stop_after is None else (lambda: bool(polls.append(1)) or len(polls) >= stop_after)
    start = time.perf_counter()
    events = list(run_strategy(tiny_lm, _patching(patch_maps="residual"), stop))
    wall_ms = (time.perf_counter() - start) * 1000
    ids = tiny_lm.tokenizer(CLEAN)["input_ids"]
    started = events[0]
    assert isinstance(started, RunStarted) and started.prompt_text == CLEAN
    patching = next(e for e in events if isinstance(e, PatchingStarted))
    corrupted_ids = tiny_lm.tokenizer(CORRUPTED)["input_ids"]
    assert patching.corrupted_tokens == tuple(tiny_lm.tokenizer.decode([i]) for i in corrupted_ids)
    (prefill,) = [e for e in events if isinstance(e, PrefillDone)]
    # two recorded forwards: at least a fifth of one plain forward, and less than the whole run took
    assert isinstance(prefill.prefill_ms, float)
    assert 0.2 * _one_forward_ms(tiny_lm, ids) < prefill.prefill_ms < wall_ms
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.prefill_ms == prefill.prefill_ms
    assert finished.text == "" and finished.tokens_per_s == 0.0
    rows = [e for e in events if isinstance(e, PatchingRow)]
    assert finished.stop_reason == ("max_new_tokens" if stop_after is None else "stopped")
    assert len(rows) == (2 if stop_after is None else 1)


def test_word_occlusion_through_the_salience_run(tiny_lm):
    """``--occlude word`` reaches the maps from a run (kills x__with_salience 34: the setting dropped, so the run's
    occlusion hid single tokens)."""
    settings = RunSettings.from_flat(strategy="greedy", prompt="The capital of France is", chat=False,
                                     max_new_tokens=2, salience="occlusion", salience_step=0, occlude="word")
    events = list(run_strategy(tiny_lm, settings))
    (made,) = [e for e in events if isinstance(e, SalienceMap)]
    assert made.detail.startswith("each word (all its tokens) replaced by")
