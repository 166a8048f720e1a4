"""Samplers that remove tokens by the distribution's shape: typical-p, epsilon and eta cutoffs (transformers'
warpers), top-nσ and XTC (llama.cpp's)."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

WHOLE = "estimate while tokens outside the recorded candidates are in play (it reads the whole distribution)"

register_sampler(SamplerSpec(
    name="typical_p", position=110, aliases=("typ_p", "typical"), reads=("typical_p",), value_only=True,
    truncating=True, help="keep the locally typical tokens (--typical-p)", is_on=lambda s: s.typical_p < 1.0,
    server=ServerWords(llama_word="typ_p", llama=lambda s, sampling: {"typical_p": s.typical_p},
                       llama_only="typical-p"), what_if=WHOLE))
register_sampler(SamplerSpec(
    name="epsilon_cutoff", position=120, aliases=("epsilon",), reads=("epsilon_cutoff",), value_only=True,
    truncating=True, help="drop tokens below a fixed probability (--epsilon-cutoff)",
    is_on=lambda s: s.epsilon_cutoff > 0.0, server=ServerWords(nowhere="no server offers epsilon sampling"),
    what_if="exact when the decision is the same at both of the tail's bounds"))
register_sampler(SamplerSpec(
    name="eta_cutoff", position=130, aliases=("eta",), reads=("eta_cutoff",), value_only=True, truncating=True,
    help="drop tokens below an entropy-dependent probability (--eta-cutoff)", is_on=lambda s: s.eta_cutoff > 0.0,
    server=ServerWords(nowhere="no server offers eta sampling"), what_if=WHOLE))
register_sampler(SamplerSpec(
    name="top_n_sigma", position=140, reads=("top_n_sigma",), value_only=True, truncating=True,
    help="keep logits within n standard deviations of the top one (--top-n-sigma)",
    is_on=lambda s: s.top_n_sigma > 0.0,
    server=ServerWords(llama_word="top_n_sigma", llama=lambda s, sampling: {"top_n_sigma": s.top_n_sigma},
                       llama_only="top-nσ"), what_if=WHOLE))
register_sampler(SamplerSpec(
    name="xtc", position=150, reads=("xtc_probability", "xtc_threshold"), value_only=True, truncating=True,
    help="exclude top choices: sometimes remove the likeliest tokens but the least of them (--xtc-probability)",
    is_on=lambda s: s.xtc_probability > 0.0, needs_run="its draw comes from the run's generator",
    server=ServerWords(llama_word="xtc", llama=lambda s, sampling: dict(xtc_probability=s.xtc_probability,
                                                                        xtc_threshold=s.xtc_threshold),
                       llama_only="XTC"),
    what_if="estimate: XTC fires at random (shown as if it fired) unless its probability is 1"))
