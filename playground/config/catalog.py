"""The strategy catalog: every strategy's name, its help line, the settings it reads and the step events it yields.

The CLI's ``--strategy`` choices and help, the window's strategy menu, saved runs, presets and the Qt-free state
read this table; it loads no torch and knows no engine. The engine registers a runner under each name
(``playground.engine.strategies``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from playground.config.beam import BeamSettings
from playground.config.cascade import CascadeSettings
from playground.config.compare import CompareSettings
from playground.config.contrastive import ContrastiveSettings
from playground.config.errors import ConfigError
from playground.config.groups import SettingsGroup
from playground.config.kv import KVSettings
from playground.config.layers import LayerSettings, LensSettings
from playground.config.quant import QuantSettings
from playground.config.speculative import SpeculativeSettings
from playground.events import BeamStep, TokenStep
from playground.events.cascade import CascadeResponse, CascadeStep
from playground.events.contrastive import ContrastStep
from playground.events.kv import KVStep
from playground.events.layers import LayerStep
from playground.events.panes import PaneToken
from playground.events.speculative import SpeculativeRound


@dataclass(frozen=True)
class Strategy:
    name: str
    help: str  # one line for --help and the menu's tooltip
    sections: tuple[str, ...] = ()  # shared settings sections it reads besides "generation": "sampling", "penalties"
    groups: tuple[type[SettingsGroup], ...] = ()  # capability settings it reads
    # The per-step events it yields, the most telling first: views pick runs by these, and the view of the first
    # comes to the front.
    step_events: tuple[type, ...] = ()
    # "module:function" of its runner, for a capability from outside the package (built-ins register theirs with
    # the engine, playground.engine.strategies.RUNNERS): (lm, settings, should_stop) -> events.
    runner: str = ""


@dataclass(frozen=True)
class SharedGroup:
    """A capability that applies across strategies (the logit lens records; ``--quant`` wraps): declared once
    here, not in every strategy's entry. Its group joins the ``groups`` of each strategy it applies to."""

    group: type[SettingsGroup]
    what: str  # the refusal's first words: "--quant runs a strategy on the model's quantized copy"
    reason: str  # why a strategy does not: "does not record them"
    takers: tuple[str, ...] | None = None  # the strategies that take it; None: every one not in ``excluding``
    excluding: tuple[str, ...] = ()
    # "module:function" (runner, lm, settings, should_stop, progress) -> events: what runs the strategy when the
    # group is active (``SettingsGroup.active``); "" when each strategy records it itself.
    wrapper: str = ""

    def applies_to(self, name: str) -> bool:
        return name in self.takers if self.takers is not None else name not in self.excluding


STRATEGIES: dict[str, Strategy] = {}
SHARED: list[SharedGroup] = []


def _with_shared(strategy: Strategy) -> Strategy:
    extra = tuple(s.group for s in SHARED if s.applies_to(strategy.name) and s.group not in strategy.groups)
    return dataclasses.replace(strategy, groups=(*strategy.groups, *extra)) if extra else strategy


def register_strategy(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
    STRATEGIES[strategy.name] = _with_shared(strategy)
    return STRATEGIES[strategy.name]


def register_shared_group(shared: SharedGroup) -> SharedGroup:
    SHARED.append(shared)
    for name, strategy in STRATEGIES.items():
        STRATEGIES[name] = _with_shared(strategy)
    return shared


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


register_strategy(Strategy(
    "greedy", "always the most likely token (after the penalties)",
    sections=("penalties",), step_events=(TokenStep,)))
register_strategy(Strategy(
    "sample", "draw from the processed distribution (temperature, top-k, top-p, min-p)",
    sections=("sampling", "penalties"), step_events=(TokenStep,)))
register_strategy(Strategy(
    "beam", "keep several hypotheses, expand all of them every step",
    sections=("penalties",), groups=(BeamSettings, KVSettings), step_events=(BeamStep,)))

register_strategy(Strategy(
    "speculative", "a drafter proposes k tokens, the target verifies them in one pass and keeps what it agrees with",
    sections=("sampling", "penalties"), groups=(SpeculativeSettings,),
    step_events=(SpeculativeRound, TokenStep)))


register_strategy(Strategy(
    "early-exit", "each token leaves the layer stack at the first layer whose logit lens is confident enough",
    sections=("penalties",), groups=(LayerSettings,), step_events=(LayerStep, TokenStep)))
register_strategy(Strategy(
    "layer-skip", "each token passes some layers by: a fixed set, or after a layer that barely changed it",
    sections=("penalties",), groups=(LayerSettings,), step_events=(LayerStep, TokenStep)))


register_strategy(Strategy(
    "kv-cache", "greedy decoding that measures its KV cache every step: contiguous, paged, quantized or none",
    sections=("sampling", "penalties"), groups=(KVSettings,), step_events=(KVStep, TokenStep)))


register_strategy(Strategy(
    "compare", "2-4 strategies (or quantized copies) on the same prompt, side by side, with figures for each output",
    groups=(CompareSettings,), step_events=(PaneToken, TokenStep)))


register_strategy(Strategy(
    "contrastive", "the expert's plausible tokens, ranked by log p_expert − log p_amateur (an early layer, a "
    "quantized copy or a smaller model)", sections=("sampling", "penalties"), groups=(ContrastiveSettings,),
    step_events=(ContrastStep, TokenStep)))


register_strategy(Strategy(
    "cascade", "a cheap model (the quantized copy, the first layers, a small model) answers first; the full model "
    "decides where the cheap one is unsure (per token or per response)", sections=("sampling", "penalties"),
    groups=(CascadeSettings,), step_events=(CascadeStep, CascadeResponse, TokenStep)))


# The capabilities that apply across strategies, each declared once.
register_shared_group(SharedGroup(
    LensSettings, "--lens records each generated token's layers", "does not record them",
    takers=("greedy", "sample", "beam", "speculative", "early-exit", "layer-skip")))
register_shared_group(SharedGroup(
    QuantSettings, "--quant runs a strategy on the model's quantized copy",
    "does not take it (it has its own options for that, if any)", excluding=("compare", "contrastive", "cascade"),
    wrapper="playground.engine.quant.compare:run_quant_wrapper"))
