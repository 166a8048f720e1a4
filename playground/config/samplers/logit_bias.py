"""Logit bias on tokens or words (transformers' ``SequenceBiasLogitsProcessor``)."""

from playground.config.samplers.base import SamplerSpec, register_sampler

# llama-server and OpenAI take it as their own ``logit_bias`` field (token ids only): playground.remote.request.
register_sampler(SamplerSpec(
    name="logit_bias", position=20, aliases=("sequence_bias",), sampling_only=False, reads=("logit_bias",),
    help="add a bias to chosen tokens or words, or ban them (--logit-bias)",
    is_on=lambda s: bool(s.logit_bias),
    what_if="exact on token ids; a word needs the tokenizer",
    what_if_examples=(dict(logit_bias=("5=-4", "7=-inf", "40=+3"), top_k=20),)))
