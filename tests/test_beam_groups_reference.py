"""Diverse (group) beam search equals transformers 4.46's ``generate(num_beams=N, num_beam_groups=G,
diversity_penalty=D)`` token for token: the returned sequences, and their scores within float tolerance. The
outputs were recorded with transformers 4.46.3 by tests/support/record_group_beam_446.py (its docstring has the
command) into tests/data/group_beam_4_46.json: on tiny models of the seven families of the project's nine that 4.46
has, Mistral and Gemma 2 with windows the text crosses (weights filled from a seed in sorted-name order,
tests/support/seeded_models.py, the same in both versions, as each case's recorded fingerprint checks; Qwen3 and
Gemma 3 are checked against a search written in tests/test_beam_groups_families.py) with length penalties, early
stopping true/never, a repetition penalty (after the diversity penalty, as 4.46 orders them), an n-gram ban and several
returned sequences; and on the default model (no chat template). Besides the returned sequences, the tokens each
group's beams chose at every step are 4.46's (so the groups' order and labels are checked too: a search that decided
the groups in reverse would return the same sequences under other labels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.seeded_models import FAMILIES_4_46, fingerprint, seeded_lm

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep

RECORD = json.loads((Path(__file__).parent / "data" / "group_beam_4_46.json").read_text())
TINY_TEXTS = ("The capital of France is", "Beam search keeps several")
EARLY = {True: "true", False: "false", "never": "never"}


def test_the_record_is_transformers_4_46():
    assert RECORD["versions"]["transformers"].startswith("4.46.")
    assert len(RECORD["tiny"]) >= 5 and len(RECORD["default"]) >= 2
    assert {c["family"] for c in RECORD["tiny"]} == set(FAMILIES_4_46)


def _settings(case: dict, prompt: str) -> RunSettings:
    extra = dict(case["settings"])
    if "early_stopping" in extra:
        extra["early_stopping"] = EARLY[extra["early_stopping"]]
    return RunSettings.from_flat(prompt=prompt, chat=False, strategy="beam", max_new_tokens=case["max_new_tokens"],
                                 num_beams=case["num_beams"], num_beam_groups=case["num_beam_groups"],
                                 diversity_penalty=case["diversity_penalty"], **extra)


def _check(events, case: dict) -> None:
    assert list(events[0].prompt_token_ids) == case["prompt_ids"]
    # Which group chose what at each step: every group's beams' tokens, in row order (4.46's, logged as its next
    # step's Hamming processor saw them; the last step's are seen by none).
    steps = [e for e in events if isinstance(e, BeamStep)]
    assert len(steps) == len(case["beam_tokens"]) + 1
    assert [list(s.token_ids) for s in steps[:-1]] == case["beam_tokens"]
    returned = events[-1].sequences
    assert [list(s.token_ids) for s in returned] == case["sequences"], [s.text for s in returned]
    assert [s.score for s in returned] == pytest.approx(case["scores"], rel=1e-4, abs=1e-5)


def _tiny_id(case: dict) -> str:
    return f"{case['family']}-{case['num_beams']}x{case['num_beam_groups']}-D{case['diversity_penalty']:g}"


@pytest.mark.parametrize("case", RECORD["tiny"], ids=_tiny_id)
def test_group_beam_search_equals_4_46_on_tiny_models_of_seven_families(case):
    lm = seeded_lm(case)
    assert fingerprint(lm.model) == case["fingerprint"]  # the weights 4.46 had
    prompt = next(t for t in TINY_TEXTS if lm.tokenizer(t)["input_ids"] == case["prompt_ids"])
    _check(list(run_strategy(lm, _settings(case, prompt))), case)


@pytest.mark.model
@pytest.mark.parametrize("case", RECORD["default"], ids=lambda c: c["prompt"])
def test_group_beam_search_equals_4_46_on_the_default_model(default_lm, case):
    assert case["pad"] == default_lm.model.generation_config.pad_token_id  # a done group emits it (4.46 too)
    _check(list(run_strategy(default_lm, _settings(case, case["prompt"]))), case)
