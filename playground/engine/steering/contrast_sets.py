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
from playground.engine.steering.build import ContrastSet, default_layers
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


# The build methods' words on the command line and in the window's dialog ("mean" is the mean difference, CAA)
METHOD_WORDS = {"mean": "mean-diff", "mean-diff": "mean-diff", "pca": "pca", "actadd": "actadd"}
VECTOR_SUFFIXES = (".gguf", ".safetensors")


@dataclass(frozen=True)
class BuildPlan:
    """A build asked for (``playground steer-build``, the window's dialog), checked before any model pass: the
    contrast set, the method, the blocks asked for (None: every block but the first) and the file to write."""

    contrast: ContrastSet
    method: str
    span: tuple[int, int] | None
    out: Path

    @classmethod
    def of(cls, contrast: str | Path, method: str | None, layers: str, out: str | Path) -> BuildPlan:
        """ConfigError naming what is wrong: an unknown set or a damaged file, a method, a block range, a suffix,
        and what a llama.cpp control vector (.gguf) cannot hold (ActAdd's rows, block 0)."""
        path = Path(out).expanduser()
        suffix = path.suffix.lower()
        if suffix not in VECTOR_SUFFIXES:
            raise ConfigError(f"the vector file {out}: the suffix must be .gguf (a llama.cpp control vector) or "
                              f".safetensors (got {suffix or 'none'})")
        shipped = load_contrast_set(contrast)
        if method and method not in METHOD_WORDS:
            raise ConfigError(f"the steering method must be one of {', '.join(METHOD_WORDS)}, not {method!r}")
        chosen = METHOD_WORDS[method] if method else shipped.method
        shipped.contrast.check(chosen)
        try:
            span = parse_layer_range(layers)
        except ValueError as error:
            raise ConfigError(f"steering blocks {error}") from None
        if suffix == ".gguf" and chosen == "actadd":
            raise ConfigError("ActAdd adds per-position rows at the front, which a llama.cpp control vector (.gguf) "
                              "cannot hold: write a .safetensors file")
        if suffix == ".gguf" and span is not None and span[0] == 0:
            raise ConfigError(f"the blocks {layers}: llama.cpp never steers block 0 and refuses a control vector "
                              "naming it: start at block 1 for a .gguf (or write a .safetensors file)")
        return cls(shipped.contrast, chosen, span, path)

    def layers(self, layer_count: int) -> tuple[int, ...]:
        return tuple(range(self.span[0], self.span[1] + 1)) if self.span is not None else default_layers(layer_count)
