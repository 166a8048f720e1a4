"""Phrase bans with backtracking (antislop, ik_llama.cpp's string and regex bans, Aphrodite's phrase guard):
``--ban TEXT`` and ``--ban-regex PATTERN`` (repeatable). When the generated text comes to contain a banned phrase
(a plain substring, or a regex ``search``), the decode rolls back to the token where the match began, forbids that
token at that position and goes on (``playground.engine.bans``; the sampler ``playground.engine.samplers.ban``
masks the forbidden tokens). Only the generated text is checked, never the prompt (nor tokens forced by hand).

A regex is Python's ``re`` syntax; a pattern that does not compile, or that matches the empty string (it would
match everywhere), is refused before the first event. No torch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playground.config.errors import ConfigError
from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting

MAX_ROLLBACKS = 64


def compile_ban(pattern: str) -> re.Pattern[str]:
    """``--ban-regex``'s pattern compiled, or ``ConfigError`` with ``re``'s message and where it is."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        where = f" at position {error.pos}" if error.pos is not None else ""
        raise ConfigError(f"--ban-regex {pattern!r}: {error.msg}{where}") from None
    if compiled.search("") is not None:
        raise ConfigError(f"--ban-regex {pattern!r} matches the empty string (it would ban everything)")
    return compiled


@register_group
@dataclass(frozen=True)
class BanSettings(SettingsGroup):
    name = "bans"
    title = "Phrase bans (backtracking)"

    ban: tuple[str, ...] = setting((), "banned phrases", "when the output comes to contain this text, roll back to "
                                   "the token where it began, forbid that token there and go on (repeatable)")
    ban_regex: tuple[str, ...] = setting((), "banned patterns", "as --ban, for text matching this regular expression "
                                         "(Python re syntax; repeatable)", flag="--ban-regex")
    ban_max_rollbacks: int = setting(MAX_ROLLBACKS, "most rollbacks", "end the run (stop reason ban_limit) after "
                                     "this many rollbacks", minimum=1, maximum=100_000, flag="--ban-max-rollbacks")

    def phrases(self) -> tuple[str, ...]:
        return tuple(p for p in self.ban if p)

    def patterns(self) -> tuple[str, ...]:
        return tuple(p for p in self.ban_regex if p)

    def active(self) -> bool:
        return bool(self.phrases() or self.patterns())

    def validate(self) -> None:
        super().validate()
        for pattern in self.patterns():
            compile_ban(pattern)

    def summary(self) -> str:
        n = len(self.phrases()) + len(self.patterns())
        return f"{n} ban{'s' if n != 1 else ''}" if n else "no bans"


register_sampler(SamplerSpec(
    name="ban", position=62, aliases=("bans", "phrase_ban"), group=BanSettings,
    reads=("ban", "ban_regex", "ban_max_rollbacks"), sampling_only=False, value_only=False, truncating=True,
    # A ban forbids single tokens (a logit of -inf), as antislop's and ik_llama.cpp's bans set it before the
    # sampler chain. Placed after transformers' processors and the penalties (each changes single tokens' logits
    # and keeps -inf at -inf, so the mask gives the same distribution before or after them: transformers' order
    # stays as it is) and before every sampler that shapes the distribution, beside the grammar's mask.
    help="ban phrases or regular expressions by backtracking: roll back to where a match began and forbid that "
         "token there (--ban, --ban-regex)",
    is_on=lambda s: s.group(BanSettings).active(),
    needs_run="it rolls the run back (cache, samplers) to where a banned phrase began",
    server=ServerWords(nowhere="servers stream only accepted text: bans with backtracking run on a local model"),
    what_if="estimate: the what-if does not replay the rollbacks (the tokens a rollback forbade are not masked)",
    what_if_examples=(dict(ban=("the",)),)))
