"""One what-if stage per sampler, in modules named as the samplers' declarations (``playground.config.samplers``):
``@stage(name)`` registers ``fn(chain, settings, context, start, steps, encode, breaker_ids)``, which transforms
``chain`` (``bounds._Chain``) in place for every step at once and flags the steps it cannot make exact. Every
module of this package is imported here, so a new sampler's stage is a new file."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageEntry:
    fn: Callable[..., None]
    label: Callable[[Any], str]  # the stage's name for these settings ("dynatemp" for temperature with a range)
    # A stage whose state follows the chosen tokens' final probabilities (mirostat's mu): (chosen_prob [S] or
    # empty for the start, settings, steps) -> its state per step [S], which ``derive`` iterates to its fixed point
    # and hands the stage as ``chain.mu``.
    feedback: Callable[[Any, Any, int], Any] | None = None
    # The stage only multiplies each step's logits by a factor it puts in ``chain.scale`` (temperature): the
    # recorded whole-vocabulary numbers still describe the chain after it. Every other stage ends them.
    scales: bool = False


STAGES: dict[str, StageEntry] = {}


StageFn = Callable[..., None]


def stage(name: str, label: Callable[[Any], str] | None = None,
          feedback: Callable[[Any, Any, int], Any] | None = None, scales: bool = False) -> Callable[[StageFn], StageFn]:
    """Decorator: the what-if's stage for the declared sampler ``name``."""
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        STAGES[name] = StageEntry(fn, label or (lambda settings: name), feedback, scales)
        return fn
    return register


for _info in pkgutil.iter_modules(__path__):  # each module registers its samplers' stages
    importlib.import_module(f"{__name__}.{_info.name}")
