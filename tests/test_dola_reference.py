"""DoLa's reference variant equals transformers 4.46's DoLa (the authors' code as transformers shipped it) token for
token on the default model: six prompts, no chat template, greedy, both buckets, repetition penalty 1.2. The outputs
were recorded with transformers 4.46.3 by tests/support/record_dola_446.py (its docstring has the command) into
tests/data/dola_transformers_4_46.json; that file also holds 4.46's plain greedy tokens, which our greedy must equal
first (else the recorded load was not the same model). The formula variant is the paper's text and parts from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events.contrastive import ContrastiveStarted

pytestmark = pytest.mark.model

RECORD = json.loads((Path(__file__).parent / "data" / "dola_transformers_4_46.json").read_text())
CASES = RECORD["cases"]
AUSTRALIA = "The capital of Australia is"


def run(lm, prompt: str, tokens: int, **settings):
    flat = {"prompt": prompt, "chat": False, "max_new_tokens": tokens, **settings}
    return list(run_strategy(lm, RunSettings.from_flat(**flat)))


def dola(lm, prompt: str, tokens: int, bucket: str, variant: str | None = None):
    chosen = {"dola_variant": variant} if variant else {}  # None: the default, which is the reference
    return run(lm, prompt, tokens, strategy="contrastive", amateur="dola", dola_layers=bucket,
               dola_repetition_penalty=RECORD["repetition_penalty"], alpha=0.1, **chosen)


def test_the_record_is_transformers_4_46():
    assert RECORD["versions"]["transformers"].startswith("4.46.")
    assert len(CASES) == 6 and any(c["prompt"] == AUSTRALIA for c in CASES)


# Two of the six (the suite's time): the load is one and the same for every prompt.
@pytest.mark.parametrize("case", CASES[:2], ids=[c["prompt"] for c in CASES[:2]])
def test_our_greedy_equals_4_46s_greedy_so_the_recorded_load_is_right(default_lm, case):
    events = run(default_lm, case["prompt"], RECORD["max_new_tokens"])
    assert list(events[0].prompt_token_ids) == case["prompt_ids"]
    assert list(events[-1].token_ids) == case["greedy_ids"]


@pytest.mark.parametrize("case", CASES, ids=[c["prompt"] for c in CASES])
@pytest.mark.parametrize("bucket", ["low", "high"])
def test_the_reference_variant_equals_transformers_4_46_token_for_token(default_lm, case, bucket):
    events = dola(default_lm, case["prompt"], RECORD["max_new_tokens"], bucket)
    started = next(e for e in events if isinstance(e, ContrastiveStarted))
    assert started.dola_variant == "reference"
    assert list(events[0].prompt_token_ids) == case["prompt_ids"]
    assert list(events[-1].token_ids) == case["dola"][bucket]["ids"], (events[-1].text, case["dola"][bucket]["text"])


def test_the_formula_variant_answers_canberra_where_the_reference_does_not(default_lm):
    formula = dola(default_lm, AUSTRALIA, 4, "high", "formula")
    assert formula[-1].text.startswith(" Canberra.")
    reference = dola(default_lm, AUSTRALIA, 6, "high", "reference")
    assert reference[-1].text == " the capital of New South Wales"
