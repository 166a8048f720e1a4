"""Constrained beam search (``--force-words``) equals transformers 4.46's ``generate(num_beams=N, force_words_ids=...)``
token for token: on the default model (phrases, two words at once, a disjunctive set) and on tiny models of the seven
families of the project's nine that 4.46 has (Mistral and Gemma 2 with windows the text crosses; Qwen3 and Gemma 3
are checked against a search written in tests/test_forced_beam_families.py). The outputs were recorded with
transformers 4.46.3 by tests/support/record_forced_beam_446.py (its docstring has the command) into
tests/data/forced_beam_4_46.json; the tiny models are rebuilt here with the same weights
(tests/support/forced_beam_cases.py), which the record's fingerprint checks. Every returned sequence holds its forced
words, as the test reads them from the ids itself (but in 4.46's fill-in, which the test names). The constraint
states and banks equal 4.46's on made-up ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.forced_beam_cases import FILL_IN, TINY_FAMILIES, build_tiny, fingerprint
from support.seeded_models import FAMILIES_4_46
from support.tiny_models import build_tokenizer

from playground.config import ConfigError, RunSettings
from playground.engine.beam_forced.constraints import (
    Constraint,
    add,
    add_all,
    advance_banks,
    advance_tokens,
    bank,
    start,
)
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.events.beam_forced import ForcedWordsDone
from playground.models.loaded import LoadedModel

RECORD = json.loads((Path(__file__).parent / "data" / "forced_beam_4_46.json").read_text())


def decode_settings(case: dict) -> RunSettings:
    return RunSettings.from_flat(prompt=case["prompt"], chat=False, strategy="beam", num_beams=case["num_beams"],
                                 max_new_tokens=case["max_new_tokens"], force_words=tuple(case["force_words"]),
                                 num_return_sequences=case["num_return_sequences"])


def decode(lm, case: dict) -> list:
    return list(run_strategy(lm, decode_settings(case)))


def holds(ids: list[int], alternatives: list) -> bool:
    """Whether ``ids`` hold one alternative of a forced word (a phrase: a list of ids; a set: a list of lists)."""
    options = alternatives if isinstance(alternatives[0], list) else [alternatives]
    return any(ids[i : i + len(o)] == o for o in options for i in range(len(ids) - len(o) + 1))


def check_case(lm, case: dict, fill_in: bool | None) -> list:
    """Our sequences and scores equal 4.46's and say which words each holds; unless 4.46 filled in (``fill_in``:
    whether it must have; None: as the run says), every one holds every forced word."""
    events = decode(lm, case)
    assert list(events[0].prompt_token_ids) == case["prompt_ids"]
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    ours = [list(s.token_ids) for s in finished.sequences]
    theirs = [s["ids"] for s in case["sequences"]]
    assert ours == theirs, ([s.text for s in finished.sequences], [s["text"] for s in case["sequences"]])
    assert [s.score for s in finished.sequences] == pytest.approx([s["score"] for s in case["sequences"]],
                                                                  abs=1e-4)
    done = next(e for e in events if isinstance(e, ForcedWordsDone))
    for ids, met in zip(ours, done.met, strict=True):
        held = tuple(i for i, word in enumerate(case["force_words_ids"]) if holds(case["prompt_ids"] + ids, word))
        assert met == held
        if not done.filled_in:
            assert held == tuple(range(len(case["force_words"]))), (case["force_words"], ids)
    if fill_in is not None:
        assert done.filled_in == fill_in
    return events


def test_the_record_is_transformers_4_46_with_a_disjunctive_set():
    assert RECORD["versions"]["transformers"].startswith("4.46.")
    assert any(isinstance(w[0], list) for c in RECORD["default"] for w in c["force_words_ids"])
    assert any(len(c["force_words"]) > 1 for c in RECORD["default"])
    assert set(RECORD["tiny"]) == set(TINY_FAMILIES) == set(FAMILIES_4_46)


@pytest.mark.model
@pytest.mark.parametrize("case", RECORD["default"], ids=[c["prompt"] for c in RECORD["default"]])
def test_default_model_equals_4_46_token_for_token(default_lm, case):
    events = check_case(default_lm, case, fill_in=case["prompt"] == FILL_IN)
    if case["prompt"] == FILL_IN:  # 4.46's fill-in: its best sequence holds neither word, and we say so
        done = next(e for e in events if isinstance(e, ForcedWordsDone))
        assert done.met[0] == () and done.filled_in


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_models_equal_4_46_token_for_token(tiny_tokenizer, family):
    torch.manual_seed(0)
    model = build_tiny(family, tiny_tokenizer)
    assert fingerprint(model) == pytest.approx(RECORD["tiny"][family]["fingerprint"], rel=1e-12)
    lm = LoadedModel(model=model, tokenizer=tiny_tokenizer, name=f"tiny-{family}", path="<memory>",
                     device=torch.device("cpu"), dtype=torch.float32)
    filled = [check_case(lm, case, fill_in=None)[-2].filled_in for case in RECORD["tiny"][family]["cases"]]
    assert filled.count(False) >= 2  # most of them place every word


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_beams": 1, "num_return_sequences": 1}, "at least 2 beams"),
    ({"force_words": ("",)}, "empty word"),
    ({"force_words": (" cat|",)}, "empty alternative"),
    ({"force_words": (" cat| cat",)}, "same alternative twice"),
    ({"force_words": (" c| coffee",)}, "start another's"),
    ({"force_words": (r"<\|im_end\|>",)}, "end-of-sequence"),
    ({"strategy": "greedy"}, "is not a beam search"),
    ({"quant": "rtn-int8"}, "does not take --quant"),
])
def test_forced_words_are_checked_before_the_run(tiny_tokenizer, settings, message):
    lm = LoadedModel(model=build_tiny("llama", tiny_tokenizer), tokenizer=tiny_tokenizer, name="tiny-llama",
                     path="<memory>", device=torch.device("cpu"), dtype=torch.float32)
    flat = {"prompt": "The capital", "chat": False, "strategy": "beam", "num_beams": 3, "max_new_tokens": 4,
            "force_words": (" coffee",), **settings}
    with pytest.raises(ConfigError, match=message):
        run_strategy(lm, RunSettings.from_flat(**flat))


BANKS = json.loads((Path(__file__).parent / "data" / "forced_banks_4_46.json").read_text())


@pytest.mark.parametrize("case", BANKS["cases"], ids=[str(c["sequence"]) for c in BANKS["cases"]])
def test_constraint_progress_and_banks_equal_4_46s(case):
    """Made-up ids (recorded by tests/support/record_forced_banks_446.py): a phrase, a set whose alternatives share
    a start, a one-token phrase; the banks of the proposed candidates keep 4.46's shared-list quirk."""
    words = (Constraint.of("phrase", (tuple(BANKS["phrases"][0]),)),
             Constraint.of("set", tuple(tuple(a) for a in BANKS["set"])),
             Constraint.of("one", (tuple(BANKS["phrases"][1]),)))
    progress = add_all(start(words), case["sequence"], words)
    assert progress.completed == case["completed"] and bank(progress, words) == case["bank"]
    ahead = advance_tokens(progress, words) if not progress.completed else []
    assert ahead == case["advance"]
    assert advance_banks(progress, ahead, words) == case["proposed_banks"]
    assert [bank(add(progress, t, words), words) for t in ahead] == case["banks_after"]


def test_the_preset_is_a_recorded_case_so_its_claim_is_checked_above():
    from playground.presets import load_preset

    case = next(c for c in RECORD["default"] if c["prompt"] == "My favourite animal is the")
    assert load_preset("beam-forced-words").settings == decode_settings(case)
    texts = [s["text"] for s in case["sequences"]]
    assert texts[0].endswith(" cat") and texts[1].startswith(" cat?")
