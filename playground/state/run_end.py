"""How a view's fold knows its run has ended: the stop reason from ``RunFinished``, or the status the window gives a
run that ended without one (it failed, or was stopped before its final event)."""

from __future__ import annotations


class RunEnd:
    """Mixin for the folds: set ``stop_reason`` from ``RunFinished``; ``end(status)`` for the other endings."""

    stop_reason: str | None = None
    ended_status: str | None = None

    def end(self, status: str) -> None:
        """A run that ended without RunFinished (failed, stopped); a no-op after one."""
        if self.stop_reason is None:
            self.ended_status = status

    @property
    def ended(self) -> bool:
        """RunFinished came, or the run was marked as ended without one."""
        return self.stop_reason is not None or self.ended_status is not None
