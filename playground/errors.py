"""The errors whose message is meant for the user (shown as is, no traceback).

Each layer raises its own kind (a setting, a model that will not load or fetch, a saved run, a server, a
screenshot); every one of them subclasses ``UserError``, so this module, at the bottom of the layers, names none
of them and the command line and the window catch them all with ``USER_ERRORS``.
"""

from __future__ import annotations


class UserError(Exception):
    """Base of the errors whose message is for the user: it says what went wrong and what to do."""


class ScreenshotError(UserError, RuntimeError):
    """A headless screenshot could not be made (the run failed); the message says why."""


USER_ERRORS: tuple[type[BaseException], ...] = (UserError,)
