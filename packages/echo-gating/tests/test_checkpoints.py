"""Checkpoint selection: worked example, spacing, explicit k, order invariance."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.checkpoints import DepthSeparation, select_checkpoints
from echo_gating.errors import CalibrationError

SETTINGS = settings(derandomize=True, deadline=None, max_examples=50)


def stats_with_aucs(aucs: dict[int, float], n: int = 100000) -> list[DepthSeparation]:
    return [DepthSeparation(d, 2 * n, n, a, 0.5) for d, a in aucs.items()]


def test_worked_example_from_docstring() -> None:
    stats = stats_with_aucs({1: 0.97, 2: 0.95, 3: 0.90, 4: 0.70, 5: 0.55})
    assert select_checkpoints(stats) == (1, 2, 3)
    assert select_checkpoints(stats, min_gap=2) == (1, 3)
    assert select_checkpoints(stats, num_checkpoints=1) == (1,)
    assert select_checkpoints(stats, num_checkpoints=4) == (1, 2, 3, 4)
    assert select_checkpoints(stats, min_depth=3) == (3,)
    assert select_checkpoints(stats, max_checkpoints=2) == (1, 2)


def test_overlapping_and_undersampled_depths_are_never_chosen_by_default() -> None:
    stats = [
        DepthSeparation(1, 30, 25, 0.99, 0.1),  # only 5 rejected: below min_class_count
        DepthSeparation(2, 1000, 500, 0.52, 0.9),
        DepthSeparation(3, 1000, 1000, math.nan, math.nan),
    ]
    assert select_checkpoints(stats) == ()
    assert select_checkpoints(stats, num_checkpoints=2) == (2,)


def test_the_lower_bound_prefers_the_well_measured_depth() -> None:
    noisy = DepthSeparation(1, 44, 22, 0.93, 0.3)
    solid = DepthSeparation(2, 20000, 10000, 0.91, 0.3)
    assert noisy.auc_lower_bound() < solid.auc_lower_bound()
    assert select_checkpoints([noisy, solid], num_checkpoints=1) == (2,)


@SETTINGS
@given(
    aucs=st.lists(st.floats(0.4, 1.0), min_size=1, max_size=10),
    rng=st.randoms(use_true_random=False),
)
def test_selection_is_invariant_to_input_order(aucs: list[float], rng: random.Random) -> None:
    stats = stats_with_aucs(dict(enumerate(aucs, start=1)), n=500)
    shuffled = list(stats)
    rng.shuffle(shuffled)
    assert select_checkpoints(shuffled) == select_checkpoints(stats)


def test_invalid_parameters() -> None:
    with pytest.raises(CalibrationError, match="num_checkpoints"):
        select_checkpoints([], num_checkpoints=-1)
    with pytest.raises(CalibrationError, match="min_gap"):
        select_checkpoints([], min_gap=0)
