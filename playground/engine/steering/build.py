"""Building a steering vector from contrast prompts: a pair of words, or lists of positive and negative examples.

What is read: the output of each chosen decoder block N (its hidden state before the next block; transformers'
``hidden_states[N + 1]``), taken with forward hooks on the anatomy's blocks, one example per forward pass (no
padding), the model unsteered.

- ``mean-diff`` (Rimsky et al.'s CAA): at each example's **last token** (repeng's and CAA's position), mean of the
  positives minus mean of the negatives. Not unit-norm: its norm is the residual's own scale.
- ``pca`` (repeng's ``pca_diff``): at the last token, positive[i] − negative[i] for each pair, the first principal
  component of those differences centred on their mean (as scikit-learn's PCA, which repeng calls, centres them),
  unit norm, the sign voted by the pairs (more positives project above their negatives). repeng's default blocks
  are the same as ours (every block but the first); one difference: for the last block repeng reads transformers'
  ``hidden_states[-1]``, which is after the final norm, where we read the block's own output (what the vector is
  added to). Needs two pairs or more.
- ``actadd`` (Turner et al.'s Activation Addition): one prompt pair, the difference of the two residual streams at
  **every** position (the shorter prompt padded with the space token, as the paper pads), added at the sequence's
  first positions only. With the chat template on, those are the template's opening tokens; the paper steers
  plain prompts.

Texts are encoded as the tokenizer encodes a plain prompt (its special tokens added, no chat template).
``build_vector`` polls the run context's Stop between examples and reports progress; ``build_and_save`` is the
window's job (as the tuned lens's training is: ``playground.engine.layers.tune_job``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from playground.config.errors import ConfigError
from playground.engine.run_context import NO_CONTEXT, Progress, RunContext, StopCheck
from playground.engine.steering.vector import (
    METHODS,
    SteeringVector,
    first_component,
    mean_difference,
    model_width,
)
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel


@dataclass(frozen=True)
class ContrastSet:
    """Positive and negative examples (``pca`` and ``actadd`` pair them in order)."""

    positive: tuple[str, ...]
    negative: tuple[str, ...]
    name: str = ""

    @classmethod
    def pair(cls, positive: str, negative: str, name: str = "") -> ContrastSet:
        """A pair of words or prompts ("Love" / "Hate")."""
        return cls((positive,), (negative,), name or f"{positive.strip()}-{negative.strip()}")

    def check(self, method: str) -> None:
        if method not in METHODS:
            raise ConfigError(f"the steering method must be one of {', '.join(METHODS)}, not {method!r}")
        if not self.positive or not self.negative or not all(t.strip() for t in self.positive + self.negative):
            raise ConfigError("a contrast set needs at least one positive and one negative example, none empty")
        if method in ("pca", "actadd") and len(self.positive) != len(self.negative):
            raise ConfigError(f"{method} pairs the examples in order: give as many positive as negative ones "
                              f"(got {len(self.positive)} and {len(self.negative)})")


def default_layers(layer_count: int) -> tuple[int, ...]:
    """Every block but the first (repeng's default, and llama.cpp never reads a direction for block 0)."""
    return tuple(range(1, layer_count)) if layer_count > 1 else (0,)


def _encode(lm: LoadedModel, text: str) -> list[int]:
    ids = list(lm.tokenizer(text, add_special_tokens=True)["input_ids"])
    if not ids:
        raise ConfigError(f"the contrast text {text!r} encodes to no tokens")
    return ids


def read_blocks(lm: LoadedModel, ids: Sequence[int], layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """The outputs of blocks ``layers`` for the token ids ``ids``: {N: float32 [positions, hidden]} (one pass, no
    cache, the model as it is: a steered run's hooks are not on between a run's steps)."""
    anatomy = anatomy_of(lm.model)
    seen: dict[int, torch.Tensor] = {}
    handles = []

    def keep(n: int):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            seen[n] = h[0].float()
        return hook

    for n in layers:
        handles.append(anatomy.layers[n].register_forward_hook(keep(n)))
    try:
        with torch.inference_mode():
            lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def build_vector(lm: LoadedModel, contrast: ContrastSet, *, method: str = "mean-diff",
                 layers: Sequence[int] | None = None, context: RunContext = NO_CONTEXT) -> SteeringVector | None:
    """The steering vector ``method`` makes from ``contrast`` at blocks ``layers`` (0-based; default: every block
    but the first), or None when the context's Stop came first. ``context.report`` after each example."""
    contrast.check(method)
    anatomy = anatomy_of(lm.model)
    count = anatomy.count
    chosen = tuple(sorted(set(layers))) if layers is not None else default_layers(count)
    if not chosen or min(chosen) < 0 or max(chosen) >= count:
        raise ConfigError(f"steering blocks must be between 0 and {count - 1} for {lm.name} (got {list(chosen)})")
    hidden = model_width(lm.model)
    texts = list(contrast.positive) + list(contrast.negative)
    if method == "actadd":
        texts = [contrast.positive[0], contrast.negative[0]]
    encoded = [_encode(lm, t) for t in texts]
    if method == "actadd":
        encoded = _padded(lm, encoded)
    states: list[dict[int, torch.Tensor]] = []
    for i, ids in enumerate(encoded):
        if context.stopped():
            return None
        context.report(f"Steering vector: reading example {i + 1} of {len(encoded)}…", i / len(encoded))
        read = read_blocks(lm, ids, chosen)
        states.append(read if method == "actadd" else {n: h[-1:] for n, h in read.items()})
    if context.stopped():
        return None
    directions: dict[int, np.ndarray] = {}
    n_pos = len(contrast.positive)
    for n in chosen:
        if method == "actadd":
            directions[n] = (states[0][n] - states[1][n]).cpu().numpy().astype(np.float32)  # [k, hidden]
            continue
        rows = torch.cat([s[n] for s in states]).cpu().numpy()  # [examples, hidden], positives first
        pos, neg = rows[:n_pos], rows[n_pos:]
        directions[n] = mean_difference(pos, neg) if method == "mean-diff" else first_component(pos, neg)
    context.report("Steering vector: done", 1.0)
    info = {"positive": " | ".join(contrast.positive), "negative": " | ".join(contrast.negative),
            "position": "every position (front)" if method == "actadd" else "last token"}
    return SteeringVector(directions, hidden_size=hidden, layer_count=count, model_name=lm.name, method=method,
                          name=contrast.name or method, info=info)


def _padded(lm: LoadedModel, encoded: list[list[int]]) -> list[list[int]]:
    """ActAdd's pair at equal length: the shorter padded at its end with the space token (the paper's padding)."""
    space = lm.tokenizer(" ", add_special_tokens=False)["input_ids"]
    pad = space[-1] if space else (lm.tokenizer.pad_token_id or 0)
    length = max(len(ids) for ids in encoded)
    return [ids + [pad] * (length - len(ids)) for ids in encoded]


def build_and_save(lm: LoadedModel, contrast: ContrastSet, path: str | Path, *, method: str = "mean-diff",
                   layers: Sequence[int] | None = None, should_stop: StopCheck | None = None,
                   progress: Progress | None = None) -> Path | None:
    """The window's job: build the vector and save it (by suffix: .safetensors or .gguf); the path, or None when
    Stop came first (nothing saved)."""
    from playground.engine.steering.files import save_vector

    context = RunContext.of(should_stop, progress)
    vector = build_vector(lm, contrast, method=method, layers=layers, context=context)
    if vector is None:
        return None
    return save_vector(vector, path)

