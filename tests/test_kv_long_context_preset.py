"""The long-context KV preset: its prompt is the shipped calibration texts (built here from the files), and its
panes (the full cache, sinks + window, H2O, KIVI int4) run, on a tiny model with the prompt cut short."""

from __future__ import annotations

import dataclasses

from support.tiny_models import build_tiny_lm

from playground.engine.strategies import run_strategy
from playground.events.panes import PaneFinished
from playground.presets import RESOURCES_DIR, load_preset

NAME = "kv-long-context"


def test_the_prompt_is_the_calibration_texts_then_the_instruction():
    preset = load_preset(NAME)
    texts = [(RESOURCES_DIR / "calibration" / f).read_text(encoding="utf-8").strip()
             for f in ("calibration.txt", "evaluation.txt")]
    whole = texts[0] + "\n\n" + texts[1]
    prompt = preset.settings.prompt
    text, instruction = prompt.rsplit("\n\n", 1)
    assert instruction == "Summarise the two texts above in a few sentences."
    assert whole.startswith(text) and 9000 < len(text) <= 9600  # ~2,000 tokens of SmolLM2 (4.8 characters each)
    assert whole[len(text)].isspace()  # cut at a word's end
    assert texts[0] in text


def test_its_panes_run_on_a_tiny_model():
    preset = load_preset(NAME)
    lm = build_tiny_lm(seed=0, max_positions=1024)
    settings = dataclasses.replace(preset.settings, prompt=preset.settings.prompt[:600], max_new_tokens=4)
    events = list(run_strategy(lm, settings))
    finished = [e for e in events if isinstance(e, PaneFinished)]
    assert [e.pane for e in finished] == [0, 1, 2, 3]
    assert all(e.token_ids for e in finished)
