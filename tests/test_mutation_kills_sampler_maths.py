"""sampler_maths' DRY match lengths and Adaptive-P's state updates where `make mutate` found no test looking (issue
28, point 4), against values worked out by hand here (llama.cpp's and text-generation-webui's definitions)."""

from __future__ import annotations

import pytest

from playground.sampler_maths import adaptive_accept, adaptive_start, adaptive_target, dry_match_lengths


def test_dry_walks_every_earlier_occurrence_without_a_position_index():
    # "5 1 2 1": the ending "1" was followed by 2 before (a repeat of length 1; "5" before it is no match)
    assert dry_match_lengths([5, 1, 2, 1], frozenset()) == {2: 1}
    # "7 3 4 8 3 4 9 3 4": "3 4" followed 8 and 9 before; 9's repeat is "3 4" (2), 8's too
    assert dry_match_lengths([7, 3, 4, 8, 3, 4, 9, 3, 4], frozenset()) == {8: 2, 9: 2}


def test_dry_finds_nothing_in_an_empty_text_or_after_a_breaker():
    assert dry_match_lengths([], frozenset()) == {}
    assert dry_match_lengths([1, 2, 9, 1, 2, 9], frozenset({9})) == {}
    assert dry_match_lengths([1, 2, 9, 1, 2, 9], frozenset()) == {1: 3}


def test_adaptive_p_state_updates_clamp_decay_and_target():
    # decay is clamped to [0, 0.99] by the maths itself, whoever calls it
    assert adaptive_start(0.5, 0.995) == pytest.approx((0.5 / 0.01, 1 / 0.01))
    assert adaptive_accept(2.0, 4.0, 0.3, 1.5) == pytest.approx((0.3 + 0.99 * 2.0, 1 + 0.99 * 4.0))
    # the adapted target: clamp(2·clamp(target) − ws/tw, 0, 1); no weight yet: the target itself
    assert adaptive_target(0.3, 0.0, 0.0) == pytest.approx(0.3)
    assert adaptive_target(0.3, 0.5, 1.0) == pytest.approx(0.1)
    assert adaptive_target(1.5, 1.2, 1.0) == pytest.approx(0.8)  # the target clamped to 1 first: 2 − 1.2
    assert adaptive_target(0.9, 0.1, 1.0) == 1.0  # 1.7 clamped


def test_dry_skips_an_occurrence_followed_by_a_breaker_and_goes_on_to_the_next():
    # "1 9 1 2 1": the first 1 was followed by the breaker 9 (never penalised), the second by 2
    assert dry_match_lengths([1, 9, 1, 2, 1], frozenset({9})) == {2: 1}


def test_dry_stops_a_match_at_the_start_of_the_text_and_at_its_cap():
    # "1 2 1 2": the earlier "1 2" is the whole text before it: a repeat of 2, not one wrapped around the start
    assert dry_match_lengths([1, 2, 1, 2], frozenset()) == {1: 2}
    # a 60-token passage repeated: the repeat is counted as 50 long (text-generation-webui's cap)
    assert dry_match_lengths(list(range(60)) * 2, frozenset()) == {0: 50}
