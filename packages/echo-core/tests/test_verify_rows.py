"""The verify-pass row layout: roots first, then each request's nodes."""

from __future__ import annotations

import torch

from echo_core.tree import ROOT, empty_tree, make_tree
from echo_core.verify_rows import node_rows, parent_rows, root_rows, verify_offsets


def test_worked_example_from_the_docstring() -> None:
    tree = make_tree(
        [
            [(1, ROOT, -0.1), (2, 0, -0.1)],
            [],
            [(3, ROOT, -0.1), (4, ROOT, -0.1), (5, 1, -0.1)],
        ]
    )
    assert tree.cu_nodes.tolist() == [0, 2, 2, 5]
    assert verify_offsets(tree).tolist() == [0, 3, 4, 8]
    assert root_rows(tree).tolist() == [0, 3, 4]
    assert node_rows(tree).tolist() == [1, 2, 5, 6, 7]
    assert parent_rows(tree).tolist() == [0, 1, 4, 4, 6]


def test_rows_cover_the_verify_pass_exactly_once() -> None:
    tree = make_tree([[(1, ROOT, -0.1)], [], [(2, ROOT, -0.1), (3, 0, -0.1)], []])
    rows = torch.cat([root_rows(tree), node_rows(tree)]).sort().values
    assert rows.tolist() == list(range(tree.batch_size + tree.num_nodes))


def test_empty_batch_rows() -> None:
    tree = empty_tree(3)
    assert verify_offsets(tree).tolist() == [0, 1, 2, 3]
    assert node_rows(tree).shape == (0,)
    assert parent_rows(tree).shape == (0,)
