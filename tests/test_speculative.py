"""Speculative decoding against independent references.

Greedy: the token ids equal ``model.generate(do_sample=False)`` (and transformers' own assisted generation) for
every drafter; every round's verdict is recomputed from a plain, cache-free forward pass of the target. Sampling:
the emitted tokens' frequencies equal the target's processed distribution, and the tokens drawn after a rejection
follow normalise(max(0, p - q)), with p and q computed here from the models' logits. The KV caches after each
rollback are compared with fresh prefills of the confirmed tokens.
"""

from __future__ import annotations

import copy
import functools
import json
import math

import pytest
import torch
from runs import Run
from support.tiny_models import build_tiny_lm, build_tokenizer
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from playground.config import ConfigError, RunSettings
from playground.engine.speculative import decode as decode_module
from playground.engine.speculative.drafters import lookup_continuation
from playground.engine.speculative.verify import residual_distribution, verify_greedy, verify_sampled
from playground.engine.strategies import run_strategy
from playground.engine.variants import quantized_copy
from playground.events import PrefillDone, TokenStep, dumps_event, event_from_dict
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.models.loaded import LoadedModel

# Chi-square critical values at the 0.1% level, by degrees of freedom.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59,
            11: 31.26, 12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70}


# ---------------------------------------------------------------------------------------------------- helpers


def spec(lm: LoadedModel, **settings) -> Run:
    settings = {"strategy": "speculative", "baseline_tokens": 0, **settings}
    return Run.from_events(run_strategy(lm, RunSettings.from_flat(**settings)))


def reference_generate(lm: LoadedModel, prompt_ids: list[int], **kwargs) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=lm.tokenizer.pad_token_id,
                                do_sample=False, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def all_logits(model, ids: list[int]) -> torch.Tensor:
    """Raw logits [len(ids), vocab] of one plain forward pass, no cache, float64."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)]), use_cache=False).logits[0].double()


def first_layers_logits(model, ids: list[int], n_layers: int) -> torch.Tensor:
    """What the target's first ``n_layers`` layers + final norm + LM head predict, [len(ids), vocab] float64: the
    hidden state after layer n from ``output_hidden_states`` (index 0 is the embeddings), normed, through lm_head."""
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[n_layers]
        assert n_layers < len(out.hidden_states) - 1, "the last hidden state is already normed"
        return model.lm_head(model.model.norm(hidden))[0].double()


def transformers_processors(penalties: dict) -> LogitsProcessorList:
    """transformers' own processors for the penalties (the reference for the processed argmax)."""
    out = LogitsProcessorList()
    if penalties.get("repetition_penalty", 1.0) != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(penalties["repetition_penalty"]))
    if penalties.get("no_repeat_ngram_size", 0):
        out.append(NoRepeatNGramLogitsProcessor(penalties["no_repeat_ngram_size"]))
    return out


def processed_rows(logits: torch.Tensor, ids: list[int], start: int, rows: int, penalties: dict) -> torch.Tensor:
    """Processed logits for positions ``start .. start + rows - 1`` of ``ids``: row j predicts the token after
    ids[: start + j + 1] and is processed with that prefix."""
    processors = transformers_processors(penalties)
    out = []
    for j in range(rows):
        prefix = torch.tensor([ids[: start + j + 1]])
        out.append(processors(prefix, logits[start + j : start + j + 1].clone())[0])
    return torch.stack(out)


def top_k_probs(logits: torch.Tensor, k: int, temperature: float) -> dict[int, float]:
    """softmax(logits / T) over the top-k, renormalised, as {token: prob}; asserts no tie at the k-th logit."""
    top = torch.topk(logits, k + 1)
    assert top.values[k - 1] > top.values[k], "a tie at the k-th logit would make the top-k set ambiguous"
    probs = torch.softmax(top.values[:k] / temperature, dim=-1)
    return dict(zip(top.indices[:k].tolist(), probs.tolist(), strict=True))


def chi_square(counts: dict[int, int], expected: dict[int, float], total: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; every expected count must be at least 5."""
    assert set(counts) <= set(expected), f"tokens outside the support: {set(counts) - set(expected)}"
    assert sum(counts.values()) == total
    assert min(total * p for p in expected.values()) >= 5, "chi-square needs expected counts of at least 5"
    chi2 = sum((counts.get(t, 0) - total * p) ** 2 / (total * p) for t, p in expected.items())
    return chi2, len(expected) - 1


def binned(expected: dict[int, float], total: int) -> list[set[int]]:
    """Fixed bins (from the expected distribution only): a token per bin where its expected count is >= 5, the
    rest merged with the smallest such bin."""
    big = [t for t, p in expected.items() if total * p >= 5]
    small = {t for t, p in expected.items() if total * p < 5}
    assert big, "no bin reaches an expected count of 5"
    bins = [{t} for t in sorted(big, key=lambda t: expected[t])]
    if small:
        bins[0] |= small
    return bins


def lookup_reference(ids: list[int], k: int, max_ngram: int) -> list[int]:
    """Prompt lookup written out plainly: for n from max_ngram down to 1, every earlier occurrence of the last n
    tokens (not the trailing one itself) offers the next k tokens after it; the longest offer wins, the latest
    of equally long ones."""
    for n in range(max_ngram, 0, -1):
        if n >= len(ids):
            continue
        suffix = ids[len(ids) - n :]
        offers = [(len(ids[s + n : s + n + k]), s) for s in range(len(ids) - n) if ids[s : s + n] == suffix]
        if offers and max(offers)[0] > 0:
            _, s = max(offers)
            return ids[s + n : s + n + k]
    return []


def perturbed(model, scale: float, seed: int):
    """A deep copy of ``model`` with Gaussian noise of ``scale`` times each weight's spread added."""
    copy_ = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy_.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * scale)
    return copy_


def save_lm(model, tokenizer, folder) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def drafts(tiny_lm, tiny_lm_eos, tmp_path_factory):
    """Draft models saved to folders (the "model" drafter loads a folder), with the in-memory copies."""
    root = tmp_path_factory.mktemp("draft-models")
    models = {
        "same": copy.deepcopy(tiny_lm.model),  # the target itself: every greedy draft is accepted
        "perturbed": perturbed(tiny_lm.model, 0.3, seed=1),  # accepts about half
        "other": build_tiny_lm(seed=7).model,  # another random model: accepts (almost) nothing
        "eos": perturbed(tiny_lm_eos.model, 0.2, seed=2),  # for the EOS-biased target
    }
    folders = {name: save_lm(model, tiny_lm.tokenizer, root / name) for name, model in models.items()}
    return {"folders": folders, "models": models}


@pytest.fixture(scope="module")
def biased_lm(tiny_lm):
    """tiny_lm with one token's logit raised, so greedy falls into runs of that token (Jacobi can accept there)."""
    model = copy.deepcopy(tiny_lm.model)
    with torch.no_grad():
        model.lm_head.weight[200] += 1.5 * model.lm_head.weight.std()
    return LoadedModel(model=model, tokenizer=tiny_lm.tokenizer, name="tiny-biased", path="<memory>",
                       device=tiny_lm.device, dtype=tiny_lm.dtype)


def drafter_options(drafter: str, drafts, model_draft: str = "perturbed") -> dict:
    return {"prompt-lookup": {"draft": "prompt-lookup"},
            "layers": {"draft": "layers", "draft_layers": 1},
            "model": {"draft": "model", "draft_model": drafts["folders"][model_draft]},
            "jacobi": {"draft": "jacobi"},
            "quantized": {"draft": "quantized", "draft_quant": "rtn-int4"}}[drafter]


