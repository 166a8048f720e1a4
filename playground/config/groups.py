"""Capability settings: one frozen dataclass per capability, registered by name.

A ``RunSettings`` carries the groups a run uses (``settings.group(BeamSettings)``); the CLI and the form list every
registered group's table, in the groups' ``order``, so a new capability adds its module (``playground.config``
imports every module of the package) and touches nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from playground.config.errors import ConfigError
from playground.config.table import check_all, from_plain, plain_value, rows

G = TypeVar("G", bound="SettingsGroup")

# Where an entry without an order number goes (a group, a strategy or a shared group from a capability outside the
# package): after the built-ins, in the order they register.
AFTER_BUILT_INS = 1000


@dataclass(frozen=True)
class SettingsGroup:
    """Base of a capability's settings. Subclasses set ``name`` (JSON key) and ``title`` (form and --help)."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    order: ClassVar[int] = AFTER_BUILT_INS  # where its box sits in the form and its section in --help

    def validate(self) -> None:
        check_all(self)
        for ok, message in self.cross_checks():
            if not ok:
                raise ConfigError(message)

    def cross_checks(self) -> list[tuple[bool, str]]:
        """Rules that involve several fields: (holds, message)."""
        return []

    def settings_checks(self, settings: Any) -> list[tuple[bool, str]]:
        """Rules that involve another group of the run's ``settings`` (a ``RunSettings``): (holds, message)."""
        return []

    def active(self) -> bool:
        """Whether these settings switch their capability on for a run (for the capabilities that apply across
        strategies, ``playground.config.catalog.SharedGroup``: the lens recording, a quantized copy)."""
        return False

    def summary(self) -> str:
        """The group's values in a few words (runs list, window title)."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    def as_plain_dict(self) -> dict[str, Any]:
        return {f.name: plain_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_plain_dict(cls: type[G], plain: dict[str, Any]) -> tuple[G, list[str]]:
        """The group from JSON values, and the keys it did not know."""
        values, unknown = from_plain(cls, plain)
        return cls(**values), unknown


GROUPS: dict[str, type[SettingsGroup]] = {}
# Flags that are not in any group's table: the shared run settings' (added by run.py) and the fixed CLI options.
RESERVED_FLAGS: set[str] = {"--model", "--device", "--dtype", "--trust-remote-code", "--preset", "--strategy",
                            "--out", "--view", "--width", "--height", "--hover", "--from-trace", "--help", "-h"}


def register_group(cls: type[G]) -> type[G]:
    """Class decorator: make a capability's settings known to the CLI, the form and saved runs."""
    if not cls.name or (cls.name in GROUPS and GROUPS[cls.name] is not cls):
        raise ValueError(f"settings group name {cls.name!r} is empty or taken")
    flags = RESERVED_FLAGS | {row.flag for group in GROUPS.values() if group is not cls for row in rows(group)}
    clash = flags & {row.flag for row in rows(cls)}
    if clash:
        raise ValueError(f"{cls.__name__} reuses the flags {sorted(clash)}")
    stuck = [row.flag for row in rows(cls) if row.type is bool and row.flag.startswith("--no-") and row.default]
    if stuck:  # such a flag is a plain switch (playground.config.words): its off state must be the default
        raise ValueError(f"{cls.__name__}: the switches {stuck} say 'no' and default to on; they could not be "
                         "switched off")
    GROUPS[cls.name] = cls
    ordered = sorted(GROUPS.values(), key=lambda group: group.order)  # stable: equal numbers keep their turn
    GROUPS.clear()
    GROUPS.update((group.name, group) for group in ordered)
    return cls
