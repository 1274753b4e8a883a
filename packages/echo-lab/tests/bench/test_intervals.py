"""Paired, interleaved speed ratios: hand-computed cases."""

from __future__ import annotations

import pytest

from echo_lab.bench.intervals import cpu_name, paired_ratio, rotated, round_ratio


def test_round_ratios_and_their_median() -> None:
    ref = [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    cand = [[1.0, 1.0], [1.0, 2.0], [2.0, 2.0]]
    r = paired_ratio(ref, cand)
    assert r.rounds == pytest.approx((2.0, 2.0, 2.0))
    assert r.ratio == pytest.approx(2.0)
    assert r.spread == pytest.approx((2.0, 2.0))
    # items summed over rounds: ref (9, 9), cand (4, 5); resampled ratios lie in [9/5, 9/4]
    lo, hi = r.ci95
    assert 9 / 5 <= lo <= hi <= 9 / 4


def test_identical_arms_give_one_with_no_width() -> None:
    t = [[0.5, 0.7, 0.9]] * 3
    r = paired_ratio(t, t)
    assert r.ratio == pytest.approx(1.0)
    assert r.ci95 == pytest.approx((1.0, 1.0))


def test_the_interval_is_reproducible_and_bad_tables_are_refused() -> None:
    ref, cand = [[1.0, 2.0, 3.0]], [[1.5, 1.0, 2.0]]
    assert paired_ratio(ref, cand) == paired_ratio(ref, cand)
    with pytest.raises(ValueError, match="equal"):
        paired_ratio([[1.0]], [[1.0, 2.0]])
    with pytest.raises(ValueError, match="> 0"):
        paired_ratio([[0.0]], [[1.0]])


def test_rotation_changes_who_goes_first() -> None:
    assert rotated(["plain", "echo"], 0) == ["plain", "echo"]
    assert rotated(["plain", "echo"], 1) == ["echo", "plain"]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert cpu_name()


def test_round_ratio_median_and_log_t_interval() -> None:
    import math

    r = round_ratio([1.0, 1.1, 1.21])
    assert r.ratio == pytest.approx(1.1)
    logs = [0.0, math.log(1.1), math.log(1.21)]  # mean log 1.1, sd log(1.1)
    half = 4.303 * math.log(1.1) / math.sqrt(3)
    assert r.ci95 == pytest.approx((1.1 * math.exp(-half), 1.1 * math.exp(half)))
    assert sum(logs) / 3 == pytest.approx(math.log(1.1))
    assert round_ratio([1.3]).ci95 == (1.3, 1.3)
    with pytest.raises(ValueError, match="> 0"):
        round_ratio([])
