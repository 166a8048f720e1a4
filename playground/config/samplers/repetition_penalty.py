"""transformers' repetition penalty (CTRL's): the logits of tokens already in the text divided by the penalty."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="repetition_penalty", position=30, sampling_only=False, reads=("repetition_penalty",),
    help="divide the logits of tokens already in the text (--repetition-penalty)",
    is_on=lambda s: s.repetition_penalty != 1.0,
    server=ServerWords(llama_word="penalties", other=lambda s, engine, sampling: (
        {"repetition_penalty": s.repetition_penalty} if engine == "vllm" else
        "repetition penalty: this server (a generic OpenAI-compatible one) has no such setting; turn it off (1.0) "
        "or use a local model")),
    what_if="exact while no tail token is raised",
    what_if_examples=(dict(repetition_penalty=1.5, top_k=20),)))
