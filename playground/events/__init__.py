"""The contract between engine and UI: frozen dataclasses of plain values, one module per capability.

Every strategy yields these. They carry no tensors and no Qt types, so the same stream feeds the GUI, the
`trace` command (JSON lines), saved runs, tests and benchmarks. Each event class has a ``type`` tag used in JSON.
A new capability adds its module and lists it in ``_MODULES``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from playground.events import beam, cascade, contrastive, kv, layers, panes, quant, remote, run, speculative
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
    TokenStep,
)

_MODULES = (run, beam, speculative, layers, kv, quant, panes, contrastive, cascade, remote)

# Every event class by its JSON ``type`` (classes with a ``type`` tag in the modules above).
EVENT_TYPES: dict[str, type] = {
    cls.type: cls
    for module in _MODULES
    for cls in vars(module).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "type", None), str)
}

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
    "TokenStep",
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
]
