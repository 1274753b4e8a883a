"""Checked verify profiles (profile_check) and the live per-row-count correction (live_cost)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from echo_scheduler.cost import ProfileCost
from echo_scheduler.elastic import ElasticFloor, step_batch
from echo_scheduler.errors import CostModelError
from echo_scheduler.live_cost import MIN_SAMPLES, WINDOW, LiveCost
from echo_scheduler.profile_check import ProfileRounds, check_profile, envelope

# The profile cached under load on the AMD EPYC VM (2026-12-05), ms at T = 1, 2, 3, 4, 7, 8.
BAD_T = (1, 2, 3, 4, 7, 8)
BAD_MS = (33.8, 49.2, 44.4, 32.9, 56.3, 37.2)
# A cost curve of the EPYC's shape: flat for 1-6 rows, a step at 7, then about 1 ms per row.
TRUE_T = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
TRUE_MS = (30.0, 30.5, 31.0, 31.0, 31.5, 32.0, 38.0, 38.5, 43.0, 47.0)


def rounds_of(
    ms: tuple[float, ...], noise: float = 0.0, n: int = 5
) -> tuple[tuple[float, ...], ...]:
    """Every point's rounds: its value times 1 + noise, 1 - noise, 1, ... (median the value)."""
    factors = [1.0 + noise * ((-1) ** r) * (r % 3 != 2) for r in range(n)]
    return tuple(tuple(m / 1e3 * f for f in factors) for m in ms)


def test_a_quiet_profile_passes_every_check() -> None:
    check = check_profile(ProfileRounds(TRUE_T, rounds_of(TRUE_MS, 0.02), (0.030, 0.031)))
    assert check.ok, check.reasons
    assert check.badness < 1.0


def test_the_profile_cached_under_load_is_no_cost_curve() -> None:
    # Even with rounds agreeing perfectly and no drift, its envelope lifts 8 rows by 51%.
    check = check_profile(ProfileRounds(BAD_T, rounds_of(BAD_MS), (0.0338, 0.0338)))
    assert not check.ok
    assert check.lift == pytest.approx(56.3 / 37.2 - 1.0)  # 8 rows; 4 rows: 49.5%
    assert check.reasons == (f"not monotone ({check.lift:.1%} lift > 10%)",)


def test_disagreeing_rounds_and_drift_are_each_rejected() -> None:
    noisy = check_profile(ProfileRounds(TRUE_T, rounds_of(TRUE_MS, 0.3), (0.030, 0.030)))
    assert noisy.spread == pytest.approx(0.3)
    assert [r.split(" (")[0] for r in noisy.reasons] == ["rounds disagree"]
    drifted = check_profile(ProfileRounds(TRUE_T, rounds_of(TRUE_MS), (0.030, 0.036)))
    assert drifted.drift == pytest.approx(0.2)
    assert [r.split(" (")[0] for r in drifted.reasons] == ["machine drifted"]


def test_rounds_validate_and_pool() -> None:
    with pytest.raises(CostModelError, match="strictly increasing"):
        ProfileRounds((2, 1), ((0.1,), (0.1,)), (0.1, 0.1))
    with pytest.raises(CostModelError, match="finite and > 0"):
        ProfileRounds((1, 2), ((0.1,), (0.0,)), (0.1, 0.1))
    a = ProfileRounds((1, 2), ((0.1,), (0.2,)), (0.1, 0.11))
    b = ProfileRounds((1, 2), ((0.3,), (0.4,)), (0.09, 0.1))
    pooled = a.pooled(b)
    assert pooled.rounds == ((0.1, 0.3), (0.2, 0.4))
    assert pooled.reference_s == (0.09, 0.11)
    assert envelope([3.0, 1.0, 4.0, 2.0]) == [3.0, 3.0, 4.0, 4.0]


def true_seconds(rows: int) -> float:
    return ProfileCost(tuple(map(float, TRUE_T)), tuple(m / 1e3 for m in TRUE_MS)).latency_at(rows)


def bad_profile() -> ProfileCost:
    return ProfileCost(tuple(map(float, BAD_T)), tuple(m / 1e3 for m in BAD_MS))