DRAFTERS = ("prompt-lookup", "layers", "model", "jacobi", "quantized")
PENALTIES = [{}, {"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 3},
             {"repetition_penalty": 0.8, "no_repeat_ngram_size": 4}]


# ---------------------------------------------------------------------------------------------- 1. greedy = plain


_REFERENCES: dict[tuple, list[int]] = {}


def cached_reference(lm, prompt_ids, **kwargs) -> list[int]:
    key = (id(lm), tuple(prompt_ids), tuple(sorted(kwargs.items())))
    if key not in _REFERENCES:
        _REFERENCES[key] = reference_generate(lm, prompt_ids, **kwargs)
    return _REFERENCES[key]


@pytest.mark.parametrize("penalties", PENALTIES, ids=["plain", "rep1.2", "ngram3", "rep0.8+ngram4"])
@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_equals_generate_for_every_drafter(tiny_lm, drafts, drafter, k, penalties):
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=40, draft_k=k, **drafter_options(drafter, drafts),
               **penalties)
    expected = cached_reference(tiny_lm, run.prompt_ids, max_new_tokens=40, **penalties)
    assert len(expected) == 40
    assert run.ids == expected
    assert [s.token_id for s in run.steps] == expected
    assert [s.step for s in run.steps] == list(range(40))
    assert run.done.stop_reason == "max_new_tokens"
    # Preconditions: the run rejected drafts (and, but for Jacobi, which accepts nothing on this random model,
    # accepted some), so both paths of the verification were taken.
    # (The quantized copy often agrees with its target everywhere: its rounds may all pass.)
    assert run.drafted > run.accepted or drafter == "quantized", "no draft was rejected"
    if drafter != "jacobi":
        assert run.accepted > 0, "no draft was accepted"
    assert all(len(r.drafted) <= k for r in run.rounds)


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.3}], ids=["plain", "rep1.3"])
@pytest.mark.parametrize("k", [1, 4])
def test_jacobi_greedy_equals_generate_where_it_accepts(biased_lm, k, penalties):
    run = spec(biased_lm, prompt="Hello", max_new_tokens=40, draft="jacobi", draft_k=k, **penalties)
    expected = reference_generate(biased_lm, run.prompt_ids, max_new_tokens=40, **penalties)
    assert run.accepted > 0 and run.drafted > run.accepted, "Jacobi should accept some drafts and reject others"
    assert run.ids == expected
    assert [s.token_id for s in run.steps] == expected


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_stops_at_eos_exactly(tiny_lm_eos, drafts, drafter, k):
    run = spec(tiny_lm_eos, prompt="Hello", max_new_tokens=40, draft_k=k,
               **drafter_options(drafter, drafts, model_draft="eos"))
    expected = reference_generate(tiny_lm_eos, run.prompt_ids, max_new_tokens=40)
    eos = tiny_lm_eos.tokenizer.eos_token_id
    assert eos in expected, "the EOS-biased tiny model should end within 40 tokens"
    assert expected.index(eos) == len(expected) - 1  # generate stops there
    assert run.ids == expected
    assert [s.token_id for s in run.steps] == expected
    assert run.done.stop_reason == "eos"


@pytest.mark.parametrize("drafter", ["layers", "model"])
def test_an_accepted_eos_inside_a_draft_ends_the_run_there(tiny_lm_eos, drafts, drafter):
    run = spec(tiny_lm_eos, prompt="Hello", max_new_tokens=40, draft_k=16,
               **drafter_options(drafter, drafts, model_draft="eos"))
    eos = tiny_lm_eos.tokenizer.eos_token_id
    last = run.rounds[-1]
    drafted = [d.token_id for d in last.drafted]
    # Precondition: the EOS was an accepted draft with more drafts after it (the run ends inside the round).
    assert eos in drafted and drafted.index(eos) < len(drafted) - 1, drafted
    assert all(d.accepted for d in last.drafted[: drafted.index(eos) + 1])
    assert run.ids == reference_generate(tiny_lm_eos, run.prompt_ids, max_new_tokens=40)
    assert run.ids[-1] == eos and run.done.stop_reason == "eos"
    assert last.target_kind == "none"
    assert [s.token_id for s in run.round_steps()[-1]] == drafted[: drafted.index(eos) + 1]


def test_a_round_cut_by_eos_says_how_many_of_its_tokens_were_emitted(tiny_lm_eos, drafts):
    """The verdict (accepted) covers every draft the target agreed with, even past the EOS; ``emitted`` counts
    the round's tokens that reached the output."""
    run = spec(tiny_lm_eos, prompt="Hello", max_new_tokens=40, draft_k=16, **drafter_options("layers", drafts))
    eos = tiny_lm_eos.tokenizer.eos_token_id
    last = run.rounds[-1]
    drafted = [d.token_id for d in last.drafted]
    end = drafted.index(eos) + 1  # drafts up to and including the EOS reach the output
    seq = run.prompt_ids + run.ids + drafted[end:]
    choices = all_logits(tiny_lm_eos.model, seq)[len(run.prompt_ids) + len(run.ids) - 1 :].argmax(dim=-1).tolist()
    # Precondition: the target's argmax after the EOS agrees with the next draft.
    assert choices[0] == drafted[end]
    agreed = end
    while agreed < len(drafted) and drafted[agreed] == choices[agreed - end]:
        agreed += 1
    assert last.accepted == agreed > end
    assert last.emitted == end == len(run.round_steps()[-1])
    assert last.target_kind == "none" and run.done.stop_reason == "eos"
    assert all(r.emitted == len(s) for r, s in zip(run.rounds, run.round_steps(), strict=True))


def first_completion(tokenizer, ids, stop) -> int:
    """Index of the token with which ``stop`` first appears in the decoded text of ``ids[: index + 1]``."""
    return next(i for i in range(len(ids)) if stop in tokenizer.decode(ids[: i + 1], skip_special_tokens=False))


# (token index m, slice of the decoded text up to token m) -> the stop string; as in test_sampling, for "Hello".
@pytest.mark.parametrize(("m", "start", "end"), [(6, -4, None), (7, -6, -2), (12, -3, None)])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_stop_string_cuts_where_it_completes(tiny_lm, drafts, drafter, m, start, end):
    tokenizer = tiny_lm.tokenizer
    prompt_ids = spec(tiny_lm, prompt="Hello", max_new_tokens=1).prompt_ids
    ids = cached_reference(tiny_lm, prompt_ids, max_new_tokens=30)
    stop = tokenizer.decode(ids[: m + 1], skip_special_tokens=False)[start:end]
    assert len(stop) >= 3, f"pick a longer stop string than {stop!r}"
    cut = first_completion(tokenizer, ids, stop)
    assert 0 < cut < len(ids) - 1, "the stop string must complete mid-run"
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=30, draft_k=4, stop_strings=(stop,),
               **drafter_options(drafter, drafts))
    assert run.done.stop_reason == "stop_string"
    assert run.ids == ids[: cut + 1]
    assert [s.token_id for s in run.steps] == ids[: cut + 1]


