"""Beam search: its settings (names as in transformers' generate) and its catalog entry."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.kv import KVSettings
from playground.config.table import setting
from playground.events.beam import BeamStep

EARLY_STOPPING = ("true", "false", "never")


@register_group
@dataclass(frozen=True)
class BeamSettings(SettingsGroup):
    name = "beam"
    title = "Beam search"
    order = 10

    num_beams: int = setting(4, "beams", "hypotheses kept at every step", minimum=1, maximum=16)
    length_penalty: float = setting(
        1.0, "length penalty", "final scores are divided by length^this: >0 favours longer outputs",
        minimum=-5.0, maximum=5.0, step=0.1)
    early_stopping: str = setting(
        "false", "early stopping", "when to stop: true = as soon as num_beams hypotheses finished; false = when "
        "no running beam can beat them; never = only when none could at the longest length", choices=EARLY_STOPPING)
    num_return_sequences: int = setting(1, "return sequences", "finished hypotheses returned, best first",
                                        minimum=1, maximum=16)

    def summary(self) -> str:
        return f"{self.num_beams} beams · length penalty {self.length_penalty:g}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.num_return_sequences <= self.num_beams,
                 f"num_return_sequences must be between 1 and num_beams={self.num_beams} "
                 f"(got {self.num_return_sequences})")]


register_strategy(Strategy(
    "beam", "keep several hypotheses, expand all of them every step",
    sections=("penalties",), groups=(BeamSettings, KVSettings), step_events=(BeamStep,),
    runner="playground.engine.beam:run_beam_search", order=30))
