"""Per-request fairness metrics by hand (bench/fairness.py)."""

from __future__ import annotations

import pytest

from echo_lab.bench.fairness import RequestTimes, request_speedups


def test_tpot_is_time_per_token_after_the_first() -> None:
    times = RequestTimes()
    times.emitted("a", 1, 10.0)  # first token
    times.emitted("a", 3, 10.6)
    times.emitted("a", 0, 11.0)  # nothing streamed: no sample
    times.emitted("a", 1, 11.0)
    times.emitted("solo", 1, 10.0)  # one token: no tpot
    assert times.tpot() == pytest.approx({"a": 1.0 / 4})


def test_speedups_follow_the_docstring_example() -> None:
    plain = {"a": 0.10, "b": 0.10, "only-plain": 0.2}
    policy = {"a": 0.05, "b": 0.125}
    assert request_speedups(plain, policy) == pytest.approx([0.8, 2.0])


def test_passed_over_runs_count_only_drafted_steps() -> None:
    times = RequestTimes()
    times.verified(["a", "b"], [2, 0])  # b passed over: 1
    times.verified(["a", "b"], [0, 0])  # nobody drafted: neutral
    times.verified(["a", "b"], [3, 0])  # b: 2
    times.verified(["a", "b"], [0, 1])  # a: 1, b's run ends
    times.verified(["b"], [0])  # alone and undrafted: neutral
    assert times.longest == {"a": 1, "b": 2}
    assert times.longest_passed_over() == 2
    assert RequestTimes().longest_passed_over() == 0
