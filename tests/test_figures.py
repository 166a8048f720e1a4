"""The output figures (``playground.events.figures``) against counts made by hand and by ``collections.Counter``:
repetition, diversity, the first divergence and agreement with a reference."""

from __future__ import annotations

from collections import Counter

import pytest

from playground.events.figures import (
    agreement_figures,
    distinct_n,
    first_divergence,
    ngrams,
    output_figures,
    repeated_ngrams,
)

LOOP = [1, 2, 3, 1, 2, 3, 1]  # a loop of length 3, seven tokens


def counted(ids: list[int], n: int) -> Counter:
    """Every n-gram of ``ids`` with how often it occurs (an independent count)."""
    return Counter(tuple(ids[i:i + n]) for i in range(max(0, len(ids) - n + 1)))


def test_ngrams_of_a_loop():
    assert ngrams(LOOP, 3) == [(1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 2, 3), (2, 3, 1)]
    assert ngrams(LOOP, 7) == [tuple(LOOP)] and ngrams(LOOP, 8) == []


@pytest.mark.parametrize("ids", [LOOP, [5, 5, 5, 5], [1, 2, 3, 4, 5], [9], []])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_distinct_and_repeated_equal_an_independent_count(ids, n):
    grams = counted(ids, n)
    total = sum(grams.values())
    assert distinct_n(ids, n) == (len(grams) / total if total else 0.0)
    assert repeated_ngrams(ids, n) == total - len(grams)


def test_distinct_and_repeated_by_hand():
    assert distinct_n(LOOP, 1) == pytest.approx(3 / 7)
    assert distinct_n(LOOP, 2) == pytest.approx(3 / 6)
    assert repeated_ngrams(LOOP) == 2  # (1, 2, 3) and (2, 3, 1) come back once each: the default n is 3
    assert repeated_ngrams([1, 2, 3, 4]) == 0 and distinct_n([4, 4], 1) == 0.5 and distinct_n([4], 2) == 0.0


@pytest.mark.parametrize(("ids", "reference", "expected"), [
    ([1, 2, 3], [1, 2, 3], -1),
    ([1, 2, 3], [1, 9, 3], 1),
    ([7, 2, 3], [1, 2, 3], 0),
    ([1, 2], [1, 2, 3], 2),  # ending early counts as diverging where it ended
    ([1, 2, 3, 4], [1, 2, 3], 3),
    ([], [], -1),
    ([], [5], 0),
])
def test_first_divergence(ids, reference, expected):
    assert first_divergence(ids, reference) == expected


def test_agreement_over_the_positions_both_have():
    # 4 shared positions, 3 agree, the first difference at 2; the reference's longer tail does not count
    figures = agreement_figures([1, 2, 9, 4], [1, 2, 3, 4, 5, 6])
    assert figures == {"first_divergence": 2.0, "identical_fraction": 0.75}
    assert agreement_figures([1, 2, 3], [1, 2, 3, 4]) == {"first_divergence": -1.0, "identical_fraction": 1.0}
    assert agreement_figures([8, 8], [1, 2]) == {"first_divergence": 0.0, "identical_fraction": 0.0}
    assert agreement_figures([], [1, 2]) == {"first_divergence": -1.0, "identical_fraction": 0.0}
    assert all(type(v) is float for v in agreement_figures([1, 2, 9, 4], [1, 2, 3, 4]).values())


def test_output_figures_name_each_figure():
    figures = output_figures(LOOP, [1, 2, 3, 1, 5], decode_ms=12.5)
    assert figures == {"tokens": 7.0, "repeated_3grams": 2.0, "distinct_1": pytest.approx(3 / 7),
                       "distinct_2": 0.5, "first_divergence": 4.0, "decode_ms": 12.5}
    assert all(type(v) is float for v in figures.values())
