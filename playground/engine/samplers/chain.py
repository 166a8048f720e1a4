"""Running the sampler chain on a compact candidate set once a truncating sampler has cut the vocabulary (as
llama.cpp's samplers shrink ``cur_p``): the stages after the first cut see only the tokens still in play.

Why this is exact. Every stage of the chain keeps a removed token removed (``-inf`` stays ``-inf``):
- the samplers whose declaration says ``value_only`` (temperature, dynamic temperature, top-k/p, min-p, typical,
  epsilon, eta, top-nσ, XTC, mirostat, top-a) read only the logits' values, and whatever they compute (a softmax, an
  entropy, a count, a mean and spread of the finite logits, a sort) gives a removed token weight 0 or leaves it
  out, so running them on the finite logits alone gives the same finite logits;
- the others run on the whole vocabulary, rebuilt: those that read token ids (penalties, DRY, logit bias, n-gram
  ban, guidance) subtract, divide by a positive
  number, add a finite bias or ``-inf``, or (guidance, scale > 0) scale a ``-inf`` log-probability: none makes a
  removed token finite; tail-free sampling reads how many tokens were removed (zeros at the end of its sorted
  probabilities) and only removes; Adaptive-P transforms only the finite logits (and keeps its input by id).
So once a stage leaves K tokens finite, a token outside those K can never be kept by a later stage, and the compact
run's logits equal the full run's on the K tokens (up to float rounding of sums taken over fewer zeros).
Without a cut (or with a cut that keeps more than ``1 / COMPACT_SHARE`` of the vocabulary) the chain runs on the
whole vocabulary, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from playground.config.samplers import spec_of_stage

# Compact once the kept tokens are at most this share of the vocabulary (a gather costs less than the pass it saves).
COMPACT_SHARE = 4


class Transform(Protocol):  # read-only members: a frozen dataclass (processors.NamedTransform) is one
    @property
    def name(self) -> str: ...
    @property
    def apply(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]: ...


def flags(transform: Transform) -> tuple[bool, bool]:
    """(value-only, truncating) of a stage: the sampler object's own, else its declaration's (by stage name)."""
    value_only, truncating = getattr(transform, "value_only", None), getattr(transform, "truncating", None)
    if value_only is None or truncating is None:
        spec = spec_of_stage(transform.name)
        return (spec.value_only, spec.truncating) if spec is not None else (False, False)
    return bool(value_only), bool(truncating)


@dataclass(frozen=True)
class Kept:
    """The compact candidate set: its token ids and where each vocabulary id sits in it."""

    ids: torch.Tensor  # [K] token ids, ascending
    position: torch.Tensor  # [vocab] index into ids, -1 for a token outside

    @classmethod
    def of(cls, ids: torch.Tensor, vocab: int) -> Kept:
        position = torch.full((vocab,), -1, dtype=torch.long, device=ids.device)
        position[ids] = torch.arange(ids.shape[0], device=ids.device)
        return cls(ids=ids, position=position)


@dataclass(frozen=True)
class CompactLogits:
    """One stage's logits on the compact set: ``values[0, j]`` is token ``kept.ids[j]``'s, every other token's is
    ``-inf``."""

    kept: Kept
    values: torch.Tensor  # [1, K]

    @property
    def vocab(self) -> int:
        return self.kept.position.shape[0]

    def at(self, index: torch.Tensor) -> torch.Tensor:
        """The logits of the vocabulary ids ``index`` ([n]) -> [n] (``-inf`` outside the set)."""
        where = self.kept.position[index]
        inside = self.values[0, where.clamp(min=0)]
        return torch.where(where >= 0, inside, torch.full_like(inside, float("-inf")))

    def full(self) -> torch.Tensor:
        """The whole vocabulary's logits [1, vocab]."""
        out = torch.full((1, self.vocab), float("-inf"), dtype=self.values.dtype, device=self.values.device)
        return out.index_copy_(1, self.kept.ids, self.values)

    def probs(self) -> torch.Tensor:
        """The softmax on the compact set [1, K] (the whole vocabulary's, on these tokens)."""
        return self.values.softmax(dim=-1)


Stage = torch.Tensor | CompactLogits  # [1, vocab], or the compact set's


def values_at(stage: Stage, index: torch.Tensor) -> torch.Tensor:
    """A stage's logits of the vocabulary ids ``index`` ([n]) -> [n], whichever form it has."""
    return stage.at(index) if isinstance(stage, CompactLogits) else stage[0, index]


def run_chain(pipeline: Sequence[Transform], ids: torch.Tensor, logits: torch.Tensor, *,
              compact: bool = True) -> list[tuple[str, Stage]]:
    """Each stage's output, in order. ``logits``: [1, vocab] (a batch of rows always runs whole); ``compact``:
    whether the stages after the first cut may run on the compact set (False: the whole vocabulary throughout)."""
    stages: list[tuple[str, Stage]] = []
    current: Stage = logits
    vocab = logits.shape[-1]
    may_compact = compact and logits.shape[0] == 1
    for transform in pipeline:
        value_only, truncating = flags(transform)
        if isinstance(current, CompactLogits):
            if value_only:
                current = CompactLogits(current.kept, transform.apply(ids, current.values))
            else:  # reads token ids: on the whole vocabulary, rebuilt; a removed token stays removed
                out = transform.apply(ids, current.full())
                current = CompactLogits(current.kept, out.index_select(1, current.kept.ids))
        else:
            current = transform.apply(ids, current)
            if may_compact and truncating:
                finite = torch.isfinite(current[0]).nonzero().squeeze(1)  # [K], ascending
                if finite.shape[0] * COMPACT_SHARE <= vocab:
                    kept = Kept.of(finite, vocab)
                    current = CompactLogits(kept, current.index_select(1, finite))
        stages.append((transform.name, current))
    return stages
