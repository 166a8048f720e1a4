"""The sampler chain as plain data: which samplers exist, the order a run applies them in, which are on.

``RunSettings.samplers`` is llama.cpp's ``--samplers``: names separated by ``;`` (``"penalties;dry;top_k;top_p;
temperature"``); empty means transformers' order (``DEFAULT_ORDER``: the processors ``generate()`` has, in its
order, then the ones it lacks). A sampler that is on but left out of a given order is refused, never silently
skipped. No torch here: the engine builds the samplers (``playground.engine.processors.build_pipeline``), the form
and the CLI read this.

Each sampler is declared once (``base.SamplerSpec``) in a module of this package, under the same stem as its
engine object (``playground.engine.samplers.<stem>``) and its what-if stage; the package imports every module, so a
new sampler is a new file. Which samplers a greedy decode applies follows transformers and llama.cpp: the
penalties, DRY, logit bias and guidance change the scores every strategy reads (transformers' processors,
llama.cpp's samplers before the pick); the rest shape the distribution a token is drawn from and apply only when
sampling (transformers' warpers).
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError
from playground.config.samplers.base import (
    ALIASES,
    SAMPLER_GROUPS,
    SAMPLERS,
    SPECS,
    SamplerSpec,
    ServerWords,
    register_sampler,
    spec_of_stage,
    unescape_breaker,
    unregister_sampler,
)

for _info in pkgutil.iter_modules(__path__):  # each module declares its samplers
    importlib.import_module(f"{__name__}.{_info.name}")


def default_order() -> tuple[str, ...]:
    """Every sampler in its default position (transformers' order, then llama.cpp's, then the later ones)."""
    return tuple(SPECS)


def sampling_only() -> frozenset[str]:
    """The samplers greedy (and beam search, ...) skip, as generate() does."""
    return frozenset(name for name, spec in SPECS.items() if spec.sampling_only)


def __getattr__(name: str) -> Any:  # the registry's views, always current (a sampler may register later)
    if name == "DEFAULT_ORDER":
        return default_order()
    if name == "SAMPLING_ONLY":
        return sampling_only()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        return default_order()
    names: list[str] = []
    for word in text.split(";"):
        key = word.strip().lower().replace("-", "_")
        if not key:
            continue
        name = ALIASES.get(key, key)
        if name not in SPECS:
            raise ConfigError(f"samplers: unknown sampler {word.strip()!r}; known: {'; '.join(SPECS)}")
        if name in names:
            raise ConfigError(f"samplers: {name} is listed twice")
        names.append(name)
    if not names:
        raise ConfigError("samplers: the list is empty; leave it blank for the default order")
    return tuple(names)


def sampler_is_on(settings: Any, name: str) -> bool:
    """Whether ``settings`` (a ``RunSettings``) switch the sampler ``name`` on."""
    return bool(SPECS[name].is_on(settings))


def active_samplers(settings: Any, sampling: bool) -> list[str]:
    """The samplers a run applies, in its order: those switched on (the sampling-only ones only when
    ``sampling``), a selecting sampler (one that draws the token itself) moved last, as llama.cpp forces it."""
    names = [name for name in parse_sampler_order(settings.samplers)
             if sampler_is_on(settings, name) and (sampling or not SPECS[name].sampling_only)]
    return [n for n in names if not SPECS[n].selecting] + [n for n in names if SPECS[n].selecting]


def sampler_chain(settings: Any) -> tuple[ChainEntry, ...]:
    """The run's chain in its order, as plain data: every listed sampler, on or off."""
    return tuple(ChainEntry(name, sampler_is_on(settings, name), SPECS[name].sampling_only, SPECS[name].help)
                 for name in parse_sampler_order(settings.samplers))


def check_sampler_chain(settings: Any) -> None:
    """Refuse an order that leaves out a sampler the settings switch on (it would be silently skipped)."""
    order = parse_sampler_order(settings.samplers)
    missing = [name for name in SPECS if name not in order and sampler_is_on(settings, name)]
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


__all__ = [
    "ALIASES",
    "DEFAULT_ORDER",
    "SAMPLERS",
    "SAMPLER_GROUPS",
    "SAMPLING_ONLY",
    "SPECS",
    "ChainEntry",
    "SamplerSpec",
    "ServerWords",
    "active_samplers",
    "check_sampler_chain",
    "default_order",
    "parse_logit_bias",
    "parse_sampler_order",
    "register_sampler",
    "sampler_chain",
    "sampler_is_on",
    "sampling_only",
    "spec_of_stage",
    "unescape_breaker",
    "unregister_sampler",
]
