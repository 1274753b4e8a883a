"""The vectorised SGLang layout against the per-node loops it replaced (kept here as references).

The loops synced the host about three times per node (``int()`` of a device scalar) and once per
depth (``nonzero``); the tensor versions must build identical layouts on random trees of every
shape: empty requests, chains (deep), stars (depth 1) and batches up to 48.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from echo_core import TreeBatch
from echo_core.layouts import NO_INDEX, ancestor_mask, max_nodes, to_sglang
from echo_core.random_trees import random_tree_batch

SHAPES = st.tuples(
    st.integers(0, 10_000),  # seed
    st.sampled_from([0, 1, 2, 5, 8, 48]),  # batch size
    st.sampled_from([0, 1, 4, 16]),  # max nodes per request
    st.sampled_from([None, 1, 2, 4]),  # max depth (1: stars)
    st.integers(0, 3),  # padding slots beyond the largest tree
)


def _loop_pointers(tree: TreeBatch, t: int) -> tuple[Tensor, Tensor]:
    """The former ``to_sglang`` loop: nodes in reverse, so first children and siblings follow
    node order."""
    b_size = tree.batch_size
    req = tree.request_index()
    local = torch.arange(tree.num_nodes) - tree.cu_nodes[:-1][req]
    next_token = torch.full((b_size, t), NO_INDEX, dtype=torch.int64)
    next_sibling = torch.full((b_size, t), NO_INDEX, dtype=torch.int64)
    parent_slot = tree.parent + 1
    for i in range(tree.num_nodes - 1, -1, -1):
        bi, ps, me = int(req[i]), int(parent_slot[i]), int(local[i]) + 1
        next_sibling[bi, me] = next_token[bi, ps]
        next_token[bi, ps] = me
    return next_token, next_sibling


def _levelwise_ancestor_mask(tree: TreeBatch) -> Tensor:
    """The former ``ancestor_mask``: ``A[i] = A[parent(i)] | e_i``, one level at a time."""
    n, width = tree.num_nodes, max_nodes(tree)
    mask = torch.zeros(n, width, dtype=torch.bool)
    if n == 0:
        return mask
    local = torch.arange(n) - tree.cu_nodes[:-1][tree.request_index()]
    gp = tree.global_parent()
    for d in range(1, tree.max_depth() + 1):
        level = (tree.depth == d).nonzero().squeeze(1)
        if d > 1:
            mask[level] = mask[gp[level]]
        mask[level, local[level]] = True
    return mask


def _tree(args: tuple[int, int, int, int | None, int]) -> tuple[TreeBatch, int]:
    seed, batch, nodes, depth, pad = args
    gen = torch.Generator().manual_seed(seed)
    tree = random_tree_batch(gen, batch, nodes, max_depth=depth)
    return tree, max_nodes(tree) + 1 + pad


@settings(max_examples=40, deadline=None)
@given(SHAPES)
def test_ancestor_mask_equals_the_levelwise_loop(
    args: tuple[int, int, int, int | None, int],
) -> None:
    tree, _ = _tree(args)
    assert torch.equal(ancestor_mask(tree), _levelwise_ancestor_mask(tree))


@settings(max_examples=40, deadline=None)
@given(SHAPES)
def test_sglang_pointers_and_mask_equal_the_per_node_loop(
    args: tuple[int, int, int, int | None, int],
) -> None:
    tree, t = _tree(args)
    b = tree.batch_size
    layout = to_sglang(tree, torch.arange(b) + 3, torch.arange(b) * 5, num_draft_tokens=t)
    next_token, next_sibling = _loop_pointers(tree, t)
    assert torch.equal(layout.retrive_next_token, next_token)
    assert torch.equal(layout.retrive_next_sibling, next_sibling)
    # The mask rows of real slots: root column plus the reference ancestors, shifted by one.
    anc = _levelwise_ancestor_mask(tree)
    req = tree.request_index()
    local = torch.arange(tree.num_nodes) - tree.cu_nodes[:-1][req]
    rows = layout.tree_mask[req, local + 1]  # [N, T]
    assert rows[:, 0].all()
    assert torch.equal(rows[:, 1 : 1 + anc.shape[1]], anc)
    assert not rows[:, 1 + anc.shape[1] :].any()
