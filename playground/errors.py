"""The error types whose message is meant for the user (shown as is, no traceback)."""

from __future__ import annotations

from playground.config import ConfigError


class ScreenshotError(RuntimeError):
    """A headless screenshot could not be made (the run failed); the message says why."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from playground.models.default_model import FetchError
    from playground.models.loading import ModelLoadError
    from playground.remote.errors import RemoteError
    from playground.traces import TraceError

    return (ConfigError, ModelLoadError, FetchError, ScreenshotError, TraceError, RemoteError)


USER_ERRORS = _user_errors()