def test_stop_string_inside_an_accepted_draft_cuts_the_round(tiny_lm, drafts):
    """The stop string completes on an accepted draft token that has accepted drafts after it."""
    tokenizer = tiny_lm.tokenizer
    opts = {"prompt": "Hello", "max_new_tokens": 30, "draft_k": 16, **drafter_options("model", drafts, "same")}
    full = spec(tiny_lm, **opts)
    ids = cached_reference(tiny_lm, full.prompt_ids, max_new_tokens=30)
    assert full.ids == ids
    first = full.rounds[0]
    assert first.accepted >= 6, "the target's own copy should accept a long first draft"
    # The first plain 3-character stop string that ends inside the first round's accepted drafts.
    texts = [tokenizer.decode(ids[: m + 1], skip_special_tokens=False) for m in range(first.accepted - 1)]
    stop = next(t[-3:] for t in texts[2:] if t[-3:].isascii() and t[-3:].isprintable() and len(t) >= 3)
    cut = first_completion(tokenizer, ids, stop)
    assert cut < first.accepted - 1, "the stop string must complete before the round's last accepted draft"

    run = spec(tiny_lm, **opts, stop_strings=(stop,))
    assert run.ids == ids[: cut + 1] and run.done.stop_reason == "stop_string"
    assert len(run.rounds) == 1 and run.rounds[0].target_kind == "none"


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}],
                         ids=["plain", "rep1.3", "ngram2"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_forced_tokens_branch_like_plain_greedy(tiny_lm, drafts, drafter, penalties):
    """Forcing (a, b) then decoding speculatively equals generate() given prompt + (a, b)."""
    prompt_ids = tiny_lm.tokenizer("Hello")["input_ids"]
    a = int(torch.topk(all_logits(tiny_lm.model, prompt_ids)[-1], 3).indices[-1])
    b = int(torch.topk(all_logits(tiny_lm.model, [*prompt_ids, a])[-1], 2).indices[-1])
    assert reference_generate(tiny_lm, prompt_ids, max_new_tokens=1, **penalties) != [a]
    assert reference_generate(tiny_lm, [*prompt_ids, a], max_new_tokens=1, **penalties) != [b]
    run = spec(tiny_lm, prompt="Hello", chat=False, max_new_tokens=24, forced_token_ids=(a, b), draft_k=4,
               **drafter_options(drafter, drafts), **penalties)
    assert run.prompt_ids == prompt_ids
    expected = [a, b, *reference_generate(tiny_lm, [*prompt_ids, a, b], max_new_tokens=22, **penalties)]
    assert run.ids == expected
    assert [s.token_id for s in run.steps] == expected
    assert [s.forced for s in run.steps] == [True, True] + [False] * 22
    assert run.start.forced_token_ids == (a, b)
    assert all(r.first_step >= 2 for r in run.rounds)  # the forced tokens are no drafter's round
    if drafter in ("prompt-lookup", "layers") and not penalties:  # the same branch, drafting trees
        tree = spec(tiny_lm, prompt="Hello", chat=False, max_new_tokens=24, forced_token_ids=(a, b), draft_k=4,
                    tree_width=2, **drafter_options(drafter, drafts))
        assert tree.ids == expected and [s.forced for s in tree.steps] == [True, True] + [False] * 22


def test_greedy_until_the_context_is_full(tiny_lm, drafts):
    run = spec(tiny_lm, prompt="word " * 60, chat=False, max_new_tokens=300, draft_k=8,
               **drafter_options("layers", drafts))
    room = tiny_lm.context_length - len(run.prompt_ids)
    assert run.ids == reference_generate(tiny_lm, run.prompt_ids, max_new_tokens=room)
    assert len(run.ids) == room and run.done.stop_reason == "context_full"


# --------------------------------------------------------------------------- 2. transformers' assisted generation


@pytest.mark.parametrize(("k", "ngram"), [(1, 1), (4, 2), (10, 3), (16, 3)])
@pytest.mark.parametrize("prompt", ["Hello", "The capital of France is Paris. The capital of"])
def test_prompt_lookup_equals_transformers_prompt_lookup(tiny_lm, prompt, k, ngram):
    run = spec(tiny_lm, prompt=prompt, max_new_tokens=40, draft="prompt-lookup", draft_k=k, prompt_lookup_ngram=ngram)
    theirs = reference_generate(tiny_lm, run.prompt_ids, max_new_tokens=40, prompt_lookup_num_tokens=k,
                                max_matching_ngram_size=ngram)
    assert run.accepted > 0
    assert run.ids == theirs


@pytest.mark.parametrize("assistant", ["same", "perturbed", "other"])
def test_model_drafter_equals_transformers_assisted_generation(tiny_lm, drafts, assistant):
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=40, draft_k=4, **drafter_options("model", drafts, assistant))
    theirs = reference_generate(tiny_lm, run.prompt_ids, max_new_tokens=40,
                                assistant_model=drafts["models"][assistant])
    assert run.ids == theirs
    if assistant == "same":  # the target's own copy proposes exactly what the target chooses
        assert run.accepted == run.drafted > 0
    if assistant == "perturbed":
        assert 0 < run.accepted < run.drafted


@pytest.mark.parametrize("assistant", ["same", "perturbed"])
def test_a_draft_models_tree_keeps_greedy_and_its_first_choices_are_the_chain(tiny_lm, drafts, assistant):
    """A separate draft model drafting trees 3 wide: the output is plain greedy; the tree's rank-0 branch is what
    the draft model itself decodes greedily, computed here; the target's own copy has every path accepted."""
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=30, draft_k=3, tree_width=3, tree_nodes=9,
               **drafter_options("model", drafts, assistant))
    assert run.ids == cached_reference(tiny_lm, run.prompt_ids, max_new_tokens=30)
    full = run.prompt_ids + run.ids
    draft_model = drafts["models"][assistant]
    for rnd in run.rounds:
        assert rnd.is_tree
        context = full[: len(run.prompt_ids) + rnd.first_step]
        first, node = [], -1
        while (kids := [i for i, p in enumerate(rnd.parents) if p == node and rnd.drafted[i].rank == 0]):
            node = kids[0]
            first.append(rnd.drafted[node].token_id)
        expected = []
        for _ in first:
            expected.append(int(all_logits(draft_model, context + expected)[-1].argmax()))
        assert first == expected
        if assistant == "same":
            assert rnd.accepted == max(rnd.depths()) + 1 or rnd.target_kind == "none"


# -------------------------------------------------------------------------- 3. every round, recomputed by hand


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 0.8, "no_repeat_ngram_size": 4}],
                         ids=["plain", "rep0.8+ngram4"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_greedy_round_matches_a_recomputation(tiny_lm, drafts, drafter, penalties):
    k, max_new = 4, 40
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=max_new, draft_k=k, **drafter_options(drafter, drafts),
               **penalties)
    generated = cached_reference(tiny_lm, run.prompt_ids, max_new_tokens=max_new, **penalties)
    assert run.ids == generated
    full = run.prompt_ids + generated
    steps_by_round = run.round_steps()
    assert sum(len(s) for s in steps_by_round) == max_new  # every token belongs to a round
    rejections = acceptances = 0
    previous = None  # (argmax choices, accepted) of the previous round, for Jacobi's guess
    for rnd, steps in zip(run.rounds, steps_by_round, strict=True):
        context = full[: len(run.prompt_ids) + rnd.first_step]
        drafted = [d.token_id for d in rnd.drafted]
        n = len(drafted)
        seq = context + drafted
        target = processed_rows(all_logits(tiny_lm.model, seq), seq, len(context) - 1, n + 1, penalties)
        choices = target.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < n and drafted[accepted] == choices[accepted]:
            accepted += 1
        assert rnd.accepted == accepted
        assert [d.accepted for d in rnd.drafted] == [i < accepted for i in range(n)]
        assert rnd.target_token_id == choices[accepted]
        assert rnd.target_kind == ("bonus" if accepted == n else "correction")
        assert [s.token_id for s in steps] == [*drafted[:accepted], choices[accepted]]
        assert steps[0].step == rnd.first_step and rnd.emitted == len(steps)
        probs = target.softmax(dim=-1)
        # Each token's step event describes the target's distribution at its own position (rows of the batched
        # verification pass, which must line up with the positions).
        raw_probs = all_logits(tiny_lm.model, seq)[len(context) - 1 :].softmax(dim=-1)
        for j, step in enumerate(steps):
            assert step.raw_prob == pytest.approx(float(raw_probs[j, step.token_id]), abs=1e-5)
            assert step.prob == pytest.approx(float(probs[j, step.token_id]), abs=1e-5)
            assert [c.token_id for c in step.candidates[:10]] == torch.topk(raw_probs[j], 10).indices.tolist()
        for i, d in enumerate(rnd.drafted):
            assert d.target_prob == pytest.approx(float(probs[i, d.token_id]), abs=1e-4)
            assert d.draw is None
        assert rnd.target_prob == pytest.approx(float(probs[accepted, choices[accepted]]), abs=1e-4)
        rejections += accepted < n
        acceptances += accepted

        # What the drafter should have proposed, computed independently.
        room = max_new - rnd.first_step
        k_round = min(k, room - 1)
        if drafter == "prompt-lookup":
            assert drafted == lookup_reference(context, k_round, 3)
            assert all(d.draft_prob == 1.0 for d in rnd.drafted)
        elif drafter == "jacobi":
            guess = previous[0][previous[1] + 1 :] if previous else []
            guess = guess or context[-k_round:]
            assert drafted == (guess + [guess[-1]] * k_round)[:k_round]
            assert all(d.draft_prob == 1.0 for d in rnd.drafted)
        else:
            if drafter == "layers":
                raw = first_layers_logits(tiny_lm.model, seq, 1)
            elif drafter == "quantized":
                raw = all_logits(quantized_copy(tiny_lm, "rtn-int4"), seq)
            else:
                raw = all_logits(drafts["models"]["perturbed"], seq)
            assert n == k_round
            if n:
                q = processed_rows(raw, seq, len(context) - 1, n, penalties)
                assert drafted == q.argmax(dim=-1).tolist()
                for i, d in enumerate(rnd.drafted):
                    assert d.draft_prob == pytest.approx(float(q.softmax(dim=-1)[i, d.token_id]), abs=1e-4)
        previous = (choices, accepted)
    assert rejections > 0 or drafter == "quantized"  # (the quantized copy may agree everywhere)
    if drafter != "jacobi":
        assert acceptances > 0


# ------------------------------------------------------------------------------------ 4. sampling: verify.py


P5 = torch.tensor([0.10, 0.20, 0.30, 0.25, 0.15], dtype=torch.float64)
Q5 = torch.tensor([0.40, 0.10, 0.10, 0.30, 0.10], dtype=torch.float64)


