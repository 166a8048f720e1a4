"""Contrastive search on tiny models of several families (Gemma 2, Gemma 3 and Qwen3 among them, which 4.46 refuses or
lacks), against references computed here: a search that re-reads the whole text every step (no cache, no batching)
and takes ``output_hidden_states``' last entry (itself first checked against 4.46's recorded tokens); every candidate's
confidence, degeneration penalty, most similar position and score recomputed by hand from those hidden states. Also
its settings' checks (CLI words and the settings), Stop, and a saved run read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import Run
from support.seeded_models import seeded_lm
from support.tiny_models import build_tiny_lm

from playground.config import ConfigError, RunSettings
from playground.config.words import settings_from_pane
from playground.engine.run_context import RunContext
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.contrastive_search import SearchStarted, SearchStep
from playground.traces import read_trace, write_trace

PROMPT = "The capital of France is Paris. The weather"
TOKENS = 10


def search(lm, tokens: int = TOKENS, **options) -> RunSettings:
    flat = {"strategy": "contrastive-search", "prompt": PROMPT, "chat": False, "max_new_tokens": tokens,
            "top_k": 4, "penalty_alpha": 0.6, **options}
    return RunSettings.from_flat(**flat)


def last_states(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole text read afresh: hidden_states[-1] of every position [n, hidden] and the last logits [vocab]."""
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0], out.logits[0, -1].float()


@torch.no_grad()
def hand_search(lm, prompt_ids: list[int], tokens: int, alpha: float, k: int) -> list[int]:
    """Contrastive search from its definition: each step re-reads the text, then each candidate's text alone."""
    ids = list(prompt_ids)
    for _ in range(tokens):
        context, logits = last_states(lm.model, ids)
        probs, top = logits.softmax(-1).topk(k)
        scores = []
        for p, token in zip(probs.tolist(), top.tolist(), strict=True):
            mine = last_states(lm.model, [*ids, token])[0][-1]
            similarity = torch.nn.functional.cosine_similarity(context, mine[None], dim=-1).max().item()
            scores.append((1 - alpha) * p - alpha * similarity)
        ids.append(top.tolist()[max(range(k), key=lambda i: (scores[i], -i))])
    return ids[len(prompt_ids):]


# 4.46 refuses Gemma 2's hybrid cache and has no Qwen3 or Gemma 3: this is their reference (the others' is 4.46's,
# tests/test_contrastive_search_reference.py)
FAMILIES = ("llama", "gemma2", "gemma3", "qwen3", "gpt_neox")


RECORD_4_46 = json.loads((Path(__file__).parent / "data" / "contrastive_search_4_46.json").read_text())


@pytest.mark.parametrize("case", [t for t in RECORD_4_46["tiny"] if t["family"] in ("llama", "gpt2")],
                         ids=lambda t: t["family"])
