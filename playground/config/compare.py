"""Strategies side by side: 2-4 configurations decoding the same prompt, streaming together in aligned panes.

Each pane is written as it would be on the command line: a strategy name, then that pane's own options
(``"sample --temperature 0.7 --seed 3"``, ``"beam --num-beams 4"``, ``"greedy --quant rtn-int4"``). A pane starts
from the run's own settings (prompt, chat, max new tokens, ...) and changes only what it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.panes import PaneToken

MIN_PANES, MAX_PANES = 2, 4


@register_group
@dataclass(frozen=True)
class CompareSettings(SettingsGroup):
    name = "compare"
    title = "Side by side"
    order = 20

    panes: tuple[str, ...] = setting(
        ("greedy", "sample --temperature 0.8"), "panes", "2-4 configurations, each a strategy and its options as "
        "on the command line, e.g. 'sample --temperature 0.7' (the first is the reference the others are compared "
        "with; separate with | in the form)", flag="--pane")
    log_likelihood: bool = setting(True, "log-likelihood", "score every pane's output under the loaded model "
                                  "(one forward pass per pane at the end)")

    def summary(self) -> str:
        return " vs ".join(self.panes)

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(MIN_PANES <= len(self.panes) <= MAX_PANES,
                 f"side by side takes {MIN_PANES} to {MAX_PANES} panes, not {len(self.panes)}"),
                (all(p.strip() for p in self.panes), "a pane is empty: write a strategy name and its options")]


register_strategy(Strategy(
    "compare", "2-4 strategies (or quantized copies) on the same prompt, side by side, with figures for each output",
    groups=(CompareSettings,), step_events=(PaneToken, TokenStep), runner="playground.engine.compare.panes:run_compare",
    order=80))
