"""Rebuild the shipped steering vector ``resources/steering/smollm2-happy-sad.safetensors`` (the
``steering-sweep-happy`` preset's): the mean difference (CAA) of six happy and six sad sentences at every decoder
block but the first of SmolLM2-135M-Instruct (float32, CPU), read at each sentence's last token.

    PYTHONPATH=. .venv/bin/python tests/support/record_steering_vector.py

The sentences are the happy-sad contrast set's (``resources/steering/happy-sad.json`` where it is shipped; the
same twelve are written here so the vector can be rebuilt without it).
"""

from __future__ import annotations

import json
from pathlib import Path

from playground.config import ModelSettings
from playground.engine.steering.build import ContrastSet, build_vector
from playground.engine.steering.files import save_vector
from playground.models.loading import load_model
from playground.presets import RESOURCES_DIR

HAPPY = ("I am so happy today, everything feels wonderful!", "What a joyful, delightful morning this is.",
         "We laughed and celebrated; it was the best day ever.", "I feel glad and cheerful about the good news.",
         "She smiled with pure joy when she saw the gift.", "Life is beautiful and I love every moment of it.")
SAD = ("I am so sad today, everything feels hopeless.", "What a gloomy, miserable morning this is.",
       "We cried and grieved; it was the worst day ever.", "I feel unhappy and depressed about the bad news.",
       "She wept with deep sorrow when she saw the letter.", "Life is painful and I hate every moment of it.")


def contrast_set() -> ContrastSet:
    shipped = RESOURCES_DIR / "steering" / "happy-sad.json"
    if shipped.is_file():
        plain = json.loads(shipped.read_text(encoding="utf-8"))
        return ContrastSet(tuple(plain["positive"]), tuple(plain["negative"]), "happy-sad")
    return ContrastSet(HAPPY, SAD, "happy-sad")


def main() -> Path:
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    vector = build_vector(lm, contrast_set(), method="mean-diff")
    assert vector is not None
    return save_vector(vector, RESOURCES_DIR / "steering" / "smollm2-happy-sad.safetensors")


if __name__ == "__main__":
    print(main())
