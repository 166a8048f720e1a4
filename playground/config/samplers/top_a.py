"""Top-a (text-generation-webui's ``TopALogitsWarper``): drop tokens less likely than top-a × the top
probability squared, so a confident step cuts hard and a flat one keeps its spread."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting


@register_group
@dataclass(frozen=True)
class TopASettings(SettingsGroup):
    name = "top_a"
    title = "Top-a"

    top_a: float = setting(0.0, "top-a", "drop tokens less likely than top-a × (the top token's probability)²; "
                           "0 = off", minimum=0.0, maximum=1.0, step=0.05, hint="0 turns it off")


register_sampler(SamplerSpec(
    name="top_a", position=170, group=TopASettings, reads=("top_a",), value_only=True, truncating=True,
    help="drop tokens below top-a × the top probability squared (--top-a)",
    is_on=lambda s: s.group(TopASettings).top_a > 0.0,
    server=ServerWords(nowhere="llama-server has no top-a sampler (nor has any OpenAI-compatible server)"),
    what_if="exact when the line falls above the tail's bound at both of its bounds",
    what_if_examples=(dict(top_a=0.2),)))
