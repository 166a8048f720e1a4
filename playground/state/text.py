"""Token text made safe to show: invisible and layout-changing characters become visible marks."""

from __future__ import annotations

# Characters that change how the *following* text is laid out (bidi overrides, zero-width marks) or draw nothing:
# shown as a visible escape so a token cannot reverse or hide its neighbours.
_FORMAT_CHARS = {*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF}


def _escape_char(ch: str) -> str:
    code = ord(ch)
    # Unicode's "control pictures" (␀ … ␟) would say it best, but common fonts (DejaVu, WenQuanYi) lack them and
    # draw boxes: the code point is readable in any font.
    if code < 0x20 or code == 0x7F or code in _FORMAT_CHARS:
        return f"⟨U+{code:04X}⟩"
    return ch


def flowing_token_text(text: str) -> str:
    """Token text for the output document: line breaks shown as ↵ and kept, other invisibles escaped."""
    text = text.replace("\r\n", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    return "".join("↵\n" if ch == "\n" else "\t" if ch == "\t" else _escape_char(ch) for ch in text)


def visible_token_text(text: str) -> str:
    """Token text on one line with invisible characters made visible, for axis labels and lists."""
    if text == "":
        return "∅"
    marks = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "⟨CR⟩", "\u2028": "↵", "\u2029": "↵"}
    return "".join(marks.get(ch) or _escape_char(ch) for ch in text)