def test_residual_distribution_is_the_formula():
    expected = torch.tensor([0.0, 0.10, 0.20, 0.0, 0.05], dtype=torch.float64) / 0.35
    assert torch.allclose(residual_distribution(P5, Q5), expected, atol=1e-12)
    # q one-hot on token 2: what is left of p once token 2 is removed, renormalised
    one_hot = torch.zeros(5, dtype=torch.float64)
    one_hot[2] = 1.0
    assert torch.allclose(residual_distribution(P5, one_hot), torch.tensor([0.1, 0.2, 0.0, 0.25, 0.15],
                                                                             dtype=torch.float64) / 0.7)
    # p == q: nothing is left (a rejection is impossible); the documented fallback is p itself
    assert torch.equal(residual_distribution(P5, P5.clone()), P5)


def test_verify_greedy_keeps_the_matching_prefix():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([3, 1, 4, 5]):
        logits[row, best] = 2.0
    def verdict(draft, rows):
        out = verify_greedy(draft, rows)
        return out.accepted, out.token_id, out.draws

    assert verdict([3, 1, 4], logits) == (3, 5, ())  # all kept: the bonus is the last row's argmax
    assert verdict([3, 2, 4], logits) == (1, 1, ())  # kept up to the first mismatch, corrected there
    assert verdict([0, 1, 4], logits) == (0, 3, ())  # a later match after a mismatch does not count
    assert verdict([], logits[:1]) == (0, 3, ())


def test_verify_sampled_emits_the_target_distribution():
    """Draft x ~ q (drawn here), one verification per generator seed: the first emitted token follows p, a draft is
    kept exactly when the seed's first uniform is below p(x)/q(x), and corrections follow max(0, p - q)."""
    trials = 6000
    drafts_rng = torch.Generator().manual_seed(12345)
    xs = torch.multinomial(Q5, trials, replacement=True, generator=drafts_rng).tolist()
    p_rows = torch.stack([P5, torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)])  # bonus row: token 4
    first_counts, correction_counts = dict.fromkeys(range(5), 0), dict.fromkeys(range(5), 0)
    rejected = 0
    for seed, x in enumerate(xs):
        verdict = verify_sampled([x], Q5[None], p_rows, torch.Generator().manual_seed(seed))
        u = float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float32))
        keep = u < min(1.0, float(P5[x] / Q5[x]))
        assert verdict.accepted == int(keep)
        assert verdict.draws == pytest.approx((u,))
        if keep:
            assert verdict.token_id == 4  # the bonus comes from the row after the draft
            first_counts[x] += 1
        else:
            rejected += 1
            correction_counts[verdict.token_id] += 1
            first_counts[verdict.token_id] += 1
    chi2, df = chi_square(first_counts, dict(enumerate(P5.tolist())), trials)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f} over {df} degrees of freedom"
    # Power: emitting the draft as proposed (q) would fail clearly.
    assert trials * float(((Q5 - P5) ** 2 / P5).sum()) > 10 * CHI2_999[4]

    # Rejections happen with probability sum(max(0, q - p)) = 0.35; corrections follow the residual exactly.
    assert abs(rejected - 0.35 * trials) < 4 * math.sqrt(trials * 0.35 * 0.65)
    residual = {0: 0.0, 1: 0.10 / 0.35, 2: 0.20 / 0.35, 3: 0.0, 4: 0.05 / 0.35}
    assert correction_counts[0] == correction_counts[3] == 0  # tokens q over-proposes are never corrections
    chi2, df = chi_square({t: c for t, c in correction_counts.items() if residual[t] > 0},
                          {t: p for t, p in residual.items() if p > 0}, rejected)
    assert chi2 < CHI2_999[df], f"corrections: chi-square {chi2:.1f} over {df} degrees of freedom"


def test_verify_sampled_second_position_uses_its_own_rows():
    """A two-token draft (x0 ~ q0, x1 ~ q1): given the first draft was kept, the second emitted token (x1 kept, or
    the correction from max(0, p1 - q1)) follows p1; a mix-up of rows would show."""
    q1 = torch.tensor([0.05, 0.05, 0.10, 0.20, 0.60], dtype=torch.float64)
    p1 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10], dtype=torch.float64)
    p_rows = torch.stack([Q5, p1, P5])  # p0 = q0: the first draft is always kept
    q_rows = torch.stack([Q5, q1])
    trials = 4000
    rng = torch.Generator().manual_seed(99)
    x0s = torch.multinomial(Q5, trials, replacement=True, generator=rng).tolist()
    x1s = torch.multinomial(q1, trials, replacement=True, generator=rng).tolist()
    second = dict.fromkeys(range(5), 0)
    for seed, (x0, x1) in enumerate(zip(x0s, x1s, strict=True)):
        verdict = verify_sampled([x0, x1], q_rows, p_rows, torch.Generator().manual_seed(seed))
        assert verdict.accepted >= 1
        second[x1 if verdict.accepted == 2 else verdict.token_id] += 1
    chi2, df = chi_square(second, dict(enumerate(p1.tolist())), trials)
    assert chi2 < CHI2_999[df], f"second token: chi-square {chi2:.1f} over {df} degrees of freedom"


# ------------------------------------------------------------------------------- 4. sampling: the whole engine


def sampled_first_tokens(lm, seeds: int, **options) -> list[tuple[list[DraftToken], int, SpeculativeRound]]:
    """Per seed: the first round's drafts, the first emitted token and the first round (max_new_tokens=2: the first
    round drafts one token)."""
    settings = RunSettings.from_flat(strategy="speculative", baseline_tokens=0, do_sample=True, max_new_tokens=2,
                                     **options)
    out = []
    for seed in range(seeds):
        events = run_strategy(lm, settings.replace(seed=seed))
        first_round = first_token = None
        for event in events:
            if isinstance(event, SpeculativeRound) and first_round is None:
                first_round = event
            if isinstance(event, TokenStep):
                first_token = event.token_id
                break
        events.close()
        assert first_round is not None and first_token is not None
        out.append((list(first_round.drafted), first_token, first_round))
    return out


def check_sampled_engine(results, p: dict[int, float], q: dict[int, float] | None, *, min_rejections: int):
    """First tokens ~ p; drafts ~ q (model drafters); corrections ~ normalise(max(0, p - q))."""
    total = len(results)
    assert all(len(drafted) == 1 for drafted, _, _ in results), "every first round should draft one token"
    first_counts: dict[int, int] = {}
    for _, token, _ in results:
        first_counts[token] = first_counts.get(token, 0) + 1
    chi2, df = chi_square(first_counts, p, total)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f} over {df} degrees of freedom"

    if q is None:  # a deterministic drafter: q is one-hot on its (fixed) draft
        (x,) = {drafted[0].token_id for drafted, _, _ in results}
        q = {x: 1.0}
    else:
        draft_counts: dict[int, int] = {}
        for drafted, _, _ in results:
            draft_counts[drafted[0].token_id] = draft_counts.get(drafted[0].token_id, 0) + 1
        chi2, df = chi_square(draft_counts, q, total)
        assert chi2 < CHI2_999[df], f"drafts: chi-square {chi2:.1f} over {df} degrees of freedom"
    for drafted, _, _ in results:
        assert drafted[0].draft_prob == pytest.approx(q[drafted[0].token_id], abs=1e-4)
        assert drafted[0].target_prob == pytest.approx(p.get(drafted[0].token_id, 0.0), abs=1e-4)
    # Power: emitting every draft as proposed (first tokens ~ q) would fail clearly, by the shape of the counts
    # or by landing outside p's support.
    support = set(p) | set(q)
    assert total * sum((q.get(t, 0.0) - p.get(t, 0.0)) ** 2 / p[t] for t in p) > 10 * CHI2_999[len(p) - 1] or \
        total * sum(q.get(t, 0.0) for t in support - set(p)) > 20

    # Rejections: the first emitted token differs from the draft exactly when the round says it was rejected
    # (after a rejection of x, max(0, p - q) is 0 at x, so a correction never equals the draft).
    corrections = []
    for drafted, token, rnd in results:
        rejected = token != drafted[0].token_id
        assert rejected == (not drafted[0].accepted) == (rnd.accepted == 0)
        assert drafted[0].draw is not None
        if rejected:
            assert rnd.target_kind == "correction" and rnd.target_token_id == token
            corrections.append(token)
    assert len(corrections) >= min_rejections, f"only {len(corrections)} rejections"
    residual_raw = {t: max(0.0, p.get(t, 0.0) - q.get(t, 0.0)) for t in support}
    mass = sum(residual_raw.values())
    residual = {t: v / mass for t, v in residual_raw.items() if v > 0}
    assert not set(corrections) - set(residual), "a correction outside the support of max(0, p - q)"
    bins = binned(residual, len(corrections))
    expected = {i: sum(residual[t] for t in b) for i, b in enumerate(bins)}
    counts = {i: sum(c in b for c in corrections) for i, b in enumerate(bins)}
    chi2, df = chi_square(counts, expected, len(corrections))
    assert chi2 < CHI2_999[df], f"corrections: chi-square {chi2:.1f} over {df} degrees of freedom"
    # Power: corrections drawn from p itself (not the residual) would fail clearly, either by landing outside the
    # residual's support (about this many times) or by the shape of the counts.
    outside = len(corrections) * sum(v for t, v in p.items() if t not in residual)
    p_inside = sum(p.get(t, 0.0) for t in residual)
    p_bins = {i: sum(p.get(t, 0.0) for t in b) / p_inside for i, b in enumerate(bins)}
    shape = len(corrections) * sum((p_bins[i] - e) ** 2 / e for i, e in expected.items())
    assert outside > 20 or shape > 2 * CHI2_999[df], (outside, shape)


