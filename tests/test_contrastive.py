"""Contrastive decoding against independent references, on tiny random-weight models.

- A uniform amateur (an enormous amateur temperature) leaves only the expert: the output equals
  ``model.generate(do_sample=False)``, for every amateur kind and several α.
- Every step's expert and amateur log-probabilities, scores, plausibility flags, chosen token and "changed" flag
  equal a cache-free recomputation: two plain model calls (the expert, and a separate amateur model or the expert's
  quantized copy), log p_expert − log p_amateur written out.
- The layer amateur equals the final norm and LM head applied to ``output_hidden_states[layer]``.
- The plausibility cut is exact at its boundary (α equal to a token's p / max p keeps it; the next float up drops it).
- Sampling: the same seed gives the same run; the first step's draw is ``torch.multinomial`` of the normalised
  scores computed here, with a generator seeded the same way.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from runs import Run
from support.tiny_models import build_tiny_lm
from transformers import DynamicCache

from playground.config import ConfigError, RunSettings
from playground.engine.contrastive.scores import plausible_set
from playground.engine.strategies import run_strategy
from playground.engine.variants import quantized_copy
from playground.events import RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.models.loaded import LoadedModel

PROMPT = "the cat sat on the mat"
ATOL = 2e-4  # a cached decode step against a cache-free recomputation (float32)


def contrastive(lm, **settings) -> Run:
    settings = {"strategy": "contrastive", "prompt": PROMPT, **settings}
    return Run.from_events(run_strategy(lm, RunSettings.from_flat(**settings)))


def reference_generate(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=lm.tokenizer.pad_token_id,
                                do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, ids.shape[1]:].tolist()


def last_logits(model, ids: list[int]) -> torch.Tensor:
    """[vocab] float32 logits after ``ids``, one cache-free forward pass."""
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def layer_logits(model, ids: list[int], layer: int) -> torch.Tensor:
    """The final norm and LM head on ``output_hidden_states[layer]`` (index 0 is the embeddings) at the last
    position: [vocab] float32."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        assert layer < len(out.hidden_states) - 1, "the last hidden state is already normed"
        return model.lm_head(model.model.norm(out.hidden_states[layer][0, -1])).float()


def check_step(step: ContrastStep, token: TokenStep, expert: torch.Tensor, amateur: torch.Tensor, alpha: float,
               temperature: float, raw: torch.Tensor | None = None) -> None:
    """One step's recorded figures against the formula written out on reference logits (``expert`` after the
    penalties, ``raw`` before them when they differ)."""
    lp_e = expert.double().log_softmax(dim=-1)
    lp_a = (amateur.double() / temperature).log_softmax(dim=-1)
    ratio = (lp_e - lp_e.max()).exp()
    plausible = ratio >= alpha
    scores = torch.where(plausible, lp_e - lp_a, torch.tensor(-math.inf, dtype=torch.float64))
    probs = scores.softmax(dim=-1)
    assert step.plausible_count == int(plausible.sum())
    assert step.cut_logprob == pytest.approx(float(lp_e.max()) + math.log(alpha), abs=ATOL)
    assert step.expert_token_id == int(lp_e.argmax())
    assert step.contrast_token_id == int(scores.argmax())
    assert step.changed == (step.contrast_token_id != int(lp_e.argmax()))
    for c in step.candidates:
        assert c.expert_logprob == pytest.approx(float(lp_e[c.token_id]), abs=ATOL)
        assert c.amateur_logprob == pytest.approx(float(lp_a[c.token_id]), abs=ATOL)
        assert c.plausible == bool(plausible[c.token_id])
        if c.plausible:
            assert c.score == pytest.approx(float(lp_e[c.token_id] - lp_a[c.token_id]), abs=2 * ATOL)
        else:
            assert c.score == -math.inf
        assert c.prob == pytest.approx(float(probs[c.token_id]), abs=ATOL)
        assert c.expert_rank == int((lp_e > lp_e[c.token_id]).sum()) + 1
    # The recorded set: the expert's top 10 and the 10 best plausible scores, in the expert's order.
    recorded = {c.token_id for c in step.candidates}
    assert set(torch.topk(lp_e, 10).indices.tolist()) <= recorded
    assert set(torch.topk(scores, min(10, int(plausible.sum()))).indices.tolist()) <= recorded
    assert [c.expert_rank for c in step.candidates] == sorted(c.expert_rank for c in step.candidates)
    # The token event: raw = the expert, processed = the normalised contrast distribution.
    assert token.step == step.step and token.token_id == step.token_id
    raw_lp = lp_e if raw is None else raw.double().log_softmax(dim=-1)
    assert token.raw_prob == pytest.approx(float(raw_lp[token.token_id].exp()), abs=ATOL)
    assert token.prob == pytest.approx(float(probs[token.token_id]), abs=ATOL)


