"""A steering vector: per decoder block, the direction added to that block's output, and what model it fits.

The representation every part of steering uses (building, files, the run's hooks, the views' events):

- ``directions[N]``: float32 ``[hidden]``, added times the strength to the output of the 0-based decoder block N
  (transformers' ``hidden_states[N + 1]``, llama.cpp's tensor ``direction.N``) at every position, including the
  prompt, as llama.cpp's control vectors and repeng's ``ControlModel`` do;
- or float32 ``[k, hidden]`` (ActAdd, Turner et al. 2023): row j is added at the sequence's position j only, for
  the first k positions (the difference of a prompt pair's residual streams, position by position). A file holds
  one kind; llama.cpp's format holds only the first (1-D tensors).

The model hints (``hidden_size``, ``layer_count``, ``model_name``) are what ``check_fits`` compares with the loaded
model: llama.cpp checks only the width; a vector for more blocks than the model has is refused too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from playground.config.errors import ConfigError

METHODS = ("mean-diff", "pca", "actadd")


@dataclass
class SteeringVector:
    directions: dict[int, np.ndarray]  # block N (0-based) -> float32 [hidden] or [k, hidden] (ActAdd's front)
    hidden_size: int
    layer_count: int = 0  # decoder blocks of the model it was made for; 0: not known (a llama.cpp file)
    model_name: str = ""  # the model it was made on (a llama.cpp / repeng file: its model hint, e.g. "llama")
    method: str = ""  # one of METHODS, or "" when the file does not say
    name: str = ""  # shown in views; files default it to their stem
    info: dict[str, str] = field(default_factory=dict)  # free-form provenance (prompts, positions, token counts)

    def __post_init__(self) -> None:
        self.directions = {int(n): np.ascontiguousarray(d, dtype=np.float32)
                           for n, d in sorted(self.directions.items())}
        shapes = {d.shape[:-1] for d in self.directions.values()}
        widths = {d.shape[-1] for d in self.directions.values()}
        if len(shapes) > 1 or any(len(s) > 1 for s in shapes):
            raise ConfigError(f"steering vector {self.label}: every block's direction must be [hidden] or "
                              f"[positions, hidden] alike (got shapes "
                              f"{sorted({d.shape for d in self.directions.values()})})")
        if widths and widths != {self.hidden_size}:
            raise ConfigError(f"steering vector {self.label}: its directions are {sorted(widths)} wide but it says "
                              f"hidden size {self.hidden_size}")
        if any(n < 0 for n in self.directions):
            raise ConfigError(f"steering vector {self.label}: block numbers start at 0 (got "
                              f"{min(self.directions)})")

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else "(unnamed)"

    @property
    def layers(self) -> tuple[int, ...]:
        """The blocks N it has a direction for, ascending."""
        return tuple(self.directions)

    @property
    def front(self) -> int:
        """0: every position; k: the sequence's first k positions only (ActAdd)."""
        first = next(iter(self.directions.values()), None)
        return int(first.shape[0]) if first is not None and first.ndim == 2 else 0

    def norm(self, layer: int) -> float:
        """‖direction‖ at block ``layer`` (the Frobenius norm of an ActAdd's rows)."""
        return float(np.linalg.norm(self.directions[layer]))

    def unit(self, layer: int) -> np.ndarray:
        """The unit direction [hidden] the residual is read along at block ``layer`` (an ActAdd's: its rows' sum);
        zeros for a zero direction."""
        d = self.directions[layer]
        d = d.sum(axis=0) if d.ndim == 2 else d
        n = float(np.linalg.norm(d))
        return (d / n).astype(np.float32) if n > 0 else np.zeros_like(d)

    def scaled(self, factor: float) -> SteeringVector:
        return dataclasses.replace(self, directions={n: d * np.float32(factor) for n, d in self.directions.items()})

    def within(self, span: tuple[int, int] | None) -> SteeringVector:
        """Only the blocks in ``span`` (inclusive; None: all)."""
        if span is None:
            return self
        low, high = span
        return dataclasses.replace(self, directions={n: d for n, d in self.directions.items() if low <= n <= high})

    def check_fits(self, hidden_size: int, layer_count: int, model_name: str, source: str = "") -> None:
        """ConfigError naming the file, the widths or block counts and the model when this vector cannot steer a
        model ``hidden_size`` wide with ``layer_count`` decoder blocks."""
        where = source or self.label
        if self.hidden_size != hidden_size:
            made = f" (made on {self.model_name})" if self.model_name else ""
            raise ConfigError(f"steering vector {where}{made} is {self.hidden_size} wide, but {model_name}'s hidden "
                              f"size is {hidden_size}: it was made for another model")
        if self.directions and max(self.directions) >= layer_count:
            raise ConfigError(f"steering vector {where} has a direction for block {max(self.directions)} (numbered "
                              f"from 0), but {model_name} has {layer_count} decoder blocks (0 to {layer_count - 1}): "
                              "it was made for a deeper model")
        if self.layer_count and self.layer_count != layer_count:
            raise ConfigError(f"steering vector {where} was made for a model with {self.layer_count} decoder blocks "
                              f"({self.model_name or 'another model'}), but {model_name} has {layer_count}")


def model_width(model: Any) -> int:
    """The hidden size of a transformers model (its decoder's, for a multimodal one): what a vector must match."""
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return int(text.hidden_size)


def mean_difference(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """CAA / ActAdd's direction: mean(positive) − mean(negative) over the examples (axis 0), float32."""
    return (positive.astype(np.float64).mean(axis=0) - negative.astype(np.float64).mean(axis=0)).astype(np.float32)


def first_component(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """repeng's ``pca_diff``: the first principal component of the pairs' differences (positive[i] − negative[i],
    centred on their mean, as scikit-learn's PCA centres them), unit norm, its sign chosen so that more pairs
    project higher on the positive side than on the negative (repeng's vote). Needs two pairs or more (one
    difference centred is zero)."""
    if positive.shape != negative.shape:
        raise ConfigError(f"the principal component needs positive and negative examples in pairs "
                          f"(got {positive.shape[0]} positive, {negative.shape[0]} negative)")
    if positive.shape[0] < 2:
        raise ConfigError("the principal component of the differences needs at least two contrast pairs "
                          "(one pair's difference has no spread): use the mean difference for a single pair")
    diffs = positive.astype(np.float64) - negative.astype(np.float64)
    centred = diffs - diffs.mean(axis=0, keepdims=True)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    direction = vt[0]
    pos, neg = positive.astype(np.float64) @ direction, negative.astype(np.float64) @ direction
    if np.mean(pos < neg) > np.mean(pos > neg):
        direction = -direction
    return (direction / np.linalg.norm(direction)).astype(np.float32)
