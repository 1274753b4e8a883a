"""The budget chain (echo_scheduler.budget): K -> lease -> cap -> floor -> cut, in one place."""

from __future__ import annotations

import pytest
import torch

from echo_scheduler.budget import BudgetChain, LocalBudget, cut
from echo_scheduler.cost import VerifyCostModel, k_max_at
from echo_scheduler.cut import exact_cut
from echo_scheduler.elastic import ElasticFloor, step_batch
from echo_scheduler.errors import CostModelError

HINGE = VerifyCostModel(0.02, 0.0, 0.001, 40.5)


def test_local_budget_fixed_knee_and_clamp() -> None:
    assert LocalBudget(fixed=7).budget(100) == 7
    assert LocalBudget(cost=HINGE).budget(8) == HINGE.k_max(8) == 32
    assert LocalBudget(cost=HINGE, max_budget=10).budget(8) == 10
    assert LocalBudget(cost=HINGE, min_budget=4).budget(60) == 4
    assert LocalBudget(knee_tokens=96, max_budget=None).budget(32) == 64 == k_max_at(96, 32)
    assert LocalBudget().budget(3) is None
    with pytest.raises(ValueError, match="at most one"):
        LocalBudget(fixed=1, cost=HINGE)
    with pytest.raises(ValueError, match="must be >= 0"):
        LocalBudget(fixed=-1)


def test_lease_and_cap_only_lower_k() -> None:
    chain = BudgetChain(LocalBudget(fixed=16))
    assert chain.k(4) == 16
    chain.set_lease(5)
    assert chain.k(4) == 5
    assert chain.local_k(4) == 16
    chain.set_lease(64)
    assert chain.k(4) == 16
    assert chain.k(4, cap=3) == 3
    chain.set_lease(None)
    assert chain.k(4) == 16
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="budget override"):
            chain.set_lease(bad)  # type: ignore[arg-type]


def test_no_local_limit_needs_a_cap() -> None:
    chain = BudgetChain(LocalBudget(max_budget=None))
    assert chain.k(4, cap=32) == 32
    with pytest.raises(CostModelError):
        chain.k(4)
    with pytest.raises(CostModelError):
        chain.local_k(4)


def test_step_adds_the_floor_prices_of_step_batch() -> None:
    caps = torch.full((4,), 8)
    plain = BudgetChain(LocalBudget(fixed=16)).step(caps)
    assert plain == step_batch(None, 16, caps)
    floor = ElasticFloor(HINGE)
    floor.observe(4, 8, 10, 0.03, 0.01, 0.005, 2)
    chain = BudgetChain(LocalBudget(fixed=16), ElasticFloor(HINGE))
    chain.observe(4, 8, 10, {"verify": 0.03, "draft": 0.005, "accept": 0.005}, 2)
    got, want = chain.step(caps), step_batch(floor, 16, caps)
    assert got.budget == want.budget == 16
    assert got.min_utility == pytest.approx(want.min_utility)
    assert got.row_price is not None


def test_cut_is_the_exact_cut_at_the_step_row_price() -> None:
    key = torch.tensor([0.9, 0.5, 0.05])
    keep = torch.ones(3, dtype=torch.bool)
    caps = torch.full((2,), 3)
    assert torch.equal(cut(key, keep, step_batch(None, 3, caps)), keep)
    floor = ElasticFloor(HINGE)
    floor.observe(2, 2, 3, 0.03, 0.01, 0.005, 2)
    step = BudgetChain(LocalBudget(fixed=3), floor).step(caps)
    assert step.row_price is not None
    assert torch.equal(cut(key, keep, step), exact_cut(key, keep, 2, step.row_price))
