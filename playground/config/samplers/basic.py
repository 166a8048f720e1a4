"""transformers' own processors and warpers: repetition penalty, the n-gram ban, top-k, top-p, min-p."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="repetition_penalty", position=30, sampling_only=False, reads=("repetition_penalty",),
    help="divide the logits of tokens already in the text (--repetition-penalty)",
    is_on=lambda s: s.repetition_penalty != 1.0,
    server=ServerWords(llama_word="penalties", other=lambda s, engine, sampling: (
        {"repetition_penalty": s.repetition_penalty} if engine == "vllm" else
        "repetition penalty: this server (a generic OpenAI-compatible one) has no such setting; turn it off (1.0) "
        "or use a local model")),
    what_if="exact while no tail token is raised"))
register_sampler(SamplerSpec(
    name="no_repeat_ngram", position=40, aliases=("no_repeat_ngram_size",), sampling_only=False,
    reads=("no_repeat_ngram_size",), help="ban tokens that would repeat an n-gram (--no-repeat-ngram-size)",
    is_on=lambda s: s.no_repeat_ngram_size > 0,  # a server run refuses it first (playground.remote.decode)
    what_if="exact"))
register_sampler(SamplerSpec(
    name="top_k", position=80, reads=("top_k",), value_only=True, truncating=True,
    help="keep the k most likely tokens (--top-k)", is_on=lambda s: s.top_k > 0,
    server=ServerWords(llama_word="top_k", other=lambda s, engine, sampling: {"top_k": s.top_k}),
    what_if="exact when the k tokens are among the recorded ones"))
register_sampler(SamplerSpec(
    name="top_p", position=90, reads=("top_p",), value_only=True, truncating=True,
    help="keep the smallest set reaching probability p (--top-p)", is_on=lambda s: s.top_p < 1.0,
    server=ServerWords(llama_word="top_p"), what_if="exact when the cut does not depend on the tail's spread"))
register_sampler(SamplerSpec(
    name="min_p", position=100, reads=("min_p",), value_only=True, truncating=True,
    help="drop tokens below min-p × the top probability (--min-p)", is_on=lambda s: s.min_p > 0.0,
    server=ServerWords(llama_word="min_p", other=lambda s, engine, sampling: {"min_p": s.min_p}),
    what_if="exact when the line falls above the tail's bound"))
