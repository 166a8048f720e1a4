"""Observers on the decode loop: what a run records besides its strategy's own events (the logit lens, the
attention rows, the KV cache's measurements, the earlier runs the suffix drafter learns from). The observers
themselves are the modules of ``playground.engine.observers``; this module is their interface and registry (it
imports none of them, nor the loop: the package is found by name on first use).

An observer attaches to ``DecodeLoop`` and is called at its hooks; a strategy names none of them, it only says
where its step's model pass is (``with loop.watching():``) and, in its ``Picked``, where each kept token was
predicted in that pass. Each module of ``playground.engine.observers`` registers a factory with
``register_observer``: given the model, the settings and the run's context it returns its observer, or None when
the run does not ask for it. That package's modules are imported on first use, so a new observer is a file added
there and nothing edited.

The hooks, in the order the loop calls them (every one optional):

- ``defer``: prompt tokens the first step should read itself instead of the prefill (the lens records that step);
- ``started(loop)``: events that follow the strategy's start events (``LayersStarted``, ``KVStarted``);
- ``watch(loop)``: a context manager around each step's model pass (the lens's layer hooks), or None;
- ``after_step(loop, picked)``: inside the step's time, once the step picked its tokens (the lens reads its
  capture here, as a recording step always has);
- ``step_events(loop, picked, units)``: outside the step's time, for each of the step's first ``units`` kept
  tokens (one for a beam step), the events that come just before that token's own (``KVStep``, ``LayerStep``);
- ``finished(loop)``: the run is over (the history remembers its tokens).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeAlias

# (Annotations by name: this module imports neither the loop nor its observers, so neither imports it in a circle.)
DecodeLoop: TypeAlias = Any
Picked: TypeAlias = Any
LoadedModel: TypeAlias = Any
RunSettings: TypeAlias = Any
RunContext: TypeAlias = Any
PACKAGE = "playground.engine.observers"


class Observer:
    """The hooks' defaults: nothing deferred, no events, nothing watched."""

    defer = 0

    def started(self, loop: DecodeLoop) -> Iterable[Any]:
        return ()

    def watch(self, loop: DecodeLoop) -> AbstractContextManager[Any] | None:
        return None

    def after_step(self, loop: DecodeLoop, picked: Picked) -> None:
        return None

    def step_events(self, loop: DecodeLoop, picked: Picked, units: int) -> Sequence[Sequence[Any]] | None:
        return None

    def finished(self, loop: DecodeLoop) -> None:
        return None


Factory = Callable[[Any, Any, Any], "Observer | None"]  # (lm, settings, context) -> an observer or None
_FACTORIES: list[tuple[int, str, Factory]] = []
_LOADED = False


def register_observer(name: str, factory: Factory, order: int = 100) -> Factory:
    """``factory(lm, settings, context)`` -> the observer a run gets, or None. ``order``: the observers' turn
    (their events before a token come in this order: the lens's, then the cache's)."""
    _FACTORIES.append((order, name, factory))
    _FACTORIES.sort(key=lambda entry: entry[0])
    return factory


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        package = importlib.import_module(PACKAGE)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{PACKAGE}.{module.name}")


def observers_for(lm: LoadedModel, settings: RunSettings, context: RunContext) -> list[Observer]:
    """The observers a run's loop gets: those its settings ask for, then the context's own."""
    _load()
    made = [factory(lm, settings, context) for _, _, factory in _FACTORIES]
    return [o for o in made if o is not None] + list(context.observers)


def overrides(observer: Observer, hook: str) -> bool:
    """Whether ``observer`` has a hook of its own (the loop calls only those: no cost for the others)."""
    return getattr(type(observer), hook) is not getattr(Observer, hook)
