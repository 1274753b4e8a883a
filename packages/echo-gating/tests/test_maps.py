"""Acceptance maps: PAV worked example, monotonicity (hypothesis), calibration vs the truth."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.errors import CalibrationError, GatingError
from echo_gating.maps import AcceptanceMaps, DepthMap, fit_acceptance_maps, fit_depth_map
from echo_gating.testing import SyntheticSpec, synthetic_records

SETTINGS = settings(derandomize=True, deadline=None, max_examples=50)


def test_worked_example_from_docstring() -> None:
    m = fit_depth_map(
        torch.tensor([-3.0, -2.0, -1.0, -0.5]), torch.tensor([False, True, False, True]), 4
    )
    assert m == DepthMap(edges=(-2.0, -0.5), values=(0.0, 0.5, 1.0), counts=(1, 2, 1))
    assert (m(-2.5), m(-1.5), m(0.0)) == (0.0, 0.5, 1.0)
    maps = AcceptanceMaps((m,))
    got = maps.expected_accept(torch.tensor([1, 1, 1]), torch.tensor([-2.5, -1.5, 0.0]))
    assert got.tolist() == [0.0, 0.5, 1.0]


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 300),
    bins=st.integers(1, 40),
    ties=st.booleans(),
)
def test_fitted_maps_are_monotone_in_path_score(seed: int, n: int, bins: int, ties: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    depth = torch.randint(1, 4, (n,), generator=g)
    score = -3 * torch.rand(n, generator=g)
    if ties:
        score = (score * 2).round() / 2
    accepted = torch.rand(n, generator=g) < torch.exp(score)
    maps = fit_acceptance_maps(depth, score, accepted, max_bins=bins, min_samples=1)
    grid = torch.linspace(-4, 0.5, 101)
    for d in range(1, 6):  # depths 4 and 5 are beyond the calibrated range
        values = maps.expected_accept(torch.full((101,), d), grid)
        assert bool((values[1:] >= values[:-1]).all())
        assert bool(((values >= 0) & (values <= 1)).all())


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 200))
def test_map_preserves_the_total_acceptance(seed: int, n: int) -> None:
    # Isotonic regression keeps the weighted mean: the map does not invent or lose accepts.
    g = torch.Generator().manual_seed(seed)
    score = -torch.rand(n, generator=g)
    accepted = torch.rand(n, generator=g) < 0.4
    m = fit_depth_map(score, accepted, max_bins=16)
    total = sum(v * c for v, c in zip(m.values, m.counts, strict=True))
    assert total == pytest.approx(float(accepted.sum()))


def test_map_is_calibrated_against_the_true_acceptance_probability() -> None:
    spec = SyntheticSpec(
        separation=(1.0, 0.8, 0.4), continue_prob=(0.8, 0.8, 0.8), width=1, sigma_accepted=1.2
    )
    records = synthetic_records(spec, torch.Generator().manual_seed(3), 20000, 1)
    maps = fit_acceptance_maps(records.depth, records.path_logprob, records.accepted)
    for d in (1, 2, 3):
        mask = records.depth == d
        est = maps.expected_accept(records.depth[mask], records.path_logprob[mask]).double()
        truth = spec.true_accept_probability(d, records.path_logprob[mask].exp())
        assert float((est - truth).abs().mean()) < 0.03, d


def test_deeper_and_shallower_depths_use_the_nearest_map() -> None:
    low = DepthMap((), (0.2,), (5,))
    high = DepthMap((), (0.7,), (5,))
    maps = AcceptanceMaps((low, high))
    got = maps.expected_accept(torch.tensor([0, 1, 2, 9]), torch.tensor([-1.0, -1.0, -1.0, -1.0]))
    torch.testing.assert_close(got, torch.tensor([0.2, 0.2, 0.7, 0.7]))


def test_sparse_depths_borrow_the_shallower_map() -> None:
    depth = torch.tensor([1] * 30 + [2] * 3 + [3] * 30)
    score = torch.linspace(-2, 0, 63)
    accepted = torch.arange(63) % 2 == 0
    maps = fit_acceptance_maps(depth, score, accepted, min_samples=10)
    assert maps.maps[1] == maps.maps[0]
    with pytest.raises(GatingError, match="no depth"):
        fit_acceptance_maps(depth, score, accepted, min_samples=100)


def test_minus_infinity_scores_map_to_the_lowest_value() -> None:
    m = fit_depth_map(torch.tensor([-math.inf, -1.0, -0.1]), torch.tensor([False, False, True]))
    maps = AcceptanceMaps((m,))
    assert maps.expected_accept(torch.tensor([1]), torch.tensor([-math.inf])).item() == 0.0


def test_dict_round_trip_and_invalid_maps() -> None:
    maps = AcceptanceMaps((DepthMap((-1.0,), (0.1, 0.6), (3, 4)), DepthMap((), (0.3,), (2,))))
    assert AcceptanceMaps.from_dict(maps.to_dict()) == maps
    with pytest.raises(CalibrationError, match="non-decreasing"):
        DepthMap((-1.0,), (0.6, 0.1), (3, 4))
    with pytest.raises(CalibrationError, match="increasing"):
        DepthMap((-1.0, -2.0), (0.1, 0.2, 0.3), (1, 1, 1))
    with pytest.raises(CalibrationError, match="counts must be >= 0"):
        DepthMap((), (0.1,), (-1,))
    with pytest.raises(CalibrationError, match="K-1 edges"):
        DepthMap((), (0.1, 0.2), (1, 1))
    with pytest.raises(CalibrationError, match="non-decreasing"):
        DepthMap((), (math.nan,), (1,))
    bad = maps.to_dict()
    bad["depths"][1]["depth"] = 5
    with pytest.raises(CalibrationError, match="must have depth 2"):
        AcceptanceMaps.from_dict(bad)
    with pytest.raises(CalibrationError, match="at least one depth"):
        AcceptanceMaps(())


def test_expected_accept_checks_shapes() -> None:
    maps = AcceptanceMaps((DepthMap((), (0.5,), (1,)),))
    with pytest.raises(GatingError, match="int64"):
        maps.expected_accept(torch.tensor([1.0]), torch.tensor([0.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_lookup_equals_the_scalar_map(seed: int) -> None:
    """The flattened ``searchsorted`` counts ``e_j <= s`` exactly as ``DepthMap.__call__`` does
    (edges float32-exact, as the lookup compares in float32),
    at the edges themselves, at -0.0 / +0.0 around a zero edge, at +-inf and past the depths."""
    g = torch.Generator().manual_seed(seed)
    maps = AcceptanceMaps(
        (
            DepthMap((), (0.5,), (3,)),  # one step, no edges
            DepthMap((-2.0, 0.0, 1.5), (0.1, 0.2, 0.6, 0.9), (1, 1, 1, 1)),
            DepthMap((-7.25, -3.0, -(2.0**-100)), (0.0, 0.3, 0.4, 0.8), (1, 1, 1, 1)),
        )
    )
    edges = torch.tensor([e for m in maps.maps for e in m.edges])
    n = 4000
    depth = torch.randint(-1, 6, (n,), generator=g)
    score = -10 * torch.rand(n, generator=g) + 2
    on_edge = torch.rand(n, generator=g) < 0.3
    score[on_edge] = edges[torch.randint(0, edges.numel(), (n,), generator=g)][on_edge]
    special = torch.tensor([-0.0, 0.0, -math.inf, math.inf, -(2.0**-100), 2.0**-149, -(2.0**-149)])
    score[: special.numel()] = special
    got = maps.expected_accept(depth, score)
    clamp = depth.clamp(1, maps.max_depth)
    want = [maps.maps[int(d) - 1](float(s)) for d, s in zip(clamp, score, strict=True)]
    assert torch.equal(got, torch.tensor(want, dtype=torch.float32))
    for d in range(-1, 6):  # one depth for every element, any shape: the same values
        at = maps.expected_accept_at(d, score.view(40, 100))
        assert at.shape == (40, 100)
        assert torch.equal(at.reshape(-1), maps.expected_accept(torch.full((n,), d), score))
