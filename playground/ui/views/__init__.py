"""The view registry: every view the window hosts, in the order their docks are made.

A view module registers its class with ``@register_view`` on import; every module of this package is imported
(a new view adds its module and edits nothing), in ``VIEW_ORDER`` first (the docks' order), then the others by
name, then the views of capabilities from outside the package (``playground.config.plugins``). The window builds
itself from ``view_classes()`` and never names a view.
"""

from __future__ import annotations

import importlib
import pkgutil

from playground.config.plugins import UI_MODULES, load_capabilities
from playground.ui.views.base import View

# The docks' order; a view module not named here comes after these, by name.
VIEW_ORDER = (
    "playground.ui.views.tokens",
    "playground.ui.views.beam_tree",
    "playground.ui.views.speculative",
    "playground.ui.views.layers",
    "playground.ui.views.kv",
    "playground.ui.views.cascade",
    "playground.ui.views.contrastive",
    "playground.ui.views.compare",
    "playground.ui.views.quant",
)

_REGISTRY: dict[str, type[View]] = {}


def register_view(cls: type[View]) -> type[View]:
    if not cls.name or not cls.consumes:
        raise ValueError(f"{cls.__name__} needs a name and the events it consumes")
    if _REGISTRY.get(cls.name, cls) is not cls:
        raise ValueError(f"a view named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def unregister_view(name: str) -> None:
    _REGISTRY.pop(name, None)


def view_modules() -> list[str]:
    found = sorted(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__))
    load_capabilities()
    return [*VIEW_ORDER, *(m for m in found if m not in VIEW_ORDER), *UI_MODULES]


def view_classes() -> list[type[View]]:
    for module in view_modules():
        importlib.import_module(module)
    return list(_REGISTRY.values())


def view_names() -> list[str]:
    return [cls.name for cls in view_classes()]
