"""The samplers beyond transformers' basic four, each a pure ``(ids, logits) -> logits`` function (with its
parameters bound by ``playground.engine.processors.build_pipeline``), and the state the stateful ones carry."""

from playground.engine.samplers.bias import apply_sequence_bias, resolve_logit_bias
from playground.engine.samplers.breakers import breaker_token_ids
from playground.engine.samplers.guidance import combine_guidance
from playground.engine.samplers.mirostat import MirostatState
from playground.engine.samplers.penalties import apply_dry, apply_presence_frequency_penalties, dry_match_lengths
from playground.engine.samplers.temperature import apply_dynamic_temperature, dynamic_temperature
from playground.engine.samplers.truncation import (
    exclude_top_choices,
    keep_above_epsilon,
    keep_above_eta,
    keep_top_n_sigma,
    keep_typical,
    truncate_by_surprise,
)

__all__ = [
    "MirostatState",
    "apply_dry",
    "apply_dynamic_temperature",
    "apply_presence_frequency_penalties",
    "apply_sequence_bias",
    "breaker_token_ids",
    "combine_guidance",
    "dry_match_lengths",
    "dynamic_temperature",
    "exclude_top_choices",
    "keep_above_epsilon",
    "keep_above_eta",
    "keep_top_n_sigma",
    "keep_typical",
    "resolve_logit_bias",
    "truncate_by_surprise",
]
