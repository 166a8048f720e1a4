"""DRY's sequence breakers as token ids: every token whose text contains a breaker string (llama.cpp's rule for
breakers of one token; a breaker spread over several tokens is not matched)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from playground.config.samplers import unescape_breaker


@lru_cache(maxsize=4)
def _token_texts(tokenizer: Any) -> tuple[str, ...]:
    # One decode of the whole vocabulary per tokenizer (~0.1 s for 49k tokens), kept for later runs.
    return tuple(tokenizer.batch_decode([[i] for i in range(len(tokenizer))]))


def breaker_token_ids(breakers: tuple[str, ...], tokenizer: Any) -> frozenset[int]:
    strings = [unescape_breaker(b) for b in breakers if b]
    if not strings:
        return frozenset()
    return frozenset(i for i, text in enumerate(_token_texts(tokenizer)) if any(s in text for s in strings))
