"""The strategy registry: name → runner, with what each strategy uses and yields.

The CLI's ``--strategy`` choices, the window's strategy menu and ``run_strategy`` all read this table. Runners are
named as ``"module:function"`` and imported on first use, so reading the table loads no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from playground.config import (
    BeamSettings,
    CascadeSettings,
    CompareSettings,
    ConfigError,
    ContrastiveSettings,
    KVSettings,
    LayerSettings,
    LensSettings,
    QuantSettings,
    RunSettings,
    SettingsGroup,
    SpeculativeSettings,
)
from playground.events import BeamStep, Event, TokenStep
from playground.events.cascade import CascadeResponse, CascadeStep
from playground.events.contrastive import ContrastStep
from playground.events.kv import KVStep
from playground.events.layers import LayerStep
from playground.events.panes import PaneToken
from playground.events.speculative import SpeculativeRound

if TYPE_CHECKING:  # the table itself must load without torch (the CLI's --help, saved runs, the Qt-free state)
    from playground.models.loaded import LoadedModel

StopCheck = Callable[[], bool]
Runner = Callable[["LoadedModel", RunSettings, "StopCheck | None"], Iterator[Event]]


@dataclass(frozen=True)
class Strategy:
    name: str
    help: str  # one line for --help and the menu's tooltip
    runner: str  # "module:function" taking (lm, settings, should_stop) and returning an event iterator
    sections: tuple[str, ...] = ()  # shared settings sections it reads besides "generation": "sampling", "penalties"
    groups: tuple[type[SettingsGroup], ...] = ()  # capability settings it reads
    # The per-step events it yields, the most telling first: views pick runs by these, and the view of the first
    # comes to the front.
    step_events: tuple[type, ...] = ()

    def load_runner(self) -> Runner:
        module, _, function = self.runner.partition(":")
        return getattr(importlib.import_module(module), function)


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
    STRATEGIES[strategy.name] = strategy
    return strategy


register_strategy(Strategy(
    "greedy", "always the most likely token (after the penalties)", "playground.engine.sampling:run_sampling",
    sections=("penalties",), groups=(LensSettings, QuantSettings), step_events=(TokenStep,)))
register_strategy(Strategy(
    "sample", "draw from the processed distribution (temperature, top-k, top-p, min-p)",
    "playground.engine.sampling:run_sampling", sections=("sampling", "penalties"),
    groups=(LensSettings, QuantSettings), step_events=(TokenStep,)))
register_strategy(Strategy(
    "beam", "keep several hypotheses, expand all of them every step", "playground.engine.beam:run_beam_search",
    sections=("penalties",), groups=(BeamSettings, LensSettings, KVSettings, QuantSettings), step_events=(BeamStep,)))

register_strategy(Strategy(
    "speculative", "a drafter proposes k tokens, the target verifies them in one pass and keeps what it agrees with",
    "playground.engine.speculative.decode:run_speculative", sections=("sampling", "penalties"),
    groups=(SpeculativeSettings, LensSettings, QuantSettings), step_events=(SpeculativeRound, TokenStep)))


register_strategy(Strategy(
    "early-exit", "each token leaves the layer stack at the first layer whose logit lens is confident enough",
    "playground.engine.layers.decode:run_early_exit", sections=("penalties",),
    groups=(LayerSettings, LensSettings, QuantSettings), step_events=(LayerStep, TokenStep)))
register_strategy(Strategy(
    "layer-skip", "each token passes some layers by: a fixed set, or after a layer that barely changed it",
    "playground.engine.layers.decode:run_layer_skip", sections=("penalties",),
    groups=(LayerSettings, LensSettings, QuantSettings), step_events=(LayerStep, TokenStep)))


register_strategy(Strategy(
    "kv-cache", "greedy decoding that measures its KV cache every step: contiguous, paged, quantized or none",
    "playground.engine.kv.decode:run_kv_cache", sections=("sampling", "penalties"),
    groups=(KVSettings, QuantSettings), step_events=(KVStep, TokenStep)))


register_strategy(Strategy(
    "compare", "2-4 strategies (or quantized copies) on the same prompt, side by side, with figures for each output",
    "playground.engine.compare.panes:run_compare", groups=(CompareSettings,), step_events=(PaneToken, TokenStep)))


register_strategy(Strategy(
    "contrastive", "the expert's plausible tokens, ranked by log p_expert − log p_amateur (an early layer, a "
    "quantized copy or a smaller model)", "playground.engine.contrastive.decode:run_contrastive",
    sections=("sampling", "penalties"), groups=(ContrastiveSettings,), step_events=(ContrastStep, TokenStep)))


register_strategy(Strategy(
    "cascade", "a cheap model (the quantized copy, the first layers, a small model) answers first; the full model "
    "decides where the cheap one is unsure (per token or per response)", "playground.engine.cascade.decode:run_cascade",
    sections=("sampling", "penalties"), groups=(CascadeSettings,),
    step_events=(CascadeStep, CascadeResponse, TokenStep)))


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, not {name!r}") from None


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
    if settings.group(LensSettings).lens and LensSettings not in strategy.groups:
        readers = ", ".join(s.name for s in STRATEGIES.values() if LensSettings in s.groups)
        raise ConfigError(f"--lens records each generated token's layers: {strategy.name} does not record them; "
                          f"use {readers}")
    quant = settings.group(QuantSettings)
    if quant.quant != "none":
        if QuantSettings not in strategy.groups:
            takers = ", ".join(s.name for s in STRATEGIES.values() if QuantSettings in s.groups)
            raise ConfigError(f"--quant runs a strategy on the model's quantized copy: {strategy.name} does not "
                              f"take it (it has its own options for that, if any); use {takers}")
        if quant.compare:  # the lab: reference and quantized copy side by side
            from playground.engine.quant.compare import run_quant_compare

            return run_quant_compare(lm, settings, should_stop, progress)
        from playground.engine.quant.apply import run_quantized

        return run_quantized(strategy.load_runner(), lm, settings, should_stop, progress)
    return strategy.load_runner()(lm, settings, should_stop)
