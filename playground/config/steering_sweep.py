"""The steering sweep: the same prompt decoded at several steering strengths, side by side, each output scored
against the unsteered model, so a user finds the strength where the style moves and the text still holds.

``--steer FILE --steer-sweep=-2,-1,1,2`` runs the strategy (greedy or sample, same seed) once unsteered (strength 0:
the reference pane) and once per strength, every vector at that strength, in aligned panes. Under each pane: the
mean KL(steered ‖ unsteered) over its tokens (how far the steering moved the model's distributions on that text) and
its perplexity under the unsteered model (whether the text still reads as language to the model it came from).
Write the list after ``=`` on the command line (``--steer-sweep=-2,-1,0,1,2``): a value starting with ``-`` would
otherwise read as an option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.steering import SteeringSettings
from playground.config.table import setting

MAX_STRENGTHS = 6  # panes besides the unsteered one (7 columns side by side is the most that stay readable)


def parse_strengths(text: str) -> tuple[float, ...]:
    """``"-2, -1, 1, 2"`` (commas or spaces; "−" accepted) -> the strengths, in order, repeats and 0 dropped (the
    unsteered pane is always there). ValueError with the reason."""
    values: list[float] = []
    for part in text.replace("−", "-").replace(",", " ").split():
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{part!r}: a strength must be a finite number")
        if value != 0.0 and value not in values:
            values.append(value)
    return tuple(values)


@register_group
@dataclass(frozen=True)
class SteeringSweepSettings(SettingsGroup):
    name = "steering_sweep"
    title = "Steering sweep"
    order = 26

    steer_sweep: str = setting(
        "", "sweep strengths", "decode the same prompt unsteered and at each of these strengths (every --steer vector "
        "at that strength; commas between, e.g. -2,-1,1,2; on the command line write --steer-sweep=-2,-1,1,2), side "
        "by side, each output with its mean KL from the unsteered model and its perplexity under it; empty = no sweep")

    def active(self) -> bool:
        return bool(self.steer_sweep.strip())

    def strengths(self) -> tuple[float, ...]:
        return parse_strengths(self.steer_sweep)

    def summary(self) -> str:
        try:
            strengths = self.strengths()
        except ValueError:
            return "sweep (invalid)"
        return "sweep " + ", ".join(f"{s:+g}" for s in strengths) if strengths else "no sweep"

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            strengths = self.strengths()
        except ValueError as error:
            return [(False, f"--steer-sweep: {error}")]
        return [(not self.active() or bool(strengths),
                 "--steer-sweep needs at least one strength other than 0 (the unsteered pane is always there)"),
                (len(strengths) <= MAX_STRENGTHS,
                 f"--steer-sweep takes at most {MAX_STRENGTHS} strengths besides the unsteered one, not "
                 f"{len(strengths)}")]

    def settings_checks(self, settings: Any) -> list[tuple[bool, str]]:
        return [(not self.active() or settings.group(SteeringSettings).active(),
                 "--steer-sweep sweeps a steering vector's strength: add --steer FILE")]


# The sweep runs the strategy's own runner (already wrapped by --steer's, which hooks the model) once per strength;
# it sits outside --steer's wrapper (a lower order) so each pane is steered by its own strength.
register_shared_group(SharedGroup(
    SteeringSweepSettings, "--steer-sweep decodes the prompt at several steering strengths side by side",
    "is not swept (the sweep runs greedy or sample once per strength)", takers=("greedy", "sample"),
    wrapper="playground.engine.steering.sweep:run_sweep", order=26))
