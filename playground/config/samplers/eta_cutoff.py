"""Eta sampling (Hewitt et al.; transformers' ``EtaLogitsWarper``): an entropy-dependent probability cutoff."""

from playground.config.samplers.base import WHOLE_DISTRIBUTION, SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="eta_cutoff", position=130, aliases=("eta",), reads=("eta_cutoff",), value_only=True, truncating=True,
    help="drop tokens below an entropy-dependent probability (--eta-cutoff)", is_on=lambda s: s.eta_cutoff > 0.0,
    server=ServerWords(nowhere="no server offers eta sampling"), what_if=WHOLE_DISTRIBUTION,
    what_if_examples=(dict(eta_cutoff=0.02),)))
