"""Confidence signals vs brute-force Python loops over random trees."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, empty_tree, make_tree
from echo_gating.errors import GatingError
from echo_gating.signals import (
    depth_confidences,
    draft_entropy,
    gate_signal,
    layer_confidence,
    node_layer_confidence,
    sibling_margin,
    top2_margin,
)

SETTINGS = settings(derandomize=True, deadline=None, max_examples=40)


def brute_layer_confidence(pool: TreeBatch, depth: int) -> list[float]:
    out = []
    for b in range(pool.batch_size):
        lo, hi = int(pool.cu_nodes[b]), int(pool.cu_nodes[b + 1])
        best = 0.0
        for i in range(lo, hi):
            if int(pool.depth[i]) == depth:
                best = max(best, math.exp(float(pool.path_logprob[i])))
        out.append(best)
    return out


def test_worked_example_from_docstring() -> None:
    pool = make_tree([[(1, -1, math.log(0.6)), (2, -1, math.log(0.3)), (3, 0, math.log(0.5))], []])
    torch.testing.assert_close(depth_confidences(pool), torch.tensor([[0.6, 0.3], [0.0, 0.0]]))
    torch.testing.assert_close(layer_confidence(pool, 2), torch.tensor([0.3, 0.0]))
    torch.testing.assert_close(node_layer_confidence(pool), torch.tensor([0.6, 0.6, 0.3]))


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(0, 6),
    max_nodes=st.integers(0, 12),
    depth=st.integers(1, 6),
)
def test_layer_confidence_matches_brute_force(
    seed: int, batch: int, max_nodes: int, depth: int
) -> None:
    pool = random_tree_batch(torch.Generator().manual_seed(seed), batch, max_nodes, max_depth=5)
    got = layer_confidence(pool, depth)
    assert got.dtype == torch.float32
    assert got.shape == (batch,)
    torch.testing.assert_close(got, torch.tensor(brute_layer_confidence(pool, depth)))
    table = depth_confidences(pool, max_depth=6)
    torch.testing.assert_close(table[:, depth - 1], got)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_node_layer_confidence_is_the_max_of_its_cell(seed: int) -> None:
    pool = random_tree_batch(torch.Generator().manual_seed(seed), 4, 10)
    per_node = node_layer_confidence(pool)
    req = pool.request_index()
    for i in range(pool.num_nodes):
        cell = (req == req[i]) & (pool.depth == pool.depth[i])
        assert float(per_node[i]) == pytest.approx(float(pool.path_logprob[cell].exp().max()))


def test_empty_pool_and_nodes_beyond_max_depth() -> None:
    assert depth_confidences(empty_tree(3)).shape == (3, 0)
    assert layer_confidence(empty_tree(2), 1).tolist() == [0.0, 0.0]
    pool = make_tree([[(1, -1, -0.1), (2, 0, -0.1)]])
    assert depth_confidences(pool, max_depth=1).shape == (1, 1)


def test_bad_depth_is_rejected() -> None:
    with pytest.raises(GatingError, match="depth must be >= 1"):
        layer_confidence(empty_tree(1), 0)


def test_entropy_and_margin() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.7, 0.2, 0.1]]))
    torch.testing.assert_close(
        draft_entropy(lp),
        torch.tensor(
            [math.log(2), 0.0, -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))]
        ),
    )
    torch.testing.assert_close(top2_margin(lp), torch.tensor([0.0, 1.0, 0.5]))
    torch.testing.assert_close(top2_margin(torch.zeros(2, 1)), torch.ones(2))
    with pytest.raises(GatingError, match=r"\[N, V\]"):
        draft_entropy(torch.zeros(3))


def brute_sibling_margin(pool: TreeBatch, depth: int) -> list[float]:
    """Module docstring of signals, literally: best node (ties: largest margin), its siblings."""
    out = []
    for b in range(pool.batch_size):
        lo, hi = int(pool.cu_nodes[b]), int(pool.cu_nodes[b + 1])
        nodes = [i for i in range(lo, hi) if int(pool.depth[i]) == depth]
        if not nodes:
            out.append(0.0)
            continue

        def margin(i: int, lo: int = lo, hi: int = hi) -> float:
            parent = int(pool.parent[i])
            sibs = [j for j in range(lo, hi) if int(pool.parent[j]) == parent]
            qs = sorted((math.exp(float(pool.draft_logprob[j])) for j in sibs), reverse=True)
            return qs[0] - (qs[1] if len(qs) > 1 else 0.0)

        best = max(float(pool.path_logprob[i]) for i in nodes)
        out.append(max(margin(i) for i in nodes if float(pool.path_logprob[i]) == best))
    return out


def test_sibling_margin_by_hand() -> None:
    ln = math.log
    pool = make_tree(
        [
            [(1, -1, ln(0.6)), (2, -1, ln(0.3)), (3, 0, ln(0.5)), (4, 0, ln(0.4))],
            [(5, -1, ln(0.9))],  # an only child: margin q_(1)
            [(6, -1, ln(0.4)), (7, -1, ln(0.4))],  # a tie for first: margin 0
            [],
        ]
    )
    torch.testing.assert_close(sibling_margin(pool, 1), torch.tensor([0.3, 0.9, 0.0, 0.0]))
    torch.testing.assert_close(sibling_margin(pool, 2), torch.tensor([0.1, 0.0, 0.0, 0.0]))
    assert gate_signal(pool, 1, "sibling_margin").tolist() == sibling_margin(pool, 1).tolist()
    with pytest.raises(GatingError, match="unknown gate signal 'entropy'"):
        gate_signal(pool, 1, "entropy")


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(0, 6),
    max_nodes=st.integers(0, 12),
    depth=st.integers(1, 5),
)
def test_sibling_margin_matches_brute_force(
    seed: int, batch: int, max_nodes: int, depth: int
) -> None:
    pool = random_tree_batch(torch.Generator().manual_seed(seed), batch, max_nodes, max_depth=5)
    got = sibling_margin(pool, depth)
    assert got.dtype == torch.float32
    assert got.shape == (batch,)
    # float32 exp and one subtraction per value: a few ulps of 1.0
    torch.testing.assert_close(
        got, torch.tensor(brute_sibling_margin(pool, depth)), atol=4 * 2**-23, rtol=0
    )
