"""End to end on the real default model (SmolLM2-135M-Instruct): what users see, checked against generate()."""

from __future__ import annotations

import json

import pytest
import torch

from playground.cli import main
from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import TokenStep

pytestmark = pytest.mark.model


def test_default_model_shape(default_lm):
    config = default_lm.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert default_lm.eos_token_ids == (2,)


def test_greedy_answer_equals_generate(default_lm):
    events = list(run_strategy(default_lm, RunSettings(max_new_tokens=32)))
    done = events[-1]
    assert done.text == "The capital of France is Paris."
    assert done.stop_reason == "eos"
    ids = torch.tensor([events[0].prompt_token_ids])
    expected = default_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=32)[0, ids.shape[1]:].tolist()
    assert list(done.token_ids) == expected
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert "".join(s.text for s in steps) == "The capital of France is Paris.<|im_end|>"
    paris = next(s for s in steps if s.text == " Paris")
    assert paris.prob > 0.5 and paris.candidates[0].text == " Paris"


def test_sampling_is_reproducible_and_respects_top_k(default_lm):
    settings = RunSettings(prompt="Write one sentence about coffee.", strategy="sample", temperature=0.9, top_k=20,
                           top_p=0.95, max_new_tokens=20, seed=11)
    a = list(run_strategy(default_lm, settings))
    b = list(run_strategy(default_lm, settings))
    assert a[-1].token_ids == b[-1].token_ids
    for step in (e for e in a if isinstance(e, TokenStep)):
        assert step.raw_rank <= 20
        assert sum(c.processed_prob for c in step.candidates) <= 1 + 1e-5


def test_trace_command_writes_json_lines(default_lm, tmp_path, capsys):
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "--prompt", "What is the capital of France?", "--max-new-tokens", "12",
                 "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all("type" in line for line in lines)
    assert [line["type"] for line in lines[:2]] == ["start", "prefill"]
    done = lines[-1]
    assert done["type"] == "done" and done["text"] == "The capital of France is Paris."
    assert done["token_ids"][-1] == 2 and done["tokens_per_s"] > 0
    assert done["device"] == "cpu" and done["dtype"] == "float32" and done["model_path"].endswith("Instruct")


def test_trace_command_bad_input_exits_with_a_message(capsys, tmp_path):
    assert main(["trace", "--model", str(tmp_path / "missing")]) == 2
    assert "no model at" in capsys.readouterr().err
    assert main(["trace", "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
