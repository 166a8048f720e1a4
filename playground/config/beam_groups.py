"""Diverse (group) beam search's settings (names as in transformers' generate): beam search's beams split into
groups that are decided one after another, each paying a diversity penalty for the tokens earlier groups chose
(``playground.engine.beam_groups``). Beam search takes them (a shared group with beam search as its one taker and
a wrapper that runs the group search in its place, so beam search's own entry is not edited); the check that the
groups divide the beams reads beam search's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playground.config.beam import BeamSettings
from playground.config.beam_forced import ForcedWordsSettings
from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting


@register_group
@dataclass(frozen=True)
class BeamGroupSettings(SettingsGroup):
    name = "beam_groups"
    title = "Diverse beam search"
    order = 11  # right after beam search's box

    num_beam_groups: int = setting(
        1, "beam groups", "diverse beam search: split the beams into this many groups, decided in turn at each "
        "step; 1 = plain beam search", minimum=1, maximum=16)
    diversity_penalty: float = setting(
        0.0, "diversity penalty", "subtracted from a group's log-prob of a token once for every beam of an earlier "
        "group that chose it at the same step (needs beam groups > 1)", minimum=0.0, maximum=100.0, step=0.1)

    def active(self) -> bool:
        return self.num_beam_groups > 1 or self.diversity_penalty > 0.0

    def summary(self) -> str:
        return f"{self.num_beam_groups} beam groups · diversity penalty {self.diversity_penalty:g}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.diversity_penalty == 0.0 or self.num_beam_groups > 1,
                 f"diversity_penalty={self.diversity_penalty:g} needs num_beam_groups > 1 (the penalty counts the "
                 "tokens that earlier groups chose)")]

    def settings_checks(self, settings: Any) -> list[tuple[bool, str]]:
        beams = settings.group(BeamSettings).num_beams
        return [(beams % self.num_beam_groups == 0,
                 f"num_beam_groups must divide num_beams: {beams} beams do not split into {self.num_beam_groups} "
                 "equal groups"),
                # transformers 4.46 refuses the two together too (constrained beam search has no groups)
                (not settings.group(ForcedWordsSettings).active(),
                 "--force-words (constrained beam search) does not take beam groups: set --num-beam-groups 1 and "
                 "--diversity-penalty 0, or drop the forced words")]


# Before --quant's (order 20): this wrapper runs the quantized copy itself when both are on.
register_shared_group(SharedGroup(
    BeamGroupSettings, "--num-beam-groups splits beam search's beams into groups (diverse beam search)",
    "is not beam search", takers=("beam",), wrapper="playground.engine.beam_groups:run_group_beam_search", order=15))
