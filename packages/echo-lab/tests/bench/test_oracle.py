"""Selection quality on hand-made pools (echo_lab.bench.oracle), every number by hand."""

from __future__ import annotations

import pytest
import torch

from echo_core.tree import ROOT, make_tree
from echo_lab.bench.oracle import continuations, step_oracle
from echo_lab.sim.rows import NO_TOKEN


def _i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_docstring_example_selection_misses_one() -> None:
    # request 0: chain 5 -> 6 -> 9 (target 5, 6, 7); request 1: chain 1 -> 2 -> 3 (all match)
    pool = make_tree(
        [
            [(5, ROOT, -0.1), (6, 0, -0.1), (9, 1, -0.1)],
            [(1, ROOT, -0.1), (2, 0, -0.1), (3, 1, -0.1)],
        ]
    )
    target = _i64([5, 6, 7, 1, 2, 3]).view(2, 3)
    keep = torch.tensor([True, True, True, False, False, False])
    hind = step_oracle(pool, keep, target, max_nodes=_i64([5, 1]))
    assert hind.reachable.tolist() == [2, 3]
    assert hind.best == 3  # min(N = 3, min(2, 5) + min(3, 1))
    assert hind.realised.tolist() == [2, 0]  # selection 2/3


def test_best_is_bounded_by_the_rows_paid_for_not_the_budget() -> None:
    # one request, chain 1 -> 2 -> 3 all on the continuation; only the first node verified.
    # The old oracle_ratio took best = min(K, 3) = 3 and scored 1/3; at its own spend the
    # selection was perfect: best = min(1, 3) = 1.
    pool = make_tree([[(1, ROOT, -0.1), (2, 0, -0.1), (3, 1, -0.1)]])
    target = _i64([1, 2, 3]).view(1, 3)
    hind = step_oracle(pool, torch.tensor([True, False, False]), target, _i64([8]))
    assert hind.best == 1
    assert hind.realised.tolist() == [1]


def test_rows_on_a_wrong_branch_lower_the_selection() -> None:
    # root children 4 (wrong) and 5 (right); 5's child 6 right; 4's child 6 is off-path.
    # Verifying 4 and its child (2 rows) realises 0 where 5 -> 6 would have realised 2.
    pool = make_tree([[(4, ROOT, -0.5), (5, ROOT, -1.0), (6, 0, -0.1), (6, 1, -0.2)]])
    target = _i64([5, 6]).view(1, 2)
    keep = torch.tensor([True, False, True, False])
    hind = step_oracle(pool, keep, target, max_nodes=_i64([8]))
    assert hind.hit.tolist() == [False, True, False, True]
    assert hind.reachable.tolist() == [2]
    assert hind.best == 2  # min(2 rows, 2 reachable)
    assert hind.realised.tolist() == [0]


def test_no_match_gives_zero_best() -> None:
    pool = make_tree([[(7, ROOT, -0.1)], [(8, ROOT, -0.1)]])
    target = _i64([1, 2]).view(2, 1)
    hind = step_oracle(pool, torch.tensor([True, True]), target, _i64([3, 3]))
    assert hind.best == 0
    assert hind.realised.tolist() == [0, 0]


def test_empty_pool_is_plain_decoding() -> None:
    pool = make_tree([[], []])
    target = _i64([1, 2]).view(2, 1)
    hind = step_oracle(pool, torch.zeros(0, dtype=torch.bool), target, _i64([3, 3]))
    assert hind.best == 0
    assert hind.reachable.tolist() == [0, 0]


def test_caps_bound_the_best_per_request() -> None:
    pool = make_tree([[(1, ROOT, -0.1), (2, 0, -0.1), (3, 1, -0.1)]])
    target = _i64([1, 2, 3]).view(1, 3)
    hind = step_oracle(pool, torch.ones(3, dtype=torch.bool), target, _i64([1]))
    assert hind.best == 1  # min(3 rows, min(3, cap 1))


def test_continuations_pad_past_the_end_of_the_output() -> None:
    seqs = [[10, 11, 12, 13], [20, 21]]
    out = continuations(seqs, roots=[1, 1], depth=3)
    assert out.tolist() == [[12, 13, NO_TOKEN], [NO_TOKEN] * 3]


def test_continuations_reject_a_root_outside_the_sequence() -> None:
    with pytest.raises(ValueError, match="root index 5"):
        continuations([[1, 2]], roots=[5], depth=2)


def test_mismatched_shapes_raise() -> None:
    pool = make_tree([[(1, ROOT, -0.1)]])
    with pytest.raises(ValueError, match="do not fit"):
        step_oracle(pool, torch.ones(2, dtype=torch.bool), _i64([1]).view(1, 1), _i64([1]))
