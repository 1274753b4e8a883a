"""The synthetic workload: shape of its confidence clusters and fitting to measured profiles."""

from __future__ import annotations

import pytest
import torch

from echo_gating.policy import DepthStats
from echo_gating.separation import auc, auc_standard_error
from echo_scheduler.errors import TraceError
from echo_scheduler.workloads import UNCOVERED, SyntheticWorkload


def test_shallow_confidence_separates_hits_from_misses_and_merges_deeper() -> None:
    w = SyntheticWorkload.qwen()
    steps = w.sample(512, 1, torch.Generator().manual_seed(0))
    top = steps[0].onpath_top
    hit = steps[0].target_rank == 0
    gap = top[hit].new_tensor(
        [float(top[:, d][hit[:, d]].mean() - top[:, d][~hit[:, d]].mean()) for d in range(w.depth)]
    )
    assert float(gap[0]) > 0.5  # clusters near 0.9 and 0.1 at depth 1
    assert float(gap[-1]) < 0.1  # uninformative where separation is 0


def test_coverage_follows_continue_probabilities() -> None:
    w = SyntheticWorkload(heterogeneity=0.0)
    rank = w.sample(4000, 1, torch.Generator().manual_seed(1))[0].target_rank
    covered = (rank < UNCOVERED).float().mean(0)
    expected = torch.tensor(w.continue_prob)
    assert torch.allclose(covered, expected, atol=0.03)


def test_from_reference_inverts_the_documented_formulas() -> None:
    ref = {1: DepthStats(100, 90, 0.98), 2: DepthStats(100, 72, 0.9), 3: DepthStats(100, 36, None)}
    w = SyntheticWorkload.from_reference(ref)
    assert w.continue_prob == pytest.approx((0.9, 0.8, 0.5))
    assert w.separation[0] > w.separation[1] > w.separation[2] == 0.0
    with pytest.raises(TraceError, match=r"depths 1\.\.D"):
        SyntheticWorkload.from_reference({2: DepthStats(10, 5, 0.7)})


@pytest.mark.parametrize("target", [0.75, 0.85, 0.95])
def test_separation_for_auc_gives_that_auc_between_hits_and_misses(target: float) -> None:
    w = SyntheticWorkload(noise=1.5)
    sep = SyntheticWorkload.separation_for_auc(torch.full((w.depth,), target), w.noise)
    w = SyntheticWorkload(separation=tuple(sep.tolist()), noise=w.noise)
    step = w.sample(4000, 1, torch.Generator().manual_seed(2))[0]
    hit = step.target_rank[:, 0] == 0
    got = auc(step.onpath_top[:, 0], hit)
    se = auc_standard_error(got, int(hit.sum()), int((~hit).sum()))
    assert abs(got - target) < 4 * se  # the two-normals formula, within sampling error