@pytest.fixture(scope="module")
def deep_lm():
    return build_tiny_lm(seed=5, layers=4)


@pytest.fixture(scope="module")
def amateur_folder(tiny_lm, tmp_path_factory) -> str:
    """Another tiny model with the same tokenizer, saved as a folder (the model amateur loads a folder)."""
    other = build_tiny_lm(seed=2)
    folder = tmp_path_factory.mktemp("amateur")
    other.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    return str(folder)


# ------------------------------------------------------------------------------------ a uniform amateur = greedy
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("amateur", ["layer", "quantized"])
def test_a_uniform_amateur_leaves_expert_greedy(tiny_lm, amateur, alpha):
    run = contrastive(tiny_lm, amateur=amateur, amateur_quant="rtn-int8", alpha=alpha, amateur_temperature=1e12,
                      max_new_tokens=24)
    assert run.ids == reference_generate(tiny_lm, run.prompt_ids, 24)
    assert not any(s.changed for s in run.of(ContrastStep))
    assert all(c.amateur_logprob == pytest.approx(-math.log(len(tiny_lm.tokenizer)), abs=1e-5)
               for s in run.of(ContrastStep) for c in s.candidates)


def test_a_uniform_model_amateur_leaves_expert_greedy(tiny_lm, amateur_folder):
    run = contrastive(tiny_lm, amateur="model", amateur_model=amateur_folder, amateur_temperature=1e12,
                      max_new_tokens=16)
    assert run.ids == reference_generate(tiny_lm, run.prompt_ids, 16)


# -------------------------------------------------------------------------------- scores = the formula, written out
def test_model_amateur_scores_equal_two_independent_models(tiny_lm, amateur_folder):
    amateur = build_tiny_lm(seed=2).model  # the same weights as the saved folder, loaded independently
    run = contrastive(tiny_lm, amateur="model", amateur_model=amateur_folder, alpha=0.05, amateur_temperature=0.7,
                      max_new_tokens=12)
    assert any(s.changed for s in run.of(ContrastStep)) and any(not s.changed for s in run.of(ContrastStep)), \
        "precondition: both kinds"
    assert run.first(ContrastiveStarted).amateur == "model" and run.first(ContrastiveStarted).alpha == 0.05
    for step, token in zip(run.of(ContrastStep), run.steps, strict=True):
        ids = run.prompt_ids + run.ids[: step.step]
        check_step(step, token, last_logits(tiny_lm.model, ids), last_logits(amateur, ids), 0.05, 0.7)


def test_tokens_a_narrower_amateur_lacks_score_minus_infinity(tiny_lm, amateur_folder):
    """An expert with 8 more LM-head rows than the amateur (a larger model of a family pads its head further),
    those rows copies of the rows of its 8 likeliest first tokens, so they are plausible: the amateur has no
    opinion on them, and they score −∞ (never chosen), the others log p_e − log p_a as written out here."""
    expert = copy.deepcopy(tiny_lm.model)
    vocab = expert.get_output_embeddings().weight.shape[0]
    prompt_ids = contrastive(tiny_lm, max_new_tokens=1).prompt_ids
    top = last_logits(tiny_lm.model, prompt_ids).topk(8).indices
    expert.resize_token_embeddings(vocab + 8, mean_resizing=False)
    with torch.no_grad():
        head = expert.get_output_embeddings().weight
        head[vocab:] = head[top]
    wide = LoadedModel(model=expert, tokenizer=tiny_lm.tokenizer, name="tiny-wide", path="<memory>",
                       device=tiny_lm.device, dtype=tiny_lm.dtype)
    amateur = build_tiny_lm(seed=2).model  # the saved folder's weights, loaded independently
    alpha, temperature = 0.1, 0.7
    run = contrastive(wide, amateur="model", amateur_model=amateur_folder, alpha=alpha,
                      amateur_temperature=temperature, max_new_tokens=8)
    lacked = 0
    for step in run.of(ContrastStep):
        ids = run.prompt_ids + run.ids[: step.step]
        lp_e = last_logits(expert, ids).double().log_softmax(dim=-1)  # [vocab + 8]
        lp_a = (last_logits(amateur, ids).double() / temperature).log_softmax(dim=-1)  # [vocab]
        plausible = (lp_e - lp_e.max()).exp() >= alpha
        scores = torch.full_like(lp_e, -math.inf)
        scores[:vocab] = torch.where(plausible[:vocab], lp_e[:vocab] - lp_a, torch.tensor(-math.inf).double())
        lacked += int(plausible[vocab:].sum())
        assert step.contrast_token_id == int(scores.argmax()) and step.contrast_token_id < vocab
        for c in step.candidates:
            if c.token_id >= vocab:
                assert c.score == -math.inf and c.prob == 0.0
    assert lacked > 0, "precondition: tokens the amateur lacks are plausible under the expert"
    assert all(t < vocab for t in run.ids)


