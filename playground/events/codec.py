"""Events as strict JSON and back: what `trace` writes and saved runs are read from.

Strict: no ``NaN`` or ``Infinity`` tokens (many JSON readers reject them). The only non-finite number an event
may hold is −∞ (the log of a probability of zero, e.g. a token a processor banned); it is written as ``null`` and
read back as −∞ in a ``float`` field.

A ``Literal`` field reads one of its values; a string it does not list reads as ``"unknown"`` where the Literal
has that value (a stop reason from a newer version or a server opens; ``StopReason``), and fails otherwise.
Fields newer than a saved run are derived from what the run holds (``LEGACY_FIELDS``, the one place that does).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

NEG_INF = float("-inf")
UNKNOWN = "unknown"  # what a Literal field that lists it reads for a string it does not list


def _remote_from_device(plain: dict[str, Any]) -> bool:
    # Before RunStarted.remote, a server's run was told by its device: "remote: <engine>" (playground.remote).
    device = plain.get("device")
    return isinstance(device, str) and device.startswith("remote")


# For each event ``type``: the fields newer than some saved runs, and how to derive each from an old run's object.
LEGACY_FIELDS: dict[str, dict[str, Callable[[dict[str, Any]], Any]]] = {
    "start": {"remote": _remote_from_device},
}


class EventDecodeError(ValueError):
    """A JSON object that is not a well-formed event; the message says what is wrong."""


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value) or value == math.inf:
            raise ValueError(f"an event holds {value}: only -inf may be non-finite")
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def event_to_dict(event: Any) -> dict[str, Any]:
    """Plain JSON-ready dict with the event's ``type`` first."""
    return {"type": event.type, **_plain(event)}


def dumps_event(event: Any) -> str:
    """One trace line (strict JSON, no trailing newline)."""
    return json.dumps(event_to_dict(event), ensure_ascii=False, allow_nan=False)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(kind: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        (kind,) = [k for k in options if k is not type(None)]
        return _decode(kind, value, where)
    if kind is Any:
        return value
    if origin is Literal:
        options = typing.get_args(kind)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value in options:
            return value
        if isinstance(value, str) and UNKNOWN in options:
            return UNKNOWN
        raise EventDecodeError(f"{where}: expected one of {', '.join(map(repr, options))}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list):
            raise EventDecodeError(f"{where}: expected a list, got {type(value).__name__}")
        item = typing.get_args(kind)[0]
        return tuple(_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise EventDecodeError(f"{where}: expected an object, got {type(value).__name__}")
        return value
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _decode_fields(kind, value, where)
    if kind is float:
        if value is None:
            return NEG_INF
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is bool or kind is str:
        if isinstance(value, kind):
            return value
    else:
        raise EventDecodeError(f"{where}: cannot read a {kind}")
    raise EventDecodeError(f"{where}: expected {kind.__name__}, got {value!r}")


def _decode_fields(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise EventDecodeError(f"{where}: expected an object, got {type(value).__name__}")
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            values[f.name] = _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise EventDecodeError(f"{where}: missing {f.name!r}")
    return cls(**values)


def event_from_dict(plain: dict[str, Any], event_types: dict[str, type]) -> Any:
    """The event a JSON object describes; ``EventDecodeError`` says why when it cannot."""
    if not isinstance(plain, dict):
        raise EventDecodeError(f"expected a JSON object, got {type(plain).__name__}")
    kind = plain.get("type")
    if not isinstance(kind, str) or kind not in event_types:
        raise EventDecodeError(f"unknown event type {kind!r}")
    cls = event_types[kind]
    fields = {k: v for k, v in plain.items() if k != "type"}
    for name, derive in LEGACY_FIELDS.get(kind, {}).items():
        if name not in fields:
            fields[name] = derive(fields)
    return _decode_fields(cls, fields, kind)
