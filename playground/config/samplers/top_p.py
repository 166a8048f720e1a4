"""transformers' top-p (nucleus) warper: keep the smallest set of likeliest tokens reaching probability p."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="top_p", position=90, reads=("top_p",), value_only=True, truncating=True,
    help="keep the smallest set reaching probability p (--top-p)", is_on=lambda s: s.top_p < 1.0,
    server=ServerWords(llama_word="top_p"), what_if="exact when the cut does not depend on the tail's spread",
    what_if_examples=(dict(top_p=0.5),)))
