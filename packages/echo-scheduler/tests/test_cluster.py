"""Water-filling split of a global budget, against brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_scheduler.cluster import water_fill
from echo_scheduler.errors import SchedulerError

FAST = settings(max_examples=60, deadline=None)

curve = st.lists(st.floats(-0.5, 1.0), min_size=0, max_size=4).map(
    lambda xs: torch.tensor(sorted(xs, reverse=True), dtype=torch.float64)
)


def _value(curves: list[torch.Tensor], budgets: tuple[int, ...]) -> float:
    return sum(float(u[: min(b, u.numel())].sum()) for u, b in zip(curves, budgets, strict=True))


@FAST
@given(curves=st.lists(curve, min_size=1, max_size=3), data=st.data())
def test_water_filling_matches_brute_force(curves: list[torch.Tensor], data: st.DataObject) -> None:
    n = len(curves)
    floors = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    caps = [f + data.draw(st.integers(0, 4)) for f in floors]
    budget = sum(floors) + data.draw(st.integers(0, 6))
    split = water_fill(curves, budget, torch.tensor(floors), torch.tensor(caps))
    got = tuple(split.budgets.tolist())
    assert sum(got) <= budget
    assert all(f <= b <= c for f, b, c in zip(floors, got, caps, strict=True))
    best = max(
        _value(curves, combo)
        for combo in itertools.product(
            *(range(f, c + 1) for f, c in zip(floors, caps, strict=True))
        )
        if sum(combo) <= budget
    )
    assert _value(curves, got) == pytest.approx(best, abs=1e-9)
    assert split.utility == pytest.approx(best, abs=1e-9)


def test_documented_example() -> None:
    curves = [torch.tensor([0.9, 0.5]), torch.tensor([0.8, 0.7, 0.1]), torch.tensor([])]
    split = water_fill(curves, 3, caps=torch.tensor([3, 3, 3]))
    assert split.budgets.tolist() == [1, 2, 0]
    assert split.level == pytest.approx(0.7)


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(SchedulerError, match="non-increasing"):
        water_fill([torch.tensor([0.1, 0.5])], 2)
    with pytest.raises(SchedulerError, match="floors sum"):
        water_fill([torch.tensor([0.5])], 1, floors=torch.tensor([2]), caps=torch.tensor([3]))
    with pytest.raises(SchedulerError, match="floor <= cap"):
        water_fill([torch.tensor([0.5])], 5, floors=torch.tensor([2]), caps=torch.tensor([1]))
