"""transformers' min-p warper: drop tokens below min-p × the top token's probability."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="min_p", position=100, reads=("min_p",), value_only=True, truncating=True,
    help="drop tokens below min-p × the top probability (--min-p)", is_on=lambda s: s.min_p > 0.0,
    server=ServerWords(llama_word="min_p", other=lambda s, engine, sampling: {"min_p": s.min_p}),
    what_if="exact when the line falls above the tail's bound",
    what_if_examples=(dict(min_p=0.2),)))
