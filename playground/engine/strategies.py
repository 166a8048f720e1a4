"""The engine's side of the strategy catalog: ``run_strategy`` imports the runner a catalog entry names and runs it.

What a strategy is called, what it reads, what it yields and which function decodes it (``runner``,
``"module:function"``) is the catalog's (``playground.config.catalog``, in the contract, each entry declared by its
capability's settings module); the runner is imported on first use, so reading the catalog loads no torch.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from playground.config import ConfigError, RunSettings
from playground.config.catalog import SHARED, get_strategy, shared_refusal
from playground.events import Event

if TYPE_CHECKING:  # the table itself must load without torch (the CLI's --help, saved runs, the Qt-free state)
    from playground.models.loaded import LoadedModel

StopCheck = Callable[[], bool]
Runner = Callable[["LoadedModel", RunSettings, "StopCheck | None"], Iterator[Event]]


def load_runner(name: str) -> Runner:
    """The function the catalog's entry ``name`` names as its runner."""
    module, _, function = get_strategy(name).runner.partition(":")
    return getattr(importlib.import_module(module), function)


def run_strategy(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None = None,
                 progress: Callable[[str, float], None] | None = None, chooser: Callable | None = None
                 ) -> Iterator[Event]:
    """Validate the settings and run the chosen strategy as a generator of events.

    ``should_stop`` is polled before each step (and between prefill chunks); when it returns True the run ends
    with a ``RunFinished`` whose ``stop_reason`` is ``"stopped"``. With ``--quant METHOD`` the strategy runs on the
    model's quantized copy, built (or taken from the cache) before the generator is returned, reporting
    ``progress(message, fraction)``; its ``QuantReady`` follows the run's ``RunStarted``. ``chooser``: step mode,
    the user picks each token (``engine.sampling.Chooser``), for a runner that takes one (greedy and sampling).
    """
    strategy = get_strategy(settings.strategy)
    settings.validate()
    runner = load_runner(strategy.name)
    for shared in SHARED:  # the capabilities that apply across strategies: the lens, --quant
        if not settings.group(shared.group).active():
            continue
        if shared.group not in strategy.groups:
            raise ConfigError(shared_refusal(shared, strategy))
        if shared.wrapper:  # e.g. --quant: the strategy runs on the model's quantized copy
            module, _, function = shared.wrapper.partition(":")
            wrap = getattr(importlib.import_module(module), function)
            return wrap(runner, lm, settings, should_stop, progress)
    return call_runner(runner, lm, settings, should_stop, progress, chooser)


def takes_chooser(strategy: str) -> bool:
    """Whether the strategy's runner lets the user pick its tokens (step mode)."""
    return "chooser" in inspect.signature(load_runner(strategy)).parameters


def call_runner(runner: Runner, lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None,
                progress: Callable[[str, float], None] | None, chooser: Callable | None = None) -> Iterator[Event]:
    """``runner(lm, settings, should_stop)``, and ``progress`` for a runner that builds something before its
    generator is returned (a drafter's, amateur's or cheap model's quantized copy) and takes it; ``chooser`` for
    one that takes it (step mode)."""
    extra: dict = {}
    parameters = inspect.signature(runner).parameters
    if progress is not None and "progress" in parameters:
        extra["progress"] = progress
    if chooser is not None and "chooser" in parameters:
        extra["chooser"] = chooser
    return runner(lm, settings, should_stop, **extra)

