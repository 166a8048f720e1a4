"""Adaptive-P (llama.cpp's ``llama_sampler_adaptive_p``, PR 17927): reshape the distribution toward tokens near a
target probability, the target adapted each step by a moving average of the chosen tokens' probabilities (before
its own transform, over what the earlier samplers left; it starts at the target). A selecting sampler: it draws
the token itself, so llama.cpp forces it last in the chain; it cuts nothing."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting


@register_group
@dataclass(frozen=True)
class AdaptivePSettings(SettingsGroup):
    name = "adaptive_p"
    title = "Adaptive-P"

    adaptive_target: float = setting(-1.0, "adaptive-P target", "select tokens near this probability, adapted "
                                     "to the recent choices (llama.cpp's --adaptive-target); negative = off",
                                     minimum=-1.0, maximum=1.0, step=0.05, off_text="off",
                                     hint="a negative target turns it off")
    adaptive_decay: float = setting(0.9, "adaptive-P decay", "decay of the moving average of the chosen tokens' "
                                    "probabilities: it spans about 1/(1 − decay) tokens (--adaptive-decay)",
                                    minimum=0.0, maximum=0.99, step=0.01)


def _server_words(s, sampling: bool) -> dict:
    g = s.group(AdaptivePSettings)
    return {"adaptive_target": g.adaptive_target, "adaptive_decay": g.adaptive_decay}


register_sampler(SamplerSpec(
    name="adaptive_p", position=190, aliases=("adaptive",), group=AdaptivePSettings,
    reads=("adaptive_target", "adaptive_decay"), selecting=True,
    # It transforms each finite logit by the token's own probability (values only), but its average needs the
    # chosen token's probability by id: it runs on the whole vocabulary.
    value_only=False, truncating=False,
    help="Adaptive-P: favour tokens near a target probability that adapts to the recent choices; runs last "
         "(--adaptive-target, --adaptive-decay)",
    is_on=lambda s: s.group(AdaptivePSettings).adaptive_target >= 0.0,
    needs_run="its moving average follows the chosen tokens",
    server=ServerWords(llama_word="adaptive_p", llama=_server_words, llama_only="Adaptive-P"),
    what_if="exact once the tokens outside the recorded candidates are cut and every earlier step is; else an "
            "estimate (it reads every token's probability, and its average the earlier choices')",
    what_if_examples=(dict(adaptive_target=0.3, adaptive_decay=0.6, top_k=20),)))
