"""The elastic cost floor: piecewise-linear verify profiles and the per-step floor."""

from __future__ import annotations

import math

import pytest
import torch

from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.elastic import ElasticFloor, step_batch
from echo_scheduler.errors import CostModelError, PolicyError
from echo_scheduler.interface import StepBatch


def test_profile_interpolates_and_extends_the_last_slope() -> None:
    cost = ProfileCost((1.0, 4.0, 8.0), (0.020, 0.026, 0.030))
    assert cost.latency_at(0.0) == 0.020  # flat below the first point
    assert cost.latency_at(1.0) == pytest.approx(0.020)
    assert cost.latency_at(2.5) == pytest.approx(0.023)
    assert cost.latency_at(8.0) == pytest.approx(0.030)
    assert cost.latency_at(12.0) == pytest.approx(0.034)  # 1 ms per row, as 4 -> 8


def test_profile_tensor_latency_equals_the_scalar_one_exactly() -> None:
    # Below the first point, on every point, between points, past the last, and a falling
    # segment that the clamp at 0 s cuts: the vector path must give the very same floats.
    cost = ProfileCost((1.0, 4.0, 8.0, 9.0), (0.020, 0.0263, 0.0301, 0.001))
    rows = torch.tensor([0.0, 0.5, 1.0, 2.5, 3.0, 4.0, 5.5, 8.0, 8.7, 9.0, 9.5, 40.0])
    got = cost.latency(rows)
    assert got.dtype == torch.float64
    assert got.tolist() == [cost.latency_at(t) for t in rows.tolist()]
    grid = torch.arange(12).view(3, 4)  # integer rows, any shape
    assert cost.latency(grid).shape == (3, 4)
    assert cost.latency(grid).flatten().tolist() == [cost.latency_at(float(t)) for t in range(12)]


@pytest.mark.parametrize(
    ("tokens", "seconds"),
    [((1.0,), (0.1,)), ((1.0, 1.0), (0.1, 0.2)), ((2.0, 1.0), (0.1, 0.2)), ((1.0, 2.0), (0.1,))],
)
def test_profile_rejects_bad_points(tokens: tuple[float, ...], seconds: tuple[float, ...]) -> None:
    with pytest.raises(CostModelError):
        ProfileCost(tokens, seconds)


def test_floor_is_throughput_times_the_mean_cost_of_the_draft_rows() -> None:
    # t(T) = 20 ms + 2 ms per row; batch 4 that verified 2 draft rows per request and emitted
    # 1.5 tokens per request, with 10 ms of other work per step.
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    floor = ElasticFloor(cost)
    floor.observe(4, verified=8, emitted=6, verify_s=0.044, other_s=0.010, draft_s=0.006, depths=3)
    got = floor.floor(4)
    t = 0.020 + 0.002 * 12  # T = B (1 + v) = 12 rows, as predicted, so the scale stays 1
    rate = 4 * 1.5 / (t + 0.010)
    assert got.throughput == pytest.approx(rate)
    assert got.min_utility == pytest.approx(rate * 0.002)
    assert got.depth_price == pytest.approx(rate * 0.002)  # 6 ms over 3 depths


def test_floor_follows_a_slower_machine_through_the_verify_scale() -> None:
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    floor = ElasticFloor(cost, alpha=1.0)
    before = floor.floor(2).min_utility
    floor.observe(
        2,
        verified=0,
        emitted=2,
        verify_s=2 * cost.latency_at(2),
        other_s=0.0,
        draft_s=0.0,
        depths=0,
    )
    after = floor.floor(2)
    # twice the latency: half the throughput, twice the marginal cost -> the same floor
    assert after.min_utility == pytest.approx(before)
    assert after.throughput == pytest.approx(2 / (2 * cost.latency_at(2)))


