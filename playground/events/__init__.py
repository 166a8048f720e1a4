"""The contract between engine and UI: frozen dataclasses of plain values, one module per capability.

Every strategy yields these. They carry no tensors and no Qt types, so the same stream feeds the GUI, the
`trace` command (JSON lines), saved runs, tests and benchmarks. Each event class has a ``type`` tag used in JSON.
Every module of this package is read for them (a new capability adds its module and edits nothing); a capability
from outside the package adds its own with ``register_event_types``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from types import ModuleType
from typing import Any

from playground.events.beam import BeamCandidate, BeamStep
from playground.events.codec import EventDecodeError, dumps_event, event_to_dict
from playground.events.codec import event_from_dict as _event_from_dict
from playground.events.run import (
    BeamSequence,
    Candidate,
    PrefillDone,
    PrefillProgress,
    ProcessorEffect,
    RunFinished,
    RunStarted,
    TokenNumbers,
    TokenStep,
)

# Every event class by its JSON ``type``.
EVENT_TYPES: dict[str, type] = {}


def register_event_types(module: ModuleType) -> None:
    """Add the event classes of ``module`` (frozen dataclasses with a ``type`` tag) to ``EVENT_TYPES``."""
    for cls in vars(module).values():
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "type", None), str):
            known = EVENT_TYPES.get(cls.type)
            if known is not None and known is not cls:
                raise ValueError(f"event type {cls.type!r} is defined twice ({known.__module__}, {cls.__module__})")
            EVENT_TYPES[cls.type] = cls


for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("codec", "figures"):
        register_event_types(importlib.import_module(f"{__name__}.{_info.name}"))

Event = Any  # any class in EVENT_TYPES


def event_from_dict(plain: dict[str, Any]) -> Event:
    return _event_from_dict(plain, EVENT_TYPES)


__all__ = [
    "EVENT_TYPES",
    "BeamCandidate",
    "BeamSequence",
    "BeamStep",
    "Candidate",
    "Event",
    "EventDecodeError",
    "PrefillDone",
    "PrefillProgress",
    "ProcessorEffect",
    "RunFinished",
    "RunStarted",
    "TokenNumbers",
    "TokenStep",
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
    "register_event_types",
]
