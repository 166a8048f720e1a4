r"""Constrained beam search (forced words): its settings and how a forced word is written.

``--force-words TEXT`` (repeatable) makes beam search a *constrained* beam search, as transformers 4.46's
``generate(force_words_ids=...)``: every returned sequence must contain each forced word. One flag is one
constraint; ``|`` inside it makes a *disjunctive* set, met by any one of its alternatives
(``--force-words " cat| kitten"``; ``\|`` is a literal ``|``). The text is tokenised exactly as written, without
special tokens (4.46's documented ``tokenizer(words, add_special_tokens=False).input_ids``): spaces matter, so
write the leading space a word has mid-sentence (" cat"), as the phrase bans do. The constraints count over the
prompt too (4.46 reads the whole sequence): a word the prompt already holds is met from the start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting

ALTERNATIVES = "|"  # separates a disjunctive set's alternatives inside one --force-words


def parse_force_word(text: str) -> tuple[str, ...]:
    r"""``" cat| kitten"`` → (" cat", " kitten"): the alternatives of one constraint, spaces kept; ``\|`` is a
    literal ``|`` (``"<\|im_end\|>"``)."""
    return tuple(part.replace("\\" + ALTERNATIVES, ALTERNATIVES) for part in re.split(r"(?<!\\)\|", text))


@register_group
@dataclass(frozen=True)
class ForcedWordsSettings(SettingsGroup):
    name = "forced_words"
    title = "Forced words"
    order = 12

    force_words: tuple[str, ...] = setting(
        (), "force words", "constrained beam search: each returned sequence must contain this word or phrase; "
        "'a|b' is a disjunctive set (any one of them), '\\|' a literal |; tokenised as written, so write the "
        "leading space a word has mid-sentence (' cat')")

    def active(self) -> bool:
        return bool(self.force_words)

    def summary(self) -> str:
        return "forced: " + ", ".join(repr(w) for w in self.force_words) if self.force_words else "no forced words"

    def cross_checks(self) -> list[tuple[bool, str]]:
        checks = []
        for word in self.force_words:
            alternatives = parse_force_word(word)
            checks.append((all(alternatives), f"--force-words {word!r}: an empty word (or an empty alternative "
                                              f"beside '{ALTERNATIVES}') forces nothing"))
            checks.append((len(set(alternatives)) == len(alternatives),
                           f"--force-words {word!r} names the same alternative twice"))
        return checks


# The beam strategy takes it: with forced words, its wrapper runs constrained beam search instead (before --quant's
# wrapper, which it refuses: one wrapper runs a strategy).
register_shared_group(SharedGroup(
    ForcedWordsSettings, "--force-words makes beam search a constrained beam search", "is not a beam search",
    takers=("beam",), wrapper="playground.engine.beam_forced.search:run_forced_wrapper", order=15))
