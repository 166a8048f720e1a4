"""Activation patching between two prompts (causal tracing): the run's prompt is the clean one, ``--corrupted``
the other, of the same number of tokens (a few of them different). For every decoder block and position the
clean activation is put into the corrupted run and the share of logit(answer) − logit(foil) at the last position
it brings back is one cell of a map: the residual stream, the attention outputs and the MLP outputs. Answer and
foil default to the clean and the corrupted prompt's top tokens. ``playground.engine.attribution.patching``.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events.patching import PATCH_MAPS, PatchingRow


def parse_maps(text: str) -> tuple[str, ...]:
    found: list[str] = []
    for part in text.replace(",", " ").split():
        name = {"resid": "residual", "attn": "attention"}.get(part.lower(), part.lower())
        if name not in PATCH_MAPS:
            raise ValueError(f"{part!r} is not a patching map (maps: {', '.join(PATCH_MAPS)})")
        if name not in found:
            found.append(name)
    return tuple(found)


@register_group
@dataclass(frozen=True)
class PatchingSettings(SettingsGroup):
    name = "patching"
    title = "Activation patching"
    order = 111

    corrupted: str = setting("", "corrupted prompt", "the prompt to patch into: the run's prompt (the clean "
                             "one) with a few words changed, the same number of tokens")
    patch_maps: str = setting("residual,attention,mlp", "maps", "which activations to patch, commas between: "
                              "residual, attention, mlp")
    patch_answer: str = setting("", "answer", "the token whose logit the maps explain (its text's first token, "
                                "e.g. ' Paris'); empty = the clean prompt's top token")
    patch_foil: str = setting("", "foil", "the token it is measured against (e.g. ' Rome'); empty = the "
                              "corrupted prompt's top token (its second when that is the answer)")

    def maps(self) -> tuple[str, ...]:
        return parse_maps(self.patch_maps)

    def summary(self) -> str:
        return f"patch {self.patch_maps} from the clean prompt into {self.corrupted!r}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            maps = self.maps()
        except ValueError as error:
            return [(False, f"--patch-maps: {error}")]
        return [(bool(maps), "--patch-maps needs at least one of residual, attention, mlp")]


register_strategy(Strategy(
    "patching", "activation patching: the clean prompt's activations put into --corrupted's run, per layer and "
    "position, and the share of the logit difference they recover (residual, attention and MLP maps)",
    groups=(PatchingSettings,), step_events=(PatchingRow,),
    runner="playground.engine.attribution.patching_run:run_patching", takes_progress=True, decodes=False, order=110))
