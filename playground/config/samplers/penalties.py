"""OpenAI's presence and frequency penalties, one sampler (llama.cpp's ``penalties`` entry)."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler


def _openai_penalties(s) -> dict:
    return {k: v for k, v in (("presence_penalty", s.presence_penalty), ("frequency_penalty", s.frequency_penalty))
            if v != 0.0}


register_sampler(SamplerSpec(
    name="penalties", position=50, aliases=("presence_penalty", "frequency_penalty"), sampling_only=False,
    reads=("presence_penalty", "frequency_penalty"),
    help="presence and frequency penalties (--presence-penalty, --frequency-penalty)",
    is_on=lambda s: s.presence_penalty != 0.0 or s.frequency_penalty != 0.0,
    server=ServerWords(llama_word="penalties", openai=_openai_penalties),
    what_if="exact while no tail token is raised",
    what_if_examples=(dict(presence_penalty=0.8, frequency_penalty=0.5, top_k=20),)))