def test_no_correction_before_a_bucket_is_ready() -> None:
    live = LiveCost(bad_profile())
    for _ in range(MIN_SAMPLES - 1):
        live.observe(2, true_seconds(2))
    assert live.estimate(2) is None
    assert not live.is_ready(2)
    assert not live.is_ready(3)
    assert live.refresh() is None
    assert live.curve is live.profile
    live.observe(2, true_seconds(2))
    assert live.is_ready(2)


def test_converges_to_the_true_curve_within_min_samples_and_ignores_outliers() -> None:
    rng = random.Random(0)
    live = LiveCost(bad_profile())
    rows = list(TRUE_T[:8])
    for step in range(MIN_SAMPLES * len(rows)):
        t = rows[step % len(rows)]
        stall = step % 7 == 3  # one step in 7 stalls: 5x the cost (contention, a page fault)
        live.observe(t, true_seconds(t) * (5.0 if stall else 1.0 + 0.01 * rng.uniform(-1, 1)))
    curve = live.refresh()
    assert curve is not None
    assert live.swaps == 1
    for t in rows:
        assert curve.latency_at(t) == pytest.approx(true_seconds(t), rel=0.02)
    assert live.refresh() is None  # confirmed: no second swap
    # Between ready buckets the profile's points are re-anchored, never left at the bad shape.
    assert all(b.curve_s is not None for b in live.buckets())


