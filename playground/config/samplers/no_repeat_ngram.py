"""transformers' n-gram ban (``NoRepeatNGramLogitsProcessor``): no token that would repeat an n-gram."""

from playground.config.samplers.base import SamplerSpec, register_sampler

register_sampler(SamplerSpec(
    name="no_repeat_ngram", position=40, aliases=("no_repeat_ngram_size",), sampling_only=False,
    reads=("no_repeat_ngram_size",), help="ban tokens that would repeat an n-gram (--no-repeat-ngram-size)",
    is_on=lambda s: s.no_repeat_ngram_size > 0,  # a server run refuses it first (playground.remote.decode)
    what_if="exact",
    what_if_examples=(dict(no_repeat_ngram_size=1, top_k=20),)))
