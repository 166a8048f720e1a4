"""Figures measured on one output's token ids, for comparing panes and runs: repetition, diversity, agreement.

The engine reports them in its final events (``PaneFinished.figures``, ``RunFinished.figures``) and the Qt-free
state applies the same rules to what it recorded; the one figure that needs the model (the log-likelihood) is the
engine's (``playground.engine.compare.likelihood``).
"""

from __future__ import annotations

from collections.abc import Sequence


def ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(ids: Sequence[int], n: int) -> float:
    """Unique n-grams / all n-grams of the output (1.0 when it never repeats one; 0.0 for an output too short)."""
    grams = ngrams(ids, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def repeated_ngrams(ids: Sequence[int], n: int = 3) -> int:
    """How many n-grams of the output repeat an earlier one (a loop of length L repeats about L of them)."""
    grams = ngrams(ids, n)
    return len(grams) - len(set(grams))


def first_divergence(ids: Sequence[int], reference: Sequence[int]) -> int:
    """The first position where ``ids`` differs from ``reference`` (one ending early counts); -1 if identical."""
    for i, (a, b) in enumerate(zip(ids, reference, strict=False)):
        if a != b:
            return i
    return -1 if len(ids) == len(reference) else min(len(ids), len(reference))


def agreement_figures(output: Sequence[int], reference: Sequence[int]) -> dict[str, float]:
    """``output`` against ``reference`` over the positions both have: where they first differ (−1: nowhere) and
    the share of positions that agree (the figures every "compared with the full model" run reports)."""
    n = min(len(output), len(reference))
    same = sum(a == b for a, b in zip(output[:n], reference[:n], strict=True))
    return {"first_divergence": float(first_divergence(output[:n], reference[:n])),
            "identical_fraction": same / n if n else 0.0}


def output_figures(ids: Sequence[int], reference_ids: Sequence[int], decode_ms: float) -> dict[str, float]:
    return {"tokens": float(len(ids)), "repeated_3grams": float(repeated_ngrams(ids, 3)),
            "distinct_1": distinct_n(ids, 1), "distinct_2": distinct_n(ids, 2),
            "first_divergence": float(first_divergence(ids, reference_ids)), "decode_ms": decode_ms}
