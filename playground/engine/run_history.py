"""The token sequences (prompt + output) of this session's earlier runs, per model: what the suffix drafter
learns from. Kept in memory only, for as long as the model is loaded (a weak reference to it)."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from torch import nn

KEEP_RUNS = 32  # the latest runs kept per model
KEEP_TOKENS = 16_384  # ... and at most this many tokens of them

_RUNS: WeakKeyDictionary[nn.Module, list[list[int]]] = WeakKeyDictionary()


def remember(model: nn.Module, ids: list[int]) -> None:
    runs = _RUNS.setdefault(model, [])
    runs.append(list(ids))
    while len(runs) > KEEP_RUNS or (len(runs) > 1 and sum(map(len, runs)) > KEEP_TOKENS):
        runs.pop(0)


def earlier_runs(model: nn.Module) -> list[list[int]]:
    """The runs remembered for ``model``, oldest first (copies' owner: do not change them)."""
    return list(_RUNS.get(model, []))


def forget(model: nn.Module) -> None:
    _RUNS.pop(model, None)
