"""transformers' top-k warper: keep the k most likely tokens."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="top_k", position=80, reads=("top_k",), value_only=True, truncating=True,
    help="keep the k most likely tokens (--top-k)", is_on=lambda s: s.top_k > 0,
    server=ServerWords(llama_word="top_k", other=lambda s, engine, sampling: {"top_k": s.top_k}),
    what_if="exact when the k tokens are among the recorded ones",
    what_if_examples=(dict(top_k=12),)))
