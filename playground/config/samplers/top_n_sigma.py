"""Top-nσ (Tang et al.; llama.cpp's): keep logits within n standard deviations of the top one."""

from playground.config.samplers.base import WHOLE_DISTRIBUTION, SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="top_n_sigma", position=140, reads=("top_n_sigma",), value_only=True, truncating=True,
    help="keep logits within n standard deviations of the top one (--top-n-sigma)",
    is_on=lambda s: s.top_n_sigma > 0.0,
    server=ServerWords(llama_word="top_n_sigma", llama=lambda s, sampling: {"top_n_sigma": s.top_n_sigma},
                       llama_only="top-nσ"), what_if=WHOLE_DISTRIBUTION.replace(
        "first in the chain", "first in the chain or after a temperature only"),
    what_if_examples=(dict(top_n_sigma=1.0), dict(top_n_sigma=1.5, temperature=0.6))))
