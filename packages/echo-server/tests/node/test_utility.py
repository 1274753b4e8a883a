"""The node's marginal-utility curve from its warm-up records."""

from __future__ import annotations

import pytest
import torch

from echo_gating.records import RecordSet
from echo_server.node.utility import PRIOR_ACCEPTANCE, marginal_utility, rank_acceptance


def _records(steps: list[list[tuple[float, bool]]]) -> RecordSet:
    """One request-step per inner list of (path log-prob, accepted) nodes."""
    rows = [(s, lp, acc) for s, nodes in enumerate(steps) for lp, acc in nodes]
    n = len(rows)
    return RecordSet(
        request_id=torch.zeros(n, dtype=torch.int64),
        step=torch.tensor([r[0] for r in rows], dtype=torch.int64),
        depth=torch.ones(n, dtype=torch.int64),
        path_logprob=torch.tensor([r[1] for r in rows], dtype=torch.float32),
        draft_logprob=torch.tensor([r[1] for r in rows], dtype=torch.float32),
        layer_confidence=torch.full((n,), 0.5),
        accepted=torch.tensor([r[2] for r in rows], dtype=torch.bool),
    )


def test_rank_acceptance_ranks_each_request_step_by_path_score() -> None:
    records = _records(
        [
            [(-2.0, False), (-0.1, True)],  # best node accepted, second not
            [(-0.5, True), (-0.7, True), (-3.0, False)],
        ]
    )

    assert rank_acceptance(records).tolist() == [1.0, 0.5, 0.0]


def test_marginal_utility_worked_example_interleaves_the_batch() -> None:
    rates = torch.tensor([0.8, 0.4], dtype=torch.float64)

    assert marginal_utility(rates, running=2, waiting=0, k_max=6, budget_step=2) == pytest.approx(
        [0.8, 0.4, 0.4]
    )
    assert marginal_utility(rates, running=1, waiting=0, k_max=3) == pytest.approx([0.8, 0.4, 0.4])


def test_marginal_utility_is_non_increasing_even_if_the_rates_are_not() -> None:
    curve = marginal_utility(torch.tensor([0.3, 0.6, 0.1]), running=1, waiting=0, k_max=3)

    assert curve == pytest.approx([0.3, 0.3, 0.1])


def test_idle_nodes_report_no_utility_and_busy_new_nodes_the_prior() -> None:
    assert marginal_utility(torch.tensor([0.9]), running=0, waiting=0, k_max=8) == []
    assert marginal_utility(None, running=1, waiting=0, k_max=3) == [PRIOR_ACCEPTANCE] * 3
    with pytest.raises(ValueError, match="budget_step"):
        marginal_utility(None, running=1, waiting=0, k_max=3, budget_step=0)
