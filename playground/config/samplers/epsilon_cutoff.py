"""Epsilon sampling (Hewitt et al.; transformers' ``EpsilonLogitsWarper``): drop tokens below a fixed probability."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="epsilon_cutoff", position=120, aliases=("epsilon",), reads=("epsilon_cutoff",), value_only=True,
    truncating=True, help="drop tokens below a fixed probability (--epsilon-cutoff)",
    is_on=lambda s: s.epsilon_cutoff > 0.0, server=ServerWords(nowhere="no server offers epsilon sampling"),
    what_if="exact when the decision is the same at both of the tail's bounds",
    what_if_examples=(dict(epsilon_cutoff=0.01),)))