def test_a_change_of_cost_is_followed_within_half_a_window() -> None:
    live = LiveCost(ProfileCost((1.0, 8.0), (0.030, 0.040)))
    for _ in range(WINDOW):
        live.observe(4, 0.034)
    assert live.refresh() is None  # the profile's 34.3 ms is confirmed within 10%
    for _ in range(WINDOW // 2):
        live.observe(4, 0.060)
    assert live.estimate(4) == pytest.approx(0.047)  # mean of the middle two: not yet
    live.observe(4, 0.060)
    assert live.estimate(4) == pytest.approx(0.060)
    curve = live.refresh()
    assert curve is not None
    assert curve.latency_at(4) == pytest.approx(0.060)


def test_one_ready_bucket_scales_the_profile_and_the_curve_never_falls() -> None:
    live = LiveCost(bad_profile())
    for _ in range(MIN_SAMPLES):
        live.observe(1, 0.0169)  # half the profile's 33.8 ms
    curve = live.corrected()
    assert curve is not None
    assert curve.latency_at(2) == pytest.approx(0.0246)  # 49.2 ms halved
    assert curve.latency_at(4) == pytest.approx(0.0246)  # 32.9 halved, lifted by the envelope
    ys = curve.seconds
    assert all(b >= a for a, b in itertools.pairwise(ys))


def test_old_samples_expire_and_bad_samples_are_ignored() -> None:
    live = LiveCost(None, window=4, min_samples=2, max_age=8)
    live.observe(3, 0.01)
    live.observe(3, 0.01)
    live.observe(5, float("nan"))
    live.observe(5, -1.0)
    assert live.ready() == {3: 0.01}
    assert live.is_ready(3)
    assert not live.is_ready(5)
    for _ in range(8):
        live.observe(9, 0.02)
    assert not live.is_ready(3)  # expired
    assert live.ready() == {9: 0.02}
    assert live.corrected() is None  # no profile and a single ready bucket
    with pytest.raises(CostModelError):
        live.observe(0, 0.01)
    with pytest.raises(CostModelError):
        LiveCost(None, window=4, min_samples=5)


def test_the_floor_prices_rows_on_the_corrected_curve_once_ready() -> None:
    floor = ElasticFloor(bad_profile())
    for _ in range(5):
        floor.observe(1, 0, 1, 0.0338, 0.001, 0.0, 0)  # plain steps, the profile's 1-row cost
    dear = floor.floor(1).min_utility
    live = LiveCost(bad_profile())
    for t in (1, 2, 3):
        for _ in range(MIN_SAMPLES):
            live.observe(t, true_seconds(t))
    curve = live.refresh()
    assert curve is not None
    floor.recalibrate(curve)
    assert floor.verify_scale == 1.0
    assert floor.cost is curve
    cheap = floor.floor(1).min_utility
    # the first draft row cost 15.4 ms on the bad profile, 0.5 ms on the live one
    assert cheap < dear / 10
    step = step_batch(floor, 8, torch.tensor([8]))
    assert step.min_utility == pytest.approx(cheap)
    assert step.row_price is not None
    assert step.row_price.latency is curve


def test_a_bucket_the_envelope_lifts_does_not_ask_for_a_new_curve_every_step() -> None:
    live = LiveCost(ProfileCost((1.0, 8.0), (0.030, 0.040)))
    for _ in range(MIN_SAMPLES):
        live.observe(2, 0.045)  # 2 rows dearer than 4 (longer contexts at the time)
        live.observe(4, 0.036)
    curve = live.refresh()
    assert curve is not None
    assert curve.latency_at(4) == pytest.approx(0.045)  # lifted by the envelope
    for _ in range(3 * WINDOW):
        live.observe(2, 0.045)
        live.observe(4, 0.036)
        assert live.refresh() is None
    assert live.swaps == 1


def test_past_the_ready_buckets_the_profile_extra_cost_is_scaled_by_their_slope_ratio() -> None:
    # rows 25x too dear in the profile: 1 + 0.5 (T - 1) against a true 1 + 0.02 (T - 1) ms
    tokens = (1, 2, 3, 4, 8, 16)
    dear = ProfileCost(tuple(map(float, tokens)), tuple((1 + 0.5 * (t - 1)) / 1e3 for t in tokens))
    live = LiveCost(dear)
    for _ in range(MIN_SAMPLES):
        for t in (1, 2, 3, 4):
            live.observe(t, (1 + 0.02 * (t - 1)) / 1e3)
    curve = live.corrected()
    assert curve is not None
    for t in (8, 16):  # the true curve, not the dear shape scaled to row 4's level
        assert curve.latency_at(t) == pytest.approx((1 + 0.02 * (t - 1)) / 1e3)
    scaled = dear.latency_at(16) * (1.06 / 2.5)  # the dear shape at row 4's ratio (before)
    assert curve.latency_at(16) < 0.5 * scaled


def test_past_the_ready_buckets_a_flat_profile_is_extended_at_their_own_slope() -> None:
    # every pass priced as one row (planted "cheap"): no profile slope to scale
    tokens = (1, 2, 4, 8, 16, 32)
    cheap = ProfileCost(tuple(map(float, tokens)), tuple(1e-3 for _ in tokens))
    live = LiveCost(cheap)
    for _ in range(MIN_SAMPLES):
        for t in (8, 10):
            live.observe(t, (1 + 0.05 * (t - 1)) / 1e3)
    curve = live.corrected()
    assert curve is not None
    for t in (16, 32):  # the true curve's slope, 0.05 ms per row, past the measured rows
        assert curve.latency_at(t) == pytest.approx((1 + 0.05 * (t - 1)) / 1e3)
    for t in (2, 4):  # below the measured rows: the same slope down, not row 8's level
        assert curve.latency_at(t) == pytest.approx((1 + 0.05 * (t - 1)) / 1e3)
    assert curve.latency_at(1) > 0
    falling = LiveCost(cheap)  # a ready span whose medians fall gives no negative slope
    for _ in range(MIN_SAMPLES):
        falling.observe(8, 2e-3)
        falling.observe(10, 1.5e-3)
    flat = falling.corrected()
    assert flat is not None
    assert flat.latency_at(32) == pytest.approx(flat.latency_at(10))


def test_a_right_flat_profile_is_left_alone_when_its_ready_buckets_agree() -> None:
    # the EPYC's shape (TRUE_MS): flat for 1-6 rows, a step at 7; buckets 3 and 4 (where the
    # profile does not rise) measured right but for 0.2 ms of noise
    true = ProfileCost(tuple(map(float, TRUE_T)), tuple(m / 1e3 for m in TRUE_MS))
    live = LiveCost(true)
    for _ in range(MIN_SAMPLES):
        live.observe(3, 0.0310)
        live.observe(4, 0.0312)
    curve = live.corrected()
    assert curve is not None
    for t in (1, 7, 8, 16):  # the step at 7 rows is kept: lambda (0.2 ms a row) is below it
        assert curve.latency_at(t) == pytest.approx(true.latency_at(t), rel=0.02)