SAMPLED_SEEDS = 1200


def test_every_sampled_round_reports_p_q_and_a_consistent_verdict(tiny_lm):
    """Sampling with the layers drafter, k = 4: each draft's p and q (computed here from the target's and the first
    layer's logits, temperature then top-k) match the round, and each kept/rejected flag follows its draw."""
    temperature, top_k = 0.9, 8
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=30, draft="layers", draft_layers=1, draft_k=4,
               do_sample=True, temperature=temperature, top_k=top_k, seed=21)
    full = run.prompt_ids + run.ids
    checked = rejected = 0
    for rnd, steps in zip(run.rounds, run.round_steps(), strict=True):
        context = full[: len(run.prompt_ids) + rnd.first_step]
        drafted = [d.token_id for d in rnd.drafted]
        seq = context + drafted
        target = all_logits(tiny_lm.model, seq)[len(context) - 1 :]
        draft = first_layers_logits(tiny_lm.model, seq, 1)[len(context) - 1 :]
        for i, d in enumerate(rnd.drafted):
            p = top_k_probs(target[i], top_k, temperature)
            q = top_k_probs(draft[i], top_k, temperature)
            assert d.target_prob == pytest.approx(p.get(d.token_id, 0.0), abs=1e-4)
            assert d.draft_prob == pytest.approx(q[d.token_id], abs=1e-4)
            if i <= rnd.accepted and i < len(drafted):  # examined: kept iff the draw is below p/q
                assert d.accepted == (d.draw < min(1.0, p.get(d.token_id, 0.0) / q[d.token_id]))
            checked += 1
        assert [s.token_id for s in steps] == [*drafted[: rnd.accepted], rnd.target_token_id]
        if rnd.accepted < len(drafted):
            rejected += 1
            # The correction lies where the target wants more than the drafter proposed.
            p = top_k_probs(target[rnd.accepted], top_k, temperature)
            q = top_k_probs(draft[rnd.accepted], top_k, temperature)
            assert p.get(rnd.target_token_id, 0.0) > q.get(rnd.target_token_id, 0.0)
        else:
            assert rnd.target_token_id in top_k_probs(target[len(drafted)], top_k, temperature)
    assert checked > 20 and rejected > 3 and run.accepted > 3


def test_sampled_runs_are_reproducible(tiny_lm):
    opts = {"prompt": "Hello", "max_new_tokens": 20, "draft": "layers", "draft_layers": 1, "do_sample": True}
    a, b, c = spec(tiny_lm, seed=4, **opts), spec(tiny_lm, seed=4, **opts), spec(tiny_lm, seed=5, **opts)
    assert a.ids == b.ids and [r.drafted for r in a.rounds] == [r.drafted for r in b.rounds]
    assert a.ids != c.ids


def test_sampled_layers_drafter_emits_the_target_distribution(tiny_lm):
    prompt, temperature, top_k = "The capital of France is", 1.0, 8
    prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
    p = top_k_probs(all_logits(tiny_lm.model, prompt_ids)[-1], top_k, temperature)
    q = top_k_probs(first_layers_logits(tiny_lm.model, prompt_ids, 1)[-1], top_k, temperature)
    results = sampled_first_tokens(tiny_lm, SAMPLED_SEEDS, prompt=prompt, chat=False, temperature=temperature,
                                   top_k=top_k, draft="layers", draft_layers=1, draft_k=4)
    assert results[0][2].first_step == 0
    check_sampled_engine(results, p, q, min_rejections=150)


def test_sampled_speculation_under_a_watermark_emits_the_watermarked_distribution(tiny_lm):
    """A green-list watermark is one more sampler of the chain, after top-k: target and drafter both sample from
    their watermarked distributions, and what a round emits follows the target's (transformers'
    WatermarkLogitsProcessor on the top-k logits, computed here), not the plain one."""
    from transformers import WatermarkLogitsProcessor

    prompt, top_k = "Once upon a time", 8  # 3 of its top 8 are green after its last token
    prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
    vocab = tiny_lm.model.config.vocab_size
    marker = WatermarkLogitsProcessor(vocab_size=vocab, device="cpu", greenlist_ratio=0.25, bias=2.0,
                                      hashing_key=15485863, seeding_scheme="lefthash", context_width=1)

    def watermarked(logits: torch.Tensor) -> dict[int, float]:
        kept = top_k_probs(logits, top_k, 1.0)
        cut = torch.full_like(logits, -torch.inf)
        cut[list(kept)] = logits[list(kept)]
        probs = marker(torch.tensor([prompt_ids]), cut[None].float())[0].double().softmax(-1)
        return {t: float(probs[t]) for t in kept}

    p = watermarked(all_logits(tiny_lm.model, prompt_ids)[-1])
    q = watermarked(first_layers_logits(tiny_lm.model, prompt_ids, 1)[-1])
    plain = top_k_probs(all_logits(tiny_lm.model, prompt_ids)[-1], top_k, 1.0)
    # Power: the plain top-k distribution would fail the chi-square by far (green tokens gain e^2 in odds).
    assert SAMPLED_SEEDS * sum((plain[t] - p[t]) ** 2 / p[t] for t in p) > 10 * CHI2_999[len(p) - 1]
    results = sampled_first_tokens(tiny_lm, SAMPLED_SEEDS, prompt=prompt, chat=False, temperature=1.0,
                                   top_k=top_k, draft="layers", draft_layers=1, draft_k=4, watermark="kirchenbauer")
    check_sampled_engine(results, p, q, min_rejections=100)


def test_sampled_model_drafter_emits_the_target_distribution(tiny_lm, drafts):
    prompt, temperature, top_k = "The capital of France is", 1.0, 8
    prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
    p = top_k_probs(all_logits(tiny_lm.model, prompt_ids)[-1], top_k, temperature)
    q = top_k_probs(all_logits(drafts["models"]["perturbed"], prompt_ids)[-1], top_k, temperature)
    results = sampled_first_tokens(tiny_lm, SAMPLED_SEEDS, prompt=prompt, chat=False, temperature=temperature,
                                   top_k=top_k, draft="model", draft_model=drafts["folders"]["perturbed"])
    check_sampled_engine(results, p, q, min_rejections=300)


def test_sampled_prompt_lookup_emits_the_target_distribution(tiny_lm):
    prompt, temperature, top_k = "token from the token from", 1.0, 8
    prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
    p = top_k_probs(all_logits(tiny_lm.model, prompt_ids)[-1], top_k, temperature)
    (x,) = lookup_reference(prompt_ids, 1, 3)
    assert 0.2 < p.get(x, 0.0) < 0.8, "the looked-up draft should be accepted in a fair share of runs"
    results = sampled_first_tokens(tiny_lm, SAMPLED_SEEDS, prompt=prompt, chat=False, temperature=temperature,
                                   top_k=top_k, draft="prompt-lookup")
    assert all(drafted[0].token_id == x for drafted, _, _ in results)
    check_sampled_engine(results, p, None, min_rejections=300)


# --------------------------------------------------------------------------------------------- 5. the caches


