"""A sampler as one object (llama.cpp's ``llama_sampler_i`` is the model): ``apply`` transforms the logits,
``accept`` follows the chosen token, ``reset`` starts over, ``clone`` copies it with its state, ``snapshot`` and
``restore`` roll its state back (speculative roll-back, backtracking bans, grammars need it).

Each engine class names the declaration it implements (``playground.config.samplers``, the same stem) and is
registered with ``@engine_sampler``; ``playground.engine.samplers`` imports every module of its package, so a new
sampler is a new file here too. ``build(settings, context)`` binds a run's settings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from playground.config.samplers import SPECS, SamplerSpec


@dataclass(frozen=True)
class BuildContext:
    """What building a run's samplers may read besides the settings."""

    tokenizer: Any = None  # to read words (logit bias, DRY's breakers); None where a strategy has none
    vocab_size: int | None = None
    run: Any = None  # the run's ``SamplerRun`` (its generator, the strategy's inputs); None: the strategy has none
    strategy: str = ""
    eos_ids: tuple[int, ...] = ()  # the model's end tokens (a constraint allows them where it accepts)


class Sampler:
    """One sampler of a run's chain. ``name``: its stage's name (usually the declaration's; "dynatemp" for
    temperature with a range). ``apply`` is pure: it never modifies its input."""

    declares: ClassVar[str] = ""  # the declaration's name
    name: str = ""

    @property
    def spec(self) -> SamplerSpec:
        return SPECS[self.declares]

    @property
    def value_only(self) -> bool:
        return self.spec.value_only

    @property
    def truncating(self) -> bool:
        return self.spec.truncating

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        raise NotImplementedError

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``ids``: [batch, seq] the text so far; ``logits``: [batch, vocab] (-inf where removed) -> new logits."""
        raise NotImplementedError

    def accept(self, token_id: int, prob: float) -> None:
        """The run took ``token_id``, of probability ``prob`` under the chain's final distribution."""

    def reset(self) -> None:
        """Back to the state at the run's start."""

    def snapshot(self) -> Any:
        """The state that ``accept`` changes (None for a stateless sampler)."""
        return None

    def restore(self, state: Any) -> None:
        """Back to a ``snapshot``."""

    def clone(self) -> Sampler:
        twin = copy.copy(self)
        twin.restore(copy.deepcopy(self.snapshot()))
        return twin

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Stateless(Sampler):
    """A sampler whose ``apply`` is a fixed function of (ids, logits): ``fn`` with its settings bound."""

    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self.fn = fn

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.fn(ids, logits)


ENGINE_SAMPLERS: dict[str, type[Sampler]] = {}


def engine_sampler(cls: type[Sampler]) -> type[Sampler]:
    """Class decorator: the engine's object for the declared sampler ``cls.declares``."""
    if cls.declares not in SPECS:
        raise ValueError(f"{cls.__name__} implements {cls.declares!r}, which no declaration in "
                         "playground.config.samplers names")
    ENGINE_SAMPLERS[cls.declares] = cls
    return cls


def stateless(declares: str, build: Any) -> type[Sampler]:
    """Register a stateless sampler from ``build(settings, context) -> (stage name, fn)``."""

    class _Bound(Stateless):
        @classmethod
        def build(cls, settings: Any, context: BuildContext) -> Sampler:
            name, fn = build(settings, context)
            out = cls(name, fn)
            return out

    _Bound.declares = declares
    _Bound.__name__ = _Bound.__qualname__ = "".join(w.title() for w in declares.split("_"))
    return engine_sampler(_Bound)
