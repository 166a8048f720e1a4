"""Classifier-free guidance against the negative prompt (transformers' ``UnbatchedClassifierFreeGuidance...``)."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="guidance", position=10, aliases=("cfg",), sampling_only=False, reads=("guidance_scale", "negative_prompt"),
    help="classifier-free guidance against the negative prompt (--guidance-scale, --negative-prompt)",
    is_on=lambda s: s.guidance_scale != 1.0,
    needs_run="it needs a second forward pass of the negative prompt",
    server=ServerWords(nowhere="classifier-free guidance needs a second prompt's logits, which no server's API takes"),
    what_if="estimate: the negative prompt's logits are not recorded",
    what_if_examples=(dict(guidance_scale=1.5, negative_prompt="a sad story"),)))
