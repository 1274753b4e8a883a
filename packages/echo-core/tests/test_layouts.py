"""Derived views (positions, ancestor masks, EAGLE and SGLang layouts) vs brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core import TreeBatch, TreeError, make_tree
from echo_core.layouts import (
    ancestor_bits,
    ancestor_mask,
    from_sglang,
    pack_bits,
    retrieve_indices,
    to_sglang,
    tree_from_retrieve_indices,
    unpack_bits,
    verify_positions,
)
from echo_core.random_trees import random_tree_batch
from echo_core.verify_rows import node_rows, parent_rows, verify_offsets

TREES = st.tuples(st.integers(0, 10_000), st.integers(0, 5), st.integers(0, 40))


def _tree(args: tuple[int, int, int]) -> TreeBatch:
    seed, batch, nodes = args
    return random_tree_batch(torch.Generator().manual_seed(seed), batch, nodes)


def _ancestors(tree: TreeBatch, b: int, i: int) -> set[int]:
    req = tree.request(b)
    out = {i}
    while int(req.parent[i]) >= 0:
        i = int(req.parent[i])
        out.add(i)
    return out


@settings(max_examples=50, deadline=None)
@given(TREES)
def test_ancestor_mask_and_bits_match_brute_force(args: tuple[int, int, int]) -> None:
    tree = _tree(args)
    mask = ancestor_mask(tree)
    for g in range(tree.num_nodes):
        b = int(tree.request_index()[g])
        local = g - int(tree.cu_nodes[b])
        expected = _ancestors(tree, b, local)
        assert {j for j in range(mask.shape[1]) if bool(mask[g, j])} == expected
    assert torch.equal(unpack_bits(ancestor_bits(tree), mask.shape[1]), mask)


def test_pack_bits_uses_the_sign_bit_of_int32() -> None:
    mask = torch.zeros(1, 33, dtype=torch.bool)
    mask[0, 31] = True
    mask[0, 32] = True
    words = pack_bits(mask)
    assert words.dtype == torch.int32
    assert words.tolist() == [[-(2**31), 1]]
    assert torch.equal(unpack_bits(words, 33), mask)


def test_positions_and_rows_follow_the_verify_layout() -> None:
    tree = make_tree([[(5, -1, -0.1), (6, 0, -0.1), (7, -1, -0.1)], [], [(8, -1, -0.2)]])
    assert verify_offsets(tree).tolist() == [0, 4, 5, 7]
    assert node_rows(tree).tolist() == [1, 2, 3, 6]
    assert parent_rows(tree).tolist() == [0, 1, 0, 5]
    pos = verify_positions(tree, torch.tensor([10, 3, 7]))
    assert pos.tolist() == [10, 11, 12, 11, 3, 7, 8]
    with pytest.raises(TreeError, match="cache_len"):
        verify_positions(tree, torch.tensor([1, 2]))


@settings(max_examples=50, deadline=None)
@given(TREES)
def test_retrieve_indices_round_trip(args: tuple[int, int, int]) -> None:
    tree = _tree(args)
    for b in range(tree.batch_size):
        req = tree.request(b)
        retrieve = retrieve_indices(tree, b)
        # Every row is a root-to-leaf path of local verify rows.
        for row in retrieve.tolist():
            path = [r for r in row if r >= 0]
            assert path[0] == 0
            for prev, cur in itertools.pairwise(path):
                assert int(req.parent[cur - 1]) == prev - 1
        tokens = torch.cat([torch.tensor([0]), req.token])
        back = tree_from_retrieve_indices(tokens, retrieve, req.draft_logprob)
        assert torch.equal(back.parent, req.parent)
        assert torch.allclose(back.path_logprob, req.path_logprob)


@settings(max_examples=50, deadline=None)
@given(TREES)
def test_sglang_layout_round_trip_and_pointers(args: tuple[int, int, int]) -> None:
    tree = _tree(args)
    roots = torch.arange(tree.batch_size, dtype=torch.int64) + 100
    cache = torch.arange(tree.batch_size, dtype=torch.int64) * 7
    layout = to_sglang(tree, roots, cache)
    t = layout.retrive_next_token.shape[1] if tree.batch_size else 1
    for b in range(tree.batch_size):
        req = tree.request(b)
        n = req.num_nodes
        for j in range(n + 1):
            children = [i + 1 for i in range(n) if int(req.parent[i]) + 1 == j]
            walk, cur = [], int(layout.retrive_next_token[b, j])
            while cur >= 0:
                walk.append(cur)
                cur = int(layout.retrive_next_sibling[b, cur])
            assert walk == children
            ancestors = {0} | ({a + 1 for a in _ancestors(tree, b, j - 1)} if j else set())
            row = layout.tree_mask[b, j]
            assert {c for c in range(t) if bool(row[c])} == ancestors
            depth = 0 if j == 0 else int(req.depth[j - 1])
            assert int(layout.positions[b * t + j]) == int(cache[b]) + depth
        for j in range(n + 1, t):  # padding: isolated, never reachable
            assert int(layout.retrive_index[b, j]) == b * t + j
            assert int(layout.retrive_next_token[b, j]) == -1
            assert {c for c in range(t) if bool(layout.tree_mask[b, j, c])} == {j}
    back, back_roots = from_sglang(layout)
    assert torch.equal(back.cu_nodes, tree.cu_nodes)
    assert torch.equal(back.token, tree.token)
    assert torch.equal(back.parent, tree.parent)
    assert torch.equal(back_roots, roots)


def test_sglang_layout_rejects_too_small_token_budget() -> None:
    tree = make_tree([[(5, -1, -0.1), (6, 0, -0.1)]])
    with pytest.raises(TreeError, match="num_draft_tokens"):
        to_sglang(tree, torch.tensor([1]), torch.tensor([0]), num_draft_tokens=2)
