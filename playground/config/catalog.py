"""The strategy catalog: every strategy's name, its help line, the settings it reads, the step events it yields and
the ``"module:function"`` of its runner.

The CLI's ``--strategy`` choices and help, the window's strategy menu, saved runs, presets and the Qt-free state
read this table; it loads no torch and knows no engine (``playground.engine.strategies`` imports a runner by its
name when a run starts). Each capability declares its entries in its own settings module (``config/beam.py``
registers beam search, ``config/layers.py`` early exit, layer skipping and the lens), and ``playground.config``
imports every module of the package, so the catalog names none of them; entries are kept in their ``order``
(the strategy menu's and ``--help``'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError
from playground.config.groups import AFTER_BUILT_INS, SettingsGroup

# What a caller hands a run besides the model and its settings, for every model source (the engine's run context,
# a server run, the window's jobs): a check polled for Stop, and a report of a build's progress (message, 0..1).
StopCheck = Callable[[], bool]
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Strategy:
    name: str
    help: str  # one line for --help and the menu's tooltip
    sections: tuple[str, ...] = ()  # shared settings sections it reads besides "generation": "sampling", "penalties"
    groups: tuple[type[SettingsGroup], ...] = ()  # capability settings it reads
    # The per-step events it yields, the most telling first: views pick runs by these, and the view of the first
    # comes to the front.
    step_events: tuple[type, ...] = ()
    # "module:function" of its runner, (lm, settings, context) -> events, imported when a run starts; the context
    # (``playground.engine.run_context.RunContext``) carries Stop, and what the entry says the runner takes:
    runner: str = ""
    takes_progress: bool = False  # it builds something before its generator is returned and reports progress
    takes_chooser: bool = False  # step mode: the user may pick its tokens
    records_itself: tuple[str, ...] = ()  # the loop's observers it does the work of itself ("lens": early exit)
    # Shared run settings it reads outside its ``sections`` (contrastive search: ``top_k``, its k); the form enables
    # those fields alone and keeps their values.
    reads: tuple[str, ...] = ()
    # Its rules over the shared settings, (settings) -> [(holds, message)], checked by ``RunSettings.validate``.
    checks: Callable[[Any], list[tuple[bool, str]]] | None = None
    order: int = AFTER_BUILT_INS  # its place in the strategy menu, --strategy's choices and --help
    decodes: bool = True  # it generates tokens (False: it studies the prompt, as activation patching does)


@dataclass(frozen=True)
class SharedGroup:
    """A capability that applies across strategies (the logit lens records; ``--quant`` wraps): declared once
    here, not in every strategy's entry. Its group joins the ``groups`` of each strategy it applies to."""

    group: type[SettingsGroup]
    what: str  # the refusal's first words: "--quant runs a strategy on the model's quantized copy"
    reason: str  # why a strategy does not: "does not record them"
    takers: tuple[str, ...] | None = None  # the strategies that take it; None: every one not in ``excluding``
    excluding: tuple[str, ...] = ()
    # "module:function" (runner, lm, settings, context) -> events: what runs the strategy when the
    # group is active (``SettingsGroup.active``); "" when each strategy records it itself.
    wrapper: str = ""
    keeps_chooser: bool = False  # its wrapper passes the run's step-mode chooser on (--quant's passes none)
    order: int = AFTER_BUILT_INS  # its turn among the shared groups (which refusal comes first, summaries' order)

    def applies_to(self, name: str) -> bool:
        return name in self.takers if self.takers is not None else name not in self.excluding


STRATEGIES: dict[str, Strategy] = {}
SHARED: list[SharedGroup] = []
_DECLARED: dict[str, Strategy] = {}  # each entry as registered, before the shared groups joined its groups


def _with_shared(strategy: Strategy) -> Strategy:
    extra = tuple(s.group for s in SHARED if s.applies_to(strategy.name) and s.group not in strategy.groups)
    return dataclasses.replace(strategy, groups=(*strategy.groups, *extra)) if extra else strategy


def register_strategy(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
    if not strategy.runner.partition(":")[2]:
        raise ValueError(f"strategy {strategy.name!r} names no runner (runner='module:function')")
    _DECLARED[strategy.name] = strategy
    STRATEGIES[strategy.name] = _with_shared(strategy)
    _keep_order()
    return STRATEGIES[strategy.name]


def register_shared_group(shared: SharedGroup) -> SharedGroup:
    SHARED.append(shared)
    SHARED.sort(key=lambda s: s.order)  # stable: equal numbers keep their turn
    for name, strategy in STRATEGIES.items():  # the shared groups follow a strategy's own, in SHARED's order
        STRATEGIES[name] = _with_shared(_DECLARED.get(name, strategy))
    return shared


def _keep_order() -> None:
    """``STRATEGIES`` in its entries' ``order``; entries with the same number in the order they registered."""
    ordered = sorted(STRATEGIES.values(), key=lambda s: s.order)
    STRATEGIES.clear()
    STRATEGIES.update((s.name, s) for s in ordered)


def shared_refusal(shared: SharedGroup, strategy: Strategy) -> str:
    takers = ", ".join(s.name for s in STRATEGIES.values() if shared.group in s.groups)
    return f"{shared.what}: {strategy.name} {shared.reason}; use {takers}"


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, not {name!r}") from None