def snapshot(cache) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    return cache.get_seq_length(), [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def fresh_cache(model, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


def assert_same_cache(layers, reference, length: int) -> None:
    assert len(layers) == len(reference)
    for (keys, values), (ref_keys, ref_values) in zip(layers, reference, strict=True):
        assert keys.shape[-2] == values.shape[-2] == length
        assert torch.allclose(keys, ref_keys, atol=1e-4) and torch.allclose(values, ref_values, atol=1e-4)


@pytest.fixture
def cache_spy(monkeypatch):
    """Records the target's cache after every rollback (``roll_back`` as called by the decode loop) and the
    drafter's cache after every ``after_round``."""
    record = {"target": [], "drafter": [], "target_cache": None, "drafter_obj": None}
    real_roll_back = decode_module.roll_back
    real_make_drafter = decode_module.make_drafter

    def roll_back(cache, keep):
        real_roll_back(cache, keep)
        record["target_cache"] = cache
        record["target"].append(snapshot(cache))

    def make_drafter(*args):
        drafter = real_make_drafter(*args)
        real_after = drafter.after_round

        def after_round(kept, choices, accepted, **more):
            real_after(kept, choices, accepted, **more)
            if hasattr(drafter, "cache"):
                record["drafter"].append(snapshot(drafter.cache))

        drafter.after_round = after_round
        record["drafter_obj"] = drafter
        return drafter

    monkeypatch.setattr(decode_module, "roll_back", roll_back)
    monkeypatch.setattr(decode_module, "make_drafter", make_drafter)
    return record


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", ["prompt-lookup", "layers", "model"])
def test_rollback_leaves_the_caches_as_a_plain_run_would(tiny_lm, drafts, cache_spy, drafter, sample):
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=30, draft_k=4, do_sample=sample, temperature=1.0, top_k=8,
               seed=3, **drafter_options(drafter, drafts))
    full = run.prompt_ids + run.ids
    prompt_len = len(run.prompt_ids)
    assert len(cache_spy["target"]) == len(run.rounds)
    rejected_rounds = 0
    for rnd, steps, (length, layers) in zip(run.rounds, run.round_steps(), cache_spy["target"], strict=True):
        # Every emitted token but the newest (the target's own, read next round) is in the cache, nothing else.
        expected_len = prompt_len + rnd.first_step + len(steps) - 1
        assert length == expected_len
        reference = fresh_cache(tiny_lm.model, full[:expected_len])
        assert_same_cache(layers, reference, expected_len)
        assert rnd.kv_cache_bytes == sum(t.numel() * t.element_size() for pair in reference for t in pair)
        rejected_rounds += rnd.accepted < len(rnd.drafted)
    assert rejected_rounds > 0, "some round must have rolled back rejected drafts"
    # After the run: the cache of a plain run that prefilled prompt + all emitted tokens but the last.
    length, layers = snapshot(cache_spy["target_cache"])
    assert length == len(full) - 1
    assert_same_cache(layers, fresh_cache(tiny_lm.model, full[:-1]), len(full) - 1)

    if drafter == "prompt-lookup":
        assert not cache_spy["drafter"]
        return
    assert len(cache_spy["drafter"]) == len(run.rounds)
    for rnd, (length, layers) in zip(run.rounds, cache_spy["drafter"], strict=True):
        confirmed = prompt_len + rnd.first_step + rnd.accepted
        # The drafter never read its own last draft; beyond that it holds only confirmed tokens.
        assert confirmed - 1 <= length <= confirmed
        if drafter == "layers":  # its layer is the target's first layer: compare with the target's own prefill
            reference = fresh_cache(tiny_lm.model, full[:length])[:1]
        elif drafter == "quantized":
            reference = fresh_cache(quantized_copy(tiny_lm, "rtn-int4"), full[:length])
        else:
            reference = fresh_cache(drafts["models"]["perturbed"], full[:length])
        assert_same_cache(layers, reference, length)


# -------------------------------------------------------------------------------------- 6. lookup_continuation


def test_lookup_continuation_latest_match_wins():
    ids = [1, 2, 3, 1, 2, 4, 9, 1, 2]
    assert lookup_continuation(ids, 2, 2) == [4, 9]
    assert lookup_continuation(ids, 4, 2) == [4, 9, 1, 2]  # the continuation may run into the suffix itself
    assert lookup_continuation(ids, 1, 2) == [4]


def test_lookup_continuation_prefers_a_match_with_a_full_continuation():
    ids = [1, 2, 3, 1, 2, 4, 9, 1, 2]
    # The latest [1, 2] (index 3) has only 4 tokens after it; the earlier one (index 0) has 5.
    assert lookup_continuation(ids, 5, 2) == [3, 1, 2, 4, 9]
    # No occurrence has 9 after it: the longest continuation, not the latest.
    assert lookup_continuation(ids, 9, 2) == [3, 1, 2, 4, 9, 1, 2]
    # Clipped continuations: the earliest match has the most tokens after it.
    assert lookup_continuation([5, 6, 5, 6, 5], 9, 1) == [6, 5, 6, 5]


def test_lookup_continuation_prefers_the_longest_ngram_then_falls_back():
    # [1, 2] matches early; the 1-gram [2] matches later: the longer n-gram wins
    assert lookup_continuation([1, 2, 5, 9, 2, 6, 1, 2], 2, 3) == [5, 9]
    assert lookup_continuation([1, 2, 5, 9, 2, 6, 1, 2], 2, 1) == [6, 1]
    # no 3- or 2-gram recurs: the 1-gram [3] does
    assert lookup_continuation([7, 3, 8, 1, 2, 3], 2, 3) == [8, 1]
    # the 3-gram [1, 2, 3] recurs: it is used, not the later 2-gram [2, 3] at index 5
    assert lookup_continuation([1, 2, 3, 4, 0, 2, 3, 5, 1, 2, 3], 1, 3) == [4]
    assert lookup_continuation([1, 2, 3, 4, 0, 2, 3, 5, 1, 2, 3], 1, 2) == [5]


def test_lookup_continuation_no_match_and_never_the_suffix_itself():
    assert lookup_continuation([1, 2, 3, 4], 3, 3) == []
    assert lookup_continuation([5], 3, 3) == []
    assert lookup_continuation([], 3, 3) == []
    assert lookup_continuation([4, 4], 3, 3) == [4]  # the first 4, followed by the second
    assert lookup_continuation([1, 1, 1], 3, 2) == [1]  # [1, 1] at 0 (the trailing [1, 1] at 1 is the suffix)
    assert lookup_continuation([1, 2, 1, 2], 3, 16) == [1, 2]  # n larger than the text is clamped
    assert lookup_continuation([1, 2, 1, 2], 0, 2) == []
    for ids in ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [1, 1, 2, 1, 1, 2, 1], [7, 8, 9]):
        for k in (1, 3, 8):
            for n in (1, 2, 3, 5):
                assert lookup_continuation(ids, k, n) == lookup_reference(ids, k, n)


# ----------------------------------------------------------------------------------------- 7. refusals


def test_model_drafter_without_a_model_is_refused(tiny_lm):
    with pytest.raises(ConfigError) as error:
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="speculative", draft="model"))
    assert str(error.value) == ("the model drafter needs --draft-model PATH (a small model with the target's "
                                "tokenizer)")


@pytest.mark.parametrize("method", ["rtn-int4", "rtn-int4-head", "rtn-int8"])
def test_the_quantized_drafter_is_the_targets_own_quantized_copy(tiny_lm, method):
    from playground.engine.quant.linear import QuantLinear
    from playground.engine.variants import quantized_copy

    run = spec(tiny_lm, prompt="Hello", max_new_tokens=16, draft="quantized", draft_quant=method)
    assert run.events[1].drafter == "quantized"
    copy_ = quantized_copy(tiny_lm, method)
    quantized = sum(isinstance(m, QuantLinear) for m in copy_.modules())
    # Every decoder linear (and the LM head with "-head"); the target itself untouched.
    assert copy_ is not tiny_lm.model and quantized == 7 * len(tiny_lm.model.model.layers) + (method == "rtn-int4-head")
    assert not any(isinstance(m, QuantLinear) for m in tiny_lm.model.modules())
    # Its drafts are the quantized copy's greedy choices: the first round's first draft, recomputed here.
    with torch.no_grad():
        first = int(copy_(input_ids=torch.tensor([run.prompt_ids])).logits[0, -1].argmax())
    assert run.rounds[0].drafted[0].token_id == first
    assert list(run.done.token_ids) == cached_reference(tiny_lm, list(run.prompt_ids), max_new_tokens=16)


@pytest.mark.parametrize("layers", [2, 3, 8])
def test_draft_layers_must_leave_a_layer_out(tiny_lm, layers):
    with pytest.raises(ConfigError) as error:
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="speculative", draft="layers", draft_layers=layers))
    assert str(error.value) == f"draft_layers must be between 1 and 1 for this 2-layer model (got {layers})"


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_lm, tmp_path):
    tokenizer = build_tokenizer(vocab_size=300)
    assert tokenizer.get_vocab() != tiny_lm.tokenizer.get_vocab()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    folder = save_lm(LlamaForCausalLM(config).eval(), tokenizer, tmp_path / "foreign")
    with pytest.raises(ConfigError) as error:
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="speculative", draft="model", draft_model=folder))
    assert str(error.value) == (f"the draft model foreign does not share {tiny_lm.name}'s tokenizer: token ids "
                                "would mean different things; pick a draft model of the same family")