def test_quantized_amateur_scores_equal_its_own_recomputation(tiny_lm):
    copy_ = quantized_copy(tiny_lm, "rtn-int4")
    run = contrastive(tiny_lm, amateur="quantized", amateur_quant="rtn-int4", max_new_tokens=10,
                      repetition_penalty=1.3)
    assert any(s.changed for s in run.of(ContrastStep)), "precondition: the contrast changed something"
    for step, token in zip(run.of(ContrastStep), run.steps, strict=True):
        ids = run.prompt_ids + run.ids[: step.step]
        raw = last_logits(tiny_lm.model, ids)
        expert = raw.clone()  # through the repetition penalty first (CTRL's rule)
        seen = torch.tensor(sorted(set(ids)))
        expert[seen] = torch.where(expert[seen] < 0, expert[seen] * 1.3, expert[seen] / 1.3)
        check_step(step, token, expert, last_logits(copy_, ids), 0.1, 1.0, raw=raw)


def test_layer_amateur_is_the_lens_of_its_layer(deep_lm):
    run = contrastive(deep_lm, amateur_layer=2, amateur_temperature=1.5, alpha=0.2, max_new_tokens=10)
    assert run.first(ContrastiveStarted).amateur_layer == 2 and run.first(ContrastiveStarted).layers == 4
    assert any(s.changed for s in run.of(ContrastStep)), "precondition: the contrast changed something"
    for step, token in zip(run.of(ContrastStep), run.steps, strict=True):
        ids = run.prompt_ids + run.ids[: step.step]
        check_step(step, token, last_logits(deep_lm.model, ids), layer_logits(deep_lm.model, ids, 2), 0.2, 1.5)


def test_the_default_amateur_layer_is_half_way_up(deep_lm, tiny_lm):
    assert contrastive(deep_lm, max_new_tokens=1).first(ContrastiveStarted).amateur_layer == 2
    assert contrastive(tiny_lm, max_new_tokens=1).first(ContrastiveStarted).amateur_layer == 1


# ------------------------------------------------------------------------------------------- the cut's boundary
def first_step_expert_logprobs(lm, prompt_ids: list[int]) -> torch.Tensor:
    """The expert's step-0 log-probabilities computed as a decode does (prefill all but the last prompt token,
    then read it through the cache): bit for bit what the engine sees."""
    with torch.no_grad():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([prompt_ids[:-1]]), cache=cache, use_cache=True)
        logits = lm.model(input_ids=torch.tensor([prompt_ids[-1:]]), cache=cache, use_cache=True).logits[0, -1]
    return logits.float().log_softmax(dim=-1)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_the_cut_is_exact_at_its_boundary(tiny_lm, k):
    prompt_ids = contrastive(tiny_lm, max_new_tokens=1).prompt_ids
    lp = first_step_expert_logprobs(tiny_lm, prompt_ids)
    ratios = (lp.double() - lp.double().max()).exp()  # p / max p
    ordered = torch.sort(ratios, descending=True).values
    assert ordered[k - 1] > ordered[k], "precondition: no tie at the k-th token"
    at = float(ordered[k - 1])  # α exactly the k-th token's p / max p: it is in, the (k+1)-th is out
    cases = [(at, k)]
    if k > 1:
        cases.append((math.nextafter(at, 2.0), k - 1))  # the next float up: the k-th token is out
    for alpha, count in cases:
        step = contrastive(tiny_lm, alpha=alpha, max_new_tokens=1).of(ContrastStep)[0]
        assert step.plausible_count == count
        inside = {c.token_id for c in step.candidates if c.plausible}
        assert inside == set(torch.topk(ratios, count).indices.tolist()) & {c.token_id for c in step.candidates}
        assert len(inside) == count  # every plausible token is among the recorded ones here


