"""The error a model load raises: in a module of its own, so the conversion cache (which the loader calls) raises it
without importing the loader."""

from __future__ import annotations

from playground.errors import UserError


class ModelLoadError(UserError, ValueError):
    """A model could not be loaded; the message is meant for the user."""
