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
from typing import Any, TypeAlias, cast

from playground.events.attention import AttentionRow, AttentionStarted
from playground.events.bans import Rollback
from playground.events.beam import BeamCandidate, BeamStep
from playground.events.beam_forced import BeamBanks, ForcedWordsDone, ForcedWordsStarted
from playground.events.beam_groups import DiverseBeamStep
from playground.events.cascade import CascadeResponse, CascadeStarted, CascadeStep
from playground.events.codec import EventDecodeError, dumps_event, event_to_dict
from playground.events.codec import event_from_dict as _event_from_dict
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.events.contrastive_search import SearchStarted, SearchStep
from playground.events.dla import AttributionMissing, LogitAttribution
from playground.events.kv import KVCompare, KVPhase, KVQuality, KVStarted, KVStep, KVSweep
from playground.events.layers import LayersStarted, LayerStep
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.events.patching import PatchingRow, PatchingStarted
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable
from playground.events.remote import RemoteStarted, RemoteTokenStep
from playground.events.run import (
    STOP_REASONS,
    BeamSequence,
    Candidate,
    PrefillDone,
    PrefillProgress,
    ProcessorEffect,
    RunFinished,
    RunStarted,
    StopReason,
    TokenNumbers,
    TokenStep,
)
from playground.events.salience import SalienceAgreement, SalienceMap
from playground.events.speculative import SpeculativeRound, SpeculativeStarted
from playground.events.steering import SteeringNorms, SteeringStarted, SteerStep
from playground.events.steps import StepEvent, UnitStep, is_step_event, is_unit_step, is_unit_step_type
from playground.events.watermark import WatermarkStarted, WatermarkStep

# Every event class by its JSON ``type``.
EVENT_TYPES: dict[str, type] = {}


def register_event_types(module: ModuleType) -> None:
    """Add the event classes of ``module`` (frozen dataclasses with a ``type`` tag) to ``EVENT_TYPES``."""
    for cls in vars(module).values():
        tag = getattr(cls, "type", None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(tag, str):
            known = EVENT_TYPES.get(tag)
            if known is not None and known is not cls:
                raise ValueError(f"event type {tag!r} is defined twice ({known.__module__}, {cls.__module__})")
            EVENT_TYPES[tag] = cls


for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("codec", "figures"):
        register_event_types(importlib.import_module(f"{__name__}.{_info.name}"))

# Every event class of this package (what EVENT_TYPES holds once the package is read; tests/test_contract.py checks
# that the two agree, so a new module's events must be named here too for the type checker to know them).
Event: TypeAlias = (
    RunStarted | PrefillProgress | PrefillDone | TokenStep | RunFinished
    | RemoteStarted | RemoteTokenStep
    | AttentionStarted | AttentionRow
    | BeamStep | DiverseBeamStep | BeamBanks | ForcedWordsStarted | ForcedWordsDone
    | Rollback
    | CascadeStarted | CascadeStep | CascadeResponse
    | ContrastiveStarted | ContrastStep
    | SearchStarted | SearchStep
    | KVStarted | KVStep | KVPhase | KVCompare | KVSweep | KVQuality
    | LayersStarted | LayerStep
    | PaneStarted | PaneToken | PaneFinished
    | QuantReady | QuantStep | QuantSummary | QuantTable
    | SpeculativeStarted | SpeculativeRound
    | SteeringStarted | SteeringNorms | SteerStep
    | LogitAttribution | AttributionMissing
    | SalienceMap | SalienceAgreement | PatchingStarted | PatchingRow
    | WatermarkStarted | WatermarkStep
)


def event_from_dict(plain: dict[str, Any]) -> Event:
    return cast(Event, _event_from_dict(plain, EVENT_TYPES))


__all__ = [
    "EVENT_TYPES",
    "STOP_REASONS",
    "BeamCandidate",
    "BeamSequence",
    "BeamStep",
    "Candidate",
    "Event",
    "EventDecodeError",
    "PrefillDone",
    "PrefillProgress",
    "ProcessorEffect",
    "Rollback",
    "RunFinished",
    "RunStarted",
    "StepEvent",
    "StopReason",
    "TokenNumbers",
    "TokenStep",
    "UnitStep",
    "dumps_event",
    "event_from_dict",
    "event_to_dict",
    "is_step_event",
    "is_unit_step",
    "is_unit_step_type",
    "register_event_types",
]
