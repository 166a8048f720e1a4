"""What the tests of exported web pages share beside conftest's ``browser`` and ``open_page`` fixtures."""

from __future__ import annotations


def rgb(colour: str) -> str:
    """``#RRGGBB`` as a browser's computed style writes it."""
    return "rgb({}, {}, {})".format(*(int(colour[k:k + 2], 16) for k in (1, 3, 5)))
