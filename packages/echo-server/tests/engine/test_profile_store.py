"""Checked verify profiles on an injected clock (engine/profile_store.py) and the engine's live
correction of the floor and K from them (engine/cost_feedback.py). Nothing here is timed: the
timer is a function of the row count and the call number."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from structlog.testing import capture_logs

from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.live_cost import MIN_SAMPLES
from echo_server.engine.budget import LocalBudget, StepBudget
from echo_server.engine.cost_feedback import CostFeedback, samples_of
from echo_server.engine.profile_store import (
    FORMAT,
    CheckedProfile,
    ProfileSource,
    Timer,
    load_or_measure_checked,
    measure_checked,
    save,
)
from echo_server.engine.report import StepReport

TOKENS = (1, 2, 3, 4, 6, 7, 8, 12, 16)
IDENTITY = {"cpu": "Test CPU", "torch": "2.x", "threads": "1", "model": "m", "device": "cpu"}


def curve_ms(t: int) -> float:
    """A quiet machine's cost: flat for 1-6 rows, a step at 7, then 1 ms per row."""
    return 30.0 + 0.3 * min(t, 6) + (6.0 if t >= 7 else 0.0) + max(t - 8, 0) * 1.0


class FakeClock:
    """Seconds of a verify pass over T rows: ``curve_ms(T)`` times ``noise(call number)``."""

    def __init__(self, noise: Callable[[int], float] = lambda n: 1.0) -> None:
        self.noise, self.calls = noise, 0

    def __call__(self, t: int) -> float:
        self.calls += 1
        return curve_ms(t) / 1e3 * self.noise(self.calls)


def jitter(n: int) -> float:
    """Rounds disagreeing by +-40%: the machine busy with other work."""
    return (1.4, 0.6, 1.0)[n % 3]


def never(_: int) -> float:
    raise AssertionError("measured although the cached profile should have been used")


def no_timer() -> Timer:
    return never


def measure(
    path: Path | None, clock: FakeClock, identity: dict[str, str] = IDENTITY
) -> CheckedProfile:
    return load_or_measure_checked(path, identity, lambda: clock, TOKENS, rounds=5)


