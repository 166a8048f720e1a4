"""One run's context, made once by ``run_strategy`` and handed to the runner: what the caller gives a run besides
the model and the settings.

``should_stop`` is polled before each step and between prefill chunks (and during the builds a runner makes before
its generator is returned); ``progress(message, fraction)`` reports those builds; ``chooser`` is step mode's (the
user picks each token); ``history`` is the earlier runs the suffix drafter learns from (default: the loaded
model's own, ``LoadedModel.history``); ``observers`` are attached to the run's decode loop besides the ones the
settings ask for (``playground.engine.observers``); ``steering`` is the live strength of a steered run (the window's
slider sets it while the run streams: ``playground.config.steering.LiveStrength``; None: the settings' strengths).
A strategy's catalog entry says whether it takes the progress
and the chooser (``takes_progress``, ``takes_chooser``); a context without them is the plain default.

The engine's helpers below the runners (the baselines, the KV lab's timed decodes and batch sweep, the variants'
builds, the cascade's and the amateur's catch-up reads, the tuned lens's training) take the run's context as it is
(``context: RunContext = NO_CONTEXT``) and poll ``context.stopped()`` / report through ``context.report``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from playground.config.catalog import Progress, StopCheck
from playground.config.steering import LiveStrength
from playground.models.run_history import RunHistory

if TYPE_CHECKING:
    from playground.events import TokenStep
    from playground.models.loaded import LoadedModel

# Step mode ("you are the sampler"): called before each step's token is committed with the step as it would be
# recorded with the strategy's own choice (its candidates, ``token_id`` the sampler's pick); returns the token to
# take (a different one is recorded as forced) or None to end the run "stopped".
Chooser = Callable[["TokenStep"], "int | None"]


def never_stop() -> bool:
    return False


@dataclass(frozen=True)
class RunContext:
    should_stop: StopCheck = never_stop
    progress: Progress | None = None
    chooser: Chooser | None = None
    history: RunHistory | None = None  # None: the loaded model's own
    observers: tuple[Any, ...] = ()  # ``playground.engine.observers.Observer``s the caller attaches
    steering: LiveStrength | None = None  # a steered run's live strength (None: the settings')

    @classmethod
    def of(cls, given: RunContext | StopCheck | None = None, progress: Progress | None = None) -> RunContext:
        """The context a runner was handed, or one around a plain stop check (None: never stop), as the tests and
        the benchmarks call a runner directly; ``progress``, when given, replaces the context's."""
        context = given if isinstance(given, RunContext) else cls(should_stop=given or never_stop)
        return context if progress is None else dataclasses.replace(context, progress=progress)

    def stopped(self) -> bool:
        return self.should_stop()

    def report(self, message: str, fraction: float) -> None:
        """``progress(message, fraction)``, when the context has one."""
        if self.progress is not None:
            self.progress(message, fraction)

    def __call__(self) -> bool:
        """A context is also a plain stop check, for a runner written against ``(lm, settings, should_stop)``."""
        return self.should_stop()

    def history_of(self, lm: LoadedModel) -> RunHistory:
        return self.history if self.history is not None else lm.history

    @staticmethod
    def generator(device: torch.device, seed: int) -> torch.Generator:
        """The run's random generator (sampling, sampled verification, parallel samples), seeded explicitly."""
        return torch.Generator(device=device).manual_seed(seed)


# The default of an engine helper called without a run's context (tests, benchmarks): it never stops, reports nothing.
NO_CONTEXT = RunContext()
