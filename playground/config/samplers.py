"""The sampler chain as plain data: which samplers exist, the order a run applies them in, which are on.

``RunSettings.samplers`` is llama.cpp's ``--samplers``: names separated by ``;`` (``"penalties;dry;top_k;top_p;
temperature"``); empty means transformers' order (``DEFAULT_ORDER``: the processors ``generate()`` has, in its
order, then the ones it lacks). A sampler that is on but left out of a given order is refused, never silently
skipped. No torch here: the engine builds the transforms (``playground.engine.processors.build_pipeline``), the form
and the CLI read this.

Which samplers a greedy decode applies follows transformers and llama.cpp: the penalties, DRY, logit bias and
guidance change the scores every strategy reads (transformers' processors, llama.cpp's samplers before the pick);
the rest shape the distribution a token is drawn from and apply only when sampling (transformers' warpers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError

# name -> (what it is, the settings that switch it on): the order is transformers' (guidance, sequence bias,
# repetition penalty, no-repeat n-gram; temperature, top-k, top-p, min-p, typical, epsilon, eta), then llama.cpp's.
SAMPLERS: dict[str, str] = {
    "guidance": "classifier-free guidance against the negative prompt (--guidance-scale, --negative-prompt)",
    "logit_bias": "add a bias to chosen tokens or words, or ban them (--logit-bias)",
    "repetition_penalty": "divide the logits of tokens already in the text (--repetition-penalty)",
    "no_repeat_ngram": "ban tokens that would repeat an n-gram (--no-repeat-ngram-size)",
    "penalties": "presence and frequency penalties (--presence-penalty, --frequency-penalty)",
    "dry": "don't repeat yourself: penalise extending a repeated sequence (--dry-multiplier)",
    "temperature": "divide the logits by the temperature, or by the entropy-based dynamic one (--dynatemp-range)",
    "top_k": "keep the k most likely tokens (--top-k)",
    "top_p": "keep the smallest set reaching probability p (--top-p)",
    "min_p": "drop tokens below min-p × the top probability (--min-p)",
    "typical_p": "keep the locally typical tokens (--typical-p)",
    "epsilon_cutoff": "drop tokens below a fixed probability (--epsilon-cutoff)",
    "eta_cutoff": "drop tokens below an entropy-dependent probability (--eta-cutoff)",
    "top_n_sigma": "keep logits within n standard deviations of the top one (--top-n-sigma)",
    "xtc": "exclude top choices: sometimes remove the likeliest tokens but the least of them (--xtc-probability)",
    "mirostat": "mirostat v2: drop tokens more surprising than mu, steering surprise to tau (--mirostat 2)",
}
DEFAULT_ORDER: tuple[str, ...] = tuple(SAMPLERS)
# Only shape the distribution a token is drawn from: greedy (and beam search, ...) skip them, as generate() does.
SAMPLING_ONLY = frozenset({"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
                           "top_n_sigma", "xtc", "mirostat"})
# Other names for the same samplers: llama.cpp's (typ_p, temp) and the settings' own words.
ALIASES = {"temp": "temperature", "dynatemp": "temperature", "typ_p": "typical_p", "typical": "typical_p",
           "epsilon": "epsilon_cutoff", "eta": "eta_cutoff", "cfg": "guidance", "sequence_bias": "logit_bias",
           "presence_penalty": "penalties", "frequency_penalty": "penalties", "no_repeat_ngram_size":
           "no_repeat_ngram", "mirostat_v2": "mirostat"}


@dataclass(frozen=True)
class ChainEntry:
    """One sampler in a run's chain, for a list in the form: its name, whether the settings switch it on, and
    whether the strategy applies it at all (``sampling_only`` ones are skipped by greedy)."""

    name: str
    on: bool
    sampling_only: bool
    help: str


def parse_sampler_order(text: str) -> tuple[str, ...]:
    """``"top_k;typ_p;temp"`` -> ("top_k", "typical_p", "temperature"); empty -> ``DEFAULT_ORDER``."""
    if not text.strip():
        return DEFAULT_ORDER
    names: list[str] = []
    for word in text.split(";"):
        key = word.strip().lower().replace("-", "_")
        if not key:
            continue
        name = ALIASES.get(key, key)
        if name not in SAMPLERS:
            raise ConfigError(f"samplers: unknown sampler {word.strip()!r}; known: {'; '.join(SAMPLERS)}")
        if name in names:
            raise ConfigError(f"samplers: {name} is listed twice")
        names.append(name)
    if not names:
        raise ConfigError("samplers: the list is empty; leave it blank for the default order")
    return tuple(names)


def sampler_is_on(settings: Any, name: str) -> bool:
    """Whether ``settings`` (a ``RunSettings``) switch the sampler ``name`` on."""
    s = settings
    return {
        "guidance": s.guidance_scale != 1.0,
        "logit_bias": bool(s.logit_bias),
        "repetition_penalty": s.repetition_penalty != 1.0,
        "no_repeat_ngram": s.no_repeat_ngram_size > 0,
        "penalties": s.presence_penalty != 0.0 or s.frequency_penalty != 0.0,
        "dry": s.dry_multiplier > 0.0,
        "temperature": s.temperature != 1.0 or s.dynatemp_range > 0.0,
        "top_k": s.top_k > 0,
        "top_p": s.top_p < 1.0,
        "min_p": s.min_p > 0.0,
        "typical_p": s.typical_p < 1.0,
        "epsilon_cutoff": s.epsilon_cutoff > 0.0,
        "eta_cutoff": s.eta_cutoff > 0.0,
        "top_n_sigma": s.top_n_sigma > 0.0,
        "xtc": s.xtc_probability > 0.0,
        "mirostat": s.mirostat == 2,
    }[name]


def sampler_chain(settings: Any) -> tuple[ChainEntry, ...]:
    """The run's chain in its order, as plain data: every listed sampler, on or off."""
    return tuple(ChainEntry(name, sampler_is_on(settings, name), name in SAMPLING_ONLY, SAMPLERS[name])
                 for name in parse_sampler_order(settings.samplers))


