"""The engine's side of the strategy catalog: a runner for every strategy name, and ``run_strategy``.

What a strategy is called, what it reads and what it yields is the catalog's (``playground.config.catalog``, in the
contract); here each name gets the function that decodes it. Runners are named as ``"module:function"`` and
imported on first use, so reading this table loads no torch.
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

# Strategy name -> "module:function" taking (lm, settings, should_stop) and returning an event iterator.
RUNNERS: dict[str, str] = {}


def register_runner(name: str, runner: str) -> None:
    """The engine's runner for the catalog's strategy ``name``."""
    get_strategy(name)  # a runner for a strategy the catalog does not know is a bug
    if name in RUNNERS:
        raise ValueError(f"strategy {name!r} has a runner already")
    RUNNERS[name] = runner


def load_runner(name: str) -> Runner:
    path = RUNNERS.get(name) or get_strategy(name).runner  # a capability from outside names its own
    if not path:
        raise RuntimeError(f"strategy {name!r} is in the catalog, but the engine registers no runner for it")
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


register_runner("greedy", "playground.engine.sampling:run_sampling")
register_runner("sample", "playground.engine.sampling:run_sampling")
register_runner("beam", "playground.engine.beam:run_beam_search")
register_runner("speculative", "playground.engine.speculative.decode:run_speculative")
register_runner("early-exit", "playground.engine.layers.decode:run_early_exit")
register_runner("layer-skip", "playground.engine.layers.decode:run_layer_skip")
register_runner("kv-cache", "playground.engine.kv.decode:run_kv_cache")
register_runner("compare", "playground.engine.compare.panes:run_compare")
register_runner("contrastive", "playground.engine.contrastive.decode:run_contrastive")
register_runner("cascade", "playground.engine.cascade.decode:run_cascade")


def run_strategy(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None = None,
                 progress: Callable[[str, float], None] | None = None) -> Iterator[Event]:
    """Validate the settings and run the chosen strategy as a generator of events.

    ``should_stop`` is polled before each step (and between prefill chunks); when it returns True the run ends
    with a ``RunFinished`` whose ``stop_reason`` is ``"stopped"``. With ``--quant METHOD`` the strategy runs on the
    model's quantized copy, built (or taken from the cache) before the generator is returned, reporting
    ``progress(message, fraction)``; its ``QuantReady`` follows the run's ``RunStarted``.
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
    return call_runner(runner, lm, settings, should_stop, progress)


def call_runner(runner: Runner, lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None,
                progress: Callable[[str, float], None] | None) -> Iterator[Event]:
    """``runner(lm, settings, should_stop)``, and ``progress`` for a runner that builds something before its
    generator is returned (a drafter's, amateur's or cheap model's quantized copy) and takes it."""
    if progress is not None and "progress" in inspect.signature(runner).parameters:
        return runner(lm, settings, should_stop, progress=progress)
    return runner(lm, settings, should_stop)

