"""Tail-free sampling (Trenton Bricken's; text-generation-webui's ``TailFreeLogitsWarper``): sort the
probabilities, take the absolute second differences normalised to sum 1, and keep the tokens before their
cumulative sum passes z (the likeliest always, the last never)."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting


@register_group
@dataclass(frozen=True)
class TailFreeSettings(SettingsGroup):
    name = "tfs"
    title = "Tail-free sampling"

    tfs: float = setting(1.0, "tail-free z", "tail-free sampling: keep the tokens before the normalised second "
                         "differences of the sorted probabilities add up to more than z; 1 = off", minimum=0.0,
                         maximum=1.0, step=0.05, hint="1 turns it off")


register_sampler(SamplerSpec(
    name="tfs", position=180, aliases=("tail_free", "tail_free_sampling"), group=TailFreeSettings, reads=("tfs",),
    # Not value-only: the zeros a cut left at the end of the sorted probabilities enter its second differences.
    value_only=False, truncating=True,
    help="tail-free sampling: cut where the sorted probabilities' curve flattens (--tfs)",
    is_on=lambda s: s.group(TailFreeSettings).tfs < 1.0,
    server=ServerWords(nowhere="llama-server has no tail-free sampling any more (nor has any OpenAI-compatible "
                               "server)"),
    what_if="exact once the tokens outside the recorded candidates are cut, or while they are in play when its cut "
            "falls within the recorded ones at both bounds of the rest's second differences (at most the last two "
            "recorded probabilities); else an estimate (it reads the whole sorted distribution)",
    what_if_examples=(dict(tfs=0.5),)))