def check_sampler_chain(settings: Any) -> None:
    """Refuse an order that leaves out a sampler the settings switch on (it would be silently skipped)."""
    order = parse_sampler_order(settings.samplers)
    missing = [name for name in SAMPLERS if name not in order and sampler_is_on(settings, name)]
    if missing:
        one = len(missing) == 1
        raise ConfigError(f"samplers: {', '.join(missing)} {'is' if one else 'are'} switched on but not in the order "
                          f"{settings.samplers!r}; add {'it' if one else 'them'} to the list or switch "
                          f"{'it' if one else 'them'} off")


def parse_logit_bias(entries: tuple[str, ...]) -> tuple[tuple[int | str, float], ...]:
    """``(" Paris=-inf", "42=+5")`` -> ((" Paris", -inf), (42, 5.0)).

    The key before the last ``=`` is a token id when it is all digits, else a word (spaces kept: `` Paris`` is the
    word with its leading space, as tokenizers write it mid-sentence). The value is a finite number added to the
    logit, or ``-inf`` to ban it.
    """
    parsed: list[tuple[int | str, float]] = []
    for entry in entries:
        key, sep, value_text = entry.rpartition("=")
        if not sep or not key:
            raise ConfigError(f"logit bias {entry!r}: write TOKEN=BIAS, e.g. ' Paris=-inf' or '42=+5'")
        try:
            value = float(value_text.strip())
        except ValueError:
            raise ConfigError(f"logit bias {entry!r}: {value_text.strip()!r} is not a number (use e.g. +5, -2.5 "
                              "or -inf)") from None
        if math.isnan(value) or value == math.inf:
            raise ConfigError(f"logit bias {entry!r}: the bias must be a finite number or -inf (a ban); +inf "
                              "would leave no distribution (use forced tokens to force one)")
        parsed.append((int(key) if key.isdigit() else key, value))
    return tuple(parsed)


def unescape_breaker(text: str) -> str:
    r"""A sequence breaker as typed (``\n`` for a newline, as the stop strings take it)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")
