"""Contrastive search equals transformers 4.46's ``generate(penalty_alpha=α, top_k=k)`` token for token: on the default
model (three prompts and three (α, k) pairs recorded, 24 tokens each, no chat template; each prompt is compared with
one pair over all 24 tokens; the other six pairs are recorded but not compared, to keep the suite's time) and on tiny
Llama, Qwen2, Mistral (a window the text crosses), Phi-3, GPT-2 and GPT-NeoX models whose weights both versions fill
from one seed (tests/support/seeded_models.py): every family of the project's nine that 4.46 runs it on (its Gemma 2
refuses, as the record keeps; Gemma 2, Gemma 3 and Qwen3 are checked against a search written in
tests/test_contrastive_search.py). The outputs were recorded with transformers 4.46.3 by
tests/support/record_contrastive_search_446.py (its docstring has the command) into
tests/data/contrastive_search_4_46.json. Before comparing, each test checks that the model is the recorded one:
4.46's greedy tokens (default model) or the weights' fingerprint (tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.seeded_models import fingerprint, seeded_lm

from playground.config import RunSettings
from playground.engine.strategies import run_strategy

RECORD = json.loads((Path(__file__).parent / "data" / "contrastive_search_4_46.json").read_text())
TINY_4_46 = {"llama", "qwen2", "mistral", "phi3", "gpt2", "gpt_neox"}  # seeded_models.FAMILIES_4_46 but Gemma 2
CHECKED = 24  # tokens compared per default-model case: all that were recorded (~0.1 s a step here)


def run(lm, prompt: str, tokens: int, **settings) -> tuple[list[int], list[int]]:
    flat = {"prompt": prompt, "chat": False, "max_new_tokens": tokens, **settings}
    events = list(run_strategy(lm, RunSettings.from_flat(**flat)))
    return list(events[0].prompt_token_ids), list(events[-1].token_ids)


def search_cases() -> list[tuple[dict, dict]]:
    return [(case, s) for case in RECORD["cases"] for s in case["search"]]


def compared_cases() -> list[tuple[dict, dict]]:
    """Prompt i with (α, k) pair i: each prompt and each pair once (the first ends at EOS after 3 tokens)."""
    return [(case, case["search"][i]) for i, case in enumerate(RECORD["cases"])]


def test_the_record_is_transformers_4_46s_and_the_searches_differ_from_greedy():
    assert RECORD["versions"]["transformers"].startswith("4.46.")
    assert len(search_cases()) == 9 and {t["family"] for t in RECORD["tiny"]} == TINY_4_46
    assert "HybridCache" in RECORD["refused"]["gemma2"]
    assert sum(s["ids"][:CHECKED] != c["greedy_ids"][:CHECKED] for c, s in search_cases()) >= 5


@pytest.mark.model
def test_our_greedy_equals_4_46s_so_the_recorded_load_is_right(default_lm):
    case = RECORD["cases"][1]
    prompt_ids, ids = run(default_lm, case["prompt"], 4)
    assert prompt_ids == case["prompt_ids"] and ids == case["greedy_ids"][:4]


@pytest.mark.model
@pytest.mark.parametrize("case,setting", compared_cases(),
                         ids=[f"{c['prompt'][:16]}-a{s['penalty_alpha']}-k{s['top_k']}" for c, s in compared_cases()])
def test_the_tokens_equal_4_46s(default_lm, case, setting):
    want = setting["ids"][:CHECKED]
    _, ids = run(default_lm, case["prompt"], len(want), strategy="contrastive-search",
                 penalty_alpha=setting["penalty_alpha"], top_k=setting["top_k"])
    assert ids == want, (default_lm.tokenizer.decode(ids), setting["text"])


@pytest.mark.parametrize("case", RECORD["tiny"], ids=[t["family"] for t in RECORD["tiny"]])
def test_tiny_models_of_six_families_equal_4_46(case):
    lm = seeded_lm({**case, "eos": None, "pad": 0})  # 4.46 ran them to the length (eos 2 is an ordinary id here)
    assert fingerprint(lm.model) == case["fingerprint"]  # the same weights as 4.46 had
    tokens = RECORD["tiny_max_new_tokens"]
    prompt_ids, greedy = run(lm, case["prompt"], tokens)
    assert prompt_ids == case["prompt_ids"] and greedy == case["greedy_ids"]
    for setting in case["search"]:
        _, ids = run(lm, case["prompt"], tokens, strategy="contrastive-search",
                     penalty_alpha=setting["penalty_alpha"], top_k=setting["top_k"])
        assert ids == setting["ids"], setting
