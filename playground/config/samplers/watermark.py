"""A decoding-time watermark as the chain's last entry (before a selecting sampler), as transformers puts its
watermark processors after the warpers since its PR #34630: Kirchenbauer et al.'s green lists
(``WatermarkingConfig``: greenlist_ratio, bias, hashing_key, seeding_scheme lefthash/selfhash, context_width) or
SynthID-Text's tournament (``SynthIDTextWatermarkingConfig``: keys, ngram_len, the sampling table, the context
history, skip_first_ngram_calls). The fields are named as transformers names them (saved runs and presets use those
names); the flags that would read ambiguously alone carry "watermark" (``--watermark-bias``, ``--watermark-keys``).
The detector's own settings (threshold, SWEET's entropy cut) ride along for the live score."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError
from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting

SCHEMES = ("off", "kirchenbauer", "synthid")
SEEDING_SCHEMES = ("lefthash", "selfhash")
# transformers' SynthIDTextWatermarkingConfig example keys (its docstring), one per tournament layer.
DEFAULT_KEYS = "654,400,836,123,340,443,597,160,57"
MAX_KEY = 2**63 - 1


def parse_keys(text: str) -> tuple[int, ...]:
    """``"654, 400,836"`` -> (654, 400, 836); a clear message for anything else."""
    words = [w.strip() for w in text.replace(";", ",").split(",") if w.strip()]
    if not words:
        raise ConfigError("watermark keys: give at least one key (whole numbers separated by commas, e.g. "
                          f"{DEFAULT_KEYS}), one per tournament layer")
    keys = []
    for word in words:
        try:
            key = int(word)
        except ValueError:
            raise ConfigError(f"watermark keys: {word!r} is not a whole number (write e.g. {DEFAULT_KEYS})") from None
        if not 0 <= key <= MAX_KEY:
            raise ConfigError(f"watermark keys: {key} is out of range; each key must be in [0, 2^63 − 1]")
        keys.append(key)
    return tuple(keys)


@register_group
@dataclass(frozen=True)
class WatermarkSettings(SettingsGroup):
    name = "watermark"
    title = "Watermark"

    watermark: str = setting("off", "watermark", "watermark the output: kirchenbauer (green lists, as transformers' "
                             "WatermarkingConfig) or synthid (SynthID-Text's tournament, as its "
                             "SynthIDTextWatermarkingConfig); off = none", choices=SCHEMES)
    greenlist_ratio: float = setting(0.25, "green-list ratio γ", "Kirchenbauer: the share of the vocabulary that "
                                     "is green at each step", minimum=0.0, above_minimum=True, maximum=1.0,
                                     step=0.05, hint="γ must lie strictly between 0 and 1")
    bias: float = setting(2.0, "bias δ", "Kirchenbauer: added to every green token's logit (0.5–2 in the paper)",
                          minimum=0.0, widget_maximum=10.0, step=0.25, flag="--watermark-bias")
    hashing_key: int = setting(15485863, "hashing key", "Kirchenbauer: the secret that seeds the green lists "
                               "(transformers' default: the millionth prime)", minimum=1, maximum=2**31 - 1,
                               hint="a key of 0 would seed every green list alike")
    seeding_scheme: str = setting("lefthash", "seeding scheme", "Kirchenbauer: lefthash seeds the green list from "
                                  "the previous token; selfhash from the context width's tokens ending in the "
                                  "candidate itself (the top 40 candidates are tried)", choices=SEEDING_SCHEMES)
    context_width: int = setting(1, "context width", "Kirchenbauer: the tokens that seed a green list (lefthash "
                                 "reads only the last one, as transformers; the first ones are not scored)",
                                 minimum=1, maximum=64)
    keys: str = setting(DEFAULT_KEYS, "SynthID keys", "SynthID: one key per tournament layer, separated by "
                        "commas", flag="--watermark-keys")
    ngram_len: int = setting(5, "n-gram length", "SynthID: the g-values hash the last ngram_len − 1 tokens with "
                             "the candidate", minimum=2, maximum=64)
    sampling_table_size: int = setting(2**16, "sampling table size", "SynthID: the g-values' random table",
                                       minimum=2, maximum=2**24)
    sampling_table_seed: int = setting(0, "sampling table seed", "SynthID: the seed of its random table",
                                       minimum=0, maximum=2**31 - 1)
    context_history_size: int = setting(1024, "context history", "SynthID: a context seen among the last this "
                                        "many is not watermarked again", minimum=1, maximum=100_000)
    skip_first_ngram_calls: bool = setting(False, "skip first n-gram calls", "SynthID: leave the first "
                                           "ngram_len − 1 tokens unwatermarked")
    z_threshold: float = setting(4.0, "z threshold", "the detector calls a text watermarked above this z-score",
                                 minimum=0.0, widget_maximum=20.0, step=0.5)
    ignore_repeated_ngrams: bool = setting(False, "count each n-gram once", "the detector scores every distinct "
                                           "n-gram once (transformers' ignore_repeated_ngrams)")
    entropy_threshold: float = setting(0.0, "SWEET entropy (bits)", "score only the tokens whose model entropy is "
                                       "at least this (SWEET, Lee et al. 2023); 0 = every token", minimum=0.0,
                                       widget_maximum=16.0, step=0.25)

    def active(self) -> bool:
        return self.watermark != "off"

    def cross_checks(self) -> list[tuple[bool, str]]:
        checks = [(self.greenlist_ratio < 1.0, f"greenlist_ratio must be in (0, 1) (got {self.greenlist_ratio:g}): "
                   "at 1 every token is green and nothing is marked")]
        if self.watermark == "synthid":
            parse_keys(self.keys)
        return checks

    def settings_checks(self, settings: Any) -> list[tuple[bool, str]]:
        return [(not (self.watermark == "synthid" and settings.strategy == "greedy"),
                 "SynthID-Text cannot act on greedy decoding: its tournament reweights the distribution a token is "
                 "drawn from, and greedy takes the top token whatever the weights; use the sample strategy, or "
                 "the kirchenbauer watermark")]

    def summary(self) -> str:
        if self.watermark == "kirchenbauer":
            return (f"kirchenbauer γ={self.greenlist_ratio:g} δ={self.bias:g} {self.seeding_scheme} "
                    f"w={self.context_width}")
        if self.watermark == "synthid":
            return f"synthid n={self.ngram_len} keys={len(parse_keys(self.keys))}"
        return "off"


register_sampler(SamplerSpec(
    name="watermark", position=200, aliases=("kirchenbauer", "synthid"), group=WatermarkSettings,
    reads=("watermark", "greenlist_ratio", "bias", "hashing_key", "seeding_scheme", "context_width", "keys",
           "ngram_len", "sampling_table_size", "sampling_table_seed", "context_history_size",
           "skip_first_ngram_calls"),
    # Applies to greedy too (transformers adds its watermark processor whatever the strategy); SynthID is refused
    # there by name (WatermarkSettings.settings_checks). It reads token ids (the context seeds it): not value-only.
    sampling_only=False, value_only=False, truncating=False,
    help="watermark: Kirchenbauer's green lists or SynthID-Text's tournament, last in the chain (--watermark)",
    is_on=lambda s: s.group(WatermarkSettings).watermark != "off",
    server=ServerWords(nowhere="no server takes a watermark (it is applied by the engine, on the logits)"),
    what_if="estimate: the watermark's green tokens (or g-values) outside the recorded candidates are not known",
    what_if_examples=(dict(watermark="kirchenbauer", bias=2.0),)))