def test_plausible_set_keeps_ties_and_drops_zero_probability():
    lp = torch.tensor([-1.0, -2.0, -2.0, -3.0, -3.0, -math.inf])  # p / max p: 1, e^-1 (twice), e^-2 (twice), 0
    mask, cut = plausible_set(lp, 0.3)
    assert mask.tolist() == [True, True, True, False, False, False]
    assert cut == pytest.approx(-1.0 + math.log(0.3))
    assert plausible_set(lp, 0.0)[0].tolist() == [True] * 5 + [False]  # p > 0 still required
    assert plausible_set(lp, 1.0)[0].tolist() == [True] + [False] * 5


# ---------------------------------------------------------------------------------------------------- sampling
def test_sampled_runs_are_reproducible(tiny_lm):
    first = contrastive(tiny_lm, contrast_sample=True, seed=11, max_new_tokens=16, alpha=0.02)
    again = contrastive(tiny_lm, contrast_sample=True, seed=11, max_new_tokens=16, alpha=0.02)
    assert first.ids == again.ids
    others = [contrastive(tiny_lm, contrast_sample=True, seed=s, max_new_tokens=16, alpha=0.02).ids for s in (1, 2)]
    assert any(ids != first.ids for ids in others)


def test_a_sampled_step_draws_from_the_normalised_scores(tiny_lm):
    """The first step's distribution, computed here bit for bit as the engine computes it (the cached expert pass,
    its layer-1 output through norm and LM head), and the draw: ``torch.multinomial`` with the run's seed."""
    prompt_ids = contrastive(tiny_lm, max_new_tokens=1).prompt_ids
    with torch.no_grad():
        cache = DynamicCache(config=tiny_lm.model.config)
        tiny_lm.model(input_ids=torch.tensor([prompt_ids[:-1]]), cache=cache, use_cache=True)
        out = tiny_lm.model(input_ids=torch.tensor([prompt_ids[-1:]]), cache=cache, use_cache=True,
                            output_hidden_states=True)
        amateur = tiny_lm.model.lm_head(tiny_lm.model.model.norm(out.hidden_states[1][0, -1:]))[0].float()
    lp_e = out.logits[0, -1].float().log_softmax(dim=-1)
    lp_a = amateur.log_softmax(dim=-1)
    plausible = (lp_e.double() - lp_e.double().max()).exp() >= 0.02
    probs = torch.where(plausible, lp_e - lp_a, torch.tensor(-math.inf)).softmax(dim=-1)[None]
    assert int((probs > 0).sum()) == int(plausible.sum()) > 3, "precondition: a plausible set to draw from"
    draws = set()
    for seed in range(24):
        run = contrastive(tiny_lm, contrast_sample=True, seed=seed, alpha=0.02, max_new_tokens=1)
        expected = int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).item())
        assert run.ids == [expected]
        assert run.steps[0].prob == pytest.approx(float(probs[0, expected]), rel=1e-6)
        draws.add(expected)
    assert len(draws) > 1  # the draw really varies with the seed


def test_the_sampler_settings_act_on_the_scores(tiny_lm):
    """top-k 1 on the scores: a sampled run is the greedy contrastive run, whatever the seed."""
    greedy = contrastive(tiny_lm, max_new_tokens=12, alpha=0.02)
    for seed in (0, 5):
        assert contrastive(tiny_lm, contrast_sample=True, top_k=1, seed=seed, max_new_tokens=12,
                           alpha=0.02).ids == greedy.ids


# ------------------------------------------------------------------------------------------ ends, branches, errors
def test_ends_at_eos_stop_strings_and_stop(tiny_lm, tiny_lm_eos):
    eos = contrastive(tiny_lm_eos, max_new_tokens=64, amateur_temperature=1e12)
    assert eos.done.stop_reason == "eos" and eos.ids[-1] in tiny_lm_eos.eos_token_ids
    assert eos.ids == reference_generate(tiny_lm_eos, eos.prompt_ids, 64)
    full = contrastive(tiny_lm, max_new_tokens=20)
    text = "".join(t.text for t in full.steps)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "precondition: a stop string to look for"
    cut = contrastive(tiny_lm, max_new_tokens=20, stop_strings=(stop,))
    assert cut.done.stop_reason == "stop_string" and stop in "".join(t.text for t in cut.steps)
    assert cut.ids == full.ids[: len(cut.ids)] and len(cut.ids) < 20
    calls = iter(range(100))
    stopped = Run.from_events(run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", prompt=PROMPT,
                                                                          max_new_tokens=20),
                                           should_stop=lambda: next(calls) >= 4))
    assert stopped.done.stop_reason == "stopped" and 0 < len(stopped.ids) < 20
    assert full.done.stop_reason == "max_new_tokens" and len(full.ids) == 20


