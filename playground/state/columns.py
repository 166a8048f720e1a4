"""A float matrix that grows by one column at a time: the per-token maps the folds keep (the lens's layers ×
tokens, the steering projections' blocks × tokens), appended in amortised constant time."""

from __future__ import annotations

import numpy as np

FIRST_CAPACITY = 64  # columns reserved before the first token; doubled when full


class GrowingColumns:
    """A float matrix of ``rows`` that grows by one column at a time (amortised: capacity doubles)."""

    def __init__(self, rows: int, fill: float = np.nan) -> None:
        self.fill = fill
        self.data = np.full((rows, FIRST_CAPACITY), fill)
        self.size = 0

    def append(self, column: list[float]) -> None:
        if self.size == self.data.shape[1]:
            grown = np.full((self.data.shape[0], 2 * self.size), self.fill)
            grown[:, : self.size] = self.data
            self.data = grown
        self.data[:, self.size] = column
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        """The filled columns (a view: copy it to keep it past the next append)."""
        return self.data[:, : self.size]