def test_a_concave_profile_charges_the_first_rows_their_real_cost() -> None:
    # 1 row 20 ms, 2 rows 30 ms, then 1 ms per row: the slope at T would say 1 ms
    cost = ProfileCost((1.0, 2.0, 16.0), (0.020, 0.030, 0.044))
    floor = ElasticFloor(cost)
    floor.observe(1, verified=1, emitted=2, verify_s=0.030, other_s=0.0, draft_s=0.0, depths=1)
    got = floor.floor(1)
    assert got.min_utility == pytest.approx(got.throughput * 0.010)


def test_past_the_knee_a_row_costs_the_compute_slope_not_the_secant() -> None:
    # hinge: 10 ms flat up to T0 = 40 rows, then 1 ms per row; B = 16 verified 2 rows each
    # (T = 48, past the knee): the secant from T = 16 is 8 ms / 32 rows = 0.25 ms, the next
    # rows cost 1 ms each.
    cost = VerifyCostModel(0.010, 0.0, 0.001, 40.0)
    floor = ElasticFloor(cost)
    floor.observe(16, verified=32, emitted=24, verify_s=0.018, other_s=0.0, draft_s=0.0, depths=2)
    got = floor.floor(16)
    assert got.min_utility == pytest.approx(got.throughput * 0.001)
    below = ElasticFloor(cost)  # well below the knee both prices are ~0: rows are nearly free
    below.observe(16, verified=8, emitted=20, verify_s=0.010, other_s=0.0, draft_s=0.0, depths=1)
    assert below.floor(16).min_utility == pytest.approx(0.0, abs=1e-12)


def test_a_wider_slope_window_averages_a_staircase_step() -> None:
    # 20 ms for 1-6 rows, 27 ms for 7-12 (a CPU's staircase); B = 4 verified 0.5 draft rows
    # each (T = 6, just below the step): the one-row slope is the whole 7 ms step, the secant
    # from T = 4 is 0, and a 6-row window prices the step over its width, 7/6 ms a row.
    tokens = tuple(float(t) for t in range(1, 13))
    cost = ProfileCost(tokens, tuple(0.020 if t <= 6 else 0.027 for t in tokens))
    mins = {}
    for rows in (1.0, 6.0):
        floor = ElasticFloor(cost, slope_rows=rows)
        floor.observe(4, verified=2, emitted=5, verify_s=0.020, other_s=0.0, draft_s=0.0, depths=1)
        got = floor.floor(4)
        mins[rows] = got.min_utility / got.throughput
    assert mins[1.0] == pytest.approx(0.007)
    assert mins[6.0] == pytest.approx(0.007 / 6)
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(CostModelError, match="slope_rows"):
            ElasticFloor(cost, slope_rows=bad)


def test_drafting_splits_into_a_price_per_call_and_per_node() -> None:
    # 1 ms per drafter call + 0.5 ms per expanded node, observed over steps of varied shape
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    floor = ElasticFloor(cost)
    assert floor.draft_split() is None  # nothing observed yet
    for calls, nodes in ((1, 4), (3, 20), (2, 6), (4, 40), (1, 1)):
        draft = 0.001 * calls + 0.0005 * nodes
        floor.observe(4, 8, 6, 0.044, draft, draft, calls, expansions=nodes)
    call, node = floor.draft_split() or (0.0, 0.0)
    assert call == pytest.approx(0.001, rel=1e-6)
    assert node == pytest.approx(0.0005, rel=1e-6)
    got = floor.floor(4)
    assert got.depth_price == pytest.approx(got.throughput * 0.001, rel=1e-6)
    assert got.node_price == pytest.approx(got.throughput * 0.0005, rel=1e-6)


