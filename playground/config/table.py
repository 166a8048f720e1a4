"""One table row per setting: the dataclass field carries its CLI flag, widget, range and message.

A settings dataclass declares each field with :func:`setting`; the CLI (argparse), the window's form and
validation all read the same row, so adding a setting touches one place.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """How one settings field appears and what values it takes."""

    label: str  # the form's label
    help: str  # CLI help and the widget's tooltip
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is not allowed (e.g. temperature > 0)
    choices: tuple[str, ...] = ()
    hint: str = ""  # appended to the message when the value is refused ("1 turns it off")
    off_text: str = ""  # the widget shows this at the minimum, which means "off"
    step: float = 1.0  # widget step (floats)
    decimals: int = 2  # widget decimals (floats)
    widget_maximum: float | None = None  # the form's range when the valid range is unbounded
    flag: str | None = None  # CLI flag; default --field-name
    cli: bool = True  # False: not a CLI option (set by the app itself, e.g. forced tokens)
    form: bool = True  # False: not in the settings form (edited elsewhere, e.g. the prompt)
    section: str = ""  # which box of the form (shared run settings only)


def setting(default: Any, label: str, help: str, **spec: Any) -> Any:
    """A dataclass field with its table row (use as ``name: type = setting(...)``)."""
    row = Setting(label=label, help=help, **spec)
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are frozen: use a tuple for sequence defaults")
    return dataclasses.field(default=default, metadata={"setting": row})


@dataclass(frozen=True)
class Row:
    """A settings field together with its Python type and table row."""

    name: str
    type: Any  # int, float, bool, str or tuple[str, ...]
    default: Any
    spec: Setting

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.name.replace("_", "-")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # get_type_hints evaluates every annotation string again on each call; settings classes are built at import
    # and never change, and their settings are checked on every construction (a third of a tiny run's CPU).
    return typing.get_type_hints(cls)


@functools.cache
def _rows(cls: type) -> tuple[Row, ...]:
    hints = _hints(cls)
    return tuple(Row(f.name, hints[f.name], f.default, f.metadata["setting"])
                 for f in dataclasses.fields(cls) if f.metadata.get("setting") is not None)


def rows(cls: type) -> list[Row]:
    """The table of a settings dataclass, in declaration order (fields without a row are skipped)."""
    return list(_rows(cls))  # a fresh list: a caller may change its own


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range_text(spec: Setting) -> str:
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        return f"in {'(' if spec.above_minimum else '['}{_num(low)}, {_num(high)}]"
    if low is not None:
        return f"above {_num(low)}" if spec.above_minimum else f"at least {_num(low)}"
    if high is not None:
        return f"at most {_num(high)}"
    return ""


def check_value(row: Row, value: Any) -> str | None:
    """Why ``value`` is not acceptable for ``row`` (a message that says what to do), or None."""
    spec, name = row.spec, row.name
    hint = f"; {spec.hint}" if spec.hint else ""
    if row.type is bool:
        return None if isinstance(value, bool) else f"{name} must be true or false (got {value!r})"
    if row.type in (int, float):
        number_ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if row.type is int:
            number_ok = isinstance(value, int) and not isinstance(value, bool)  # 3.0 would reach torch as a float
        if not number_ok:
            return f"{name} must be a{'n integer' if row.type is int else ' number'} (got {value!r})"
        if not math.isfinite(value):
            return f"{name} must be a finite number (got {value}){hint}"
        low, high = spec.minimum, spec.maximum
        too_low = low is not None and (value <= low if spec.above_minimum else value < low)
        too_high = high is not None and value > high
        if too_low or too_high:
            return f"{name} must be {_range_text(spec)} (got {_num(value)}){hint}"
        return None
    if spec.choices and value not in spec.choices:
        return f"{name} must be one of {', '.join(spec.choices)} (got {value!r})"
    if row.type is str and not isinstance(value, str):
        return f"{name} must be text (got {value!r})"
    return None


def check_all(settings: Any) -> None:
    """Raise ``ConfigError`` for the first field of ``settings`` that its row refuses."""
    for row in rows(type(settings)):
        message = check_value(row, getattr(settings, row.name))
        if message is not None:
            raise ConfigError(message)


def plain_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def from_plain(cls: type, plain: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Field values of ``cls`` found in ``plain`` (JSON values converted back), and the keys it did not know."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    unknown = []
    for key, value in plain.items():
        if key not in names:
            unknown.append(key)
            continue
        kind = hints[key]
        if typing.get_origin(kind) is tuple and isinstance(value, list):
            value = tuple(value)
        elif kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        values[key] = value
    return values, unknown
