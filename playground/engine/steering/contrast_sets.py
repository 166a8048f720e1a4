"""The contrast sets shipped in ``resources/steering/``: each a small JSON of positive and negative examples to
build a steering vector from, and the measure that says what the vector moves.

A file holds ``name``, ``description``, ``method`` (one of the build methods), ``positive`` / ``negative`` (lists of
texts, paired in order) and ``measure``: a ``prompt`` (with ``chat`` on or off, as a run encodes it), ``words``
(each one token of the model's vocabulary, written as the tokenizer sees it: ``" happy"`` with its leading
space), the blocks ``layers`` (``"11-13"`` or ``"15"``: 0-based, inclusive, as ``--steer-layers``) and the
``strengths`` of a sweep. The claim: the probability mass on ``words`` at the prompt's next token rises over the
sweep, with the vector built by ``method`` at ``layers``. tests/test_steering_sets.py checks each set's claim on
the default model; the README gives the measured figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.config.errors import ConfigError
from playground.config.steering import parse_layer_range
from playground.engine.steering.build import ContrastSet
from playground.engine.steering.vector import METHODS
from playground.resources import RESOURCES_DIR

SETS_DIR = RESOURCES_DIR / "steering"


@dataclass(frozen=True)
class Measure:
    prompt: str
    chat: bool
    words: tuple[str, ...]
    layers: tuple[int, int]  # inclusive
    strengths: tuple[float, ...]
    claim: str = ""

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(range(self.layers[0], self.layers[1] + 1))

    def word_ids(self, tokenizer: Any) -> tuple[int, ...]:
        """The words' token ids; ConfigError naming a word that is not one token of this tokenizer."""
        ids = []
        for word in self.words:
            encoded = tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise ConfigError(f"the measure's word {word!r} is {len(encoded)} tokens for this tokenizer, not one")
            ids.append(int(encoded[0]))
        return tuple(ids)


@dataclass(frozen=True)
class ShippedSet:
    name: str
    description: str
    method: str
    contrast: ContrastSet
    measure: Measure


def shipped_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SETS_DIR.glob("*.json")))


def load_contrast_set(name_or_path: str | Path) -> ShippedSet:
    """A shipped set by name (``"happy-sad"``) or any file of the same form; ConfigError naming what is wrong."""
    path = Path(name_or_path)
    if path.suffix.lower() != ".json":
        path = SETS_DIR / f"{name_or_path}.json"
        if not path.is_file():
            raise ConfigError(f"no shipped contrast set named {name_or_path!r}; known: {', '.join(shipped_names())}")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        measure = spec["measure"]
        low_high = parse_layer_range(str(measure["layers"]))
        if low_high is None:
            raise ValueError("the measure's layers are empty")
        shipped = ShippedSet(
            name=str(spec.get("name") or path.stem), description=str(spec.get("description", "")),
            method=str(spec.get("method", "mean-diff")),
            contrast=ContrastSet(tuple(map(str, spec["positive"])), tuple(map(str, spec["negative"])),
                                 str(spec.get("name") or path.stem)),
            measure=Measure(prompt=str(measure["prompt"]), chat=bool(measure.get("chat", False)),
                            words=tuple(map(str, measure["words"])), layers=low_high,
                            strengths=tuple(float(s) for s in measure["strengths"]),
                            claim=str(measure.get("claim", ""))))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"contrast set file {path} is not a valid contrast set: {error!r}") from None
    if shipped.method not in METHODS:
        raise ConfigError(f"contrast set file {path}: method {shipped.method!r} is not one of {', '.join(METHODS)}")
    shipped.contrast.check(shipped.method)
    return shipped
