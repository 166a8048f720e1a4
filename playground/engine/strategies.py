"""The engine's side of the strategy catalog: ``run_strategy`` imports the runner a catalog entry names and runs it.

What a strategy is called, what it reads, what it yields, what it takes (``takes_progress``, ``takes_chooser``)
and which function decodes it (``runner``, ``"module:function"``) is the catalog's (``playground.config.catalog``,
in the contract, each entry declared by its capability's settings module); the runner is imported on first use, so
reading the catalog loads no torch. Every runner is called ``runner(lm, settings, context)`` with the run's one
``RunContext``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from playground.config import ConfigError, RunSettings
from playground.config.catalog import SHARED, get_strategy, shared_refusal
from playground.events import Event

if TYPE_CHECKING:  # the table itself must load without torch (the CLI's --help, saved runs, the Qt-free state)
    from playground.engine.run_context import Chooser, Progress, RunContext, StopCheck
    from playground.models.loaded import LoadedModel

Runner = Callable[["LoadedModel", RunSettings, "RunContext"], Iterator[Event]]


def load_runner(name: str) -> Runner:
    """The function the catalog's entry ``name`` names as its runner."""
    module, _, function = get_strategy(name).runner.partition(":")
    return getattr(importlib.import_module(module), function)


def run_strategy(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | RunContext | None = None,
                 progress: Progress | None = None, chooser: Chooser | None = None) -> Iterator[Event]:
    """Validate the settings and run the chosen strategy as a generator of events.

    ``should_stop`` is polled before each step (and between prefill chunks); when it returns True the run ends
    with a ``RunFinished`` whose ``stop_reason`` is ``"stopped"``. With ``--quant METHOD`` the strategy runs on the
    model's quantized copy, built (or taken from the cache) before the generator is returned, reporting
    ``progress(message, fraction)``; its ``QuantReady`` follows the run's ``RunStarted``. ``chooser``: step mode,
    the user picks each token (``engine.run_context.Chooser``), for a strategy whose entry ``takes_chooser``.
    The three are made into the run's one ``RunContext`` here (a context given as ``should_stop`` is used as it
    is: a compare pane's or the quantization lab's inner runs share their run's).
    """
    from playground.engine.run_context import RunContext

    strategy = get_strategy(settings.strategy)
    settings.validate()
    runner = load_runner(strategy.name)
    given = RunContext.of(should_stop)
    context = dataclasses.replace(given, progress=progress or given.progress,
                                  chooser=(chooser or given.chooser) if strategy.takes_chooser else None)
    wrappers = []
    for shared in SHARED:  # the capabilities that apply across strategies: the lens, --quant, --steer
        if not settings.group(shared.group).active():
            continue
        if shared.group not in strategy.groups:
            raise ConfigError(shared_refusal(shared, strategy))
        if shared.wrapper:  # e.g. --quant: the strategy runs on the model's quantized copy
            module, _, function = shared.wrapper.partition(":")
            wrappers.append((getattr(importlib.import_module(module), function), shared.keeps_chooser))
    if not wrappers:
        return call_runner(runner, lm, settings, context)
    # Several wrappers nest in the shared groups' order, the first outermost (--quant's copy is then the model
    # --steer hooks); a wrapper that does not keep the chooser passes none on.
    inner = runner
    for wrap, keeps in reversed(wrappers[1:]):
        inner = _wrapped(wrap, inner, keeps)
    wrap, keeps = wrappers[0]
    return wrap(inner, lm, settings, context if keeps else dataclasses.replace(context, chooser=None))


def _wrapped(wrap: Callable[..., Iterator[Event]], runner: Runner, keeps_chooser: bool) -> Runner:
    def run(lm: LoadedModel, settings: RunSettings, context: RunContext) -> Iterator[Event]:
        return wrap(runner, lm, settings, context if keeps_chooser else dataclasses.replace(context, chooser=None))
    return run


def takes_chooser(strategy: str) -> bool:
    """Whether the strategy lets the user pick its tokens (step mode): its catalog entry says."""
    return get_strategy(strategy).takes_chooser


def call_runner(runner: Runner, lm: LoadedModel, settings: RunSettings, context: RunContext) -> Iterator[Event]:
    """``runner(lm, settings, context)``: the context without a progress for a strategy whose entry does not take
    one (it builds nothing before its generator is returned)."""
    if context.progress is not None and not get_strategy(settings.strategy).takes_progress:
        context = dataclasses.replace(context, progress=None)
    return runner(lm, settings, context)
