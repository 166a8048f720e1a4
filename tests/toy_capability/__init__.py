"""A toy capability from outside the package, for tests/test_toy_capability.py: it declares a strategy
("toy-echo": greedy decoding that also reports each token's length), its settings group ("toy": one setting), one
event (``ToyStep``), a fold and a view, and no file of the playground names it. Loaded by its module name through
``PLAYGROUND_CAPABILITIES``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

from playground.config import SettingsGroup, register_group, setting
from playground.config.catalog import Strategy, register_strategy
from playground.config.plugins import register_ui_module
from playground.events import TokenStep, register_event_types


@register_group
@dataclass(frozen=True)
class ToySettings(SettingsGroup):
    name: ClassVar[str] = "toy"
    title: ClassVar[str] = "Toy echo"
    toy_scale: int = setting(2, "length scale", "each token's reported length is its characters times this",
                             minimum=1, maximum=10)


@dataclass(frozen=True)
class ToyStep:
    type: ClassVar[str] = "toy_step"
    step: int
    token_id: int
    length: int  # characters of the token's text times toy_scale


register_event_types(sys.modules[__name__])
register_strategy(Strategy("toy-echo", "greedy decoding that reports each token's length (a toy capability)",
                           groups=(ToySettings,), step_events=(ToyStep, TokenStep),
                           runner="toy_capability.engine:run_toy"))
register_ui_module("toy_capability.view")
