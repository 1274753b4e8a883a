"""Water-filling split of a global budget, against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_controller.water_fill import water_fill

FAST = settings(max_examples=60, deadline=None)

curve = st.lists(st.floats(-0.5, 1.0), min_size=0, max_size=4).map(
    lambda xs: sorted(xs, reverse=True)
)


def _value(curves: list[list[float]], budgets: tuple[int, ...]) -> float:
    return sum(sum(u[: min(b, len(u))]) for u, b in zip(curves, budgets, strict=True))


@FAST
@given(curves=st.lists(curve, min_size=1, max_size=3), data=st.data())
def test_water_filling_matches_brute_force(curves: list[list[float]], data: st.DataObject) -> None:
    n = len(curves)
    floors = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    caps = [f + data.draw(st.integers(0, 4)) for f in floors]
    budget = sum(floors) + data.draw(st.integers(0, 6))
    split = water_fill(curves, budget, floors, caps)
    got = split.budgets
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
    split = water_fill([[0.9, 0.5], [0.8, 0.7, 0.1], []], 3, caps=[3, 3, 3])
    assert split.budgets == (1, 2, 0)
    assert split.level == pytest.approx(0.7)
    assert split.utility == pytest.approx(2.4)


def test_ties_go_to_the_lower_node_index() -> None:
    assert water_fill([[0.5, 0.5], [0.5, 0.5]], 3).budgets == (2, 1)


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-increasing"):
        water_fill([[0.1, 0.5]], 2)
    with pytest.raises(ValueError, match="finite"):
        water_fill([[float("nan")]], 2)
    with pytest.raises(ValueError, match="floors sum"):
        water_fill([[0.5]], 1, floors=[2], caps=[3])
    with pytest.raises(ValueError, match="floor <= cap"):
        water_fill([[0.5]], 5, floors=[2], caps=[1])
    with pytest.raises(ValueError, match="one entry per node"):
        water_fill([[0.5], [0.4]], 5, caps=[1])
    with pytest.raises(ValueError, match=">= 0"):
        water_fill([[0.5]], -1)
