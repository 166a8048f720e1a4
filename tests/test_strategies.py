"""The strategy registry: what the CLI and the window offer, and that every registered strategy runs."""

from __future__ import annotations

import argparse

import pytest
from support.strategy_needs import NEEDS

from playground.config import ConfigError, RunSettings
from playground.config.catalog import STRATEGIES, get_strategy
from playground.engine.strategies import load_runner, run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted


def _strategy_choices(command: str) -> list[str]:
    from playground.cli import build_parser

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (action,) = [a for a in subparsers.choices[command]._actions if a.dest == "strategy"]
    return list(action.choices)


def test_registry_holds_the_known_strategies():
    assert {"greedy", "sample", "beam"} <= set(STRATEGIES)
    for name, strategy in STRATEGIES.items():
        assert strategy.name == name and strategy.help and strategy.step_events


def test_the_engine_runs_exactly_the_catalog():
    """Every catalog entry names a runner (``module:function``) that the engine can import and call."""
    for name, strategy in STRATEGIES.items():
        module, _, function = strategy.runner.partition(":")
        assert module.startswith("playground.engine.") and function, (name, strategy.runner)
        assert callable(load_runner(name)), name


def test_the_catalog_keeps_the_menus_order():
    """Each capability's settings module declares its entries, imported by name: the menu and --help keep their
    order by the entries' numbers, not by which module was imported first."""
    assert list(STRATEGIES) == ["greedy", "sample", "beam", "speculative", "early-exit", "layer-skip", "kv-cache",
                                "compare", "contrastive", "contrastive-search", "cascade", "patching"]
    from playground.config import GROUPS  # the form's boxes and --help's sections, by the groups' numbers

    assert list(GROUPS)[:13] == ["beam", "beam_groups", "forced_words", "compare", "steering", "steering_sweep",
                                 "quant", "contrastive", "kv", "lens", "layers", "speculative", "cascade"]
    # A strategy's groups: its own, then the shared ones in their order, whichever module registered first.
    assert [g.name for g in get_strategy("beam").groups] == ["beam", "kv", "lens", "forced_words", "beam_groups",
                                                             "quant", "steering"]
    assert [g.name for g in get_strategy("greedy").groups] == ["lens", "quant", "steering_sweep", "steering", "dla",
                                                               "salience"]


@pytest.mark.parametrize("command", ["trace", "shot", "app"])
def test_cli_offers_exactly_the_registry(command):
    assert _strategy_choices(command) == list(STRATEGIES)


def test_window_offers_exactly_the_registry(qapp):
    from playground.ui.controls import RunControls

    controls = RunControls()
    combo = controls.strategy
    assert [combo.itemText(i) for i in range(combo.count())] == list(STRATEGIES)




@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_runs_on_a_tiny_model(tiny_lm, name):
    strategy = STRATEGIES[name]
    assert callable(load_runner(name))
    settings = RunSettings.from_flat(strategy=name, max_new_tokens=3, prompt="Hello", **NEEDS.get(name, {}))
    events = list(run_strategy(tiny_lm, settings))
    assert isinstance(events[0], RunStarted) and events[0].strategy == name
    assert isinstance(events[-1], RunFinished)
    # Between the start and the prefill, only the strategy's own description (e.g. speculative's drafter).
    prefill = next(i for i, e in enumerate(events) if isinstance(e, PrefillDone))
    assert all(not isinstance(e, (*strategy.step_events, RunFinished)) for e in events[1:prefill])
    # Then only step events; after the last of them, only the run's summaries (e.g. measurements made at the end).
    last = max(i for i, e in enumerate(events) if isinstance(e, strategy.step_events))
    steps = events[prefill + 1 : last + 1]
    assert steps and all(isinstance(e, strategy.step_events) for e in steps), [type(e).__name__ for e in steps]
    assert not any(isinstance(e, (*strategy.step_events, PrefillDone)) for e in events[last + 1 : -1])
    assert events[-1].stop_reason == "max_new_tokens"  # this tiny model does not end within 3 tokens
    if strategy.decodes:  # (activation patching studies the prompt: no tokens)
        assert sum(isinstance(e, strategy.step_events[-1]) for e in steps) == 3
        assert len(events[-1].token_ids) == 3


def test_unknown_strategy_is_refused_naming_the_known_ones(tiny_lm):
    with pytest.raises(ConfigError) as error:
        run_strategy(tiny_lm, RunSettings(strategy="nucleus"))
    message = str(error.value)
    assert message == f"strategy must be one of {', '.join(STRATEGIES)}, not 'nucleus'"
    assert all(name in message for name in ("greedy", "sample", "beam"))
    with pytest.raises(ConfigError, match="not 'nucleus'"):
        get_strategy("nucleus")
