"""The samplers, one engine object each (``base.Sampler``: apply, accept, reset, clone, snapshot/restore), in
modules named as their declarations' in ``playground.config.samplers`` (one sampler a module; ``base``, ``chain``,
``cuts`` and ``breakers`` are what several share); every module of this package is imported here, so a new sampler
is a new file. ``playground.engine.processors.build_pipeline`` builds a run's chain from them; the pure functions
they bind stay importable from here."""

import importlib
import pkgutil

from playground.engine.samplers.base import ENGINE_SAMPLERS, BuildContext, Sampler
from playground.engine.samplers.breakers import breaker_token_ids
from playground.engine.samplers.dry import apply_dry, dry_match_lengths
from playground.engine.samplers.epsilon_cutoff import keep_above_epsilon
from playground.engine.samplers.eta_cutoff import keep_above_eta
from playground.engine.samplers.guidance import combine_guidance
from playground.engine.samplers.logit_bias import apply_sequence_bias, resolve_logit_bias
from playground.engine.samplers.mirostat import MirostatState, truncate_by_surprise
from playground.engine.samplers.penalties import apply_presence_frequency_penalties
from playground.engine.samplers.temperature import apply_dynamic_temperature, dynamic_temperature
from playground.engine.samplers.top_n_sigma import keep_top_n_sigma
from playground.engine.samplers.typical_p import keep_typical
from playground.engine.samplers.xtc import exclude_top_choices

for _info in pkgutil.iter_modules(__path__):  # each module registers its samplers' engine objects
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "ENGINE_SAMPLERS",
    "BuildContext",
    "MirostatState",
    "Sampler",
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
