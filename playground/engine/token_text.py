"""Token ids to display text, without breaking multi-byte characters or leading spaces."""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Turns a growing id sequence into text deltas.

    A token's text is the text of ``ids[:n+1]`` minus the text of ``ids[:n]``, decoded over a short window so the
    cost stays flat. When a token ends in the middle of a multi-byte character its delta is held back ("") and comes
    out with the token that completes it.
    """

    def __init__(self, tokenizer: Any, context_ids: list[int] | tuple[int, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context_ids)
        self._read = len(self._ids)
        self._prefix = max(0, self._read - 6)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=False)
        after = decode(self._ids[self._prefix :], skip_special_tokens=False)
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            delta = after[len(before) :]
            self._prefix = max(self._read, len(self._ids) - 6)
            self._read = len(self._ids)
            return delta
        return ""


class TokenTextCache:
    """Display text of single tokens (for candidate lists), decoded once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            if REPLACEMENT in text:  # part of a multi-byte character: show its bytes, e.g. <0xE2>
                text = _byte_repr(str(self._tokenizer.convert_ids_to_tokens(token_id)))
            self._texts[token_id] = text
        return text


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _byte_repr(token: str) -> str:
    """``<0xE2><0x80>`` for a byte-level token; the token itself for other vocabularies (e.g. ``<0xE2>``)."""
    if token and all(ch in _UNICODE_TO_BYTE for ch in token):
        return "".join(f"<0x{_UNICODE_TO_BYTE[ch]:02X}>" for ch in token)
    return token
