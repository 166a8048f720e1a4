"""The error a setting raises when it cannot work."""

from __future__ import annotations

from playground.errors import UserError


class ConfigError(UserError, ValueError):
    """A setting that cannot work; the message says which and what to do."""