def test_draft_rows_are_priced_by_their_own_measured_scale() -> None:
    # request rows cost what the profile says, draft rows twice that (long contexts): the
    # verify time splits into s_req = 1 and s_row = 2, and rows are priced at s_row
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    floor = ElasticFloor(cost)
    assert floor.row_scale() == floor.verify_scale == 1.0  # nothing observed yet
    for b, n in ((4, 8), (8, 2), (2, 6), (8, 0), (6, 12)):
        t_b, t_bn = cost.latency_at(b), cost.latency_at(b + n)
        floor.observe(b, n, b + n // 2, t_b + 2.0 * (t_bn - t_b), 0.0, 0.0, 1 if n else 0)
    assert floor.row_scale() == pytest.approx(2.0, rel=1e-6)
    got = floor.floor(4)
    assert got.min_utility == pytest.approx(got.throughput * 2.0 * 0.002, rel=1e-6)
    batch = step_batch(floor, 16, torch.full((4,), 8))
    assert batch.row_price is not None
    assert batch.row_price.scale == pytest.approx(2.0, rel=1e-6)


def test_the_row_scale_falls_back_and_is_clamped() -> None:
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    plain = ElasticFloor(cost, alpha=1.0)
    plain.observe(4, 0, 4, 2 * cost.latency_at(4), 0.0, 0.0, 0)  # no draft row: no split
    assert plain.row_scale() == plain.verify_scale == pytest.approx(2.0)
    wild = ElasticFloor(cost)
    for b, n in ((4, 8), (8, 2), (2, 6)):
        t_b, t_bn = cost.latency_at(b), cost.latency_at(b + n)
        wild.observe(b, n, b, t_b - 0.9 * (t_bn - t_b), 0.0, 0.0, 1)  # rows "save" time
    assert wild.row_scale() == wild.verify_scale  # never below s


def test_a_row_floor_below_one_lets_rows_cost_less_than_the_pass() -> None:
    # request rows at 2x the profile (long contexts), draft rows at 1.2x: the default prices
    # rows at s (about 1.9 from these steps), row_floor = 0.25 at the fitted 1.2
    cost = VerifyCostModel(0.020, 0.002, 0.0, 0.0)
    floors = {f: ElasticFloor(cost, row_floor=f) for f in (1.0, 0.25)}
    for b, n in ((4, 8), (8, 2), (2, 6), (8, 0), (6, 12)):
        t_b, t_bn = cost.latency_at(b), cost.latency_at(b + n)
        for floor in floors.values():
            floor.observe(b, n, b + n // 2, 2.0 * t_b + 1.2 * (t_bn - t_b), 0.0, 0.0, 1)
    s = floors[1.0].verify_scale
    assert 1.2 < s < 2.0
    assert floors[1.0].row_scale() == s
    assert floors[0.25].row_scale() == pytest.approx(1.2, rel=1e-6)
    with pytest.raises(CostModelError, match="row_floor"):
        ElasticFloor(cost, row_floor=0.0)


def test_proportional_calls_and_nodes_cannot_be_split() -> None:
    floor = ElasticFloor(VerifyCostModel(0.020, 0.002, 0.0, 0.0))
    for calls in (1, 2, 3):
        floor.observe(4, 8, 6, 0.044, 0.003 * calls, 0.003 * calls, calls, expansions=4 * calls)
    assert floor.draft_split() is None
    assert floor.floor(4).node_price is None  # the per-depth average prices a call instead


def test_bad_feedback_is_rejected() -> None:
    floor = ElasticFloor(VerifyCostModel(0.02, 0.001, 0.0, 0.0))
    with pytest.raises(CostModelError):
        floor.observe(0, 1, 1, 0.1, 0.0, 0.0, 1)
    with pytest.raises(CostModelError):
        floor.observe(1, 1, 1, math.nan, 0.0, 0.0, 1)
    with pytest.raises(CostModelError):
        ElasticFloor(VerifyCostModel(0.02, 0.001, 0.0, 0.0), alpha=0.0)
    assert floor.floor(0).min_utility == 0.0


@pytest.mark.parametrize(("floor", "price"), [(-0.1, None), (math.inf, None), (0.1, -1.0)])
def test_step_batch_rejects_a_bad_floor(floor: float, price: float | None) -> None:
    caps = torch.ones(2, dtype=torch.int64)
    with pytest.raises(PolicyError):
        StepBatch(2, 4, caps, min_utility=floor, depth_price=price)
