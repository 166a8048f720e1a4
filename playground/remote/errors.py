"""The error a remote run raises when the server cannot be used; its message says what happened and what to do."""

from __future__ import annotations

from playground.errors import UserError


class RemoteError(UserError, RuntimeError):
    """A server could not be reached or misbehaved (refused, 401/404/5xx, stalled, malformed stream, no logprobs).

    The message never holds the API key: only the name of the environment variable it was read from.
    """
