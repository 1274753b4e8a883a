"""Exact AUC vs a brute-force pair count (with ties), overlap and its edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.errors import GatingError
from echo_gating.separation import auc, auc_standard_error, overlap

SETTINGS = settings(derandomize=True, deadline=None, max_examples=60)


def brute_auc(scores: list[float], labels: list[bool]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_worked_example_with_a_tie() -> None:
    scores = torch.tensor([0.9, 0.5, 0.5, 0.1])
    accepted = torch.tensor([True, True, False, False])
    assert auc(scores, accepted) == 0.875


@SETTINGS
@given(
    data=st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=60).filter(
        lambda xs: any(y for _, y in xs) and not all(y for _, y in xs)
    )
)
def test_auc_equals_brute_force_pair_count_with_ties(data: list[tuple[int, bool]]) -> None:
    scores = [float(s) / 5 for s, _ in data]  # few distinct values: many ties
    labels = [y for _, y in data]
    got = auc(torch.tensor(scores), torch.tensor(labels))
    assert got == pytest.approx(brute_auc(scores, labels), abs=1e-12)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 200))
def test_auc_is_invariant_to_order_and_complements(seed: int, n: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, generator=g)
    labels = torch.rand(n, generator=g) < 0.5
    if labels.all() or not labels.any():
        labels[0] = ~labels[0]
    perm = torch.randperm(n, generator=g)
    assert auc(scores[perm], labels[perm]) == pytest.approx(auc(scores, labels), abs=1e-12)
    assert auc(-scores, labels) == pytest.approx(1 - auc(scores, labels), abs=1e-12)


def test_auc_undefined_with_one_class() -> None:
    assert math.isnan(auc(torch.rand(4), torch.ones(4, dtype=torch.bool)))
    assert math.isnan(overlap(torch.rand(4), torch.zeros(4, dtype=torch.bool)))
    assert auc_standard_error(math.nan, 3, 4) == math.inf


def test_auc_rejects_nan_and_bad_shapes() -> None:
    with pytest.raises(GatingError, match="NaN at index 1"):
        auc(torch.tensor([0.1, math.nan]), torch.tensor([True, False]))
    with pytest.raises(GatingError, match="bool"):
        auc(torch.rand(3), torch.ones(3))


def test_overlap_disjoint_identical_and_constant() -> None:
    scores = torch.tensor([0.05, 0.1, 0.9, 0.95])
    labels = torch.tensor([False, False, True, True])
    assert overlap(scores, labels, value_range=(0.0, 1.0)) == 0.0
    same = torch.tensor([0.2, 0.7, 0.2, 0.7])
    assert overlap(same, labels, value_range=(0.0, 1.0)) == pytest.approx(1.0)
    assert overlap(torch.full((4,), 0.3), labels) == 1.0


def test_standard_error_shrinks_with_samples() -> None:
    small = auc_standard_error(0.9, 20, 20)
    large = auc_standard_error(0.9, 2000, 2000)
    assert 0 < large < small < 0.1
