"""What every per-step event has, as protocols: the session and the views dispatch on these, never on attribute
names.

A *step event* belongs to one step of the run (``step``: 0 = the first generated token), whatever it describes (a
token, the cache after it, the layers that led to it). A *unit step* is a step event that produces the run's unit
(a token, a beam step: its class says which in ``unit``), with its time and the cache's measured size after it:
what counts and speeds are made of. Both are structural: an event class is one by having the members, and
``tests/test_contract.py`` checks that every event class with a ``step`` field (and every one with a ``unit``)
is one.

``is_step_event`` / ``is_unit_step`` are the checks to dispatch with: ``isinstance`` on a runtime-checkable
protocol looks every member up on each call (~0.1 ms on Python 3.11, per event on the window's thread); these
look a class up once.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import ClassVar, Protocol, TypeGuard


class StepEvent(Protocol):
    """An event of one step of the run."""

    type: ClassVar[str]

    @property
    def step(self) -> int: ...


class UnitStep(StepEvent, Protocol):
    """A step event that produces the run's unit: one of what the run counts."""

    unit: ClassVar[str]  # what one step produces: "token", or "step" where a step grows several sequences

    @property
    def step_ms(self) -> float: ...

    @property
    def kv_cache_bytes(self) -> int: ...


def _members(protocol: type) -> frozenset[str]:
    """The names a protocol asks for (its own and its bases')."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        names.update(inspect.get_annotations(base))
        names.update(name for name, value in vars(base).items() if isinstance(value, property))
    return frozenset(names)


STEP_MEMBERS = _members(StepEvent)
UNIT_STEP_MEMBERS = _members(UnitStep)


def class_has(cls: type, members: frozenset[str]) -> bool:
    """Whether instances of ``cls`` have every name in ``members`` (a dataclass's fields, or the class's own)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return all(name in fields or hasattr(cls, name) for name in members)


_STEP_TYPES: dict[type, bool] = {}  # is_step_event's answers, by class
_UNIT_TYPES: dict[type, bool] = {}  # is_unit_step's


def is_step_event(event: object) -> TypeGuard[StepEvent]:
    cls = type(event)
    known = _STEP_TYPES.get(cls)
    if known is None:
        known = _STEP_TYPES[cls] = class_has(cls, STEP_MEMBERS)
    return known


def is_unit_step(event: object) -> TypeGuard[UnitStep]:
    return is_unit_step_type(type(event))


def is_unit_step_type(kind: type) -> TypeGuard[type[UnitStep]]:
    """Whether ``kind``'s events are unit steps (a strategy's catalog entry names the types it yields)."""
    known = _UNIT_TYPES.get(kind)
    if known is None:
        known = _UNIT_TYPES[kind] = class_has(kind, UNIT_STEP_MEMBERS)
    return known
