"""The web page's sections, one module each: a module here defines ``SECTION`` and is found on import, so a view's
part of the page is a file added (as views and strategies are), not an edit of the page.

A section's ``data`` turns the run's events into compact JSON (``None``: the run has nothing for it, and the section
stays hidden); its ``script`` is the body of a JavaScript function called with ``S`` (that data) and ``D`` (the whole
page's data, with the helpers ``pct`` and ``esc`` in scope), run only when ``S`` exists.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Section:
    name: str  # its key in the page's data; its element is ``<name>-section``
    order: int  # where it stands on the page, smaller first
    heading: str  # the section's title (HTML)
    body: str  # the elements its script fills (HTML)
    script: str  # a JavaScript function body over S and D
    data: Callable[[list[Any]], Any | None]
    style: str = ""  # its CSS rules, added to the page's


def _found() -> tuple[Section, ...]:
    sections = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        section = getattr(module, "SECTION", None)
        if not isinstance(section, Section):
            raise TypeError(f"{module.__name__} defines no SECTION")
        sections.append(section)
    names = [s.name for s in sections]
    if len(set(names)) != len(names):
        raise ValueError(f"two web page sections share a name: {sorted(names)}")
    return tuple(sorted(sections, key=lambda s: (s.order, s.name)))


SECTIONS: tuple[Section, ...] = _found()
