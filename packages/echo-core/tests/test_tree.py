"""Packed tree invariants, validation errors and ancestor-closed selection."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core import TreeBatch, TreeError, empty_tree, make_tree, select_nodes
from echo_core.random_trees import random_tree_batch


def _replace(tree: TreeBatch, **fields: torch.Tensor) -> TreeBatch:
    values = {name: getattr(tree, name) for name in TreeBatch.__slots__}
    values.update(fields)
    return TreeBatch(**values)


def test_make_tree_derives_depth_and_path_scores() -> None:
    tree = make_tree([[(5, -1, -0.5), (7, 0, -0.25), (9, -1, -1.0)], []])
    assert tree.depth.tolist() == [1, 2, 1]
    assert tree.path_logprob.tolist() == pytest.approx([-0.5, -0.75, -1.0])
    assert tree.nodes_per_request().tolist() == [3, 0]
    assert tree.request_index().tolist() == [0, 0, 0]


def test_zero_node_requests_are_legal() -> None:
    tree = empty_tree(3)
    tree.validate()
    assert tree.batch_size == 3
    assert tree.num_nodes == 0
    assert tree.max_depth() == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("parent", torch.tensor([-1, 1]), "parents must precede"),
        ("depth", torch.tensor([1, 3]), "expected 2"),
        ("path_logprob", torch.tensor([-0.5, -0.5]), "path_logprob"),
        ("token", torch.tensor([3, -4]), "non-negative"),
        ("cu_nodes", torch.tensor([0, 3]), "cu_nodes"),
        ("depth", torch.tensor([1.0, 2.0]), "int64"),
    ],
)
def test_validation_names_the_violation(field: str, value: torch.Tensor, message: str) -> None:
    tree = make_tree([[(5, -1, -0.5), (7, 0, -0.25)]])
    with pytest.raises(TreeError, match=message):
        _replace(tree, **{field: value}).validate()


def test_make_tree_rejects_forward_parent() -> None:
    with pytest.raises(TreeError, match="parent 2"):
        make_tree([[(1, -1, -0.1), (2, 2, -0.1)]])


def test_select_rejects_orphan() -> None:
    tree = make_tree([[(5, -1, -0.5), (7, 0, -0.25)]])
    with pytest.raises(TreeError, match="ancestor-closed"):
        select_nodes(tree, torch.tensor([False, True]))


def test_select_reindexes_parents() -> None:
    tree = make_tree([[(1, -1, -0.1), (2, -1, -0.2), (3, 1, -0.3)], [(4, -1, -0.4), (5, 0, -0.5)]])
    sub = select_nodes(tree, torch.tensor([False, True, True, True, False]))
    sub.validate()
    assert sub.cu_nodes.tolist() == [0, 2, 3]
    assert sub.token.tolist() == [2, 3, 4]
    assert sub.parent.tolist() == [-1, 0, -1]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(0, 5), nodes=st.integers(0, 9))
def test_random_selection_matches_python(seed: int, batch: int, nodes: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    pool = random_tree_batch(gen, batch, nodes)
    # Ancestor-closed by construction: keep a node iff its parent is kept and a coin says so.
    coin = torch.rand(pool.num_nodes, generator=gen) < 0.7
    keep = torch.zeros(pool.num_nodes, dtype=torch.bool)
    gp = pool.global_parent().tolist()
    for i in range(pool.num_nodes):
        keep[i] = bool(coin[i]) and (gp[i] < 0 or bool(keep[gp[i]]))
    sub = select_nodes(pool, keep)
    sub.validate()
    for b in range(pool.batch_size):
        full, part = pool.request(b), sub.request(b)
        lo = int(pool.cu_nodes[b])
        kept = [i for i in range(full.num_nodes) if bool(keep[lo + i])]
        assert part.token.tolist() == [int(full.token[i]) for i in kept]
        remap = {old: new for new, old in enumerate(kept)}
        expected = [-1 if int(full.parent[i]) < 0 else remap[int(full.parent[i])] for i in kept]
        assert part.parent.tolist() == expected
