"""DRY, "don't repeat yourself" (text-generation-webui's, llama.cpp's): penalise extending a repeated sequence."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler, unescape_breaker


def _dry_words(s, sampling: bool) -> dict:
    return dict(dry_multiplier=s.dry_multiplier, dry_base=s.dry_base, dry_allowed_length=s.dry_allowed_length,
                dry_penalty_last_n=-1,  # -1: the whole context
                dry_sequence_breakers=[unescape_breaker(b) for b in s.dry_sequence_breakers])


register_sampler(SamplerSpec(
    name="dry", position=60, sampling_only=False,
    reads=("dry_multiplier", "dry_base", "dry_allowed_length", "dry_sequence_breakers"),
    help="don't repeat yourself: penalise extending a repeated sequence (--dry-multiplier)",
    is_on=lambda s: s.dry_multiplier > 0.0,
    server=ServerWords(llama_word="dry", llama=_dry_words, llama_only="DRY"),
    what_if="exact; breakers given as words need the tokenizer",
    what_if_examples=(dict(dry_multiplier=1.5, dry_allowed_length=1, dry_sequence_breakers=(), top_k=20),)))
