"""Where in a JSON document a partial text is: the JSON path of the value being written ("$.items[2].name").

No constraint library reports where in the grammar a step is (llguidance's matcher has no such query), so the tokens
view derives it from the output text so far, for JSON-schema runs. A small character scanner, robust to a text cut
anywhere: inside a string, in the middle of an escape (``\\u00`` included), a number or a ``true`` not yet complete.

What the path names, for the text so far:

- the value being written, or the one certain to come next: after ``{"a":`` it is ``$.a``; after ``[1,`` it is
  ``$[1]``; after ``[`` (the array may still close empty) it is the array's own ``$``;
- while an object's key is being written (its string still open), the object's path, ``in_key`` set and the key so
  far in ``key``; once the key's closing quote is written the path names it (``{"ab"`` -> ``$.ab``);
- a value just completed is still named (``{"a": {}`` is ``$.a``) until the comma after it, which leaves the
  container's own path (``{"a": 1,`` is ``$``) until the next key closes or the next element begins.

Keys that are identifiers read ``.name``; any other key reads ``["..."]`` with the key JSON-escaped
(``$["a b"]``, ``$["say \\"hi\\""]``). Text that is not JSON stops the scan: the path is the one before it, and
``valid`` is False (a number, ``true``, ``false`` or ``null`` is checked once it ends, so a text cut inside one is not
judged yet).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
_WHITESPACE = " \t\n\r"
_SCALAR_CHARS = frozenset("0123456789+-.eEtruefalsn")
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")


def format_path(segments: tuple[str | int, ...]) -> str:
    """``("items", 2, "name")`` -> ``$.items[2].name`` (a key that is not an identifier in brackets, as JSON)."""
    out = ["$"]
    for segment in segments:
        if isinstance(segment, int):
            out.append(f"[{segment}]")
        elif _IDENTIFIER.match(segment):
            out.append(f".{segment}")
        else:
            out.append(f"[{json.dumps(segment, ensure_ascii=False)}]")
    return "".join(out)


@dataclass(frozen=True)
class JsonPlace:
    """Where the text so far is: the path's ``segments`` (keys and indices), whether a key is being written (and
    the key so far), whether the document is complete, and whether the text was JSON all the way."""

    segments: tuple[str | int, ...]
    in_key: bool = False
    key: str = ""
    complete: bool = False
    valid: bool = True

    @property
    def path(self) -> str:
        return format_path(self.segments)

    def describe(self) -> str:
        """The path in words for a tooltip: "$.items[2].name", "$.items[2] (writing a key: "na…")"."""
        if not self.valid:
            return f"{self.path} (the text after it is not JSON)"
        if self.in_key:
            begun = f": {json.dumps(self.key, ensure_ascii=False)[:-1]}…" if self.key else ""
            return f"{self.path} (writing a key{begun})"
        if self.complete:
            return f"{self.path} (the document is complete)"
        return self.path


@dataclass
class _Frame:
    kind: str  # "object" or "array"
    # object: "key?" (after {: a key or } next), "key!" (after a comma: a key next), "key" (in the key's string),
    # "colon" (key done, : next), "value" (after :, the value begun or to come), "after" (the value done: , or }).
    # array: "first" (after [: a value or ] next), "value", "after".
    state: str
    key: str | None = None  # object: the member's key, once its closing quote is written
    index: int = 0  # array: the element's index


@dataclass
class JsonPathScanner:
    """Feed a JSON text in pieces (``feed``); ``place()`` says where it is after each. Work proportional to the new
    piece only, so a run's steps cost one pass over its text."""

    stack: list[_Frame] = field(default_factory=list)
    in_string: bool = False
    escape: str = ""  # the escape being read: "\\" after a backslash, "\\uXX" inside a \u escape
    in_scalar: bool = False  # a number, true, false or null being written
    scalar: str = ""  # its characters so far (checked against JSON's spelling once it ends)
    key_chars: list[str] = field(default_factory=list)
    complete: bool = False  # the top-level value is done
    valid: bool = True

    def feed(self, text: str) -> JsonPlace:
        for char in text:
            if not self.valid:
                break
            self._char(char)
        return self.place()

    def place(self) -> JsonPlace:
        segments: list[str | int] = []
        for frame in self.stack:
            if frame.kind == "object":
                if frame.state in ("colon", "value", "after") and frame.key is not None:
                    segments.append(frame.key)
            elif frame.state in ("value", "after"):
                segments.append(frame.index)
        top = self.stack[-1] if self.stack else None
        in_key = top is not None and top.kind == "object" and top.state == "key"
        return JsonPlace(tuple(segments), in_key=in_key, key="".join(self.key_chars) if in_key else "",
                         complete=self.complete, valid=self.valid)

    # -- the scanner ------------------------------------------------------------------------------------------
    def _char(self, char: str) -> None:
        if self.in_string:
            self._string_char(char)
            return
        if self.in_scalar:
            if char in _SCALAR_CHARS:
                self.scalar += char
                return
            self.in_scalar, scalar, self.scalar = False, self.scalar, ""
            if not _SCALAR.fullmatch(scalar):
                self.valid = False  # not a number, true, false or null ("tfalse", "1.2.3", "01")
                return
            self._value_done()
        if char in _WHITESPACE:
            return
        top = self.stack[-1] if self.stack else None
        if top is None:
            if self.complete:
                self.valid = False  # a second value after the document
                return
            self._begin_value(char)
            return
        if top.kind == "object":
            self._object_char(top, char)
        else:
            self._array_char(top, char)

    def _object_char(self, top: _Frame, char: str) -> None:
        if top.state in ("key?", "key!"):
            if char == '"':
                top.state, top.key, self.in_string = "key", None, True
                self.key_chars = []
            elif char == "}" and top.state == "key?":  # (not after a comma: {"a": 1,} is not JSON)
                self._close()
            else:
                self.valid = False
        elif top.state == "colon":
            if char == ":":
                top.state = "value"
            else:
                self.valid = False
        elif top.state == "value":
            self._begin_value(char)
        elif top.state == "after":
            if char == ",":
                top.state, top.key = "key!", None
            elif char == "}":
                self._close()
            else:
                self.valid = False

    def _array_char(self, top: _Frame, char: str) -> None:
        if top.state == "first":
            if char == "]":
                self._close()
                return
            self._begin_value(char)
            if self.valid:  # (a character that begins no value leaves the path the array's own)
                top.state = "value"
        elif top.state == "value":
            self._begin_value(char)
        elif top.state == "after":
            if char == ",":
                top.state, top.index = "value", top.index + 1
            elif char == "]":
                self._close()
            else:
                self.valid = False

    def _begin_value(self, char: str) -> None:
        """A value starts with ``char`` where one is expected: the callers call it only there (the top level before
        the document is complete, an object's "value", an array's "first" or "value")."""
        if char == "{":
            self.stack.append(_Frame("object", "key?"))
        elif char == "[":
            self.stack.append(_Frame("array", "first"))
        elif char == '"':
            self.in_string = True
        elif char in "-0123456789tfn":
            self.in_scalar, self.scalar = True, char
        else:
            self.valid = False

    def _string_char(self, char: str) -> None:
        top = self.stack[-1] if self.stack else None
        keying = top is not None and top.kind == "object" and top.state == "key"
        if self.escape:
            self.escape += char
            if self.escape[:2] == "\\u":
                if len(self.escape) > 2 and char not in _HEX:
                    self.valid = False  # a \u escape takes four hex digits
                elif len(self.escape) == 6:
                    if keying:
                        self.key_chars.append(chr(int(self.escape[2:], 16)))
                    self.escape = ""
                return
            if char not in _ESCAPES:
                self.valid = False  # not one of JSON's escapes
                return
            if keying:
                self.key_chars.append(_ESCAPES[char])
            self.escape = ""
            return
        if char == "\\":
            self.escape = "\\"
        elif char < " ":
            self.valid = False  # a control character must be escaped in a JSON string
        elif char == '"':
            self.in_string = False
            if keying and top is not None:
                top.key, top.state = _join_surrogates("".join(self.key_chars)), "colon"
                self.key_chars = []
            else:
                self._value_done()
        elif keying:
            self.key_chars.append(char)

    def _value_done(self) -> None:
        """A value just ended (a string's quote, a scalar's end, a container's bracket)."""
        if not self.stack:
            self.complete = True
            return
        self.stack[-1].state = "after"

    def _close(self) -> None:
        self.stack.pop()
        self._value_done()


def _join_surrogates(text: str) -> str:
    """A key's ``\\ud83d\\ude00`` pair read as one character (each \\u escape was read alone)."""
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return text


def json_place(text: str) -> JsonPlace:
    """Where ``text`` (the start of a JSON document) is."""
    return JsonPathScanner().feed(text)


def json_path(text: str) -> str:
    """The JSON path of the value ``text`` is writing: ``json_path('{"items": [1, {"na')`` -> ``$.items[1]``."""
    return json_place(text).path


def json_places(pieces: list[str]) -> list[JsonPlace]:
    """Where the text is before each piece (``pieces[i]`` is step i's text): one pass over the whole text."""
    scanner = JsonPathScanner()
    out = []
    for piece in pieces:
        out.append(scanner.place())
        scanner.feed(piece)
    return out