def test_a_quiet_measurement_is_fresh_and_cached_with_its_raw_rounds(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    checked = measure(path, FakeClock())
    assert checked.source is ProfileSource.FRESH
    assert checked.attempts == 1
    assert checked.profile.latency_at(7) == pytest.approx(curve_ms(7) / 1e3)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT
    assert data["machine"] == IDENTITY
    assert len(data["rounds"]) == len(TOKENS)
    assert all(len(r) == 5 for r in data["rounds"])


def test_a_noisy_measurement_is_rejected_and_measured_again() -> None:
    calls = {"n": 0}

    def first_attempt_noisy(n: int) -> float:
        calls["n"] = n
        return jitter(n) if n <= len(TOKENS) * 6 + 10 else 1.0  # noisy through attempt 1

    with capture_logs() as logs:
        checked = measure_checked(FakeClock(first_attempt_noisy), TOKENS, rounds=5)
    assert checked.source is ProfileSource.FRESH
    assert checked.attempts == 2
    rejected = [e for e in logs if e["event"] == "verify_profile_rejected"]
    assert len(rejected) == 1
    assert "rounds disagree" in rejected[0]["reasons"][0]


def test_a_cached_good_profile_is_kept_without_measuring(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    measure(path, FakeClock())
    checked = load_or_measure_checked(path, IDENTITY, no_timer, TOKENS)
    assert checked.source is ProfileSource.CACHED
    assert checked.attempts == 0
    assert checked.profile.latency_at(12) == pytest.approx(curve_ms(12) / 1e3)


def plant(path: Path, ms: dict[int, float], identity: dict[str, str] = IDENTITY) -> None:
    """A cache file of ``ms`` whose rounds agree exactly and whose reference did not drift."""
    tokens = sorted(ms)
    data = {
        "format": FORMAT,
        "machine": identity,
        "tokens": tokens,
        "seconds": [ms[t] / 1e3 for t in tokens],
        "rounds": [[ms[t] / 1e3] * 5 for t in tokens],
        "reference_s": [ms[tokens[0]] / 1e3] * 2,
    }
    path.write_text(json.dumps(data))


def test_the_profile_cached_under_load_is_rejected_on_load_and_measured_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.json"
    # the AMD EPYC VM's profile of 2026-12-05, taken while other work ran
    plant(path, {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2})
    clock = FakeClock()
    with capture_logs() as logs:
        checked = measure(path, clock)
    assert clock.calls > 0
    assert checked.source is ProfileSource.FRESH
    (rejected,) = [e for e in logs if e["event"] == "verify_profile_cache_rejected"]
    assert rejected["reason"] == "check"
    assert "not monotone" in rejected["failed"][0]
    assert json.loads(path.read_text())["tokens"] == list(TOKENS)  # replaced by the new one


@pytest.mark.parametrize("stale", ["machine", "format"])
def test_another_machine_or_format_is_measured_again(tmp_path: Path, stale: str) -> None:
    path = tmp_path / "k.json"
    if stale == "machine":
        plant(path, {t: curve_ms(t) for t in TOKENS}, {**IDENTITY, "torch": "2.y"})
    else:  # the medians-only file written before 2026-12-05
        path.write_text(json.dumps({"tokens": list(TOKENS), "seconds": [0.03] * len(TOKENS)}))
    clock = FakeClock()
    with capture_logs() as logs:
        checked = measure(path, clock)
    assert checked.source is ProfileSource.FRESH
    assert clock.calls > 0
    assert [e["reason"] for e in logs if e["event"] == "verify_profile_cache_rejected"] == [stale]


def test_a_profile_that_never_settles_is_used_but_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    with capture_logs() as logs:
        checked = measure(path, FakeClock(jitter))
    assert checked.source is ProfileSource.UNSETTLED
    assert checked.attempts == 3
    assert not path.exists()
    (event,) = [e for e in logs if e["event"] == "verify_profile_unsettled"]
    assert event["cached"] is False
    assert event["reasons"]
    ys = checked.profile.seconds  # the monotone envelope of every attempt's rounds pooled
    assert all(b >= a for a, b in itertools.pairwise(ys))
    assert len(checked.rounds.rounds[0]) == 15
    with pytest.raises(ValueError, match="only a fresh"):
        save(path, IDENTITY, checked)


def bad_profile() -> ProfileCost:
    ms = {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2, 16: 60.0, 32: 90.0}
    return ProfileCost(tuple(map(float, ms)), tuple(v / 1e3 for v in ms.values()))


def test_the_floor_and_k_follow_the_live_curve_once_enough_samples_exist() -> None:
    profile = bad_profile()
    floor = ElasticFloor(profile)
    hinge = VerifyCostModel.fit(list(profile.tokens), list(profile.seconds))
    budget = StepBudget(LocalBudget(cost=hinge))
    ceiling = 12
    checked = cast(CheckedProfile, SimpleNamespace(profile=profile, source=ProfileSource.CACHED))
    feedback = CostFeedback(checked, floor, budget, ceiling)
    before_k, before_u = budget.k(1), floor.floor(1).min_utility
    rows = (1, 2, 3, 4, 6, 7, 8, 16, 32)
    for _step in range(MIN_SAMPLES - 1):
        for t in rows:
            assert feedback.take([(t, curve_ms(t) / 1e3)]) is None  # not yet ready
            assert floor.cost is profile
    assert budget.k(1) == before_k
    swapped = [feedback.take([(t, curve_ms(t) / 1e3)]) for t in rows]
    assert any(c is not None for c in swapped)
    assert floor.cost is feedback.live.curve
    assert floor.cost.latency_at(2) == pytest.approx(curve_ms(2) / 1e3)
    assert floor.floor(1).min_utility < before_u
    assert budget.local.cost is not hinge  # refitted to the corrected curve
    assert budget.k(1) <= ceiling  # never past the KV slack admission reserved
    assert feedback.snapshot.source == "cached"
    assert feedback.snapshot.swaps >= 1
    live = {b.rows: b.live_s for b in feedback.snapshot.buckets}
    assert live[7] == pytest.approx(curve_ms(7) / 1e3)


def test_samples_come_from_timed_passes_only() -> None:
    def verified(b: int, n: int, forward: float | None) -> object:
        tree = SimpleNamespace(num_nodes=n)
        return SimpleNamespace(request_ids=("r",) * b, tree=tree, forward_s=forward)

    report = cast(StepReport, SimpleNamespace(passes=(verified(2, 5, 0.03), verified(1, 0, None))))
    assert samples_of(report) == [(7, 0.03)]
