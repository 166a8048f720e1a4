"""Capabilities from outside the package: modules that declare a strategy, its settings, events and view.

A capability module registers what it brings with the registries every built-in capability uses
(``register_group``, ``register_strategy`` with its runner's ``"module:function"``, ``register_event_types``, and
``register_ui_module`` for the module that registers its view), and is found by name: the entry-point group
``playground.capabilities`` of an installed package, or the environment variable ``PLAYGROUND_CAPABILITIES``
(module names, comma-separated). The command line, the window and ``shot`` load them before reading settings or
saved runs, so a new capability adds files and edits none.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from playground.errors import UserError

ENV = "PLAYGROUND_CAPABILITIES"
ENTRY_POINT_GROUP = "playground.capabilities"

UI_MODULES: list[str] = []  # modules that register a capability's view; the window imports them
_LOADED: list[str] = []


class CapabilityError(UserError):
    """A capability module that cannot be imported; the message names it."""


def register_ui_module(module: str) -> None:
    """The module (imported by the window only) that registers a capability's view with ``@register_view``."""
    if module not in UI_MODULES:
        UI_MODULES.append(module)


def capability_modules() -> list[str]:
    named = [m.strip() for m in os.environ.get(ENV, "").split(",") if m.strip()]
    installed = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(dict.fromkeys(installed + named))


def load_capabilities() -> list[str]:
    """Import every capability module once (each registers itself); returns the names loaded so far."""
    for name in capability_modules():
        if name in _LOADED:
            continue
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise CapabilityError(f"the capability module {name!r} (from ${ENV} or the "
                                  f"{ENTRY_POINT_GROUP!r} entry points) cannot be imported: {error}") from error
        _LOADED.append(name)
    return list(_LOADED)
