"""Greedy acceptance against a brute-force enumeration of root-to-node paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.acceptance import PAD_NODE, AcceptResult, greedy_accept, result_from_leaf
from echo_core.errors import AcceptanceError
from echo_core.tree import ROOT, TreeBatch, empty_tree, make_tree

Request = list[tuple[int, int, float]]


def brute_force(requests: list[Request], argmax: list[int]) -> list[tuple[list[int], int]]:
    """Per request: (accepted request-local path, bonus), by enumerating every path."""
    out = []
    row0 = 0
    for nodes in requests:

        def row(i: int, base: int = row0) -> int:
            return base if i == ROOT else base + 1 + i

        best: list[int] = []
        for leaf in range(len(nodes)):  # node order: the first of the deepest wins on ties
            path, i = [], leaf
            while i != ROOT:
                path.append(i)
                i = nodes[i][1]
            path.reverse()
            matches = all(nodes[j][0] == argmax[row(nodes[j][1])] for j in path)
            if matches and len(path) > len(best):
                best = path
        out.append((best, argmax[row(best[-1] if best else ROOT)]))
        row0 += len(nodes) + 1
    return out


@st.composite
def trees_and_argmax(draw: st.DrawFn) -> tuple[list[Request], list[int]]:
    vocab = draw(st.integers(1, 3))  # tiny vocab: many matches, duplicate siblings
    requests: list[Request] = []
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 9))
        requests.append(
            [
                (draw(st.integers(0, vocab - 1)), draw(st.integers(ROOT, i - 1)), -0.1)
                for i in range(n)
            ]
        )
    rows = sum(len(r) + 1 for r in requests)
    argmax = draw(st.lists(st.integers(0, vocab - 1), min_size=rows, max_size=rows))
    return requests, argmax


def check_against_brute_force(requests: list[Request], argmax: list[int]) -> AcceptResult:
    tree = make_tree(requests)
    result = greedy_accept(tree, torch.tensor(argmax))
    expected = brute_force(requests, argmax)
    width = max((len(p) for p, _ in expected), default=0)
    assert result.accepted_nodes.shape == (len(requests), width)
    for b, (path, bonus) in enumerate(expected):
        assert result.accepted_nodes[b].tolist() == path + [PAD_NODE] * (width - len(path))
        assert int(result.num_accepted[b]) == len(path)
        assert int(result.bonus_token[b]) == bonus
    tokens = [
        [*(requests[b][i][0] for i in path), bonus] for b, (path, bonus) in enumerate(expected)
    ]
    assert result.emitted_tokens(tree) == tokens
    return result


@settings(max_examples=150, deadline=None)
@given(trees_and_argmax())
def test_matches_brute_force_on_random_trees(case: tuple[list[Request], list[int]]) -> None:
    check_against_brute_force(*case)


def test_worked_example_from_the_docstring() -> None:
    # root argmax 5; nodes (5, ROOT), (6, ROOT), (7, 0); argmax 7 at node 0's row, 9 at node 2's.
    tree = make_tree([[(5, ROOT, -0.1), (6, ROOT, -0.1), (7, 0, -0.1)]])
    result = greedy_accept(tree, torch.tensor([5, 7, 0, 9]))
    assert result.emitted_tokens(tree) == [[5, 7, 9]]
    assert result.accepted_nodes.tolist() == [[0, 2]]


def test_all_accepted_chain_emits_every_draft_token_and_bonus() -> None:
    chain = [(10 + i, i - 1, -0.1) for i in range(6)]
    result = check_against_brute_force([chain], [10, 11, 12, 13, 14, 15, 99])
    assert result.num_accepted.tolist() == [6]
    assert result.bonus_token.tolist() == [99]


def test_all_rejected_emits_root_argmax() -> None:
    requests = [[(1, ROOT, -0.1), (2, ROOT, -0.1), (3, 0, -0.1)]]
    result = check_against_brute_force(requests, [4, 1, 1, 1])
    assert result.num_accepted.tolist() == [0]
    assert result.accepted_nodes.shape == (1, 0)
    assert result.bonus_token.tolist() == [4]


def test_zero_node_requests_equal_plain_argmax() -> None:
    tree = empty_tree(4)
    result = greedy_accept(tree, torch.tensor([3, 1, 4, 1]))
    assert result.emitted_tokens(tree) == [[3], [1], [4], [1]]
    assert result.accepted_nodes.shape == (4, 0)


def test_mixed_batch_pads_short_paths() -> None:
    requests: list[Request] = [
        [],
        [(1, ROOT, -0.1), (2, 0, -0.1), (3, 1, -0.1)],
        [(7, ROOT, -0.1), (8, ROOT, -0.1)],
        [(5, ROOT, -0.1)],
    ]
    argmax = [9, 1, 2, 3, 4, 8, 0, 0, 6, 5]
    result = check_against_brute_force(requests, argmax)
    assert result.accepted_nodes.tolist() == [[-1, -1, -1], [0, 1, 2], [1, -1, -1], [-1, -1, -1]]
    assert result.emitted_tokens(make_tree(requests)) == [[9], [1, 2, 3, 4], [8, 0], [6]]


def test_duplicate_siblings_take_the_first_in_node_order() -> None:
    requests = [[(4, ROOT, -0.1), (4, ROOT, -0.2)]]
    result = check_against_brute_force(requests, [4, 7, 8])
    assert result.accepted_nodes.tolist() == [[0]]
    assert result.bonus_token.tolist() == [7]


def test_a_deeper_path_beats_an_earlier_sibling() -> None:
    # Nodes 0 and 1 both match; only node 1's child matches too: the longest path wins.
    requests = [[(4, ROOT, -0.1), (4, ROOT, -0.2), (6, 1, -0.1)]]
    result = check_against_brute_force(requests, [4, 0, 6, 2])
    assert result.accepted_nodes.tolist() == [[1, 2]]


def test_result_from_leaf_rebuilds_the_path() -> None:
    tree = make_tree([[(1, ROOT, -0.1), (2, 0, -0.1), (3, 0, -0.1)], [(4, ROOT, -0.1)]])
    result = result_from_leaf(tree, torch.tensor([2, -1]), torch.tensor([5, 6]))
    assert result.accepted_nodes.tolist() == [[0, 2], [-1, -1]]
    assert result.num_accepted.tolist() == [2, 0]
    assert result.emitted_tokens(tree) == [[1, 3, 5], [6]]


@pytest.mark.parametrize(
    "argmax",
    [torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2)],
)
def test_bad_argmax_raises_with_the_expected_shape(argmax: torch.Tensor) -> None:
    tree: TreeBatch = make_tree([[(1, ROOT, -0.1), (2, 0, -0.1)], []])
    with pytest.raises(AcceptanceError, match=r"target_argmax must be \[B\+N\] = \[4\] int64"):
        greedy_accept(tree, argmax)


def test_inconsistent_result_raises() -> None:
    with pytest.raises(AcceptanceError, match="bonus_token must be"):
        AcceptResult(
            accepted_nodes=torch.zeros(2, 0, dtype=torch.int64),
            num_accepted=torch.zeros(2, dtype=torch.int64),
            bonus_token=torch.zeros(3, dtype=torch.int64),
        )
