"""Constraints turned into GBNF, for a llama-server built without LLGuidance (it takes GBNF and JSON schemas only).

``choices_gbnf``: ``root ::= "yes" | "no"``, each choice one escaped literal. ``regex_gbnf``: a regular expression
of a plain subset, translated construct by construct: literals, ``.``, character classes (ranges, negation,
``\\d \\w \\s`` inside them), groups (capturing or ``(?:...)``), alternation, the quantifiers ``* + ? {n} {n,}
{n,m}`` (lazy ones too: under a whole-text match they give the same language), and ``^``/``$`` at the pattern's two
ends (the constraint matches the whole text anyway). ``\\d``, ``\\w``, ``\\s`` are their ASCII classes
(``[0-9]``, ``[0-9A-Za-z_]``, ``[ \\t\\n\\r\\f\\v]``): a server run then never writes a non-ASCII digit, which the
local constraint would allow. Anything else (look-around, back-references, word boundaries, flags, Unicode classes,
nested sets) is refused by name with ``ConfigError``: a wrong translation would constrain the server to another
language than the local run, silently. Every ASCII character that is not a letter, a digit or a space is written as a
``\\xHH`` escape, the one form llama.cpp's GBNF reader takes everywhere (it has no ``\\-`` escape); other
characters go as they are (UTF-8).
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config import ConfigError

_ASCII_CLASSES = {"d": [("0", "9")], "w": [("0", "9"), ("A", "Z"), ("a", "z"), ("_", "_")],
                  "s": [(" ", " "), ("\t", "\t"), ("\n", "\n"), ("\r", "\r"), ("\f", "\f"), ("\v", "\v")]}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_REFUSED_ESCAPES = {"b": "a word boundary (\\b)", "B": "a word boundary (\\B)", "A": "an anchor (\\A)",
                    "z": "an anchor (\\z)", "Z": "an anchor (\\Z)", "p": "a Unicode class (\\p)",
                    "P": "a Unicode class (\\P)"}


def _code(char: str) -> str:
    """One character as GBNF writes it: letters, digits, spaces and non-ASCII characters (UTF-8, which llama.cpp
    reads in literals and sets; llguidance's GBNF reader garbles their \\u escapes) as they are; the rest of ASCII
    escaped."""
    if not char.isascii() or char.isalnum() or char == " ":
        return char
    return f"\\x{ord(char):02X}"


def gbnf_literal(text: str) -> str:
    """``text`` as one GBNF string literal."""
    return '"' + "".join(_code(c) for c in text) + '"'


def choices_gbnf(choices: tuple[str, ...]) -> str:
    """The grammar whose sentences are exactly ``choices``."""
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices) + "\n"


def _refuse(pattern: str, what: str, at: int) -> ConfigError:
    return ConfigError(f"--regex: {what} (at character {at + 1} of {pattern!r}) cannot be sent to llama-server: it "
                       "takes GBNF, and only a plain regex (literals, classes, groups, |, * + ? {n,m}) is translated; "
                       "write the constraint as a GBNF --grammar, or use a local model")


@dataclass
class _Parser:
    pattern: str  # the part translated (the pattern less its end anchors)
    original: str  # the pattern as given (for messages)
    shift: int = 0  # where ``pattern`` starts in it
    at: int = 0

    def peek(self) -> str:
        return self.pattern[self.at] if self.at < len(self.pattern) else ""

    def take(self) -> str:
        char = self.peek()
        self.at += 1
        return char

    def refuse(self, what: str, at: int | None = None) -> ConfigError:
        return _refuse(self.original, what, (self.at if at is None else at) + self.shift)

    def alternation(self) -> str:
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            items.append(atom + self.quantifier())
        return " ".join(items) if items else '""'

    def atom(self) -> str:
        start, char = self.at, self.take()
        if char == "(":
            if self.peek() == "?":
                if self.pattern[self.at:self.at + 2] != "?:":
                    raise self.refuse("a group with flags or look-around ('(?')", start)
                self.at += 2
            inner = self.alternation()
            if self.take() != ")":
                raise self.refuse("an unclosed group", start)
            return "(" + inner + ")"
        if char == "[":
            return self.char_class(start)
        if char == ".":
            return "[^\\x0A]"  # any character but a newline, as Python's and Rust's regex read it
        if char == "\\":
            return self.escape(start, in_class=False)
        if char in "*+?{":
            raise self.refuse(f"a quantifier with nothing before it ({char!r})", start)
        if char in "^$":
            raise self.refuse(f"an anchor ({char!r}) inside the pattern", start)
        return gbnf_literal(char)

    def escape(self, start: int, in_class: bool) -> str:
        char = self.take()
        if not char:
            raise self.refuse("a trailing backslash", start)
        if char in _ASCII_CLASSES:
            ranges = "".join(_code(a) + ("" if a == b else "-" + _code(b)) for a, b in _ASCII_CLASSES[char])
            return ranges if in_class else "[" + ranges + "]"
        if char.isupper() and char.lower() in _ASCII_CLASSES:
            if in_class:
                raise self.refuse(f"a negated class (\\{char}) inside a set", start)
            lower = char.lower()
            return "[^" + "".join(_code(a) + ("" if a == b else "-" + _code(b)) for a, b in _ASCII_CLASSES[lower]) \
                + "]"
        if char in _CHAR_ESCAPES:
            return _code(_CHAR_ESCAPES[char]) if in_class else gbnf_literal(_CHAR_ESCAPES[char])
        if char == "x":
            digits = self.pattern[self.at:self.at + 2]
            if len(digits) != 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.refuse("a \\x escape without two hex digits", start)
            self.at += 2
            value = chr(int(digits, 16))
            return _code(value) if in_class else gbnf_literal(value)
        if char in _REFUSED_ESCAPES:
            raise self.refuse(_REFUSED_ESCAPES[char], start)
        if char.isalnum():
            raise self.refuse(f"the escape \\{char}", start)
        return _code(char) if in_class else gbnf_literal(char)  # an escaped punctuation mark is itself

    def class_char(self, start: int) -> tuple[str, bool]:
        """One member of a set: (a GBNF-coded character or an ASCII class's ranges, whether it is a class)."""
        char = self.take()
        if not char:
            raise self.refuse("an unclosed set ('[')", start)
        if char == "\\":
            is_class = self.peek() in "dwsDWS" and self.peek() != ""
            return self.escape(self.at - 1, in_class=True), is_class
        if char == "[":
            raise self.refuse("a nested set or a POSIX class inside a set", self.at - 1)
        if char in "&~-" and self.peek() == char:
            raise self.refuse(f"a set operation ({char * 2})", self.at - 1)
        return _code(char), False

    def char_class(self, start: int) -> str:
        negated = self.peek() == "^"
        if negated:
            self.take()
        if self.peek() == "]":
            raise self.refuse("a set that starts with ']' (read differently by regex engines)", self.at)
        parts: list[str] = []
        while self.peek() != "]":
            first_at = self.at
            if not self.peek():
                raise self.refuse("an unclosed set ('[')", start)
            low, low_class = self.class_char(start)
            if self.peek() == "-" and self.pattern[self.at + 1:self.at + 2] not in ("]", ""):
                self.take()
                high_at = self.at
                high, high_class = self.class_char(start)
                if low_class or high_class:
                    raise self.refuse("a range with a class at one end", high_at)
                if _point(low) > _point(high):
                    raise self.refuse("a range whose ends are out of order", first_at)
                parts.append(low + "-" + high)
            else:
                parts.append(low)
        self.take()
        return "[" + ("^" if negated else "") + "".join(parts) + "]"

    def quantifier(self) -> str:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.take()
            out = char
        elif char == "{" and self._counted():
            start = self.at
            body = self.pattern[self.at + 1:self.pattern.index("}", self.at)]
            self.at += len(body) + 2
            low, _, high = body.partition(",")
            if "," in body and high and int(high) < int(low):
                raise self.refuse("a repetition {n,m} with m < n", start)
            out = "{" + body + "}"
        else:
            return ""
        if self.peek() == "?":  # lazy: the same language under a whole-text match
            self.take()
        if self.peek() in ("+", "*") or (self.peek() == "{" and self._counted()):
            raise self.refuse("a quantifier after a quantifier (possessive or nested)")
        return out

    def _counted(self) -> bool:
        """A ``{n}``, ``{n,}`` or ``{n,m}`` here (anything else is a literal brace, as both regex engines read it)."""
        end = self.pattern.find("}", self.at)
        if end < 0:
            return False
        low, comma, high = self.pattern[self.at + 1:end].partition(",")
        return low.isdigit() and (not high or high.isdigit()) and (bool(comma) or not high)


def _point(coded: str) -> int:
    return int(coded[2:], 16) if coded.startswith("\\x") else ord(coded)


def regex_gbnf(pattern: str) -> str:
    """The GBNF grammar of ``pattern`` as a whole-text match; ``ConfigError`` naming what is not translated."""
    body, shift = pattern, 0
    if body.startswith("^"):
        body, shift = body[1:], 1
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    parser = _Parser(body, pattern, shift)
    expression = parser.alternation()
    if parser.at < len(body):
        raise parser.refuse("an unmatched ')'")
    return "root ::= " + expression + "\n"