def test_the_search_written_here_equals_4_46s_record(case):
    """The reference is proven: on two families 4.46 has, it returns 4.46's recorded tokens."""
    lm = seeded_lm({**case, "eos": None, "pad": 0})
    setting = case["search"][0]
    ids = hand_search(lm, case["prompt_ids"], len(setting["ids"]), setting["penalty_alpha"], setting["top_k"])
    assert ids == setting["ids"] != case["greedy_ids"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_run(request):
    lm = build_tiny_lm(family=request.param)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random norm weights: at their initial ones a norm only rescales, and cosines ignore that
        for name, parameter in lm.model.named_parameters():
            if "norm" in name:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return lm, Run.from_events(run_strategy(lm, search(lm)))


def test_it_equals_contrastive_search_written_from_its_definition(family_run):
    lm, run = family_run
    assert len(run.ids) == TOKENS
    assert run.ids == hand_search(lm, run.prompt_ids, TOKENS, 0.6, 4)


@torch.no_grad()
def test_every_candidates_numbers_equal_a_hand_computation_from_output_hidden_states(family_run):
    lm, run = family_run
    steps = run.of(SearchStep)
    assert [s.step for s in steps] == list(range(TOKENS))
    assert any(s.overturned for s in steps) and not all(s.overturned for s in steps)
    for step in steps:
        ids = run.prompt_ids + run.ids[: step.step]
        context, logits = last_states(lm.model, ids)
        probs = logits.softmax(-1)
        assert [c.token_id for c in step.candidates] == probs.topk(4).indices.tolist()
        for c in step.candidates:
            mine = last_states(lm.model, [*ids, c.token_id])[0][-1]
            cos = torch.nn.functional.cosine_similarity(context, mine[None], dim=-1)
            assert c.confidence == pytest.approx(probs[c.token_id].item(), abs=1e-6)
            assert c.penalty == pytest.approx(cos.max().item(), abs=1e-5)
            assert c.similar_position == int(cos.argmax())
            assert c.score == pytest.approx(0.4 * c.confidence - 0.6 * c.penalty, abs=1e-6)
        best = max(range(4), key=lambda i: (step.candidates[i].score, -i))
        assert step.winner == best and step.token_id == step.candidates[best].token_id
        assert step.overturned == (best != 0)
    tokens = run.of(TokenStep)
    assert [t.token_id for t in tokens] == run.ids


def test_alpha_0_is_greedy_and_the_start_event_says_alpha_and_k(tiny_lm):
    greedy = Run.from_events(run_strategy(tiny_lm, search(tiny_lm, strategy="greedy")))
    zero = Run.from_events(run_strategy(tiny_lm, search(tiny_lm, penalty_alpha=0.0, top_k=3)))
    assert zero.ids == greedy.ids
    started = zero.first(SearchStarted)
    assert (started.alpha, started.k) == (0.0, 3)
    assert "".join(started.context_tokens) == PROMPT and len(started.context_tokens) == len(zero.prompt_ids)
    assert not any(s.overturned for s in zero.of(SearchStep))


def test_the_settings_refuse_alpha_outside_0_1_and_k_below_1(tiny_lm):
    for spec, message in (("contrastive-search --top-k 0", r"takes its k from --top-k: set --top-k K ≥ 1"),
                          ("contrastive-search --top-k 4 --penalty-alpha 1.5", r"penalty_alpha must be in \[0, 1\]"),
                          ("contrastive-search --top-k 4 --penalty-alpha -0.1", r"penalty_alpha must be in \[0, 1\]")):
        with pytest.raises(ConfigError, match=message):
            settings_from_pane(RunSettings(), spec)  # the command line's words
    with pytest.raises(ConfigError, match=r"--top-k K ≥ 1, .*got 0\)"):
        run_strategy(tiny_lm, search(tiny_lm, top_k=0))
    assert settings_from_pane(RunSettings(), "contrastive-search --top-k 1 --penalty-alpha 1").top_k == 1
    RunSettings.from_flat(strategy="greedy", top_k=0).validate()  # the rule is contrastive search's alone


def test_stop_keeps_the_steps_and_a_saved_run_reads_back_the_same(tiny_lm, tmp_path):
    steps = []

    def stop_after_three() -> bool:
        return len(steps) >= 3

    events = []
    for event in run_strategy(tiny_lm, search(tiny_lm), RunContext.of(stop_after_three)):
        events.append(event)
        if isinstance(event, SearchStep):
            steps.append(event)
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason == "stopped"
    assert len(steps) == 3 and len(events[-1].token_ids) == 3
    back = read_trace(write_trace(events, tmp_path / "search.jsonl"))
    assert not back.problems() and list(back.events) == events


def test_a_forced_token_is_taken_and_recorded_among_or_outside_the_candidates(tiny_lm):
    free = Run.from_events(run_strategy(tiny_lm, search(tiny_lm, tokens=3)))
    first = free.of(SearchStep)[0]
    outside = next(t for t in range(300) if t not in {c.token_id for c in first.candidates})
    inside = first.candidates[-1].token_id
    for forced, winner in ((inside, len(first.candidates) - 1), (outside, -1)):
        run = Run.from_events(run_strategy(tiny_lm, search(tiny_lm, tokens=3, forced_token_ids=(forced,))))
        step = run.of(SearchStep)[0]
        assert run.ids[0] == forced and step.forced and step.winner == winner
        assert [c.token_id for c in step.candidates] == [c.token_id for c in first.candidates]


@pytest.mark.model
def test_the_preset_writes_on_where_greedy_loops(default_lm):
    from playground.presets import load_preset

    settings = load_preset("contrastive-search-loop").settings.replace(max_new_tokens=14)  # two loops by 14
    assert settings.strategy == "contrastive-search" and settings.top_k == 4
    greedy = Run.from_events(run_strategy(default_lm, settings.replace(strategy="greedy")))
    searched = Run.from_events(run_strategy(default_lm, settings))

    def repeats(ids: list[int], n: int = 4) -> int:
        grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
        return len(grams) - len(set(grams))

    assert greedy.done.text.count("I'm a big apple") >= 2 and repeats(greedy.ids) >= 3
    assert repeats(searched.ids) == 0 and "big apple" not in searched.done.text
    steps = searched.of(SearchStep)
    assert sum(s.overturned for s in steps) >= 2
    assert searched.done.figures["overturned_steps"] == sum(s.overturned for s in steps)