def test_forced_tokens_branch_and_the_contrast_still_records_its_choice(tiny_lm):
    plain = contrastive(tiny_lm, max_new_tokens=6)
    forced = (plain.of(ContrastStep)[0].candidates[-1].token_id, 100)
    run = contrastive(tiny_lm, max_new_tokens=6, forced_token_ids=forced)
    assert tuple(run.ids[:2]) == forced
    assert [s.forced for s in run.of(ContrastStep)] == [True, True, False, False, False, False]
    # the same first step, overruled
    assert run.of(ContrastStep)[0].contrast_token_id == plain.of(ContrastStep)[0].token_id
    assert all(t.forced == s.forced for t, s in zip(run.steps, run.of(ContrastStep), strict=True))


def test_settings_are_checked_before_the_first_event(tiny_lm, tmp_path):
    with pytest.raises(ConfigError, match=r"amateur_layer must be between 1 and 1 for this 2-layer model \(got 2;"):
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", amateur_layer=2))
    with pytest.raises(ConfigError, match="the model amateur needs --amateur-model PATH"):
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", amateur="model"))
    with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\] \(got 1.5\)"):
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", alpha=1.5))


def test_a_model_amateur_with_another_tokenizer_is_refused(tiny_lm, tmp_path):
    from support.tiny_models import build_tokenizer

    other = build_tiny_lm(seed=3)
    tokenizer = build_tokenizer(vocab_size=300)
    other.model.save_pretrained(tmp_path / "foreign")
    tokenizer.save_pretrained(tmp_path / "foreign")
    with pytest.raises(ConfigError, match=r"^amateur model: the draft model foreign does not share"):
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="contrastive", amateur="model",
                                                    amateur_model=str(tmp_path / "foreign")))


def test_events_order_figures_and_round_trip(tiny_lm):
    run = contrastive(tiny_lm, max_new_tokens=8, contrast_baseline=8, alpha=0.3)
    kinds = [e.type for e in run.events]
    assert kinds[:3] == ["start", "contrast_start", "prefill"] and kinds[-1] == "done"
    assert kinds[3:-1] == ["contrast", "token"] * 8  # each step's contrast event right before its token event
    assert [s.step for s in run.of(ContrastStep)] == list(range(8))
    assert any(c.score == -math.inf for s in run.of(ContrastStep) for c in s.candidates), \
        "precondition: a cut candidate"
    for event in run.events:
        assert event_from_dict(json.loads(dumps_event(event))) == event
    figures = run.done.figures
    assert figures["changed_steps"] == sum(s.changed for s in run.of(ContrastStep))
    assert figures["mean_plausible"] == pytest.approx(sum(s.plausible_count for s in run.of(ContrastStep)) / 8)
    assert figures["greedy_tokens_per_s"] > 0 and figures["step_cost"] > 0
    greedy = reference_generate(tiny_lm, run.prompt_ids, 8)
    same = [a == b for a, b in zip(run.ids, greedy, strict=True)]
    assert figures["first_divergence"] == (same.index(False) if False in same else -1)
    # The plausibility cut shows in the token events as a processor that removed the implausible candidates.
    cut = [c for t in run.steps for c in t.candidates if c.cut_by == "plausibility"]
    assert cut and all(c.processed_prob == 0.0 for c in cut)
    assert "greedy_tokens_per_s" not in contrastive(tiny_lm, max_new_tokens=2).done.figures


# --------------------------------------------------------------------------------------------- the default model
@pytest.mark.model
def test_the_preset_on_the_default_model(default_lm):
    """What the preset says users will see: greedy's wrong explanation, the contrast's right one; and the real
    model's layer amateur equals an independent lens computation at two steps."""
    from playground.presets import load_preset

    preset = load_preset("contrastive-early-layer")
    run = Run.from_events(run_strategy(default_lm, preset.settings))
    greedy = list(run_strategy(default_lm, preset.settings.replace(strategy="greedy")))[-1]
    assert isinstance(greedy, RunFinished)
    assert "reflects off the surface of the Earth" in greedy.text
    assert run.done.text.startswith("A rainbow is formed when sunlight interacts with water droplets suspended in "
                                    "the atmosphere")
    assert run.first(ContrastiveStarted).amateur_layer == 15 and 0.2 < run.done.figures["changed_fraction"] < 0.6
    for index in (0, 20):
        step = run.of(ContrastStep)[index]
        ids = run.prompt_ids + run.ids[:index]
        check_step(step, run.steps[index], last_logits(default_lm.model, ids),
                   layer_logits(default_lm.model, ids, 15), 0.1, 1.0)
