"""Decoding-time watermarks and their detection: Kirchenbauer et al.'s green lists (``kirchenbauer``), SynthID-Text
(``synthid``), the detector for any token ids (``detect``), a text scored
by its settings and the edit budget's edits (``text``); ``keys_of`` builds a scheme's key from the settings.
The chain's entry is ``playground.engine.samplers.watermark``."""

from __future__ import annotations

from playground.config.samplers.watermark import WatermarkSettings, parse_keys
from playground.watermarking.kirchenbauer import GreenLists, KirchenbauerKey
from playground.watermarking.synthid import SynthID, SynthIDKey


def kirchenbauer_key(g: WatermarkSettings, vocab_size: int) -> KirchenbauerKey:
    return KirchenbauerKey(vocab_size=vocab_size, greenlist_ratio=g.greenlist_ratio, bias=g.bias,
                           hashing_key=g.hashing_key, seeding_scheme=g.seeding_scheme, context_width=g.context_width)


def synthid_key(g: WatermarkSettings) -> SynthIDKey:
    return SynthIDKey(keys=parse_keys(g.keys), ngram_len=g.ngram_len, sampling_table_size=g.sampling_table_size,
                      sampling_table_seed=g.sampling_table_seed, context_history_size=g.context_history_size,
                      skip_first_ngram_calls=g.skip_first_ngram_calls)


__all__ = ["GreenLists", "KirchenbauerKey", "SynthID", "SynthIDKey", "kirchenbauer_key", "synthid_key"]