# ----------------------------------------------------------------------------------------------- 8. events


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_events_order_figures_and_round_trip(tiny_lm, drafts, drafter, sample):
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=24, draft_k=4, do_sample=sample, seed=6,
               **drafter_options(drafter, drafts))
    events = run.events
    assert isinstance(events[1], SpeculativeStarted)
    assert events[1].drafter == drafter and events[1].draft_k == 4 and events[1].do_sample is sample
    assert events[1].baseline_tokens == 0
    assert isinstance(events[2], PrefillDone)
    # The short prompt is read by the first verification pass, with the first draft: no pass of its own.
    prefill = events[2]
    assert (prefill.forward_passes, prefill.deferred_tokens, prefill.kv_cache_bytes) == (0, len(run.prompt_ids), 0)
    assert run.rounds[0].prompt_read == len(run.prompt_ids) and all(r.prompt_read == 0 for r in run.rounds[1:])
    assert run.start.settings["speculative"]["draft"] == drafter
    for i, event in enumerate(events):
        if isinstance(event, SpeculativeRound):
            assert isinstance(events[i + 1], TokenStep) and events[i + 1].step == event.first_step
    assert [r.round for r in run.rounds] == list(range(len(run.rounds)))

    figures = run.done.figures
    assert set(figures) == {"rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted", "target_calls",
                            "draft_ms", "verify_ms"}
    drafted, accepted, rounds = run.drafted, run.accepted, len(run.rounds)
    assert figures["rounds"] == rounds and figures["drafted"] == drafted and figures["accepted"] == accepted
    assert figures["acceptance_rate"] == accepted / drafted
    assert figures["mean_accepted"] == accepted / rounds
    assert figures["target_calls"] == rounds
    assert figures["draft_ms"] >= 0 and figures["verify_ms"] > 0
    assert len(run.steps) == 24 == sum(r.accepted for r in run.rounds) + rounds  # each round adds its own token

    for event in events:
        assert event_from_dict(json.loads(dumps_event(event))) == event


def count_target_forwards(lm, monkeypatch) -> list[int]:
    calls = [0]
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        calls[0] += 1
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    return calls


@pytest.mark.parametrize(("prompt", "max_new_tokens"), [("Hello", 24), ("Hi", 1), ("Hi", 12)])
def test_target_calls_count_the_target_forward_passes(tiny_lm, monkeypatch, prompt, max_new_tokens):
    calls = count_target_forwards(tiny_lm, monkeypatch)
    run = spec(tiny_lm, prompt=prompt, chat=prompt == "Hello", max_new_tokens=max_new_tokens, draft="prompt-lookup")
    # A short prompt is read with the first draft (an empty one when nothing recurs in "Hi"): one pass per round.
    assert run.done.figures["target_calls"] == calls[0] == len(run.rounds)


def test_baseline_figures_present_only_when_asked(tiny_lm, drafts):
    with_baseline = spec(tiny_lm, prompt="Hello", max_new_tokens=12, baseline_tokens=8,
                         **drafter_options("layers", drafts))
    figures = with_baseline.done.figures
    assert with_baseline.events[1].baseline_tokens == 8
    assert figures["baseline_tokens_per_s"] > 0
    assert figures["speedup"] == with_baseline.done.tokens_per_s / figures["baseline_tokens_per_s"]
    without = spec(tiny_lm, prompt="Hello", max_new_tokens=12, baseline_tokens=0,
                   **drafter_options("layers", drafts))
    assert "baseline_tokens_per_s" not in without.done.figures and "speedup" not in without.done.figures
    assert without.ids == with_baseline.ids
    for event in with_baseline.events[-1:]:
        assert event_from_dict(json.loads(dumps_event(event))) == event


def test_a_draft_equal_to_the_target_is_always_accepted(tiny_lm, drafts):
    for sample in (False, True):
        run = spec(tiny_lm, prompt="Hello", max_new_tokens=30, draft_k=4, do_sample=sample, seed=11,
                   **drafter_options("model", drafts, "same"))
        assert run.accepted == run.drafted > 0
        assert all(r.target_kind == "bonus" for r in run.rounds)
        for rnd in run.rounds:
            for d in rnd.drafted:
                assert d.draft_prob == pytest.approx(d.target_prob, abs=1e-5)


# ---------------------------------------------------------------------------------------- the default model


REPEAT_PROMPT = ("Repeat exactly: Speculative decoding drafts several tokens and verifies them with one forward pass "
                 "of the target model, keeping the longest accepted prefix.")


@pytest.fixture(scope="module")
def default_reference(default_lm):
    prompt_ids = spec(default_lm, prompt=REPEAT_PROMPT, max_new_tokens=1).prompt_ids
    return prompt_ids, reference_generate(default_lm, prompt_ids, max_new_tokens=40)


@pytest.mark.model
def test_default_model_prompt_lookup_equals_generate(default_lm, default_reference):
    prompt_ids, expected = default_reference
    run = spec(default_lm, prompt=REPEAT_PROMPT, max_new_tokens=40, draft="prompt-lookup", draft_k=8)
    assert run.prompt_ids == prompt_ids
    assert run.done.figures["acceptance_rate"] > 0.5, "the repeat prompt should let prompt lookup accept a lot"
    assert run.drafted > run.accepted
    assert default_lm.tokenizer.eos_token_id == expected[-1] and len(expected) < 40  # it ends at EOS
    assert run.ids == expected and run.done.stop_reason == "eos"
    theirs = reference_generate(default_lm, prompt_ids, max_new_tokens=40, prompt_lookup_num_tokens=8,
                                max_matching_ngram_size=3)
    assert theirs == expected


@pytest.mark.model
def test_default_model_layers_drafter_equals_generate(default_lm, default_reference):
    _, expected = default_reference
    run = spec(default_lm, prompt=REPEAT_PROMPT, max_new_tokens=12, draft="layers", draft_layers=8, draft_k=3)
    assert run.drafted > run.accepted, "some layers-drafted token should be rejected"
    assert run.ids == expected[:12]



def test_adaptive_k_follows_the_heuristic_schedule_and_keeps_greedy(tiny_lm):
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    run = spec(tiny_lm, prompt=prompt, chat=False, max_new_tokens=40, draft="prompt-lookup", draft_k=3,
               adaptive_k=True)
    k = 3
    for rnd in run.rounds:
        if rnd.drafted:  # each round drafts what the last verdicts allow (fewer only near the end or a short match)
            assert len(rnd.drafted) <= k
            k = min(16, k + 2) if rnd.accepted == len(rnd.drafted) else max(1, k - 1)
    assert any(r.accepted == len(r.drafted) > 0 for r in run.rounds) and any(
        r.accepted < len(r.drafted) for r in run.rounds), "precondition: both kinds of verdict"
    assert max(len(r.drafted) for r in run.rounds) > 3  # the schedule grew the draft
    assert list(run.done.token_ids) == cached_reference(tiny_lm, list(run.prompt_ids), max_new_tokens=40)


def test_adaptive_k_round_by_round_equals_a_simulation_written_here(tiny_lm, drafts):
    """The rounds of an adaptive model-drafted greedy run, simulated here from the target's greedy tokens and the
    draft model's own argmax continuations: each round drafts min(k, room - 1) tokens, keeps the prefix that
    matches the target's tokens, and k becomes min(16, k + 2) after a fully accepted draft, max(1, k - 1) after a
    rejection."""
    n, k = 60, 2
    run = spec(tiny_lm, prompt="Hello", max_new_tokens=n, draft_k=k, adaptive_k=True,
               **drafter_options("model", drafts, "perturbed"))
    target = cached_reference(tiny_lm, run.prompt_ids, max_new_tokens=n)
    draft_model = drafts["models"]["perturbed"]
    lengths, accepts, done = [], [], 0
    while done < n:
        room = n - done
        m = min(k, room - 1) if room > 1 else 0
        context = run.prompt_ids + target[:done]
        proposal = []
        for _ in range(m):
            proposal.append(int(all_logits(draft_model, context + proposal)[-1].argmax()))
        accepted = next((i for i, (a, b) in enumerate(zip(proposal, target[done:], strict=False)) if a != b), m)
        lengths.append(m)
        accepts.append(accepted)
        done += accepted + 1
        if m:
            k = min(16, k + 2) if accepted == m else max(1, k - 1)
    assert any(a == m > 0 for a, m in zip(accepts, lengths, strict=True)) and any(
        a < m for a, m in zip(accepts, lengths, strict=True)), "precondition: both kinds of verdict"
    assert max(lengths) >= 5, "precondition: the schedule grew the draft over consecutive rounds"
    assert [len(r.drafted) for r in run.rounds] == lengths
    assert [r.accepted for r in run.rounds] == accepts
    assert run.ids == target


