"""Threshold rules: brute force, observed range, known optimum, and utility vs Youden's J.

The comparison that decided the default (``utility``) lives here: on the known synthetic model
the utility rule's true expected gain is never below Youden's and is far above it when the prior
is skewed; on the mechanistic draft/target simulation ("real-ish", answer known only
empirically) it wins on held-out data at every depth and alignment tried.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.errors import GatingError
from echo_gating.records import gate_samples
from echo_gating.testing import SyntheticSpec, simulated_chain_samples, synthetic_records
from echo_gating.thresholds import (
    best_upper_threshold,
    choose_threshold,
    utility_threshold,
    youden_threshold,
)

SETTINGS = settings(derandomize=True, deadline=None, max_examples=60)

confidences = st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=40).map(
    lambda xs: (torch.tensor([c / 20 for c, _ in xs]), torch.tensor([y for _, y in xs]))
)


def brute_best(scores: list[float], weights: list[float]) -> float:
    best_tau, best_gain = max(scores), float("-inf")
    for tau in sorted(set(scores), reverse=True):
        gain = sum(w for s, w in zip(scores, weights, strict=True) if s >= tau)
        if gain > best_gain + 1e-12:
            best_tau, best_gain = tau, gain
    return best_tau if best_gain >= 0 else max(scores)


def test_worked_example_from_docstring() -> None:
    c = torch.tensor([0.9, 0.8, 0.3, 0.2])
    y = torch.tensor([True, True, False, True])
    assert utility_threshold(c, y, 0.5) == pytest.approx(0.8)
    assert youden_threshold(c, y) == pytest.approx(0.8)


@SETTINGS
@given(data=confidences, r=st.floats(0.05, 0.95))
def test_utility_threshold_matches_brute_force_and_stays_in_range(
    data: tuple[torch.Tensor, torch.Tensor], r: float
) -> None:
    c, y = data
    tau = utility_threshold(c, y, r)
    weights = [(1.0 if a else 0.0) - r for a in y.tolist()]
    assert tau == pytest.approx(brute_best(c.tolist(), weights))
    assert float(c.min()) <= tau <= float(c.max())
    if 0 < int(y.sum()) < y.numel():
        assert float(c.min()) <= youden_threshold(c, y) <= float(c.max())


def test_all_losing_gate_keeps_only_the_top() -> None:
    c = torch.tensor([0.1, 0.2, 0.3])
    assert best_upper_threshold(c, torch.full((3,), -1.0)) == pytest.approx(0.3)


def test_bad_arguments() -> None:
    with pytest.raises(GatingError, match="cost_ratio"):
        utility_threshold(torch.rand(3), torch.ones(3, dtype=torch.bool), 1.0)
    with pytest.raises(GatingError, match="both classes"):
        youden_threshold(torch.rand(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(GatingError, match="unknown threshold rule"):
        choose_threshold(torch.rand(3), torch.ones(3, dtype=torch.bool), "best", 0.5)  # type: ignore[arg-type]  # deliberately invalid
    with pytest.raises(GatingError, match="non-empty"):
        best_upper_threshold(torch.zeros(0), torch.zeros(0))
    # Youden without a negative class falls back to the utility rule instead of failing.
    assert choose_threshold(
        torch.tensor([0.4, 0.6]), torch.ones(2, dtype=torch.bool), "youden", 0.5
    ) == pytest.approx(0.4)


SPECS = {
    "balanced": SyntheticSpec(separation=(0.6,), continue_prob=(0.5,)),
    "skewed prior": SyntheticSpec(separation=(0.6,), continue_prob=(0.9,)),
    "rare accept": SyntheticSpec(separation=(0.6,), continue_prob=(0.2,)),
    "unequal spread": SyntheticSpec(
        separation=(0.6,), continue_prob=(0.4,), sigma_accepted=0.8, sigma_rejected=2.0
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("cost_ratio", [0.3, 0.5, 0.7])
def test_utility_rule_recovers_the_known_optimum_and_beats_youden(
    name: str, cost_ratio: float
) -> None:
    spec = SPECS[name]
    samples = gate_samples(synthetic_records(spec, torch.Generator().manual_seed(7), 20000, 1))
    tau_u = utility_threshold(samples.confidence, samples.accepted, cost_ratio)
    tau_j = youden_threshold(samples.confidence, samples.accepted)
    optimum = spec.optimal_threshold(1, cost_ratio)
    gain = spec.expected_utility(1, torch.tensor([tau_u, tau_j, optimum]), cost_ratio).tolist()
    assert tau_u == pytest.approx(optimum, abs=0.05)
    assert gain[0] >= gain[2] - 0.002  # near-zero regret against the analytic optimum
    assert gain[0] >= gain[1] - 0.002  # never meaningfully worse than Youden's J
    if name in ("skewed prior", "rare accept"):
        assert gain[0] > gain[1] + 0.005


@pytest.mark.parametrize("alignment", [0.6, 0.8, 0.9])
def test_utility_rule_beats_youden_held_out_on_simulated_pairs(alignment: float) -> None:
    g = torch.Generator().manual_seed(1)
    train = simulated_chain_samples(g, 8000, 3, alignment=alignment)
    test = simulated_chain_samples(g, 8000, 3, alignment=alignment)
    cost_ratio = 0.5
    for d in (1, 2, 3):
        m, mt = train.depth == d, test.depth == d
        c, y = train.confidence[m], train.accepted[m]

        def held_out(tau: float, mt: torch.Tensor = mt) -> float:
            keep = test.confidence[mt] >= tau
            return float(((test.accepted[mt].double() - cost_ratio) * keep).mean())

        u = held_out(utility_threshold(c, y, cost_ratio))
        j = held_out(youden_threshold(c, y))
        assert u >= j - 0.002, (d, u, j)
