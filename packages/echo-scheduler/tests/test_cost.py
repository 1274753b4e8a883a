"""Verify-cost model fit, roofline, K_max and the goodput-optimal budget."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_scheduler.cost import (
    Hardware,
    ModelGeometry,
    VerifyCostModel,
    choose_budget,
    gain_curve,
)
from echo_scheduler.errors import CostModelError

FAST = settings(max_examples=30, deadline=None)


@FAST
@given(
    base=st.floats(0.001, 0.1),
    mem=st.floats(0.0, 1e-5),
    cmp=st.floats(1e-5, 1e-3),
    knee=st.sampled_from([16, 64, 128, 256]),
)
def test_fit_recovers_a_hinge_from_exact_points(
    base: float, mem: float, cmp: float, knee: int
) -> None:
    truth = VerifyCostModel(base, mem, cmp, float(knee))
    t = [1, 8, 16, 32, 64, 128, 256, 512, 1024]
    model = VerifyCostModel.fit(t, truth.latency(torch.tensor(t, dtype=torch.float64)).tolist())
    assert model.knee_tokens == knee
    got = model.latency(torch.tensor(t, dtype=torch.float64))
    assert torch.allclose(got, truth.latency(torch.tensor(t, dtype=torch.float64)), rtol=1e-6)


def test_cpu_profile_knee_and_k_max() -> None:
    model = VerifyCostModel.smollm2_cpu()
    assert model.knee_tokens == 64
    assert model.k_max(4) == 60
    assert model.k_max(100) == 0


def test_roofline_matches_the_documented_example() -> None:
    model = VerifyCostModel.roofline(Hardware.h200(), ModelGeometry.llama31_8b(), 256, 2048)
    assert model.base_s == pytest.approx(0.0221, rel=1e-2)
    assert model.knee_tokens == pytest.approx(818, rel=1e-2)
    assert model.k_max(256) == 562


def test_speculation_is_switched_off_when_it_does_not_pay() -> None:
    compute_bound = VerifyCostModel(0.01, 0.0, 1e-3, 0.0)  # every token costs 1 ms
    weak = gain_curve(torch.full((50,), 0.2))  # 0.2 tokens per verified token
    choice = choose_budget(compute_bound, 64, weak, draft_s=0.001)
    assert choice.budget == 0
    assert choice.goodput == choice.plain_goodput


def test_goodput_budget_stops_at_the_knee_and_respects_the_lease() -> None:
    model = VerifyCostModel(0.01, 0.0, 1e-3, 100.0)
    strong = gain_curve(torch.full((200,), 0.6))
    free = choose_budget(model, 36, strong, draft_s=0.0005)
    assert free.budget == 64  # flat until T = 100 tokens, then 0.6 tokens cost 1 ms each
    assert free.goodput > free.plain_goodput
    assert choose_budget(model, 36, strong, draft_s=0.0005, lease=10).budget == 10
    # a short lease does not pay for a slow drafter: plain decoding, not a cliff below it
    assert choose_budget(model, 36, strong, draft_s=0.002, lease=10).budget == 0


def test_gain_curve_sorts_utilities_and_starts_at_zero() -> None:
    assert gain_curve(torch.tensor([0.1, 0.9, 0.5])).tolist() == pytest.approx([0, 0.9, 1.4, 1.5])


def test_bad_measurements_are_rejected() -> None:
    with pytest.raises(CostModelError, match="3"):
        VerifyCostModel.fit([1, 2], [0.1, 0.2])
    with pytest.raises(CostModelError, match="distinct"):
        VerifyCostModel.fit([1, 1, 2], [0.1, 0.1, 0.2])
    with pytest.raises(CostModelError, match="non-decreasing"):
        choose_budget(VerifyCostModel.smollm2_cpu(), 1, torch.tensor([0.0, 1.0, 0.5]), 0.0)