# ------------------------------------------------------------------- a draft head narrower or wider than the target


def first_token_counts(q_draft: torch.Tensor, p_rows: torch.Tensor, trials: int) -> tuple[dict, dict]:
    """Per generator seed: x ~ q drawn here, one verification; counts of the first emitted token and of the
    corrections."""
    rng = torch.Generator().manual_seed(2024)
    xs = torch.multinomial(q_draft, trials, replacement=True, generator=rng).tolist()
    first, corrections = {}, {}
    for seed, x in enumerate(xs):
        verdict = verify_sampled([x], q_draft[None], p_rows, torch.Generator().manual_seed(seed))
        token = x if verdict.accepted else verdict.token_id
        first[token] = first.get(token, 0) + 1
        if not verdict.accepted:
            corrections[verdict.token_id] = corrections.get(verdict.token_id, 0) + 1
    return first, corrections


def test_verify_sampled_with_a_draft_head_narrower_than_the_targets():
    """q over 5 tokens, p over 6: the token the draft lacks has q = 0, so it comes only as a correction, from
    max(0, p - q) with q = 0 there; the emitted tokens follow p."""
    p6 = torch.cat([P5 / 2, torch.tensor([0.5], dtype=torch.float64)])
    p_rows = torch.stack([p6, p6])
    trials = 3000
    first, corrections = first_token_counts(Q5, p_rows, trials)
    chi2, df = chi_square(first, dict(enumerate(p6.tolist())), trials)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f} over {df} degrees of freedom"
    residual = (p6 - torch.cat([Q5, torch.zeros(1, dtype=torch.float64)])).clamp(min=0)
    residual = {t: float(v) for t, v in enumerate(residual / residual.sum()) if v > 0}
    assert set(corrections) <= set(residual)
    chi2, df = chi_square(corrections, residual, sum(corrections.values()))
    assert chi2 < CHI2_999[df], f"corrections: chi-square {chi2:.1f} over {df} degrees of freedom"


def test_verify_sampled_with_a_draft_head_wider_than_the_targets():
    """q over 6 tokens, p over 5: a draft of the token the target lacks is always rejected; emitted tokens ~ p."""
    q6 = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.1, 0.2], dtype=torch.float64)
    p_rows = torch.stack([P5, P5])
    trials = 3000
    rng = torch.Generator().manual_seed(7)
    for seed in range(200):
        verdict = verify_sampled([5], q6[None], p_rows, torch.Generator(rng.device).manual_seed(seed))
        assert verdict.accepted == 0 and verdict.token_id < 5
    first, _ = first_token_counts(q6, p_rows, trials)
    chi2, df = chi_square(first, dict(enumerate(P5.tolist())), trials)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f} over {df} degrees of freedom"


@pytest.fixture(scope="module")
def wide_target(tiny_lm):
    """tiny_lm with 8 more LM-head rows (as a larger model of a family pads its head further): the draft models,
    of the tokenizer's width, lack them."""
    model = copy.deepcopy(tiny_lm.model)
    vocab = model.get_output_embeddings().weight.shape[0]
    model.resize_token_embeddings(vocab + 8, mean_resizing=False)
    return LoadedModel(model=model, tokenizer=tiny_lm.tokenizer, name="tiny-wide", path="<memory>",
                       device=tiny_lm.device, dtype=tiny_lm.dtype)


def test_a_narrower_draft_model_drafts_for_a_wider_target(wide_target, drafts):
    """Greedy equals the wide target's generate(); sampled runs end (every rejection draws from max(0, p - q) on
    the target's width) with drafts inside the draft's own vocabulary."""
    width = len(wide_target.tokenizer)
    options = {"prompt": "Hello", "max_new_tokens": 24, "draft_k": 3, **drafter_options("model", drafts, "other")}
    greedy = spec(wide_target, **options)
    assert greedy.ids == reference_generate(wide_target, greedy.prompt_ids, max_new_tokens=24)
    for seed in range(3):
        run = spec(wide_target, do_sample=True, seed=seed, **options)
        assert len(run.ids) == 24 and any(r.accepted < len(r.drafted) for r in run.rounds)
        assert all(d.token_id < width for r in run.rounds for d in r.drafted)


def test_a_sampled_branchs_first_own_token_follows_the_target_after_the_forced_tokens(tiny_lm):
    """Forcing (a, b) in a sampled run: the token after them is drawn from the target's distribution given
    prompt + a + b (top-k 4 at T = 1, computed here), not from a row before them: chi-square over many seeds."""
    prompt_ids = tiny_lm.tokenizer("Hello")["input_ids"]
    a = int(torch.topk(all_logits(tiny_lm.model, prompt_ids)[-1], 3).indices[-1])
    b = int(torch.topk(all_logits(tiny_lm.model, [*prompt_ids, a])[-1], 2).indices[-1])
    logits = all_logits(tiny_lm.model, [*prompt_ids, a, b])
    p = top_k_probs(logits[-1], 4, 1.0)
    for row in (-2, -3):  # the rows before (predicting b, predicting a) would give other tokens
        assert set(top_k_probs(logits[row], 4, 1.0)) != set(p)
    settings = RunSettings.from_flat(strategy="speculative", baseline_tokens=0, do_sample=True, top_k=4,
                                     prompt="Hello", chat=False, max_new_tokens=3, forced_token_ids=(a, b),
                                     draft="layers", draft_layers=1)
    counts: dict[int, int] = {}
    seeds = 600
    for seed in range(seeds):
        tokens = [e.token_id for e in run_strategy(tiny_lm, settings.replace(seed=seed)) if isinstance(e, TokenStep)]
        assert tokens[:2] == [a, b]
        counts[tokens[2]] = counts.get(tokens[2], 0) + 1
    chi2, df = chi_square(counts, p, seeds)
    assert chi2 < CHI2_999[df], f"first own token: chi-square {chi2:.1f} over {df} degrees of freedom"


def test_verify_sampled_draws_only_from_its_generator():
    """The same seed gives the same verdict whatever torch's global generator did in between: the uniform draws,
    the corrections from max(0, p - q) and the bonus token all come from the run's own generator."""
    p_rows = torch.stack([P5, P5, torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1], dtype=torch.float64)])
    q_rows = torch.stack([Q5, Q5])
    kinds = set()
    for seed in range(40):
        verdicts = []
        for noise in (1, 2):
            torch.manual_seed(noise)  # the global generator, which a run must not read
            verdicts.append(verify_sampled([0, 3], q_rows, p_rows, torch.Generator().manual_seed(seed)))
        assert verdicts[0] == verdicts[1], seed
        kinds.add(verdicts[0].accepted)
    assert kinds >= {0, 2}, "precondition: corrections and bonus tokens both drawn"


def test_a_round_that_drafted_a_token_the_target_lacks_records_it_at_probability_zero(tiny_lm):
    """A wider draft head (a larger model of the family pads its head further) may propose one of its extra
    rows: the round records the target's probability of it as 0, and does not fail."""
    from playground.engine.speculative.decode import RoundRecord
    from playground.engine.speculative.tree import chain
    from playground.engine.speculative.verify import Verdict
    from playground.engine.token_text import TokenTextCache

    vocab = tiny_lm.model.config.vocab_size
    target = torch.full((2, vocab), 1.0 / vocab)
    q = torch.zeros((1, vocab + 8))
    q[0, vocab + 3] = 1.0
    draft = chain([vocab + 3])
    draft.probs = q
    record = RoundRecord(index=0, first_step=0, tree=draft, target_probs=target, verdict=Verdict(0, 5, (0.5,)),
                         path=[], emitted=[5])  # a correction: the target's token after no accepted draft
    event = record.event(1, False, TokenTextCache(tiny_lm.tokenizer))
    assert event.drafted[0].target_prob == 0.0 and event.drafted[0].draft_prob == 1.0
    assert event.target_prob == pytest.approx(1.0 / vocab)
