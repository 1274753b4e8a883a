"""Step metrics: the worked example of the module docstring, empty cases, accumulation."""

from __future__ import annotations

import pytest
import torch

from echo_core.acceptance import greedy_accept
from echo_core.errors import AcceptanceError
from echo_core.stats import StatsAccumulator, StepStats
from echo_core.tree import ROOT, TreeBatch, empty_tree, make_tree


def worked_example() -> tuple[TreeBatch, StepStats]:
    # Request 0: chain of 3, accepts 2. Request 1: two root children, accepts none.
    # Request 2: no draft nodes.
    tree = make_tree(
        [
            [(1, ROOT, -0.1), (2, 0, -0.1), (3, 1, -0.1)],
            [(4, ROOT, -0.1), (5, ROOT, -0.1)],
            [],
        ]
    )
    argmax = torch.tensor([1, 2, 9, 9, 0, 0, 0, 7])
    return tree, StepStats.from_result(tree, greedy_accept(tree, argmax))


def test_worked_example_numbers() -> None:
    _, stats = worked_example()
    assert stats.verified.tolist() == [3, 2, 0]
    assert stats.accepted.tolist() == [2, 0, 0]
    assert stats.bonus.tolist() == [1, 1, 1]
    assert stats.accepted_per_depth.tolist() == [1, 1, 0]
    assert stats.verified_per_depth.tolist() == [3, 1, 1]
    assert stats.total_verified == 5
    assert stats.total_accepted == 2
    assert stats.total_emitted == 5
    assert stats.draft_yield == pytest.approx(0.4)
    assert stats.mean_accepted_length == pytest.approx(5 / 3)


def test_nothing_verified_has_zero_yield() -> None:
    tree = empty_tree(2)
    stats = StepStats.from_result(tree, greedy_accept(tree, torch.tensor([3, 4])))
    assert stats.draft_yield == 0.0
    assert stats.mean_accepted_length == 1.0
    assert stats.accepted_per_depth.shape == (0,)
    assert stats.verified_per_depth.shape == (0,)


def test_empty_batch_has_zero_ratios() -> None:
    tree = empty_tree(0)
    stats = StepStats.from_result(tree, greedy_accept(tree, torch.zeros(0, dtype=torch.int64)))
    assert stats.batch_size == 0
    assert stats.mean_accepted_length == 0.0


def test_result_of_another_batch_raises() -> None:
    tree, _ = worked_example()
    other = empty_tree(2)
    with pytest.raises(AcceptanceError, match="result has 2 requests, tree has 3"):
        StepStats.from_result(tree, greedy_accept(other, torch.zeros(2, dtype=torch.int64)))


def test_accumulator_sums_steps_of_different_depths() -> None:
    _, first = worked_example()
    shallow = make_tree([[(1, ROOT, -0.1)]])
    second = StepStats.from_result(shallow, greedy_accept(shallow, torch.tensor([1, 0])))
    acc = StatsAccumulator()
    assert acc.draft_yield == 0.0
    assert acc.mean_accepted_length == 0.0
    acc.add(first)
    acc.add(second)
    assert (acc.steps, acc.request_steps, acc.verified, acc.accepted, acc.bonus) == (2, 4, 6, 3, 4)
    assert acc.draft_yield == pytest.approx(3 / 6)
    assert acc.mean_accepted_length == pytest.approx(7 / 4)
    assert acc.accepted_per_depth.tolist() == [2, 1, 0]
    assert acc.verified_per_depth.tolist() == [4, 1, 1]
    acc.reset()
    assert (acc.steps, acc.verified, acc.accepted_per_depth.tolist()) == (0, 0, [])
