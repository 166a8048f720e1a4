"""Temperature, and llama.cpp's entropy-based dynamic temperature (its engine stage is named "dynatemp")."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler


def _dynatemp_words(s, sampling: bool) -> dict:
    return dict(dynatemp_range=s.dynatemp_range, dynatemp_exponent=s.dynatemp_exponent) if s.dynatemp_range > 0 else {}


register_sampler(SamplerSpec(
    name="temperature", position=70, aliases=("temp", "dynatemp"), stages=("dynatemp",), value_only=True,
    reads=("temperature", "dynatemp_range", "dynatemp_exponent"),
    help="divide the logits by the temperature, or by the entropy-based dynamic one (--dynatemp-range)",
    is_on=lambda s: s.temperature != 1.0 or s.dynatemp_range > 0.0,
    server=ServerWords(llama_word="temperature", llama=_dynatemp_words),
    what_if="exact (the tail's share bounded); dynamic temperature reads the whole distribution: exact where it "
            "sees the raw one (first in the chain: each step records its entropy), else an estimate while the tail "
            "is in play",
    what_if_examples=(dict(temperature=0.7, top_k=20), dict(temperature=1.2, dynatemp_range=0.6, top_k=20),)))
